// A signer key never wedges, and nothing is signed above its gas ceiling or fee cap: every kind of
// broadcast a node refuses for good is provoked on a real anvil node, and afterwards a settlement
// from the same key succeeds with the nonce the refused transaction held (reused) or the next one,
// judged by receipts and the key's transaction count on chain.
import { afterEach, describe, expect, it } from "vitest";
import { parseGwei, type Address, type Hex } from "viem";
import { ENGINES, startRig, type Rig } from "./helpers/settlement-rig.ts";
import { balanceOf } from "./helpers/chain.ts";
import { postJson } from "./helpers/payments.ts";
import { eventually, metricSum, nonceOf, publicClient, rpc, sendFrom } from "./helpers/onchain.ts";
import type { RunningFacilitator } from "../services/facilitator/service.ts";

let rig: Rig | undefined;
afterEach(async () => {
  await rig?.stop();
  rig = undefined;
});

const rejected = (f: RunningFacilitator, reason: string) => metricSum(f.adminUrl, "x402_settlement_broadcast_rejected_total", { reason });

/** A settlement that must succeed from `signer` with exactly `nonce`, judged on chain. */
async function settlesWithNonce(r: Rig, f: RunningFacilitator, signer: Address, nonce: number, amount = 10n) {
  const before = await balanceOf(r.anvil.rpcUrl, r.usdc.address, r.receiver);
  const answer = (await postJson(`${f.url}/settle`, await r.payment(amount))).json;
  expect(answer).toMatchObject({ success: true });
  const client = publicClient(r.anvil.rpcUrl);
  const hash = answer.transaction as Hex;
  expect((await client.getTransactionReceipt({ hash })).status).toBe("success");
  const tx = await client.getTransaction({ hash });
  expect(tx.from.toLowerCase()).toBe(signer.toLowerCase());
  expect(tx.nonce).toBe(nonce);
  expect(await nonceOf(r.anvil.rpcUrl, signer)).toBe(nonce + 1);
  expect(await balanceOf(r.anvil.rpcUrl, r.usdc.address, r.receiver)).toBe(before + amount);
}

