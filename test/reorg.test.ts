// Reorgs: a mined settlement stays watched until it is `confirmations` deep; when its block leaves
// the canonical chain (anvil_reorg), the reconciler re-sends the very bytes that were mined (same
// hash, same nonce), counts it and the payee ends up paid; the key's next settlement works.
import { afterEach, describe, expect, it } from "vitest";
import type { Address, Hex } from "viem";
import { ENGINES, startRig, type Rig } from "./helpers/settlement-rig.ts";
import { balanceOf } from "./helpers/chain.ts";
import { postJson } from "./helpers/payments.ts";
import { eventually, metricSum, nonceOf, publicClient, rpc } from "./helpers/onchain.ts";

let rig: Rig | undefined;
afterEach(async () => {
  await rig?.stop();
  rig = undefined;
});

describe.each(ENGINES)("reorgs (%s store)", (engine) => {
  it("a settlement whose block is reorged out is re-broadcast as signed and mined again", async () => {
    rig = await startRig({ engine });
    const f = await rig.facilitator();
    const signer = f.signers[0] as Address;
    const client = publicClient(rig.anvil.rpcUrl);
    const answer = (await postJson(`${f.url}/settle`, await rig.payment(500n))).json;
    expect(answer).toMatchObject({ success: true });
    const hash = answer.transaction as Hex;
    const mined = await client.getTransactionReceipt({ hash });
    const raw = await client.getTransaction({ hash });
    expect(await balanceOf(rig.anvil.rpcUrl, rig.usdc.address, rig.receiver)).toBe(500n);

    // Replace the settlement's block with an empty one: the transfer is gone from the chain.
    await rpc(rig.anvil.rpcUrl, "anvil_reorg", [1, []]);
    await expect(client.getTransactionReceipt({ hash })).rejects.toThrow();
    expect(await balanceOf(rig.anvil.rpcUrl, rig.usdc.address, rig.receiver)).toBe(0n);

    const again = await eventually(() => client.getTransactionReceipt({ hash }).catch(() => undefined), 100, 200);
    expect(again.status).toBe("success");
    expect(again.blockHash).not.toBe(mined.blockHash);
    const resent = await client.getTransaction({ hash });
    expect(resent.nonce).toBe(raw.nonce);
    expect(resent.from).toBe(raw.from);
    expect(await balanceOf(rig.anvil.rpcUrl, rig.usdc.address, rig.receiver)).toBe(500n);
    expect(await metricSum(f.adminUrl, "x402_settlement_reorged_total")).toBe(1);
    // The recorded answer still names the transaction on chain.
    const retry = (await postJson(`${f.url}/settle`, { ...(await rig.payment(1n)), ...{} })).json;
    expect(retry).toMatchObject({ success: true });
    expect((await client.getTransaction({ hash: retry.transaction as Hex })).nonce).toBe(raw.nonce + 1);
    expect(await nonceOf(rig.anvil.rpcUrl, signer)).toBe(raw.nonce + 2);
    expect(await balanceOf(rig.anvil.rpcUrl, rig.usdc.address, rig.receiver)).toBe(501n);
  });
});
