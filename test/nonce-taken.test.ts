// A re-send the node refuses with "nonce too low" is ambiguous: the nonce may be taken by our own
// attempt, mined where the node answering receipt lookups cannot see it yet (replicas behind a load
// balancer), or by a transaction of the key sent outside the fleet. The reconciler gives the
// transaction up only after the chain has moved on without a receipt of ours; judged on chain.
import { afterEach, describe, expect, it } from "vitest";
import type { Address, Hex } from "viem";
import { stopRig, ENGINES, startRig, type Rig } from "./helpers/settlement-rig.ts";
import { balanceOf } from "./helpers/chain.ts";
import { postJson } from "./helpers/payments.ts";
import { nonceOf, publicClient, rpc, sendFrom } from "./helpers/onchain.ts";
import { startRpcFaultProxy, type RpcFaultProxy } from "./helpers/rpc-fault-proxy.ts";
import { NONCE_TAKEN_GRACE_BLOCKS } from "../services/facilitator/settlement/reconciler.ts";

let rig: Rig | undefined;
let proxy: RpcFaultProxy | undefined;
afterEach(() => stopRig(rig, proxy).finally(() => (rig = proxy = undefined)));

describe.each(ENGINES)("a nonce the node calls used (%s store)", (engine) => {
  it("our own transaction, mined but invisible to receipt lookups, is not given up: recorded as the success it is", async () => {
    rig = await startRig({ engine });
    proxy = await startRpcFaultProxy({ upstream: rig.anvil.rpcUrl });
    const f = await rig.facilitator({ rpcUrls: [proxy.url], receiptTimeoutMs: 1000 });
    // The lagging replica: it refuses nothing, it just does not know our transaction yet.
    proxy.configure({ schedule: { eth_getTransactionReceipt: ["rpc_error"], eth_getTransactionByHash: ["rpc_error"] } });
    const body = await rig.payment(300n);
    const first = (await postJson(`${f.url}/settle`, body)).json;
    expect(first).toMatchObject({ success: false, errorReason: "settlement_pending" });
    const hash = first.transaction as Hex;
    expect((await publicClient(rig.anvil.rpcUrl).getTransactionReceipt({ hash })).status).toBe("success");
    expect(await balanceOf(rig.anvil.rpcUrl, rig.usdc.address, rig.receiver)).toBe(300n);

    // Each pass re-sends (the node "forgot" it) and hears "nonce too low".
    for (let i = 0; i < 3; i++) await f.reconciler.pass();
    expect((await postJson(`${f.url}/settle`, body)).json).toMatchObject({ success: false, errorReason: "settlement_pending", transaction: hash });

    proxy.configure({});
    await f.reconciler.pass();
    expect((await postJson(`${f.url}/settle`, body)).json).toMatchObject({ success: true, transaction: hash });
    // The nonce stays ours: the key's next settlement takes the following one.
    const next = (await postJson(`${f.url}/settle`, await rig.payment(1n))).json;
    expect(next).toMatchObject({ success: true });
    const sent = await publicClient(rig.anvil.rpcUrl).getTransaction({ hash: next.transaction as Hex });
    const ours = await publicClient(rig.anvil.rpcUrl).getTransaction({ hash });
    expect(sent.nonce).toBe(ours.nonce + 1);
  });

  it("a nonce taken outside the fleet is given up once the chain moves on: the payment fails, nothing moved", async () => {
    rig = await startRig({ engine });
    const f = await rig.facilitator({ receiptTimeoutMs: 1000 });
    const signer = f.signers[0] as Address;
    await rig.test.setAutomine(false);
    const body = await rig.payment(400n);
    const first = (await postJson(`${f.url}/settle`, body)).json;
    expect(first).toMatchObject({ success: false, errorReason: "settlement_pending" });
    const hash = first.transaction as Hex;
    const nonce = (await publicClient(rig.anvil.rpcUrl).getTransaction({ hash })).nonce;
    // The pool forgets ours; the key itself spends the nonce outside the fleet.
    await rpc(rig.anvil.rpcUrl, "anvil_dropTransaction", [hash]);
    await sendFrom(rig.anvil.rpcUrl, rig.chainId, rig.signerKeys[0]!, { to: signer, nonce });
    await rig.test.mine({ blocks: 1 });
    await rig.test.setAutomine(true);

    await f.reconciler.pass(); // first sighting: waits
    await f.reconciler.pass();
    expect((await postJson(`${f.url}/settle`, body)).json).toMatchObject({ errorReason: "settlement_pending" });

    await rig.test.mine({ blocks: Number(NONCE_TAKEN_GRACE_BLOCKS) + 2 });
    await f.reconciler.pass();
    const final = (await postJson(`${f.url}/settle`, body)).json;
    expect(final).toMatchObject({ success: false, errorReason: "invalid_transaction_state" });
    expect(await balanceOf(rig.anvil.rpcUrl, rig.usdc.address, rig.receiver)).toBe(0n);
    // The allocator moved past the foreign nonce: the next settlement is mined.
    const next = (await postJson(`${f.url}/settle`, await rig.payment(5n))).json;
    expect(next).toMatchObject({ success: true });
    expect(await nonceOf(rig.anvil.rpcUrl, signer)).toBe(nonce + 2);
  });
});
