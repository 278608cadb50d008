// A transaction the node holds but never executes: taken into its pool while the node saw a gap
// before it, and never promoted once the gap closed (anvil does this under concurrent sends; it
// left a key's whole backlog unmined in the bench). Re-sending the same bytes changes nothing
// ("already known"); the reconciler replaces it, within the fee cap as it stood when signed, even
// after the base fee fell below what that cap now allows. Judged on chain.
import type { Address, Hex } from "viem";
import { afterEach, describe, expect, it } from "vitest";
import { stopRig, ENGINES, startRig, type Rig } from "./helpers/settlement-rig.ts";
import { postJson } from "./helpers/payments.ts";
import { balanceOf } from "./helpers/chain.ts";
import { eventually, nonceOf, publicClient, rpc } from "./helpers/onchain.ts";
import { startRpcFaultProxy, type RpcFaultProxy } from "./helpers/rpc-fault-proxy.ts";
import { HELD_WAIT_MS } from "../services/facilitator/settlement/reconciler.ts";

let rig: Rig | undefined;
let proxy: RpcFaultProxy | undefined;
afterEach(() => stopRig(rig, proxy).finally(() => (rig = proxy = undefined)));

/**
 * One settlement mined, then the node loses track of the key (it sees nonce 0 as next), so the
 * next settlement's transaction (nonce 1) goes to its queue; then the gap closes, and the node
 * holds that transaction without ever executing it. The fee schedule alone would replace it
 * after an hour: only the held check can unstick it.
 */
async function heldSettlement(r: Rig) {
  const f = await r.facilitator({ receiptTimeoutMs: 1000, replaceAfterMs: 3_600_000, policy: { sendRawTransactionSync: false } });
  const signer = f.signers[0] as Address;
  expect((await postJson(`${f.url}/settle`, await r.payment(100n))).json).toMatchObject({ success: true });
  await rpc(r.anvil.rpcUrl, "anvil_setNonce", [signer, "0x0"]);
  const body = await r.payment(200n);
  const first = (await postJson(`${f.url}/settle`, body)).json;
  expect(first).toMatchObject({ success: false, errorReason: "settlement_pending" });
  await rpc(r.anvil.rpcUrl, "anvil_setNonce", [signer, "0x1"]);
  return { f, signer, body, held: first.transaction as Hex };
}

describe.each(ENGINES)("a transaction the node holds without executing it (%s store)", (engine) => {
  it("is replaced and mined, and the key's later settlements follow it", async () => {
    rig = await startRig({ engine });
    const url = rig.anvil.rpcUrl;
    const { f, signer, body, held } = await heldSettlement(rig);
    // Blocks go by (the base fee falls well below what the transaction was priced at), and the
    // node still holds it unexecuted.
    const baseFeeBefore = (await publicClient(url).getBlock()).baseFeePerGas!;
    await rig.test.mine({ blocks: 30 });
    expect((await publicClient(url).getBlock()).baseFeePerGas! * 10n).toBeLessThan(baseFeeBefore);
    expect(await rpc<{ queued: Hex }>(url, "txpool_status")).toMatchObject({ queued: "0x1" });
    expect((await publicClient(url).getTransaction({ hash: held })).blockNumber).toBeNull();
    expect(await nonceOf(url, signer, "pending")).toBe(1);

    // Blocks keep coming (other keys' traffic): the replacement comes once the transaction has
    // looked held for a few of them.
    await eventually(async () => {
      await rig!.test.mine({ blocks: 1 });
      return (await balanceOf(url, rig!.usdc.address, rig!.receiver)) === 300n ? true : undefined;
    }, 40, 500);
    const settled = (await postJson(`${f.url}/settle`, body)).json;
    expect(settled).toMatchObject({ success: true });
    // A replacement of the held transaction carried the payment: same nonce, another hash, mined.
    const hash = settled.transaction as Hex;
    expect(hash).not.toBe(held);
    expect((await publicClient(url).getTransactionReceipt({ hash })).status).toBe("success");
    expect((await publicClient(url).getTransaction({ hash })).nonce).toBe(1);
    expect(await balanceOf(url, rig.usdc.address, rig.receiver)).toBe(300n);
    expect(await nonceOf(url, signer)).toBe(2);
    // The key goes on at the next nonce.
    const next = (await postJson(`${f.url}/settle`, await rig.payment(1n))).json;
    expect(next).toMatchObject({ success: true });
    expect((await publicClient(url).getTransaction({ hash: next.transaction as Hex })).nonce).toBe(2);
    expect(await balanceOf(url, rig.usdc.address, rig.receiver)).toBe(301n);
  });

  it("a healthy one, behind a provider whose pending nonce counts only mined transactions, is left alone until blocks pass without it", async () => {
    rig = await startRig({ engine });
    proxy = await startRpcFaultProxy({ upstream: rig.anvil.rpcUrl });
    proxy.configure({ pendingAsLatest: true });
    const f = await rig.facilitator({ rpcUrls: [proxy.url], receiptTimeoutMs: 1000, replaceAfterMs: 3_600_000, policy: { sendRawTransactionSync: false } });
    // In the pool and executable, but no block comes for a while: to this provider it looks held.
    await rig.test.setAutomine(false);
    const body = await rig.payment(50n);
    const first = (await postJson(`${f.url}/settle`, body)).json;
    expect(first).toMatchObject({ success: false, errorReason: "settlement_pending" });
    const sent = first.transaction as Hex;
    // Past the 5 s an attempt, passes look at it, with no block: nothing is replaced.
    await new Promise((r) => setTimeout(r, 6000));
    for (let i = 0; i < 3; i++) await f.reconciler.pass();
    expect(await rpc<{ pending: Hex }>(rig.anvil.rpcUrl, "txpool_status")).toMatchObject({ pending: "0x1" });
    await rig.test.mine({ blocks: 1 });
    await rig.test.setAutomine(true);
    const settled = await eventually(async () => {
      const answer = (await postJson(`${f.url}/settle`, body)).json;
      return answer.success === true ? answer : undefined;
    }, 20, 200);
    // The very transaction sent first was mined: no replacement was signed.
    expect(settled.transaction).toBe(sent);
    expect((await publicClient(rig.anvil.rpcUrl).getTransactionReceipt({ hash: sent })).status).toBe("success");
    expect(await balanceOf(rig.anvil.rpcUrl, rig.usdc.address, rig.receiver)).toBe(50n);
    expect(await nonceOf(rig.anvil.rpcUrl, f.signers[0] as Address)).toBe(1);
  });
});

