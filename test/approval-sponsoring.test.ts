// The erc20ApprovalGasSponsoring extension on the devnet's BNB Smart Chain, judged on chain: a
// payer holding USDT (no EIP-2612, no EIP-3009) but no gas and no Permit2 allowance pays a
// reference @x402/express server through our router with the reference client; the facilitator
// funds exactly what the approval may cost, relays it and settles. A payer who spends the funding
// on something else gets no payment through and is never funded again; approvals that could cost
// more than the bound, or that would not lead to a settlement, are refused before anything is sent.
import type { Server } from "node:http";
import type { AddressInfo } from "node:net";
import { writeFile } from "node:fs/promises";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import express from "express";
import { paymentMiddleware, x402ResourceServer } from "@x402/express";
import { HTTPFacilitatorClient } from "@x402/core/server";
import { ExactEvmScheme as ExactEvmServer } from "@x402/evm/exact/server";
import { ExactEvmScheme as ExactEvmClient } from "@x402/evm/exact/client";
import { UptoEvmScheme as UptoEvmServer } from "@x402/evm/upto/server";
import { UptoEvmScheme as UptoEvmClient } from "@x402/evm/upto/client";
import { PERMIT2_ADDRESS, toClientEvmSigner } from "@x402/evm";
import { declareErc20ApprovalGasSponsoringExtension } from "@x402/extensions";
import { decodePaymentResponseHeader, wrapFetchWithPayment, x402Client } from "@x402/fetch";
import { createPublicClient, createTestClient, createWalletClient, encodeFunctionData, erc20Abi, http, maxUint256, parseTransaction, type Address, type Hex } from "viem";
import { generatePrivateKey, privateKeyToAccount, type PrivateKeyAccount } from "viem/accounts";
import { pino } from "pino";
import type { RunningDevnet } from "../services/devnet/devnet.ts";
import { facilitatorConfigFromEnv, resolveFacilitatorConfig } from "../services/facilitator/config.ts";
import { startFacilitatorService, type RunningFacilitator } from "../services/facilitator/service.ts";
import type { RoutingTable } from "../services/router/routing-table.ts";
import { startRouterService, type RunningRouter } from "../services/router/service.ts";
import { startTestDevnet } from "./helpers/devnet.ts";
import { postJson } from "./helpers/payments.ts";

const NETWORK = "eip155:56" as const;
let devnet: RunningDevnet & { dir: string };
let server: Server;
let base: string;

const net = () => devnet.info.networks[0]!;
const usdt = () => net().assets.find((a) => a.symbol === "USDT")!.address as Address;
const chain = () => createPublicClient({ transport: http(net().rpcUrl) });
const payTo = () => devnet.info.receivers[0]!.address as Address;
const AMOUNT = 10n ** 16n; // 0.01 USDT (18 decimals)

beforeAll(async () => {
  devnet = await startTestDevnet([NETWORK], { hub: false, wallets: false });
  ({ server, base } = await startResourceServer(devnet.info.routerUrl, ["exact", "upto"]));
});

afterAll(async () => {
  await new Promise((r) => server?.close(r));
  await devnet?.stop();
});

/** A reference @x402/express server selling /report (exact) and /metered (upto) in USDT, settled by the facilitator at `url`. */
async function startResourceServer(url: string, schemes: ("exact" | "upto")[]): Promise<{ server: Server; base: string }> {
  let resourceServer = new x402ResourceServer(new HTTPFacilitatorClient({ url }));
  if (schemes.includes("exact")) resourceServer = resourceServer.register(NETWORK, new ExactEvmServer());
  if (schemes.includes("upto")) resourceServer = resourceServer.register(NETWORK, new UptoEvmServer());
  const price = { asset: usdt(), amount: AMOUNT.toString(), extra: { assetTransferMethod: "permit2" } };
  const routes = {
    "GET /report": { accepts: { scheme: "exact", network: NETWORK, payTo: payTo(), price }, description: "paid in USDT", extensions: declareErc20ApprovalGasSponsoringExtension() },
    "GET /metered": { accepts: { scheme: "upto", network: NETWORK, payTo: payTo(), price }, description: "metered in USDT", extensions: declareErc20ApprovalGasSponsoringExtension() },
  };
  const app = express();
  app.use(paymentMiddleware(Object.fromEntries(Object.entries(routes).filter(([, r]) => schemes.includes(r.accepts.scheme as "exact" | "upto"))), resourceServer));
  app.get("/report", (_req, res) => void res.json({ ok: true }));
  app.get("/metered", (_req, res) => void res.json({ ok: true }));
  const listening = await new Promise<Server>((resolve) => {
    const s = app.listen(0, "127.0.0.1", () => resolve(s));
  });
  return { server: listening, base: `http://127.0.0.1:${(listening.address() as AddressInfo).port}` };
}

