// Settlements on their way to a transaction take turns: at most `limit` at once, in arrival order.
// A burst of a thousand payments admitted all at once interleaves every step of every payment on
// the one event loop, so the first transaction is sent only when almost all of them have been
// verified, claimed and signed; the chain's first block leaves with a fraction of what it could
// carry. Taking turns, payments are sent from the first milliseconds at the same total cost, and a
// payment leaves its turn as soon as its first transaction is stored (the receipt wait, a retry's
// wait for another request's outcome, and the answer need none).

export interface SendLane {
  /** Waits for a turn; the returned function ends it (idempotent). */
  enter(): Promise<() => void>;
  /** Turns taken and payments waiting for one (metrics, tests). */
  load(): { active: number; waiting: number };
}

export function createSendLane(limit: number): SendLane {
  let active = 0;
  const waiting: (() => void)[] = [];
  const turn = (): (() => void) => {
    let open = true;
    return () => {
      if (!open) return;
      open = false;
      const next = waiting.shift();
      if (next) next(); // the turn passes on: active stays the same
      else active--;
    };
  };
  return {
    enter() {
      if (active < limit) {
        active++;
        return Promise.resolve(turn());
      }
      return new Promise((resolve) => waiting.push(() => resolve(turn())));
    },
    load: () => ({ active, waiting: waiting.length }),
  };
}
