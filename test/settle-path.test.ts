// The settlement's critical path (issue 17): on a chain that keeps a block schedule, a payment
// verified at the block that is provably still the head is settled without a second simulation
// and without an L1 fee quote on the path (one round trip with eth_sendRawTransactionSync); once
// the head has moved, or on a chain mining on demand, it is simulated again. Counted at an RPC
// proxy in front of a real anvil, judged on chain. (Safety on an on-demand chain, where the payer
// spends between verify and settle: settle-reverts.test.ts.)
import { afterEach, describe, expect, it } from "vitest";
import type { Hex } from "viem";
import { stopRig, startRig, type Rig } from "./helpers/settlement-rig.ts";
import { balanceOf } from "./helpers/chain.ts";
import { postJson } from "./helpers/payments.ts";
import { publicClient } from "./helpers/onchain.ts";
import { callsDuring, startRpcFaultProxy, type RpcFaultProxy } from "./helpers/rpc-fault-proxy.ts";

let rig: Rig | undefined;
let proxy: RpcFaultProxy | undefined;
afterEach(() => stopRig(rig, proxy).finally(() => (rig = proxy = undefined)));

/** Calls that would be a simulation or a quote on the settlement's path (the background fee reads are not). */
const onPath = (calls: Record<string, number>) => (calls.eth_estimateGas ?? 0) + (calls.eth_call ?? 0);

async function nextBlock(url: string): Promise<void> {
  const client = publicClient(url);
  const start = await client.getBlockNumber({ cacheTime: 0 });
  while ((await client.getBlockNumber({ cacheTime: 0 })) === start) await new Promise((r) => setTimeout(r, 50));
}

describe("settlement's critical path", () => {
  it("block schedule kept: verified at the provable head, the settlement is one eth_sendRawTransactionSync; after a new block it is simulated again", async () => {
    rig = await startRig({ blockTime: 2 });
    proxy = await startRpcFaultProxy({ upstream: rig.anvil.rpcUrl });
    const f = await rig.facilitator({ rpcUrls: [proxy.url], policy: { sendRawTransactionSync: true, minBlockIntervalMs: 2000 } });
    const warm = await rig.payment(1n);
    await postJson(`${f.url}/verify`, warm);
    expect((await postJson(`${f.url}/settle`, warm)).json).toMatchObject({ success: true });

    // Right after a block (seen by the facilitator's background read), verify then settle.
    const reused: Record<string, number>[] = [];
    let paid = 1n;
    for (let attempt = 0; attempt < 5 && reused.length === 0; attempt++) {
      await nextBlock(rig.anvil.rpcUrl);
      await new Promise((r) => setTimeout(r, 600));
      const body = await rig.payment(100n);
      expect((await postJson(`${f.url}/verify`, body)).json).toMatchObject({ isValid: true });
      let answer: Record<string, unknown> = {};
      const calls = await callsDuring(proxy, async () => (answer = (await postJson(`${f.url}/settle`, body)).json));
      expect(answer, JSON.stringify(answer)).toMatchObject({ success: true });
      paid += 100n;
      expect((await publicClient(rig.anvil.rpcUrl).getTransactionReceipt({ hash: answer.transaction as Hex })).status).toBe("success");
      if (onPath(calls) === 0) reused.push(calls);
    }
    expect(reused.length, "no settlement reused its verification within 5 blocks").toBe(1);
    expect(reused[0]!.eth_sendRawTransactionSync).toBe(1);
    expect(reused[0]!.eth_sendRawTransaction ?? 0).toBe(0);

    // The head moved between verify and settle: the settlement is simulated again.
    const body = await rig.payment(7n);
    expect((await postJson(`${f.url}/verify`, body)).json).toMatchObject({ isValid: true });
    await nextBlock(rig.anvil.rpcUrl);
    let answer: Record<string, unknown> = {};
    const calls = await callsDuring(proxy, async () => (answer = (await postJson(`${f.url}/settle`, body)).json));
    expect(answer).toMatchObject({ success: true });
    expect(calls.eth_estimateGas).toBe(1);
    expect(await balanceOf(rig.anvil.rpcUrl, rig.usdc.address, rig.receiver)).toBe(paid + 7n);
  });

  it("no schedule (anvil mining on demand): every settlement is simulated again, even right after its verification", async () => {
    rig = await startRig();
    proxy = await startRpcFaultProxy({ upstream: rig.anvil.rpcUrl });
    const f = await rig.facilitator({ rpcUrls: [proxy.url], policy: { sendRawTransactionSync: true } });
    for (const amount of [5n, 6n, 7n]) {
      const body = await rig.payment(amount);
      expect((await postJson(`${f.url}/verify`, body)).json).toMatchObject({ isValid: true });
      const calls = await callsDuring(proxy, () => postJson(`${f.url}/settle`, body));
      expect(calls.eth_estimateGas).toBe(1);
    }
    expect(await balanceOf(rig.anvil.rpcUrl, rig.usdc.address, rig.receiver)).toBe(18n);
  });
});
