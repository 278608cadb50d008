// Which block is provably still the head (settlement/head.ts): the rules on a clock we move by hand.
// The settlement path's use of it is judged on chain in settle-path.test.ts.
import { describe, expect, it } from "vitest";
import { PROOF_MARGIN_MS, createHeadTracker } from "../services/facilitator/settlement/head.ts";

function tracker(interval = 2000) {
  let t = 1_000_000;
  const head = createHeadTracker(interval, () => t, () => t);
  return { head, at: (ms: number) => (t = ms), ts: (ms: number) => BigInt(Math.floor(ms / 1000)) };
}

describe("provable head", () => {
  it("a block is provable from the last read that saw its parent until one interval (less the margin) later, not after", () => {
    const { head, at, ts } = tracker();
    at(1_000_000);
    head.observe(10n, 1_000_000, ts(1_000_000));
    expect(head.current()).toBeUndefined(); // when 10 was made is unknown
    head.observe(10n, 1_000_400, ts(1_000_000)); // a later read still sees 10
    at(1_000_900);
    head.observe(11n, 1_000_900, ts(1_002_000));
    // 11 was made after the read started at 1_000_400: 12 cannot exist before 1_002_400, and the
    // proof ends PROOF_MARGIN_MS earlier
    at(1_002_400 - PROOF_MARGIN_MS - 1);
    expect(head.current()).toBe(11n);
    at(1_002_400 - PROOF_MARGIN_MS);
    expect(head.current()).toBeUndefined();
  });

  it("blocks closer than the interval (a chain mining on demand) end every proof for good", () => {
    const { head, at, ts } = tracker();
    at(1_000_000);
    head.observe(10n, 1_000_000, ts(1_000_000));
    at(1_000_500);
    head.observe(13n, 1_000_500, ts(1_001_000)); // three blocks in one second
    expect(head.offSchedule()).toBe(true);
    at(1_003_000);
    head.observe(14n, 1_003_000, ts(1_003_000));
    at(1_003_100);
    head.observe(15n, 1_003_100, ts(1_005_000));
    expect(head.current()).toBeUndefined();
  });

  it("a head whose timestamp trails the clock by more than an interval and a second (a sequencer catching up) is not provable", () => {
    const { head, at, ts } = tracker();
    at(1_004_000);
    head.observe(10n, 1_004_000, ts(1_000_000));
    at(1_005_100);
    head.observe(11n, 1_005_100, ts(1_002_000)); // 3.1 s behind the clock: catching up
    expect(head.offSchedule()).toBe(false);
    expect(head.current()).toBeUndefined();
  });

  it("our own receipt's block (no timestamp) moves the head; an older block seen later does not", () => {
    const { head, at, ts } = tracker();
    at(1_000_000);
    head.observe(10n, 1_000_000, ts(1_000_000));
    at(1_000_300);
    head.observe(11n, 1_000_200); // a receipt of a transaction sent at 1_000_200
    expect(head.current()).toBe(11n);
    head.observe(9n, 1_000_300, ts(998_000)); // a lagging fallback endpoint
    expect(head.current()).toBe(11n);
    expect(head.latest()).toBe(11n);
  });

  it("no schedule (0): nothing is ever provable", () => {
    const { head, at, ts } = tracker(0);
    at(1_000_000);
    head.observe(10n, 1_000_000, ts(1_000_000));
    head.observe(11n, 1_000_000, ts(1_002_000));
    expect(head.current()).toBeUndefined();
    expect(head.offSchedule()).toBe(false);
  });
});
