// Calls of one kind made in the same turn of the event loop become one statement: a burst's
// hundred claims, receipts recorded or answers stored in a turn cost the database one parse, one
// plan and one round trip instead of a hundred (the embedded engine runs every statement on the
// event loop's thread, so there it is most of a settlement's CPU). Each call gets its own result.
// Two calls on one key never share a statement (each must see the other as a separate write), and
// a statement that fails runs its calls again one by one, so no call fails for its neighbours.

export interface CoalesceOptions<I> {
  /** Writes: calls with the same key go to different statements (reads need none). */
  key?: (item: I) => string;
  /** Calls per statement at most. */
  max?: number;
  /**
   * Statements of this kind in flight at most; the calls that come meanwhile wait for one to end
   * and go together. A process busy with a burst reaches a statement with a request or two a turn,
   * so without it a turn's batch is smallest exactly when the database is busiest.
   */
  lanes?: number;
  /** How long a run may hold its lane before the batches behind it go without it (5 s). */
  laneHeldMs?: number;
}

/** `run` gets the calls of a turn and answers with one result per call, in order. */
export function coalesce<I, R>(run: (items: I[]) => Promise<R[]>, opts: CoalesceOptions<I> = {}): (item: I) => Promise<R> {
  const max = opts.max ?? 500;
  type Batch = { items: I[]; keys: Set<string>; waiters: { resolve: (r: R) => void; reject: (e: unknown) => void }[] };
  let current: Batch | undefined;
  const settle = (b: Batch, results: R[]) => b.waiters.forEach((w, i) => w.resolve(results[i]!));
  const lanes = opts.lanes ?? Infinity;
  let inFlight = 0;
  // Batches made and not yet run, oldest first (the last may still be `current`, open to more calls).
  const waiting: Batch[] = [];
  /** One batch: its run, or its calls one by one (in the same lane) when the run failed. */
  async function runBatch(b: Batch): Promise<void> {
    try {
      settle(b, await run(b.items));
    } catch (e) {
      if (b.items.length === 1) return b.waiters[0]!.reject(e);
      for (const [i, item] of b.items.entries()) {
        try {
          b.waiters[i]!.resolve((await run([item]))[0]!);
        } catch (err) {
          b.waiters[i]!.reject(err);
        }
      }
    }
  }
  const pump = () => {
    while (inFlight < lanes && waiting.length > 0) {
      const b = waiting.shift()!;
      if (current === b) current = undefined;
      inFlight++;
      // A run that hangs (a lock held elsewhere) gives its lane back after a while: its own calls
      // wait on, the ones behind it do not. (Without a lane limit there is nothing to give back.)
      let freed = false;
      const free = () => {
        if (freed) return;
        freed = true;
        clearTimeout(timer);
        inFlight--;
        pump();
      };
      const timer = lanes === Infinity ? undefined : setTimeout(free, opts.laneHeldMs ?? 5_000);
      timer?.unref();
      void Promise.resolve().then(() => runBatch(b)).finally(free);
    }
  };
  return (item) =>
    new Promise<R>((resolve, reject) => {
      const key = opts.key?.(item);
      if (!current || (key !== undefined && current.keys.has(key)) || current.items.length >= max) {
        // Run at the end of the turn, or, with every lane busy, once one frees (calls join it meanwhile).
        waiting.push((current = { items: [], keys: new Set(), waiters: [] }));
        setImmediate(pump);
      }
      current.items.push(item);
      if (key !== undefined) current.keys.add(key);
      current.waiters.push({ resolve, reject });
    });
}