/** A new payer holding USDT and nothing else: no native coin, no allowance. */
async function gaslessPayer(): Promise<PrivateKeyAccount> {
  const payer = privateKeyToAccount(generatePrivateKey());
  const funder = createWalletClient({ account: privateKeyToAccount(devnet.info.payers[0]!.privateKey), transport: http(net().rpcUrl) });
  const hash = await funder.writeContract({ chain: null, address: usdt(), abi: erc20Abi, functionName: "transfer", args: [payer.address, 10n * AMOUNT] });
  await chain().waitForTransactionReceipt({ hash });
  expect(await chain().getBalance({ address: payer.address })).toBe(0n);
  return payer;
}

async function onChain(payer: Address, signer: Address = net().signers[0]!) {
  const c = chain();
  const [payerUsdt, payToUsdt, payerGas, allowance, signerNonce, signerGas] = await Promise.all([
    c.readContract({ address: usdt(), abi: erc20Abi, functionName: "balanceOf", args: [payer] }),
    c.readContract({ address: usdt(), abi: erc20Abi, functionName: "balanceOf", args: [payTo()] }),
    c.getBalance({ address: payer }),
    c.readContract({ address: usdt(), abi: erc20Abi, functionName: "allowance", args: [payer, PERMIT2_ADDRESS] }),
    c.getTransactionCount({ address: signer }),
    c.getBalance({ address: signer }),
  ]);
  return { payerUsdt, payToUsdt, payerGas, allowance, signerNonce, signerGas };
}

/** The facilitator's body for a payment the reference client signs with the approval extension. */
async function sponsoredBody(payer: PrivateKeyAccount, tamper?: (info: Record<string, unknown>) => Promise<void> | void) {
  const requirements = { scheme: "exact", network: NETWORK, asset: usdt(), amount: AMOUNT.toString(), payTo: payTo(), maxTimeoutSeconds: 60, extra: { assetTransferMethod: "permit2" } };
  const created = await new ExactEvmClient(toClientEvmSigner(payer, chain())).createPaymentPayload(2, requirements as never, { extensions: { erc20ApprovalGasSponsoring: {} } } as never);
  const info = (created.extensions as Record<string, { info: Record<string, unknown> }>).erc20ApprovalGasSponsoring!.info;
  await tamper?.(info);
  return { x402Version: 2, paymentPayload: { ...created, accepted: requirements }, paymentRequirements: requirements };
}

/** The payer's approval re-signed with some fields changed (nonce, gas, fees, chain). */
async function resigned(payer: PrivateKeyAccount, info: Record<string, unknown>, change: Record<string, unknown>) {
  info.signedTransaction = await payer.signTransaction({ ...unsigned(info.signedTransaction as Hex), ...change } as never);
}

/** A signed transaction's fields without its signature. */
function unsigned(raw: Hex) {
  const { r: _r, s: _s, v: _v, yParity: _y, ...tx } = parseTransaction(raw);
  return tx;
}

