// The controller runtime's work queue and rate limiter: deduplication, one worker per key,
// per-key exponential backoff and the global bucket, graceful drain. No clocks are waited on.
import { describe, expect, it } from "vitest";
import { RateLimiter, WorkQueue } from "../operator/runtime/queue.ts";

describe("rate limiter", () => {
  it("doubles the delay per consecutive failure of a key, caps it, and forgets on success", () => {
    const clock = () => 0;
    const rl = new RateLimiter({ baseDelayMs: 5, maxDelayMs: 1_000_000, qps: 1e9, burst: 1e9 }, clock);
    const delays = Array.from({ length: 5 }, () => rl.when("a"));
    expect(delays).toEqual([5, 10, 20, 40, 80]);
    expect(rl.when("b")).toBe(5); // per key
    for (let i = 0; i < 40; i++) rl.when("a");
    expect(rl.when("a")).toBe(1_000_000);
    expect(rl.numRequeues("a")).toBe(46);
    rl.forget("a");
    expect(rl.when("a")).toBe(5);
  });

  it("spaces retries of all keys by the global token bucket once its burst is spent", () => {
    let t = 0;
    const rl = new RateLimiter({ baseDelayMs: 1, maxDelayMs: 1, qps: 10, burst: 2 }, () => t);
    expect([rl.when("a"), rl.when("b")]).toEqual([1, 1]);
    expect(rl.when("c")).toBe(100); // one token short at 10 qps
    expect(rl.when("d")).toBe(200);
    t = 10_000; // refilled
    expect(rl.when("e")).toBe(1);
  });
});

describe("work queue", () => {
  it("queues a key at most once", async () => {
    const q = new WorkQueue();
    q.add("a");
    q.add("b");
    q.add("a");
    expect(q.len()).toBe(2);
    expect(await q.get()).toBe("a");
    expect(await q.get()).toBe("b");
    expect(q.len()).toBe(0);
  });

  it("never hands a key to a second worker while it is processed; an add meanwhile requeues it once done", async () => {
    const q = new WorkQueue();
    q.add("a");
    const first = await q.get();
    expect(first).toBe("a");
    q.add("a");
    q.add("a");
    expect(q.len()).toBe(0); // held back: "a" is being processed
    let second: string | undefined;
    const waiting = q.get().then((k) => (second = k));
    await Promise.resolve();
    expect(second).toBeUndefined();
    q.done("a");
    await waiting;
    expect(second).toBe("a");
    expect(q.isProcessing("a")).toBe(true);
    q.done("a");
    expect(q.len()).toBe(0);
  });

  it("delays rate-limited keys and lets an earlier delay win", () => {
    const q = new WorkQueue(new RateLimiter({ baseDelayMs: 60_000, maxDelayMs: 60_000, qps: 1e9, burst: 1e9 }));
    expect(q.addRateLimited("a")).toBe(60_000);
    expect(q.len()).toBe(0);
    q.addAfter("a", 0);
    expect(q.len()).toBe(1);
    void q.shutDown();
  });

  it("drains on shutdown: hands out nothing more and waits for keys in progress", async () => {
    const q = new WorkQueue();
    q.add("a");
    q.add("b");
    const key = await q.get();
    let drained = false;
    const shutdown = q.shutDown().then(() => (drained = true));
    expect(await q.get()).toBeUndefined();
    await Promise.resolve();
    expect(drained).toBe(false);
    q.done(key!);
    await shutdown;
    expect(drained).toBe(true);
  });
});
