// The status API against the attackers of its review (docs/facilitator-interface.md "Settlement
// status"), judged on chain: a lying RPC endpoint never makes a payment look mined; a copy of a
// payment with another `extra` never plants a refusal on the genuine one; tenants never hide or take
// each other's view; a refusal with nothing sent is final only when the request can never pass.
import { afterEach, describe, expect, it } from "vitest";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { writeFile } from "node:fs/promises";
import { join } from "node:path";
import { type Hex } from "viem";
import { privateKeyToAccount } from "viem/accounts";
import { startRig, stopRig, type Rig } from "./helpers/settlement-rig.ts";
import { balanceOf } from "./helpers/chain.ts";
import { postJson } from "./helpers/payments.ts";
import { publicClient, rpc } from "./helpers/onchain.ts";
import { refusalStatus } from "../services/facilitator/settlement/status.ts";

let rig: Rig | undefined;
let server: Server | undefined;
afterEach(async () => {
  server?.close();
  server?.closeAllConnections();
  server = undefined;
  await stopRig(rig);
  rig = undefined;
});

const TOKEN = "status-review-router-token-0123456789abcdefghij";
const as = (tenant: string) => ({ "x402-fleet-router-token": TOKEN, "x402-fleet-tenant": tenant, "x402-fleet-gas-allowance": "unlimited" });

/**
 * An RPC endpoint in front of the node that answers receipts of `lie.hash` with one of a block no
 * canonical block has; with `lie.sync`, every eth_sendRawTransactionSync is sent the plain way and
 * answered at once with such a receipt; with `lie.realBlock`, the forged receipts name the real
 * latest block (its number and hash), which does not hold the transaction.
 */
async function lyingEndpoint(upstream: string, lie: { hash?: string; sync?: boolean; realBlock?: boolean }): Promise<string> {
  const forgedReceipt = async (hash: string) => {
    const latest = await rpc<{ number: string; hash: string }>(upstream, "eth_getBlockByNumber", ["latest", false]);
    const tx = await rpc<Record<string, string>>(upstream, "eth_getTransactionByHash", [hash]);
    const receipt = { transactionHash: hash, transactionIndex: "0x0", blockHash: lie.realBlock ? latest.hash : `0x${"ee".repeat(32)}`, blockNumber: latest.number, from: tx.from, to: tx.to };
    return { ...receipt, cumulativeGasUsed: "0x10000", gasUsed: "0x10000", effectiveGasPrice: "0x3b9aca00", contractAddress: null, logs: [], logsBloom: `0x${"00".repeat(256)}`, status: "0x1", type: "0x2" };
  };
  server = createServer(async (req, res) => {
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(c as Buffer);
    const parsed = JSON.parse(Buffer.concat(chunks).toString());
    const calls = (Array.isArray(parsed) ? parsed : [parsed]) as { id: unknown; method: string; params: unknown[] }[];
    const answers = await Promise.all(
      calls.map(async (c) => {
        if (lie.hash && c.method === "eth_getTransactionReceipt" && String(c.params[0]).toLowerCase() === lie.hash) return { jsonrpc: "2.0", id: c.id, result: await forgedReceipt(lie.hash) };
        if (lie.sync && c.method === "eth_sendRawTransactionSync") {
          const hash = await rpc<string>(upstream, "eth_sendRawTransaction", [c.params[0]]);
          return { jsonrpc: "2.0", id: c.id, result: await forgedReceipt(hash) };
        }
        return (await fetch(upstream, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(c) })).json();
      }),
    );
    res.setHeader("content-type", "application/json");
    res.end(JSON.stringify(Array.isArray(parsed) ? answers : answers[0]));
  });
  await new Promise<void>((r) => server!.listen(0, "127.0.0.1", () => r()));
  return `http://127.0.0.1:${(server!.address() as AddressInfo).port}`;
}