describe("erc20ApprovalGasSponsoring (USDT on eip155:56)", () => {
  it("is advertised where it is served", async () => {
    const supported = await (await fetch(`${devnet.info.routerUrl}/supported`)).json();
    expect(supported.extensions).toContain("erc20ApprovalGasSponsoring");
  });

  it("upto: a gasless payer's approval is sponsored too", async () => {
    const payer = await gaslessPayer();
    const before = await onChain(payer.address);
    const pay = wrapFetchWithPayment(fetch, x402Client.fromConfig({ schemes: [{ network: "eip155:*", client: new UptoEvmClient(toClientEvmSigner(payer, chain())) }], spendControls: { allowedAssets: [{ network: NETWORK, asset: usdt() }] } }));
    expect((await pay(`${base}/metered`)).status).toBe(200);
    const after = await onChain(payer.address);
    expect(after.payToUsdt).toBe(before.payToUsdt + AMOUNT);
    expect(after.allowance).toBe(maxUint256);
    expect(after.signerNonce).toBe(before.signerNonce + 2);
  });

  it("approvals that could cost more than the bound or could not lead to a settlement are refused before anything is sent", async () => {
    const payer = await gaslessPayer();
    const before = await onChain(payer.address);
    const cases: [string, (info: Record<string, unknown>) => Promise<void> | void][] = [
      ["erc20_approval_tx_gas_too_high", (info) => resigned(payer, info, { gas: 5_000_000n })],
      ["erc20_approval_tx_fee_too_high", (info) => resigned(payer, info, { maxFeePerGas: 10n ** 15n, maxPriorityFeePerGas: 10n ** 15n })],
      ["erc20_approval_tx_nonce_mismatch", (info) => resigned(payer, info, { nonce: 5 })],
      ["erc20_approval_tx_wrong_chain", (info) => resigned(payer, info, { chainId: 97 })],
      ["erc20_approval_tx_has_value", (info) => resigned(payer, info, { value: 1n })],
      ["erc20_approval_tx_wrong_spender", (info) => resigned(payer, info, { data: encodeFunctionData({ abi: erc20Abi, functionName: "approve", args: [payer.address, maxUint256] }) })],
      ["erc20_approval_tx_signer_mismatch", async (info) => void (info.signedTransaction = await privateKeyToAccount(generatePrivateKey()).signTransaction(unsigned(info.signedTransaction as Hex) as never))],
    ];
    for (const [reason, tamper] of cases) {
      const body = await sponsoredBody(payer, tamper);
      const verified = await postJson(`${devnet.info.routerUrl}/verify`, body);
      expect([reason, verified.json]).toEqual([reason, expect.objectContaining({ isValid: false, invalidReason: reason })]);
      const settled = await postJson(`${devnet.info.routerUrl}/settle`, body);
      expect([reason, settled.json]).toEqual([reason, expect.objectContaining({ success: false, errorReason: reason })]);
    }
    // An approval that is fine but a payment that cannot settle (more than the payer holds): the simulation of the whole sequence refuses it.
    const poor = privateKeyToAccount(generatePrivateKey());
    const unpayable = await sponsoredBody(poor);
    expect((await postJson(`${devnet.info.routerUrl}/verify`, unpayable)).json).toMatchObject({ isValid: false, invalidReason: "permit2_simulation_failed" });
    expect((await postJson(`${devnet.info.routerUrl}/settle`, unpayable)).json).toMatchObject({ success: false });
    const after = await onChain(payer.address);
    expect(after).toEqual(before); // no funding, no approval, no settlement
    expect(await chain().getBalance({ address: poor.address })).toBe(0n);
  });

  it("a payer who spends the funding on something else gets nothing settled and is never funded again", async () => {
    const payer = await gaslessPayer();
    const test = createTestClient({ mode: "anvil", transport: http(net().rpcUrl) });
    const body = await sponsoredBody(payer);
    const approval = parseTransaction((body.paymentPayload.extensions as Record<string, { info: { signedTransaction: Hex } }>).erc20ApprovalGasSponsoring!.info.signedTransaction);
    // The payer's competing transaction: the same nonce, a higher fee, paid from the funding.
    const competing = await payer.signTransaction({ chainId: 56, type: "eip1559", to: payer.address, value: 0n, gas: 21_000n, nonce: approval.nonce!, maxFeePerGas: approval.maxFeePerGas! * 2n, maxPriorityFeePerGas: approval.maxFeePerGas! * 2n });
    const before = await onChain(payer.address);
    await test.setAutomine(false);
    try {
      const settling = postJson(`${devnet.info.routerUrl}/settle`, body);
      // Wait for the funding to reach the pool, mine it, then front-run the relay with the competing transaction.
      for (let i = 0; ; i++) {
        const pending = await chain().getBlock({ blockTag: "pending", includeTransactions: true });
        if (pending.transactions.some((t) => t.to?.toLowerCase() === payer.address.toLowerCase())) break;
        if (i > 400) throw new Error("the funding never reached the pool");
        await new Promise((r) => setTimeout(r, 25));
      }
      await test.mine({ blocks: 1 });
      await chain().sendRawTransaction({ serializedTransaction: competing });
      await test.mine({ blocks: 1 });
      await test.setAutomine(true);
      const answer = await settling;
      expect(answer.json).toMatchObject({ success: false });
      expect(String(answer.json.errorReason)).toMatch(/^erc20_approval_(broadcast_failed|tx_failed)$/);
    } finally {
      await test.setAutomine(true);
    }
    const after = await onChain(payer.address);
    expect(after.payToUsdt).toBe(before.payToUsdt); // nothing moved
    expect(after.payerUsdt).toBe(before.payerUsdt);
    expect(after.allowance).toBe(0n);
    expect(after.signerNonce).toBe(before.signerNonce + 1); // the funding only: the settlement was never sent
    const lost = before.signerGas - after.signerGas;
    expect(lost).toBeLessThanOrEqual(100_000n * approval.maxFeePerGas! + 21_000n * approval.maxFeePerGas! * 2n); // one funding, bounded
    // The same payer with a new, well-formed approval is refused at /verify and /settle: nothing is sent again.
    const again = await sponsoredBody(payer);
    expect((await postJson(`${devnet.info.routerUrl}/verify`, again)).json).toMatchObject({ isValid: false, invalidReason: "erc20_approval_payer_refused" });
    expect((await postJson(`${devnet.info.routerUrl}/settle`, again)).json).toMatchObject({ success: false, errorReason: "erc20_approval_payer_refused" });
    expect((await onChain(payer.address)).signerNonce).toBe(after.signerNonce);
  });
});

