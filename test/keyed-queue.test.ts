// The store's per-key queue (store.ts createKeyedQueue): runs of one key never overlap and keep
// their order, a failed run does not hold up the next, and other keys are not held up at all.
import { describe, expect, it } from "vitest";
import { createKeyedQueue } from "../services/facilitator/settlement/store.ts";

describe("keyed queue", () => {
  it("serialises one key in order, lets other keys run beside it, and survives a failed run", async () => {
    const inTurn = createKeyedQueue();
    const running = new Map<string, number>();
    const most = new Map<string, number>();
    const order: string[] = [];
    let overall = 0;
    let overallMost = 0;
    const task = (key: string, name: string, fail = false) =>
      inTurn(key, async () => {
        running.set(key, (running.get(key) ?? 0) + 1);
        overallMost = Math.max(overallMost, ++overall);
        most.set(key, Math.max(most.get(key) ?? 0, running.get(key)!));
        await new Promise((r) => setImmediate(r));
        await new Promise((r) => setImmediate(r));
        order.push(name);
        running.set(key, running.get(key)! - 1);
        overall--;
        if (fail) throw new Error(`${name} failed`);
        return name;
      });
    const results = await Promise.allSettled([task("a", "a1"), task("a", "a2", true), task("a", "a3"), task("b", "b1"), task("b", "b2")]);
    expect(results.map((r) => r.status)).toEqual(["fulfilled", "rejected", "fulfilled", "fulfilled", "fulfilled"]);
    expect(most.get("a")).toBe(1);
    expect(most.get("b")).toBe(1);
    expect(overallMost).toBe(2); // a and b side by side
    expect(order.filter((n) => n.startsWith("a"))).toEqual(["a1", "a2", "a3"]);
    expect(order.filter((n) => n.startsWith("b"))).toEqual(["b1", "b2"]);
    expect(await inTurn("a", async () => "after")).toBe("after");
  });
});
