// The settlement status API (docs/facilitator-interface.md "Settlement status"), judged on chain:
// a payment answered settlement_pending (mining paused) reports `submitted`, then `confirmed` with
// the same hash once mined, `settled` once as deep as the published finality; a reorged one
// reports `reorged`, then its new outcome; a refused one `failed` with its reason, to whoever holds
// the payment only; an unknown one 404. Every claim is checked against receipts and balances.
import { afterEach, describe, expect, it } from "vitest";
import { type Address, type Hex } from "viem";
import { privateKeyToAccount } from "viem/accounts";
import { appendPaymentIdentifierToExtensions, declarePaymentIdentifierExtension } from "@x402/extensions/payment-identifier";
import { ENGINES, startRig, stopRig, type Rig } from "./helpers/settlement-rig.ts";
import { balanceOf } from "./helpers/chain.ts";
import { postJson } from "./helpers/payments.ts";
import { eventually, nonceOf, publicClient, rpc } from "./helpers/onchain.ts";
import type { AddressInfo } from "node:net";
import express from "express";
import { paymentMiddleware, x402ResourceServer } from "@x402/express";
import { HTTPFacilitatorClient } from "@x402/core/server";
import { ExactEvmScheme as ExactServer } from "@x402/evm/exact/server";
import { ExactEvmScheme as ExactClient } from "@x402/evm/exact/client";
import { decodePaymentResponseHeader, wrapFetchWithPayment, x402Client } from "@x402/fetch";
import { recoverPendingSettlements } from "../services/x402/settlement-status.ts";

let rig: Rig | undefined;
afterEach(() => stopRig(rig).finally(() => (rig = undefined)));

const get = async (url: string) => {
  const res = await fetch(url);
  return { status: res.status, json: (await res.json()) as Record<string, unknown> };
};
const authorization = (body: Awaited<ReturnType<Rig["payment"]>>) => (body.paymentPayload.payload as { authorization: { from: Address; nonce: Hex } }).authorization;

describe.each(ENGINES)("settlement status (%s store)", (engine) => {
  it("settlement_pending while mining is paused reports submitted; mined, confirmed with the same hash and its depth; settled at the published finality", async () => {
    rig = await startRig({ engine });
    const f = await rig.facilitator({ confirmations: 3, receiptTimeoutMs: 1000 });
    const supported = (await get(`${f.url}/supported`)).json;
    expect(supported.confirmationPolicy).toEqual({ [rig.network]: { confirmations: 3 } });
    expect(supported.extensions).toContain("settlement-status");

    const body = await rig.payment(700n);
    const { from, nonce } = authorization(body);
    await rig.test.setAutomine(false);
    const answer = (await postJson(`${f.url}/settle`, body)).json;
    expect(answer).toMatchObject({ success: false, errorReason: "settlement_pending" });
    const hash = answer.transaction as Hex;
    expect(hash).toMatch(/^0x[0-9a-f]{64}$/);

    const byHash = `${f.url}/settlements/status?network=${rig.network}&transaction=${hash}`;
    const submitted = (await get(byHash)).json;
    expect(submitted).toMatchObject({ status: "pending", terminal: false, state: "submitted", transaction: hash, payer: from, payTo: rig.receiver.toLowerCase(), amount: "700", finality: { confirmations: 3 } });
    expect(await balanceOf(rig.anvil.rpcUrl, rig.usdc.address, rig.receiver)).toBe(0n);
    // The same payment, named by its payer and nonce, and by the payment itself.
    expect((await get(`${f.url}/settlements/status?network=${rig.network}&payer=${from}&nonce=${nonce}`)).json).toMatchObject({ paymentId: submitted.paymentId, state: "submitted" });
    expect((await postJson(`${f.url}/settlements/status`, body)).json).toMatchObject({ paymentId: submitted.paymentId, state: "submitted" });

    await rig.test.mine({ blocks: 1 });
    const receipt = await publicClient(rig.anvil.rpcUrl).getTransactionReceipt({ hash });
    expect(receipt.status).toBe("success");
    expect(await balanceOf(rig.anvil.rpcUrl, rig.usdc.address, rig.receiver)).toBe(700n);
    // Chain reads are shared for a moment (an anonymous endpoint): the answer may trail the block just mined, never lead it.
    const stateOf = (want: (s: Record<string, unknown>) => boolean) =>
      eventually(async () => {
        const s = (await get(byHash)).json;
        expect(s.confirmations ?? 0).toBeLessThanOrEqual(Number((await publicClient(rig!.anvil.rpcUrl).getBlockNumber()) - receipt.blockNumber + 1n));
        return want(s) ? s : undefined;
      }, 50, 100);
    const mined = await stateOf((s) => s.state === "confirmed");
    expect(mined).toMatchObject({ status: "pending", terminal: false, transaction: hash, confirmations: 1, blockNumber: receipt.blockNumber.toString(), blockHash: receipt.blockHash });

    await rig.test.mine({ blocks: 2 });
    // As deep as the finality target: `settled` once the engine records it (as /settle answers it), never on a chain read alone.
    const deep = await stateOf((s) => s.confirmations === 3);
    expect(deep).toMatchObject({ state: "confirmed", transaction: hash });
    if (deep.status !== "settled") expect(deep).toMatchObject({ status: "pending", terminal: false });
    // /settle agrees: the retry is the recorded success with that transaction, and the status reads the record.
    expect((await postJson(`${f.url}/settle`, body)).json).toMatchObject({ success: true, transaction: hash });
    expect((await get(byHash)).json).toMatchObject({ status: "settled", terminal: true, state: "confirmed", transaction: hash, confirmations: 3 });
    expect(await balanceOf(rig.anvil.rpcUrl, rig.usdc.address, rig.receiver)).toBe(700n);
  });
});