// ------------------------------------------------------------------ the bound, configured

describe("erc20ApprovalGasSponsoring within the bound the operator configured", () => {
  // The reference client signs approve(Permit2) with a gas limit of 70,000 (@x402/evm ERC20_APPROVE_GAS_LIMIT).
  const CLIENT_APPROVAL_GAS = 70_000n;
  // Non-default bounds, set through the facilitator's environment: the approval's gas limit (default
  // 100,000), the funding of one payer (default: that gas x the fee cap), the fee cap and the gas
  // ceilings of the facilitator's own two transactions (funding, settlement).
  const MAX_APPROVAL_GAS = 75_000n;
  const FUNDING_GAS_CEILING = 21_000n;
  const SETTLE_GAS_CEILING = 200_000n;
  // The payer's wallet offers 0.5 gwei per gas for its approval (BSC's base fee is 0; its tip floor 0.05 gwei).
  const APPROVAL_FEE = 500_000_000n;
  // Room for the client's approval (70,000 gas), not for one of 74,000 gas: below the default (75,000 x the fee cap).
  const maxFundingWei = 72_000n * APPROVAL_FEE;
  const maxFeePerGasWei = 3_000_000_000n;
  let signer: Address;
  let facilitator: RunningFacilitator;
  let router: RunningRouter;
  let shop: { server: Server; base: string };

  beforeAll(async () => {
    const key = generatePrivateKey();
    signer = privateKeyToAccount(key).address;
    await createTestClient({ mode: "anvil", transport: http(net().rpcUrl) }).setBalance({ address: signer, value: 10n ** 19n });
    const config = resolveFacilitatorConfig(
      facilitatorConfigFromEnv({
        X402_ERC20_APPROVAL_SPONSORING: "on",
        X402_ERC20_APPROVAL_MAX_GAS: MAX_APPROVAL_GAS.toString(),
        X402_ERC20_APPROVAL_MAX_FUNDING_WEI: maxFundingWei.toString(),
        X402_MAX_FEE_PER_GAS_WEI: maxFeePerGasWei.toString(),
        X402_GAS_CEILINGS: `gas_funding=${FUNDING_GAS_CEILING},permit2_settle=${SETTLE_GAS_CEILING}`,
        X402_SCHEMES: "exact",
      }),
      // what the devnet sets for its own facilitators (its tokens, a block per transaction)
      { network: NETWORK, rpcUrls: [net().facilitatorRpcUrl], signerKeys: [key], assets: net().assets, confirmations: 1, host: "127.0.0.1", port: 0, dataDir: join(devnet.dir, "bounded-facilitator") },
    );
    expect(config.approvalSponsoring).toEqual({ maxApprovalGas: MAX_APPROVAL_GAS, maxFundingWei, dailyFundingWei: undefined });
    expect(config.maxFeePerGasWei).toBe(maxFeePerGasWei);
    facilitator = await startFacilitatorService(config, pino({ level: "silent" }));
    // Our router in front of it, as in production.
    const supported = facilitator.facilitator.supported();
    const table: RoutingTable = { backends: [{ network: NETWORK, url: facilitator.url, kinds: supported.kinds, signers: facilitator.signers, extensions: supported.extensions }] };
    const routingTablePath = join(devnet.dir, "bounded-routing.json");
    await writeFile(routingTablePath, JSON.stringify(table));
    router = await startRouterService({ routingTablePath, host: "127.0.0.1", port: 0, adminPort: 0 }, pino({ level: "silent" }));
    shop = await startResourceServer(router.url, ["exact"]);
  });

  afterAll(async () => {
    await new Promise((r) => shop?.server.close(r));
    await router?.close();
    await facilitator?.close();
  });

  it("a payer with no gas and no allowance pays through the reference stack; the facilitator's key spends within the configured bound", async () => {
    const payer = await gaslessPayer();
    const before = await onChain(payer.address, signer);
    const wallet = toClientEvmSigner({ ...payer, estimateFeesPerGas: async () => ({ maxFeePerGas: APPROVAL_FEE, maxPriorityFeePerGas: APPROVAL_FEE }) } as never, chain());
    const pay = wrapFetchWithPayment(fetch, x402Client.fromConfig({ schemes: [{ network: "eip155:*", client: new ExactEvmClient(wallet) }], spendControls: { allowedAssets: [{ network: NETWORK, asset: usdt() }] } }));
    const res = await pay(`${shop.base}/report`);
    expect(res.status).toBe(200);
    const settled = decodePaymentResponseHeader(res.headers.get("payment-response")!);
    const after = await onChain(payer.address, signer);
    expect(after.payerUsdt).toBe(before.payerUsdt - AMOUNT);
    expect(after.payToUsdt).toBe(before.payToUsdt + AMOUNT);
    expect(after.allowance).toBe(maxUint256); // the payer's own approval, relayed
    expect(after.signerNonce).toBe(before.signerNonce + 2); // the funding, then the settlement
    // The answer names the settlement (to the exact Permit2 proxy), not the funding or the approval.
    const settleTx = await chain().getTransaction({ hash: settled.transaction as Hex });
    expect(settleTx.from.toLowerCase()).toBe(signer.toLowerCase());
    expect(settleTx.input.startsWith("0x13cd3b53")).toBe(true); // settle(...) of the exact Permit2 proxy
    // The funding was what the approval could cost at most (gas limit x max fee), and the payer spent it on the approval.
    const funding = (await chain().getBlock({ blockNumber: (await chain().getTransactionReceipt({ hash: settleTx.hash })).blockNumber - 2n, includeTransactions: true })).transactions.find((t) => t.to?.toLowerCase() === payer.address.toLowerCase())!;
    expect(funding.from.toLowerCase()).toBe(signer.toLowerCase());
    const approval = (await chain().getBlock({ blockNumber: funding.blockNumber! + 1n, includeTransactions: true })).transactions.find((t) => t.from.toLowerCase() === payer.address.toLowerCase())!;
    expect([approval.gas, approval.maxFeePerGas]).toEqual([CLIENT_APPROVAL_GAS, APPROVAL_FEE]); // the premise of the bounds above
    expect(funding.value).toBe(approval.gas * approval.maxFeePerGas!);
    expect(funding.value).toBeLessThanOrEqual(maxFundingWei);
    const approvalReceipt = await chain().getTransactionReceipt({ hash: approval.hash });
    expect(after.payerGas).toBe(funding.value - approvalReceipt.gasUsed * approvalReceipt.effectiveGasPrice);
    // What the facilitator's key spent (its balance, and the same from the receipts): the funding and
    // its two transactions' fees, within the configured bound: one funding at most maxFundingWei, and
    // two transactions of at most their configured gas ceilings at the configured fee cap.
    const receipts = await Promise.all([funding.hash, settleTx.hash].map((hash) => chain().getTransactionReceipt({ hash })));
    const fees = receipts.reduce((sum, r) => sum + r.gasUsed * r.effectiveGasPrice, 0n);
    const spent = before.signerGas - after.signerGas;
    expect(spent).toBe(funding.value + fees);
    for (const r of receipts) expect(r.effectiveGasPrice).toBeLessThanOrEqual(maxFeePerGasWei);
    expect(spent).toBeLessThanOrEqual(maxFundingWei + (FUNDING_GAS_CEILING + SETTLE_GAS_CEILING) * maxFeePerGasWei);
  });

  it("an approval that would need more than the configured funding, or more gas than the configured limit, is refused before anything is sent", async () => {
    const payer = await gaslessPayer();
    const before = await onChain(payer.address, signer);
    const cases: [string, bigint][] = [
      // 74,000 gas at the client's fee costs more than maxFundingWei (72,000 x that fee), though under the default bound
      ["erc20_approval_funding_above_bound", 74_000n],
      // 76,000 gas: above the configured 75,000, under the default 100,000
      ["erc20_approval_tx_gas_too_high", MAX_APPROVAL_GAS + 1_000n],
    ];
    for (const [reason, gas] of cases) {
      const b = await sponsoredBody(payer, (info) => resigned(payer, info, { gas, maxFeePerGas: APPROVAL_FEE, maxPriorityFeePerGas: APPROVAL_FEE }));
      const verified = await postJson(`${router.url}/verify`, b);
      expect([reason, verified.json]).toEqual([reason, expect.objectContaining({ isValid: false, invalidReason: reason })]);
      const settled = await postJson(`${router.url}/settle`, b);
      expect([reason, settled.json]).toEqual([reason, expect.objectContaining({ success: false, errorReason: reason, transaction: "" })]);
    }
    expect(await onChain(payer.address, signer)).toEqual(before); // no funding, no approval, no settlement
  });
});