describe.each(ENGINES)("refused broadcasts never wedge a key (%s store)", (engine) => {
  it("intrinsic gas too low: refused, classified, its nonce goes to the next settlement", async () => {
    rig = await startRig({ engine });
    const f = await rig.facilitator();
    const signer = f.signers[0] as Address;
    await settlesWithNonce(rig, f, signer, 0);
    await expect(f.outbox.sendTransaction({ to: rig.receiver, data: "0x", gas: 20_000n })).rejects.toThrow(/intrinsic_gas_too_low/);
    expect(await rejected(f, "intrinsic_gas_too_low")).toBe(1);
    expect(await nonceOf(rig.anvil.rpcUrl, signer, "pending")).toBe(1); // nothing entered the pool
    await settlesWithNonce(rig, f, signer, 1);
  });

  it("exceeds the block gas limit: refused, classified, the key goes on", async () => {
    rig = await startRig({ engine });
    const f = await rig.facilitator({ gasCeilings: "other=100000000" }); // lets the node, not the ceiling, refuse it
    const signer = f.signers[0] as Address;
    await expect(f.outbox.sendTransaction({ to: rig.receiver, data: "0x", gas: 40_000_000n })).rejects.toThrow(/exceeds_block_gas_limit/);
    expect(await rejected(f, "exceeds_block_gas_limit")).toBe(1);
    await settlesWithNonce(rig, f, signer, 0);
  });

  it("fee below the block's base fee (underpriced): the settlement fails cleanly, the nonce is reused", async () => {
    rig = await startRig({ engine });
    const f = await rig.facilitator({ maxFeePerGasWei: parseGwei("2").toString() });
    const signer = f.signers[0] as Address;
    await settlesWithNonce(rig, f, signer, 0);
    await rig.test.setNextBlockBaseFeePerGas({ baseFeePerGas: parseGwei("100") });
    await rig.test.mine({ blocks: 1 });
    await new Promise((r) => setTimeout(r, 1100)); // the signer's fee estimate is cached for one second
    const refused = (await postJson(`${f.url}/settle`, await rig.payment(10n))).json;
    expect(refused).toMatchObject({ success: false, errorReason: "invalid_exact_evm_transaction_failed", transaction: "" });
    expect(String(refused.errorMessage)).toMatch(/underpriced/);
    expect(await rejected(f, "underpriced")).toBe(1);
    expect(await nonceOf(rig.anvil.rpcUrl, signer, "pending")).toBe(1);
    await rig.test.setNextBlockBaseFeePerGas({ baseFeePerGas: parseGwei("1") });
    await rig.test.mine({ blocks: 1 });
    await new Promise((r) => setTimeout(r, 1100));
    await settlesWithNonce(rig, f, signer, 1);
  });

  it("nonce too low (the key was used outside the fleet): skips forward and settles", async () => {
    rig = await startRig({ engine });
    const f = await rig.facilitator();
    const signer = f.signers[0] as Address;
    await settlesWithNonce(rig, f, signer, 0);
    await publicClient(rig.anvil.rpcUrl).waitForTransactionReceipt({ hash: await sendFrom(rig.anvil.rpcUrl, rig.chainId, rig.signerKeys[0]!, { to: rig.receiver }), pollingInterval: 50 });
    await settlesWithNonce(rig, f, signer, 2);
    expect(await rejected(f, "nonce_too_low")).toBe(1);
  });

  it("replacement underpriced (another transaction of the key holds the nonce in the pool): takes the next nonce", async () => {
    rig = await startRig({ engine });
    const f = await rig.facilitator();
    const signer = f.signers[0] as Address;
    await settlesWithNonce(rig, f, signer, 0);
    await rig.test.setAutomine(false);
    await sendFrom(rig.anvil.rpcUrl, rig.chainId, rig.signerKeys[0]!, { to: rig.receiver, nonce: 1, tip: parseGwei("50"), maxFee: parseGwei("500") });
    const answer = postJson(`${f.url}/settle`, await rig.payment(10n));
    await eventually(async () => ((await nonceOf(rig!.anvil.rpcUrl, signer, "pending")) === 3 ? true : undefined));
    await rig.test.mine({ blocks: 1 });
    await rig.test.setAutomine(true);
    const json = (await answer).json;
    expect(json).toMatchObject({ success: true });
    const tx = await publicClient(rig.anvil.rpcUrl).getTransaction({ hash: json.transaction as Hex });
    expect(tx.nonce).toBe(2);
    expect(await rejected(f, "replacement_underpriced")).toBe(1);
    await settlesWithNonce(rig, f, signer, 3);
  });

  it("insufficient funds: refused, the key leaves rotation and /readyz says so; funded again, the nonce is reused", async () => {
    rig = await startRig({ engine });
    const f = await rig.facilitator({ balanceRefreshMs: 600_000 }); // the balance read stays stale: the node is the one to refuse
    const signer = f.signers[0] as Address;
    await eventually(async () => ((await fetch(`${f.adminUrl}/readyz`)).status === 200 ? true : undefined));
    await rig.test.setBalance({ address: signer, value: 10n ** 12n });
    const refused = (await postJson(`${f.url}/settle`, await rig.payment(10n))).json;
    expect(refused).toMatchObject({ success: false, transaction: "" });
    expect(await rejected(f, "insufficient_funds")).toBe(1);
    expect(await nonceOf(rig.anvil.rpcUrl, signer, "pending")).toBe(0);
    const ready = await fetch(`${f.adminUrl}/readyz`);
    expect(ready.status).toBe(503);
    expect(((await ready.json()) as { checks: Record<string, boolean> }).checks.signer_funded).toBe(false);
    const skipped = (await postJson(`${f.url}/settle`, await rig.payment(10n))).json;
    expect(skipped).toMatchObject({ success: false });
    expect(String(skipped.errorMessage)).toMatch(/no signer key/);
    expect(await rejected(f, "insufficient_funds")).toBe(1); // not even tried: the key was out of rotation
    await rig.test.setBalance({ address: signer, value: 10n ** 21n });
    await eventually(async () => ((await fetch(`${f.adminUrl}/readyz`)).status === 200 ? true : undefined));
    await settlesWithNonce(rig, f, signer, 0);
  });
});