describe("settlement status", () => {
  it("a reorged settlement reports reorged, then its new outcome on the canonical chain", async () => {
    rig = await startRig();
    const f = await rig.facilitator();
    const body = await rig.payment(300n);
    const answer = (await postJson(`${f.url}/settle`, body)).json;
    expect(answer).toMatchObject({ success: true });
    const hash = answer.transaction as Hex;
    const byHash = `${f.url}/settlements/status?network=${rig.network}&transaction=${hash}`;
    expect((await get(byHash)).json).toMatchObject({ status: "settled", state: "confirmed", transaction: hash });

    // Its block leaves the chain while nothing is mined: the reconciler finds out, the record is reopened.
    await rig.test.setAutomine(false);
    await rpc(rig.anvil.rpcUrl, "anvil_reorg", [1, []]);
    expect(await balanceOf(rig.anvil.rpcUrl, rig.usdc.address, rig.receiver)).toBe(0n);
    const reorged = await eventually(async () => {
      await f.reconciler.pass();
      const s = (await get(byHash)).json;
      return s.state === "reorged" ? s : undefined;
    }, 50, 100);
    expect(reorged).toMatchObject({ status: "pending", terminal: false, reorgedFrom: "succeeded", transaction: hash });
    expect(await publicClient(rig.anvil.rpcUrl).getTransactionReceipt({ hash }).catch(() => undefined)).toBeUndefined();

    // Mined again (the very bytes): its new outcome.
    await rig.test.mine({ blocks: 1 });
    await rig.test.setAutomine(true);
    const again = await eventually(async () => {
      await f.reconciler.pass();
      const s = (await get(byHash)).json;
      return s.status === "settled" ? s : undefined;
    }, 50, 100);
    const receipt = await publicClient(rig.anvil.rpcUrl).getTransactionReceipt({ hash });
    expect(receipt.status).toBe("success");
    expect(again).toMatchObject({ state: "confirmed", transaction: hash, blockNumber: receipt.blockNumber.toString(), blockHash: receipt.blockHash });
    expect(await balanceOf(rig.anvil.rpcUrl, rig.usdc.address, rig.receiver)).toBe(300n);
  });

  it("a settlement reorged into a new block that is not yet as deep as the finality target is not settled again until it is", async () => {
    rig = await startRig();
    const f = await rig.facilitator({ confirmations: 2 });
    const body = await rig.payment(400n);
    const answering = postJson(`${f.url}/settle`, body);
    // Success waits for depth 2: one more block after the transaction's.
    await eventually(async () => ((await balanceOf(rig!.anvil.rpcUrl, rig!.usdc.address, rig!.receiver)) === 400n ? true : undefined), 100, 100);
    await rig.test.mine({ blocks: 1 });
    const answer = (await answering).json;
    expect(answer, JSON.stringify(answer)).toMatchObject({ success: true });
    const hash = answer.transaction as Hex;
    const raw = await rpc<Hex>(rig.anvil.rpcUrl, "eth_getRawTransactionByHash", [hash]);
    // Both blocks replaced; the transaction included again in the new head only (depth 1 of 2).
    await rig.test.setAutomine(false);
    await rpc(rig.anvil.rpcUrl, "anvil_reorg", [2, [[raw, 1]]]);
    const receipt = await publicClient(rig.anvil.rpcUrl).getTransactionReceipt({ hash });
    expect(receipt.status).toBe("success");
    expect((await publicClient(rig.anvil.rpcUrl).getBlockNumber()) - receipt.blockNumber + 1n).toBe(1n);
    const byHash = `${f.url}/settlements/status?network=${rig.network}&transaction=${hash}`;
    await eventually(async () => {
      await f.reconciler.pass();
      const s = (await get(byHash)).json;
      return s.reorgedFrom === "succeeded" || s.state === "reorged" ? s : undefined;
    }, 50, 100);
    await f.reconciler.pass();
    await f.reconciler.pass();
    const shallow = (await get(byHash)).json;
    expect(shallow.status).not.toBe("settled");
    // /settle agrees: pending (with its latest attempt's hash), not the stale success.
    expect((await postJson(`${f.url}/settle`, body)).json).toMatchObject({ success: false, errorReason: "settlement_pending" });
    // One block more: as deep as the target, recorded, settled.
    await rig.test.mine({ blocks: 1 });
    await rig.test.setAutomine(true);
    const settled = await eventually(async () => {
      await f.reconciler.pass();
      const s = (await get(byHash)).json;
      return s.status === "settled" ? s : undefined;
    }, 50, 100);
    expect(settled).toMatchObject({ state: "confirmed", transaction: hash, blockNumber: receipt.blockNumber.toString(), blockHash: receipt.blockHash });
    expect(await balanceOf(rig.anvil.rpcUrl, rig.usdc.address, rig.receiver)).toBe(400n);
  });

  it("a refused payment reads failed with its reason, only to whoever holds it; nothing was sent", async () => {
    rig = await startRig();
    const f = await rig.facilitator();
    const signer = f.signers[0] as Address;
    const nonceBefore = await nonceOf(rig.anvil.rpcUrl, signer, "pending");
    const payerBalance = await balanceOf(rig.anvil.rpcUrl, rig.usdc.address, privateKeyToAccount(rig.payerKey).address);
    const body = await rig.payment(payerBalance + 1n);
    const answer = (await postJson(`${f.url}/settle`, body)).json;
    expect(answer).toMatchObject({ success: false, errorReason: "invalid_exact_evm_insufficient_balance" });
    expect(await nonceOf(rig.anvil.rpcUrl, signer, "pending")).toBe(nonceBefore);

    const status = await postJson(`${f.url}/settlements/status`, body);
    expect(status.status).toBe(200);
    // Short of funds: the protocol's `blocked` (it may pay once funded), not terminal.
    expect(status.json).toMatchObject({ status: "blocked", terminal: false, state: "failed", errorReason: "invalid_exact_evm_insufficient_balance", amount: String(payerBalance + 1n) });
    expect(status.json.transaction).toBeUndefined();
    // Naming its payer and nonce is not holding it: a refusal never speaks for a payment to someone who only names it.
    const { from, nonce } = authorization(body);
    const named = await get(`${f.url}/settlements/status?network=${rig.network}&payer=${from}&nonce=${nonce}`);
    expect(named.status).toBe(404);
    expect(named.json.error).toMatch(/^payment_not_found: /);
  });

  it("a payment identifier names its payment once it sent a transaction; unknown payments are 404 and malformed questions 400", async () => {
    rig = await startRig();
    const f = await rig.facilitator();
    const body = await rig.payment(200n);
    const id = `status-${Date.now()}-abcdefgh`;
    (body.paymentPayload as { extensions?: Record<string, unknown> }).extensions = appendPaymentIdentifierToExtensions({ "payment-identifier": declarePaymentIdentifierExtension() }, id);
    const answer = (await postJson(`${f.url}/settle`, body)).json;
    expect(answer).toMatchObject({ success: true });
    const receipt = await publicClient(rig.anvil.rpcUrl).getTransactionReceipt({ hash: answer.transaction as Hex });
    expect(receipt.status).toBe("success");
    const { from } = authorization(body);
    const byId = (await get(`${f.url}/settlements/status?network=${rig.network}&paymentIdentifier=${id}`)).json;
    expect(byId).toMatchObject({ status: "settled", state: "confirmed", transaction: answer.transaction, payer: from, amount: "200", blockNumber: receipt.blockNumber.toString() });
    expect((await get(`${f.url}/settlements/status?network=${rig.network}&paymentIdentifier=${id}&payer=${from}`)).json).toMatchObject({ paymentId: byId.paymentId });
    // Another payer's scope does not hold it.
    const other = privateKeyToAccount(`0x${"11".repeat(32)}`).address;
    expect((await get(`${f.url}/settlements/status?network=${rig.network}&paymentIdentifier=${id}&payer=${other}`)).status).toBe(404);

    for (const query of [`transaction=0x${"ab".repeat(32)}`, `payer=${from}&nonce=0x${"cd".repeat(32)}`, `paymentIdentifier=never-used-id-123456`]) {
      const r = await get(`${f.url}/settlements/status?network=${rig.network}&${query}`);
      expect(r.status, query).toBe(404);
      expect(r.json.error).toMatch(/^payment_not_found: /);
    }
    const fresh = await rig.payment(5n);
    expect((await postJson(`${f.url}/settlements/status`, fresh)).status).toBe(404);
    for (const query of ["", `transaction=0x12`, `nonce=1`, `payer=0x12&nonce=1`, "paymentIdentifier=abc%00defghijklmnopq", "paymentIdentifier=short", `transaction=0x${"ab".repeat(32)}%0a`, `transaction=0x${"ab".repeat(32)}&paymentIdentifier=x`, `network=eip155:1&transaction=0x${"ab".repeat(32)}`]) {
      const r = await get(`${f.url}/settlements/status?${query}`);
      expect(r.status, query).toBe(400);
      expect(r.json.error).toMatch(/^invalid_status_query: /);
    }
    expect((await postJson(`${f.url}/settlements/status`, { nonsense: true })).status).toBe(400);
  });
});

