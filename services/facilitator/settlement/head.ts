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
// (network-policy.ts minBlockIntervalMs; 0 turns this off) and the local clock's rate (not its
// offset: only local times are compared). Caveats: a reorg to a lower height is not seen until the
// next new block; a block made off schedule before any timestamp shows it is trusted for at most
// one interval. A sequencer catching up after a halt makes blocks faster than their timestamps:
// while the newest timestamp trails the local clock by more than two intervals (plus a second of
// clock offset), nothing is provable.

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

export function createHeadTracker(minBlockIntervalMs: number, now: () => number = Date.now): HeadTracker {
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
          behind = now() - Number(timestamp) * 1000 > 2 * minBlockIntervalMs + 1000;
        }
      }
      if (!head) {
        // When the first block we see was made is unknown: nothing is provable until the next one.
        head = { number, validUntil: 0, seenSince: startedAt };
      } else if (number > head.number) {
        head = { number, validUntil: broken ? 0 : head.seenSince + minBlockIntervalMs, seenSince: startedAt };
      } else if (number === head.number && startedAt > head.seenSince) {
        head.seenSince = startedAt;
      }
    },
    current: () => (!broken && !behind && head && now() < head.validUntil ? head.number : undefined),
    latest: () => head?.number,
    offSchedule: () => broken && minBlockIntervalMs > 0,
  };
}
