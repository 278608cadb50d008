// platform/coalesce.ts: calls of a turn share one run, each gets its own result; calls on one key
// never share a run; a failed run is retried call by call, so one bad call fails alone.
import { expect, it } from "vitest";
import { coalesce } from "../services/platform/coalesce.ts";

it("calls of one turn share a run, in order, each with its own result; one key never twice in a run", async () => {
  const runs: string[][] = [];
  const echo = coalesce(async (items: string[]) => (runs.push(items), items.map((i) => i.toUpperCase())), { key: (i) => i });
  expect(await Promise.all(["a", "b", "a", "c"].map((i) => echo(i)))).toEqual(["A", "B", "A", "C"]);
  expect(runs).toEqual([["a", "b"], ["a", "c"]]);
});

it("a run that fails is retried call by call: only the bad call fails", async () => {
  const runs: number[][] = [];
  const check = coalesce(async (items: number[]) => {
    runs.push(items);
    if (items.includes(13)) throw new Error("bad item");
    return items.map((i) => i * 2);
  });
  const results = await Promise.allSettled([1, 13, 3].map((i) => check(i)));
  expect(results.map((r) => (r.status === "fulfilled" ? r.value : "failed"))).toEqual([2, "failed", 6]);
  expect(runs[0]).toEqual([1, 13, 3]);
  expect(runs.slice(1).sort()).toEqual([[1], [13], [3]].sort());
});

it("with its lanes busy, calls of later turns wait and go together in the next run, in order", async () => {
  const runs: number[][] = [];
  let open!: () => void;
  const gate = new Promise<void>((r) => (open = r));
  const write = coalesce(
    async (items: number[]) => {
      runs.push(items);
      if (runs.length === 1) await gate; // the first run holds the only lane
      return items.map((i) => -i);
    },
    { lanes: 1 },
  );
  const first = write(1);
  await new Promise((r) => setImmediate(r));
  // Three more turns, one call each, while the lane is held: one run for them, not three.
  const later: Promise<number>[] = [];
  for (const i of [2, 3, 4]) {
    later.push(write(i));
    await new Promise((r) => setImmediate(r));
  }
  expect(runs).toEqual([[1]]);
  open();
  expect(await Promise.all([first, ...later])).toEqual([-1, -2, -3, -4]);
  expect(runs).toEqual([[1], [2, 3, 4]]);
});

it("a run that hangs gives its lane back: the calls behind it go on, its own keep waiting", async () => {
  const runs: string[][] = [];
  const read = coalesce(
    async (items: string[]) => {
      runs.push(items);
      if (items.includes("stuck")) await new Promise(() => undefined); // a lock held elsewhere, for ever
      return items;
    },
    { lanes: 1, laneHeldMs: 50 },
  );
  let stuckAnswered = false;
  void read("stuck").then(() => (stuckAnswered = true));
  await new Promise((r) => setImmediate(r));
  expect(await read("next")).toBe("next");
  expect(runs).toEqual([["stuck"], ["next"]]);
  expect(stuckAnswered).toBe(false);
});