describe("a transaction the node holds without executing it, where the node counts its pool", () => {
  it("is replaced at once: no block, no wait", async () => {
    rig = await startRig();
    const url = rig.anvil.rpcUrl;
    const f = await rig.facilitator({ receiptTimeoutMs: 1000, replaceAfterMs: 3_600_000, policy: { sendRawTransactionSync: false } });
    const signer = f.signers[0] as Address;
    expect((await postJson(`${f.url}/settle`, await rig.payment(100n))).json).toMatchObject({ success: true });
    // Mining paused: the next settlement waits in the pool, ready, and the node's pending nonce
    // counts it (2, one mined): a pass sees the node count its pool.
    await rig.test.setAutomine(false);
    expect((await postJson(`${f.url}/settle`, await rig.payment(200n))).json).toMatchObject({ success: false, errorReason: "settlement_pending" });
    expect(await nonceOf(url, signer, "pending")).toBe(2);
    await f.reconciler.pass();
    await rig.test.mine({ blocks: 1 });
    expect(await nonceOf(url, signer)).toBe(2);
    // The node loses track of the key while the next settlement's transaction (nonce 2) comes in:
    // queued behind a gap that then closes without promoting it.
    await rpc(url, "anvil_setNonce", [signer, "0x1"]);
    const body = await rig.payment(300n);
    const first = (await postJson(`${f.url}/settle`, body)).json;
    expect(first).toMatchObject({ success: false, errorReason: "settlement_pending" });
    const held = first.transaction as Hex;
    await rpc(url, "anvil_setNonce", [signer, "0x2"]);
    expect(await rpc<{ pending: Hex; queued: Hex }>(url, "txpool_status")).toEqual({ pending: "0x0", queued: "0x1" });
    const head = await publicClient(url).getBlockNumber();
    // No block comes: within a few passes (HELD_WAIT_MS is 20 s) a replacement is in the pool, ready.
    await eventually(async () => ((await rpc<{ pending: Hex }>(url, "txpool_status")).pending === "0x1" ? true : undefined), 12, 500);
    expect(await publicClient(url).getBlockNumber()).toBe(head);
    await rig.test.mine({ blocks: 1 });
    const settled = await eventually(async () => {
      const answer = (await postJson(`${f.url}/settle`, body)).json;
      return answer.success === true ? answer : undefined;
    }, 20, 200);
    expect(settled.transaction).not.toBe(held);
    expect((await publicClient(url).getTransaction({ hash: settled.transaction as Hex })).nonce).toBe(2);
    expect(await balanceOf(url, rig.usdc.address, rig.receiver)).toBe(600n);
    expect(await nonceOf(url, signer)).toBe(3);
  });
});

describe("a transaction the node holds without executing it, on a chain that mines on demand", () => {
  it("is replaced after HELD_WAIT_MS where no block comes at all", async () => {
    rig = await startRig();
    const url = rig.anvil.rpcUrl;
    const { f, signer, body, held } = await heldSettlement(rig);
    const head = await publicClient(url).getBlockNumber();
    // No traffic, no block: only the wait can tell it is held.
    await eventually(async () => ((await balanceOf(url, rig!.usdc.address, rig!.receiver)) === 300n ? true : undefined), Math.ceil((HELD_WAIT_MS + 15_000) / 500), 500);
    const settled = (await postJson(`${f.url}/settle`, body)).json;
    expect(settled).toMatchObject({ success: true });
    expect(settled.transaction).not.toBe(held);
    // The replacement's own block is the only one since.
    expect(await publicClient(url).getBlockNumber()).toBe(head + 1n);
    expect(await nonceOf(url, signer)).toBe(2);
  }, HELD_WAIT_MS + 40_000);
});
