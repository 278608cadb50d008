// Which block is provably still the chain's head, without asking the node. On a chain that never
// makes two blocks closer than `minBlockIntervalMs` (an OP Stack sequencer's schedule), a block
// first seen by a read that started at `s`, after a read that started at `p` still saw its parent,
// was made after `p`: its successor cannot exist before `p + minBlockIntervalMs`. Until then a
// simulation at that block is the simulation a fresh call at "latest" would run, so /settle may
// reuse the one /verify ran (outbox-signer.ts takeSimulation).
//
// Guarantees: current() never names a block older than the head while the chain keeps its
// schedule; a chain seen breaking it (two blocks' timestamps closer than the interval: a devnet
// mining on demand, a wrong policy) never gets a provable head again. Assumptions: the schedule
// (network-policy.ts minBlockIntervalMs; 0 turns this off), one endpoint answering every read (the
// signer makes no proof behind a fallback of several), and a monotonic local clock. A proof ends
// half a second early: blocks reach the node a little late, and a node behind its peers by more
// than that is outside the assumption. Caveats: a reorg to a lower height is not seen until the next
// new block. A sequencer catching up after a halt makes blocks faster than their timestamps: while
// the newest timestamp trails the wall clock by more than an interval and a second, nothing is
// provable (so a wall clock off by more than a second turns proofs off or weakens this check).

export interface HeadTracker {
  /** A read that started at local time `startedAt` (ms) saw `number` as the head, made at `timestamp` (s) if known. */
  observe(number: bigint, startedAt: number, timestamp?: bigint): void;
  /** Whether a block was seen off the schedule (then current() is always undefined). */
  offSchedule(): boolean;
  /** The block that is provably still the head now, or undefined when that cannot be known. */
  current(): bigint | undefined;
  /** The highest block seen, provable or not. */
  latest(): bigint | undefined;
}

/** How much earlier than the schedule allows a proof ends (propagation to the node, a small lag). */
export const PROOF_MARGIN_MS = 500;

export function createHeadTracker(minBlockIntervalMs: number, now: () => number = () => performance.now(), wallClock: () => number = Date.now): HeadTracker {
  // `seenSince`: the start of the latest read that saw this block (its successor comes after it).
  let head: { number: bigint; validUntil: number; seenSince: number } | undefined;
  let stamped: { number: bigint; timestamp: bigint } | undefined;
  let broken = minBlockIntervalMs <= 0;
  let behind = false;
  return {
    observe(number, startedAt, timestamp) {
      if (timestamp !== undefined) {
        // n blocks must span at least n intervals of block time, or the schedule is not kept.
        if (stamped && number > stamped.number && (timestamp - stamped.timestamp) * 1000n < (number - stamped.number) * BigInt(minBlockIntervalMs)) broken = true;
        if (!stamped || number > stamped.number) {
          stamped = { number, timestamp };
          behind = wallClock() - Number(timestamp) * 1000 > minBlockIntervalMs + 1000;
        }
      }
      if (!head) {
        // When the first block we see was made is unknown: nothing is provable until the next one.
        head = { number, validUntil: 0, seenSince: startedAt };
      } else if (number > head.number) {
        head = { number, validUntil: broken ? 0 : head.seenSince + minBlockIntervalMs - PROOF_MARGIN_MS, seenSince: startedAt };
      } else if (number === head.number && startedAt > head.seenSince) {
        head.seenSince = startedAt;
      }
    },
    current: () => (!broken && !behind && head && now() < head.validUntil ? head.number : undefined),
    latest: () => head?.number,
    offSchedule: () => broken && minBlockIntervalMs > 0,
  };
}