describe("gas ceilings and fee caps", () => {
  it("a key too poor for its next transaction is out of rotation before anything fails: nothing is sent", async () => {
    rig = await startRig();
    const signer = (await import("viem/accounts")).privateKeyToAccount(rig.signerKeys[0]!).address;
    await rig.test.setBalance({ address: signer, value: 10n ** 12n }); // below the derived minimum (largest ceiling x fee cap)
    const f = await rig.facilitator();
    const ready = await fetch(`${f.adminUrl}/readyz`);
    expect(ready.status).toBe(503);
    expect(((await ready.json()) as { checks: Record<string, boolean> }).checks.signer_funded).toBe(false);
    const answer = (await postJson(`${f.url}/settle`, await rig.payment(10n))).json;
    expect(answer).toMatchObject({ success: false, transaction: "" });
    expect(await nonceOf(rig.anvil.rpcUrl, signer, "pending")).toBe(0);
    expect(await metricSum(f.adminUrl, "x402_settlement_broadcast_rejected_total")).toBe(0);
  });

  it("a transaction above its kind's gas ceiling is never signed and takes no nonce", async () => {
    rig = await startRig();
    const f = await rig.facilitator({ gasCeilings: "eip3009_transfer=30000" });
    const signer = f.signers[0] as Address;
    const answer = (await postJson(`${f.url}/settle`, await rig.payment(10n))).json;
    expect(answer).toMatchObject({ success: false, errorReason: "invalid_exact_evm_transaction_failed", transaction: "" });
    expect(String(answer.errorMessage)).toMatch(/eip3009_transfer transaction needs \d+ gas, above its ceiling of 30000/);
    expect(await metricSum(f.adminUrl, "x402_settlement_gas_ceiling_refused_total", { kind: "eip3009_transfer" })).toBe(1);
    expect(await nonceOf(rig.anvil.rpcUrl, signer, "pending")).toBe(0);
    expect(await balanceOf(rig.anvil.rpcUrl, rig.usdc.address, rig.receiver)).toBe(0n);
    // The next transaction of the key gets nonce 0: the refused one never held it.
    const hash = await f.outbox.sendTransaction({ to: rig.receiver, data: "0x" });
    const tx = await publicClient(rig.anvil.rpcUrl).getTransaction({ hash });
    expect(tx.nonce).toBe(0);
  });

  it("fee replacement stops at the fee cap: the stuck transaction waits, then mines when the market falls", async () => {
    rig = await startRig();
    const cap = parseGwei("50");
    const f = await rig.facilitator({ maxFeePerGasWei: cap.toString(), replaceAfterMs: 200, receiptTimeoutMs: 500 });
    const signer = f.signers[0] as Address;
    await rig.test.setAutomine(false);
    const body = await rig.payment(44n);
    const first = (await postJson(`${f.url}/settle`, body)).json;
    expect(first.errorReason).toBe("settlement_pending");
    await eventually(async () => {
      await rig!.test.setNextBlockBaseFeePerGas({ baseFeePerGas: parseGwei("1000") });
      await rig!.test.mine({ blocks: 1 });
      return (await metricSum(f.adminUrl, "x402_settlement_replacement_capped_total", { limit: "fee_cap" })) >= 1 ? true : undefined;
    }, 100, 200);
    // Nothing of this key in the pool is priced above the cap (anvil may also have evicted it: it is sent again later).
    const pool = await rpc<{ pending: Record<string, Record<string, { maxFeePerGas: string }>> }>(rig.anvil.rpcUrl, "txpool_content");
    const mine = Object.entries(pool.pending).find(([a]) => a.toLowerCase() === signer.toLowerCase())?.[1] ?? {};
    for (const tx of Object.values(mine)) expect(BigInt(tx.maxFeePerGas) <= cap).toBe(true);
    expect(await nonceOf(rig.anvil.rpcUrl, signer)).toBe(0);
    await rig.test.setNextBlockBaseFeePerGas({ baseFeePerGas: parseGwei("1") });
    await rig.test.mine({ blocks: 1 });
    await rig.test.setAutomine(true);
    const final = await eventually(async () => {
      const r = (await postJson(`${f.url}/settle`, body)).json;
      return r.success ? r : undefined;
    });
    const receipt = await publicClient(rig.anvil.rpcUrl).getTransactionReceipt({ hash: final.transaction as Hex });
    expect(receipt.status).toBe("success");
    expect(receipt.effectiveGasPrice <= cap).toBe(true);
    expect((await publicClient(rig.anvil.rpcUrl).getTransaction({ hash: final.transaction as Hex })).maxFeePerGas! <= cap).toBe(true);
    expect(await balanceOf(rig.anvil.rpcUrl, rig.usdc.address, rig.receiver)).toBe(44n);
  });

  it("fee replacement stops after the maximum number of bumps", async () => {
    rig = await startRig();
    const f = await rig.facilitator({ maxFeeBumps: 0, replaceAfterMs: 200, receiptTimeoutMs: 500 });
    await rig.test.setAutomine(false);
    const body = await rig.payment(45n);
    const first = (await postJson(`${f.url}/settle`, body)).json;
    expect(first.errorReason).toBe("settlement_pending");
    await eventually(async () => {
      await rig!.test.setNextBlockBaseFeePerGas({ baseFeePerGas: parseGwei("1000") });
      await rig!.test.mine({ blocks: 1 });
      return (await metricSum(f.adminUrl, "x402_settlement_replacement_capped_total", { limit: "bumps" })) >= 1 ? true : undefined;
    }, 100, 200);
    await rig.test.setNextBlockBaseFeePerGas({ baseFeePerGas: parseGwei("1") });
    await rig.test.mine({ blocks: 1 });
    await rig.test.setAutomine(true);
    const final = await eventually(async () => {
      const r = (await postJson(`${f.url}/settle`, body)).json;
      return r.success ? r : undefined;
    });
    expect(final.transaction).toBe(first.transaction); // never replaced
    expect((await publicClient(rig.anvil.rpcUrl).getTransactionReceipt({ hash: final.transaction as Hex })).status).toBe("success");
  });
});
