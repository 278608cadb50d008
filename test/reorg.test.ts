// Reorgs: a mined settlement stays watched until it is `confirmations` deep; when its block leaves
// the canonical chain (anvil_reorg), the reconciler re-sends the very bytes that were mined (same
// hash, same nonce), counts it and the payee ends up paid; the key's next settlement works.
import { afterEach, describe, expect, it } from "vitest";
import { encodeFunctionData, erc20Abi, parseGwei, type Address, type Hex } from "viem";
import { generatePrivateKey, privateKeyToAccount } from "viem/accounts";
import { stopRig, ENGINES, startRig, type Rig } from "./helpers/settlement-rig.ts";
import { balanceOf } from "./helpers/chain.ts";
import { postJson } from "./helpers/payments.ts";
import { eventually, metricSum, nonceOf, publicClient, rpc } from "./helpers/onchain.ts";
import { callsDuring, startRpcFaultProxy, type RpcFaultProxy } from "./helpers/rpc-fault-proxy.ts";

let rig: Rig | undefined;
let proxy: RpcFaultProxy | undefined;
afterEach(() => stopRig(rig, proxy).finally(() => (rig = proxy = undefined)));

describe.each(ENGINES)("reorgs (%s store)", (engine) => {
  it("settlements mined in one block are watched through that block: no receipt lookup per transaction, and all sent again when it leaves the chain", async () => {
    rig = await startRig({ engine });
    proxy = await startRpcFaultProxy({ upstream: rig.anvil.rpcUrl });
    const f = await rig.facilitator({ rpcUrls: [proxy.url] });
    const bodies = await Promise.all([1n, 2n, 3n, 4n].map((a) => rig!.payment(a)));
    await rig.test.setAutomine(false);
    const answers = Promise.all(bodies.map(async (b) => (await postJson(`${f.url}/settle`, b)).json));
    await eventually(async () => ((await rig!.test.getTxpoolStatus()).pending === bodies.length ? true : undefined), 400, 50);
    await rig.test.mine({ blocks: 1 });
    await rig.test.setAutomine(true);
    const hashes = (await answers).map((a) => a.transaction as Hex);
    const blocks = new Set(await Promise.all(hashes.map(async (hash) => (await publicClient(rig!.anvil.rpcUrl).getTransactionReceipt({ hash })).blockNumber)));
    expect(blocks.size).toBe(1);
    // Four watched transactions, one block: passes read the block, never the four receipts.
    const calls = await callsDuring(proxy, async () => {
      await f.reconciler.pass();
      await f.reconciler.pass();
    });
    expect(calls.eth_getTransactionReceipt ?? 0).toBe(0);
    expect(calls.eth_getBlockByNumber).toBeGreaterThanOrEqual(1);

    // That block leaves the chain: its four transactions are found out through it and sent again.
    await rpc(rig.anvil.rpcUrl, "anvil_reorg", [1, []]);
    expect(await balanceOf(rig.anvil.rpcUrl, rig.usdc.address, rig.receiver)).toBe(0n);
    for (const hash of hashes) expect((await eventually(() => publicClient(rig!.anvil.rpcUrl).getTransactionReceipt({ hash }).catch(() => undefined), 100, 200)).status).toBe("success");
    expect(await balanceOf(rig.anvil.rpcUrl, rig.usdc.address, rig.receiver)).toBe(10n);
    expect(await metricSum(f.adminUrl, "x402_settlement_reorged_total")).toBe(4);
  });


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
    // Mined twice, paid once on the canonical chain: gas is counted at the first mining only.
    expect(await metricSum(f.adminUrl, "x402_settlement_gas_spent_wei")).toBe(Number(mined.gasUsed * mined.effectiveGasPrice));
    // The recorded answer still names the transaction on chain.
    const retry = (await postJson(`${f.url}/settle`, { ...(await rig.payment(1n)), ...{} })).json;
    expect(retry).toMatchObject({ success: true });
    expect((await client.getTransaction({ hash: retry.transaction as Hex })).nonce).toBe(raw.nonce + 1);
    expect(await nonceOf(rig.anvil.rpcUrl, signer)).toBe(raw.nonce + 2);
    expect(await balanceOf(rig.anvil.rpcUrl, rig.usdc.address, rig.receiver)).toBe(501n);
  });

  it("once a reorg took its transaction off the chain, a retry is never told the stale success: pending while it is sent again, then the re-mined outcome", async () => {
    rig = await startRig({ engine });
    const f = await rig.facilitator({ receiptTimeoutMs: 500 });
    const client = publicClient(rig.anvil.rpcUrl);
    const body = await rig.payment(600n);
    // A careful client: on a loaded machine the 500 ms receipt bound may answer pending first.
    let answer = (await postJson(`${f.url}/settle`, body)).json;
    for (let i = 0; i < 50 && answer.errorReason === "settlement_pending"; i++) answer = (await postJson(`${f.url}/settle`, body)).json;
    expect(answer).toMatchObject({ success: true });
    const hash = answer.transaction as Hex;
    expect(await balanceOf(rig.anvil.rpcUrl, rig.usdc.address, rig.receiver)).toBe(600n);

    // The block leaves the chain and nothing is mined: the reconciler finds out and sends the bytes again.
    await rig.test.setAutomine(false);
    await rpc(rig.anvil.rpcUrl, "anvil_reorg", [1, []]);
    await f.reconciler.pass();
    await expect(client.getTransactionReceipt({ hash })).rejects.toThrow();
    expect(await balanceOf(rig.anvil.rpcUrl, rig.usdc.address, rig.receiver)).toBe(0n);
    // The payee holds nothing on the canonical chain: the retry is pending on the same transaction, not the old success.
    const retry = (await postJson(`${f.url}/settle`, body)).json;
    expect(retry).toMatchObject({ success: false, errorReason: "settlement_pending", transaction: hash });
    expect(await balanceOf(rig.anvil.rpcUrl, rig.usdc.address, rig.receiver)).toBe(0n);

    // Mined again: the retry answers the chain's outcome, the same transaction, the payee paid once.
    await rig.test.mine({ blocks: 1 });
    await rig.test.setAutomine(true);
    expect((await client.getTransactionReceipt({ hash })).status).toBe("success");
    let settled = (await postJson(`${f.url}/settle`, body)).json;
    for (let i = 0; i < 50 && settled.errorReason === "settlement_pending"; i++) settled = (await postJson(`${f.url}/settle`, body)).json;
    expect(settled).toMatchObject({ success: true, transaction: hash });
    expect(await balanceOf(rig.anvil.rpcUrl, rig.usdc.address, rig.receiver)).toBe(600n);
    expect(await metricSum(f.adminUrl, "x402_settlement_reversed_total")).toBe(0);
  });

  it("a success whose transaction, mined again after a reorg, reverts is corrected to a failure; gas is counted once", async () => {
    rig = await startRig({ engine });
    const f = await rig.facilitator();
    const client = publicClient(rig.anvil.rpcUrl);
    const body = await rig.payment(700n);
    const answer = (await postJson(`${f.url}/settle`, body)).json;
    expect(answer).toMatchObject({ success: true });
    const hash = answer.transaction as Hex;
    const mined = await client.getTransactionReceipt({ hash });
    expect(await metricSum(f.adminUrl, "x402_settlement_gas_spent_wei")).toBe(Number(mined.gasUsed * mined.effectiveGasPrice));

    // The new chain has the payer spend its whole balance first: the very same settlement bytes,
    // sent again by the reconciler, revert there. The payee was paid on the old chain only.
    const payer = privateKeyToAccount(rig.payerKey);
    // Its balance on the new chain, where the 700 never left it.
    const balance = (await balanceOf(rig.anvil.rpcUrl, rig.usdc.address, payer.address)) + 700n;
    await rpc(rig.anvil.rpcUrl, "anvil_setBalance", [payer.address, "0xde0b6b3a7640000"]);
    const drain = await payer.signTransaction({
      chainId: rig.chainId,
      type: "eip1559",
      nonce: await client.getTransactionCount({ address: payer.address }),
      to: rig.usdc.address,
      data: encodeFunctionData({ abi: erc20Abi, functionName: "transfer", args: [privateKeyToAccount(generatePrivateKey()).address, balance] }),
      gas: 100_000n,
      maxFeePerGas: parseGwei("500"),
      maxPriorityFeePerGas: parseGwei("1"),
    });
    await rpc(rig.anvil.rpcUrl, "anvil_reorg", [1, [[drain, 0]]]);
    expect(await balanceOf(rig.anvil.rpcUrl, rig.usdc.address, payer.address)).toBe(0n);

    const again = await eventually(() => client.getTransactionReceipt({ hash }).catch(() => undefined), 100, 200);
    expect(again.status).toBe("reverted");
    expect(await balanceOf(rig.anvil.rpcUrl, rig.usdc.address, rig.receiver)).toBe(0n);
    // The record follows the canonical chain: the same payment asked again is a failure now.
    const retry = await eventually(async () => {
      const r = (await postJson(`${f.url}/settle`, body)).json;
      return r.success === false ? r : undefined;
    }, 50, 200);
    expect(retry).toMatchObject({ success: false, transaction: hash });
    expect(await metricSum(f.adminUrl, "x402_settlement_reversed_total")).toBe(1);
    // The bytes mined twice are one payment of gas on the canonical chain, counted once.
    expect(await metricSum(f.adminUrl, "x402_settlement_gas_spent_wei")).toBe(Number(mined.gasUsed * mined.effectiveGasPrice));
  });
});
