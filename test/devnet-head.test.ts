// The devnet keeps an on-demand chain's head recent (anvil.ts keepHeadFresh): an idle anvil's head
// would fall minutes behind the clock, and simulations at its timestamp would find payments signed
// a minute ago "not yet valid". Judged on the chain: an empty block appears once the head is old,
// and none while mining is paused.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createPublicClient, createTestClient, http } from "viem";
import { keepHeadFresh, startAnvil, type AnvilNode } from "../services/devnet/anvil.ts";
import { until } from "./helpers/cluster.ts";

let anvil: AnvilNode;
let stopKeeping: () => void;
beforeAll(async () => {
  anvil = await startAnvil({ chainId: 8453 });
  stopKeeping = keepHeadFresh(anvil.rpcUrl, 1500);
});
afterAll(async () => {
  stopKeeping?.();
  await anvil?.stop();
});

describe("keepHeadFresh", () => {
  it("mines an empty block when the head is older than its bound, and never while mining is paused", async () => {
    const chain = createPublicClient({ transport: http(anvil.rpcUrl) });
    const test = createTestClient({ mode: "anvil", transport: http(anvil.rpcUrl) });
    await until(async () => (await chain.getBlockNumber({ cacheTime: 0 })) >= 2n, "an empty block mined by the keeper", 30_000);
    const head = await chain.getBlock({ blockTag: "latest" });
    expect(head.transactions).toHaveLength(0);
    expect(Date.now() / 1000 - Number(head.timestamp)).toBeLessThan(60);

    await test.setAutomine(false);
    const paused = await chain.getBlockNumber({ cacheTime: 0 });
    await new Promise((r) => setTimeout(r, 4000)); // more than two of the keeper's ticks past its bound
    expect(await chain.getBlockNumber({ cacheTime: 0 })).toBe(paused);
    await test.setAutomine(true);
  });
});