describe("the resource server's side", () => {
  it("a reference resource server with recoverPendingSettlements serves a payment whose settle stayed settlement_pending once it is mined; the client hears success with the mined hash", async () => {
    rig = await startRig();
    const f = await rig.facilitator({ receiptTimeoutMs: 1000 });
    const recover = recoverPendingSettlements({ url: f.url, waitMs: 60_000, intervalMs: 200 });
    // The reference itself retries a pending settle; the hook runs once /settle has said pending for good.
    let failed: (() => void) | undefined;
    const settleFailed = new Promise<void>((r) => (failed = r));
    const resourceServer = new x402ResourceServer(new HTTPFacilitatorClient({ url: f.url }))
      .register(rig.network as `${string}:${string}`, new ExactServer())
      .onSettleFailure(async (context) => {
        failed!();
        return recover(context);
      });
    const app = express();
    app.use(paymentMiddleware({ "GET /report": { accepts: { scheme: "exact", price: "$0.01", network: rig.network as `${string}:${string}`, payTo: rig.receiver } } }, resourceServer));
    app.get("/report", (_req, res) => void res.json({ report: "sunny" }));
    const server = await new Promise<ReturnType<typeof app.listen>>((resolve) => {
      const s = app.listen(0, "127.0.0.1", () => resolve(s));
    });
    try {
      const pay = wrapFetchWithPayment(fetch, x402Client.fromConfig({ schemes: [{ network: rig.network as `${string}:${string}`, client: new ExactClient(privateKeyToAccount(rig.payerKey)) }] }));
      await rig.test.setAutomine(false);
      const paid = pay(`http://127.0.0.1:${(server.address() as AddressInfo).port}/report`);
      // Its settlement is sent and waits in the pool past every /settle the reference makes; then it is mined.
      await settleFailed;
      expect((await rig.test.getTxpoolStatus()).pending).toBe(1);
      expect(await balanceOf(rig.anvil.rpcUrl, rig.usdc.address, rig.receiver)).toBe(0n);
      await rig.test.mine({ blocks: 1 });
      const res = await paid;
      expect(res.status).toBe(200);
      expect(await res.json()).toEqual({ report: "sunny" });
      const answer = decodePaymentResponseHeader(res.headers.get("payment-response")!);
      expect(answer).toMatchObject({ success: true });
      const receipt = await publicClient(rig.anvil.rpcUrl).getTransactionReceipt({ hash: answer.transaction as Hex });
      expect(receipt.status).toBe("success");
      expect(await balanceOf(rig.anvil.rpcUrl, rig.usdc.address, rig.receiver)).toBe(10_000n);
    } finally {
      server.close();
      server.closeAllConnections();
    }
  });
});