describe("settlement status under attack", () => {
  it("an endpoint that forges a receipt for a transaction still in the pool: the status stays submitted, never confirmed or settled", async () => {
    rig = await startRig();
    const lie: { hash?: string } = {};
    const f = await rig.facilitator({ rpcUrls: [await lyingEndpoint(rig.anvil.rpcUrl, lie)], receiptTimeoutMs: 500 });
    const body = await rig.payment(55n);
    await rig.test.setAutomine(false);
    const answer = (await postJson(`${f.url}/settle`, body)).json;
    expect(answer).toMatchObject({ errorReason: "settlement_pending" });
    lie.hash = (answer.transaction as string).toLowerCase();
    for (let i = 0; i < 3; i++) {
      const s = (await (await fetch(`${f.url}/settlements/status?network=${rig.network}&transaction=${answer.transaction}`)).json()) as Record<string, unknown>;
      expect(s).toMatchObject({ status: "pending", terminal: false, state: "submitted" });
      await new Promise((r) => setTimeout(r, 300));
    }
    expect(await publicClient(rig.anvil.rpcUrl).getTransactionReceipt({ hash: answer.transaction as Hex }).catch(() => undefined)).toBeUndefined();
    expect(await balanceOf(rig.anvil.rpcUrl, rig.usdc.address, rig.receiver)).toBe(0n);
    lie.hash = undefined;
    await rig.test.setAutomine(true);
  });

  it.each([
    ["a block no chain has", false],
    ["the real latest block, which does not hold it", true],
  ])("a synchronous send answered with a forged receipt naming %s (the transaction only in the pool): /settle never answers success; pending, with nothing moved, until it is really mined", async (_, realBlock) => {
    rig = await startRig();
    const lie = { sync: true, realBlock };
    const f = await rig.facilitator({ rpcUrls: [await lyingEndpoint(rig.anvil.rpcUrl, lie)], receiptTimeoutMs: 500, policy: { sendRawTransactionSync: true } });
    const body = await rig.payment(56n);
    await rig.test.setAutomine(false);
    const answer = (await postJson(`${f.url}/settle`, body)).json;
    // the endpoint's receipt is of no canonical block: not a success (it was, trusted as it came)
    expect(answer).toMatchObject({ success: false, errorReason: "settlement_pending" });
    expect(await publicClient(rig.anvil.rpcUrl).getTransactionReceipt({ hash: answer.transaction as Hex }).catch(() => undefined)).toBeUndefined();
    expect(await balanceOf(rig.anvil.rpcUrl, rig.usdc.address, rig.receiver)).toBe(0n);
    lie.sync = false;
    await rig.test.setAutomine(true);
    await rig.test.mine({ blocks: 1 });
    const again = (await postJson(`${f.url}/settle`, body)).json;
    expect(again).toMatchObject({ success: true, transaction: answer.transaction });
    expect(await balanceOf(rig.anvil.rpcUrl, rig.usdc.address, rig.receiver)).toBe(56n);
  });

  it("a copy of the payment with another extra (the signature's domain) is refused under its own request: the genuine payment's status is untouched, and it settles", async () => {
    rig = await startRig();
    const f = await rig.facilitator();
    const body = await rig.payment(66n);
    const variant = structuredClone(body) as typeof body & { paymentRequirements: { extra: Record<string, unknown> } };
    variant.paymentRequirements.extra = { ...variant.paymentRequirements.extra, name: "Not The Token", version: "9" };
    expect((await postJson(`${f.url}/settle`, variant)).json).toMatchObject({ success: false });
    expect((await postJson(`${f.url}/settlements/status`, variant)).json).toMatchObject({ state: "failed" });
    expect((await postJson(`${f.url}/settlements/status`, body)).status).toBe(404);
    expect((await postJson(`${f.url}/settle`, body)).json).toMatchObject({ success: true });
    expect((await postJson(`${f.url}/settlements/status`, body)).json).toMatchObject({ status: "settled", state: "confirmed" });
    expect(await balanceOf(rig.anvil.rpcUrl, rig.usdc.address, rig.receiver)).toBe(66n);
  });

  it("tenants: another tenant's settle of a refused payment hides nothing from its owner; each tenant that settled a payment reads it; a forged body tells a stranger nothing", async () => {
    rig = await startRig();
    await writeFile(join(rig.dir, "router.token"), `${TOKEN}\n`);
    const f = await rig.facilitator({ routerTokenFile: join(rig.dir, "router.token") });
    const payer = privateKeyToAccount(rig.payerKey).address;
    const short = await rig.payment((await balanceOf(rig.anvil.rpcUrl, rig.usdc.address, payer)) + 1n);
    expect((await postJson(`${f.url}/settle`, short, { headers: as("owner") })).json).toMatchObject({ errorReason: "invalid_exact_evm_insufficient_balance" });
    await postJson(`${f.url}/settle`, short, { headers: as("stranger") });
    expect((await postJson(`${f.url}/settlements/status`, short, { headers: as("owner") })).json).toMatchObject({ status: "blocked", state: "failed" });
    expect((await postJson(`${f.url}/settlements/status`, short, { headers: as("nobody") })).status).toBe(404);

    const body = await rig.payment(123n);
    const first = (await postJson(`${f.url}/settle`, body, { headers: as("payer-tenant") })).json;
    expect((await postJson(`${f.url}/settle`, body, { headers: as("merchant") })).json).toMatchObject({ success: true, transaction: first.transaction });
    expect((await publicClient(rig.anvil.rpcUrl).getTransactionReceipt({ hash: first.transaction as Hex })).status).toBe("success");
    for (const tenant of ["payer-tenant", "merchant"]) {
      const byHash = await fetch(`${f.url}/settlements/status?network=${rig.network}&transaction=${first.transaction}`, { headers: as(tenant) });
      expect(byHash.status, tenant).toBe(200);
      expect((await postJson(`${f.url}/settlements/status`, body, { headers: as(tenant) })).json).toMatchObject({ transaction: first.transaction, state: "confirmed" });
    }
    expect((await fetch(`${f.url}/settlements/status?network=${rig.network}&transaction=${first.transaction}`, { headers: as("stranger") })).status).toBe(404);
    // The stranger's copy with another payee: not "nonce used by another payment" (that would tell it the payment exists).
    const forged = structuredClone(body) as typeof body & { paymentRequirements: { payTo: string } };
    forged.paymentRequirements.payTo = privateKeyToAccount(`0x${"22".repeat(32)}`).address;
    expect((await postJson(`${f.url}/settlements/status`, forged, { headers: as("stranger") })).status).toBe(404);
    expect((await postJson(`${f.url}/settlements/status`, forged, { headers: as("merchant") })).json).toMatchObject({ status: "failed", terminal: true, errorReason: "invalid_exact_evm_nonce_already_used" });
    expect(await balanceOf(rig.anvil.rpcUrl, rig.usdc.address, rig.receiver)).toBe(123n);
  });

  it("a refusal with nothing sent is final only when the same request can never pass", () => {
    expect(refusalStatus("invalid_exact_evm_payload_authorization_valid_before")).toBe("expired");
    expect(refusalStatus("invalid_exact_evm_payload_authorization_valid_after")).toBe("deferred_until");
    expect(refusalStatus("invalid_exact_evm_nonce_already_used")).toBe("failed");
    expect(refusalStatus("invalid_exact_evm_payload_signature")).toBe("failed");
    for (const reason of ["invalid_exact_evm_insufficient_balance", "payee_denied", "payer_denied", "gas_budget_exhausted", "invalid_transaction_state"]) expect(refusalStatus(reason), reason).toBe("blocked");
  });
});
