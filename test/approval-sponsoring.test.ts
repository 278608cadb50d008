// The erc20ApprovalGasSponsoring extension on the devnet's BNB Smart Chain, judged on chain: a
// payer holding USDT (no EIP-2612, no EIP-3009) but no gas and no Permit2 allowance pays a
// reference @x402/express server through our router with the reference client; the facilitator
// funds exactly what the approval may cost, relays it and settles. A payer who spends the funding
// on something else gets no payment through and is never funded again; approvals that could cost
// more than the bound, or that would not lead to a settlement, are refused before anything is sent.
// One approval is funded once, however many payments carry it and on however many replicas; a payer
// that holds the allowance is not funded; a payer's fundings per day are bounded by default.
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
import { createPublicClient, createTestClient, createWalletClient, encodeFunctionData, erc20Abi, http, keccak256, maxUint256, parseTransaction, type Address, type Hex } from "viem";
import { generatePrivateKey, privateKeyToAccount, type PrivateKeyAccount } from "viem/accounts";
import { pino } from "pino";
import type { RunningDevnet } from "../services/devnet/devnet.ts";
import { facilitatorConfigFromEnv, resolveFacilitatorConfig } from "../services/facilitator/config.ts";
import { startFacilitatorService, type RunningFacilitator } from "../services/facilitator/service.ts";
import type { RoutingTable } from "../services/router/routing-table.ts";
import { startRouterService, type RunningRouter } from "../services/router/service.ts";
import { openDatabase, type Database } from "../services/platform/storage.ts";
import { SETTLEMENT_MIGRATIONS } from "../services/facilitator/settlement/store.ts";
import { startTestDevnet } from "./helpers/devnet.ts";
import { postJson } from "./helpers/payments.ts";
import { DATABASE_URL, ENGINES } from "./helpers/settlement-rig.ts";
import { startRpcFaultProxy, type RpcFaultProxy } from "./helpers/rpc-fault-proxy.ts";
import { until } from "./helpers/wait.ts";

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
    // No daily bounds configured: the defaults, in fundings at the per-payer bound (finite, per network and per payer).
    expect(config.approvalSponsoring).toEqual({ maxApprovalGas: MAX_APPROVAL_GAS, maxFundingWei, dailyFunding: { fundings: 100n }, payerDailyFunding: { fundings: 3n } });
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

// ------------------------------------------------------------------ one funding per approval nonce

describe.each(ENGINES)("erc20ApprovalGasSponsoring funds an approval once (%s store)", (engine) => {
  // The payer's wallet offers 0.5 gwei per gas; the reference client's approval takes 70,000 gas at most.
  const APPROVAL_FEE = 500_000_000n;
  const FUNDING = 70_000n * APPROVAL_FEE;
  const fixedFee = (payer: PrivateKeyAccount, change: Record<string, unknown> = {}) => (info: Record<string, unknown>) => resigned(payer, info, { maxFeePerGas: APPROVAL_FEE, maxPriorityFeePerGas: APPROVAL_FEE, ...change });
  const approvalOf = (body: Awaited<ReturnType<typeof sponsoredBody>>) => (body.paymentPayload.extensions as Record<string, { info: { signedTransaction: Hex } }>).erc20ApprovalGasSponsoring!.info;
  let signer: Address;
  let proxy: RpcFaultProxy;
  let db: Database;
  const facilitators: RunningFacilitator[] = [];

  const pendingNonce = (address: Address) => chain().getTransactionCount({ address, blockTag: "pending" });
  const fundingRows = (payer: Address) =>
    db.query<{ approval_nonce: string; funded_wei: string; state: string }>(`SELECT approval_nonce::text, funded_wei::text, state FROM settlement_gas_fundings WHERE network = $1 AND payer = $2 ORDER BY approval_nonce`, [NETWORK, payer]);

  beforeAll(async () => {
    const key = generatePrivateKey();
    signer = privateKeyToAccount(key).address;
    await createTestClient({ mode: "anvil", transport: http(net().rpcUrl) }).setBalance({ address: signer, value: 10n ** 19n });
    // Counts the facilitators' reads of the chain (nothing is faulted).
    proxy = await startRpcFaultProxy({ upstream: net().rpcUrl });
    // Two replicas on one PostgreSQL; the embedded engine has one writer.
    const dataDir = join(devnet.dir, `once-${engine}`);
    db = await openDatabase(engine === "postgres" ? { url: DATABASE_URL, migrations: SETTLEMENT_MIGRATIONS } : { dataDir, migrations: SETTLEMENT_MIGRATIONS });
    for (let i = 0; i < (engine === "postgres" ? 2 : 1); i++) {
      const config = resolveFacilitatorConfig(
        facilitatorConfigFromEnv({
          X402_ERC20_APPROVAL_SPONSORING: "on",
          // One payer's funding at most what the client's approval costs: the default daily bound of a payer is three of them.
          X402_ERC20_APPROVAL_MAX_FUNDING_WEI: FUNDING.toString(),
          // A shared PostgreSQL holds other runs' fundings of this network today: the network's bound is not under test.
          X402_ERC20_APPROVAL_DAILY_FUNDING_WEI: (10n ** 24n).toString(),
          X402_MAX_FEE_PER_GAS_WEI: "3000000000",
          X402_SCHEMES: "exact",
          X402_BALANCE_REFRESH_MS: "3600000", // no background balance reads among the counted ones
        }),
        { network: NETWORK, rpcUrls: [proxy.url], signerKeys: [key], assets: net().assets, confirmations: 1, host: "127.0.0.1", port: 0, ...(engine === "postgres" ? { databaseUrl: DATABASE_URL } : {}) },
      );
      facilitators.push(await startFacilitatorService(config, pino({ level: "silent" }), engine === "embedded" ? { db } : {}));
    }
  });

  afterAll(async () => {
    await Promise.all(facilitators.map((f) => f.close()));
    await db?.close();
    await proxy?.close();
  });

  it("four payments carrying one approval, settled together on every replica while the funding is unmined: funded once, four settlements", async () => {
    const payer = await gaslessPayer();
    const before = { ...(await onChain(payer.address, signer)), signerPending: await pendingNonce(signer) };
    const bodies = await Promise.all([0, 1, 2, 3].map(() => sponsoredBody(payer, fixedFee(payer))));
    const approval = approvalOf(bodies[0]!).signedTransaction;
    for (const b of bodies) approvalOf(b).signedTransaction = approval; // the same signed approval, four Permit2 nonces
    const test = createTestClient({ mode: "anvil", transport: http(net().rpcUrl) });
    const balanceReads = () => proxy.calls.eth_getBalance ?? 0;
    const readsBefore = balanceReads();
    await test.setAutomine(false);
    let answers: Awaited<ReturnType<typeof postJson>>[];
    try {
      const settling = Promise.all(bodies.map((b, i) => postJson(`${facilitators[i % facilitators.length]!.url}/settle`, b)));
      // Every payment reads the payer's balance (once, when it plans its funding) before any funding is
      // mined: each sees none, and a funding sent meanwhile waits in the pool.
      await until(() => (balanceReads() >= readsBefore + 4 ? true : undefined), "every payment's balance read");
      await test.setAutomine(true);
      await test.mine({ blocks: 1 });
      answers = await settling;
    } finally {
      await test.setAutomine(true);
    }
    const after = await onChain(payer.address, signer);
    const approved = await chain().getTransactionReceipt({ hash: keccak256(approval) });
    expect(after.payerGas).toBe(FUNDING - approved.gasUsed * approved.effectiveGasPrice); // funded once: it kept only the rest of one funding
    expect(await pendingNonce(signer)).toBe(before.signerPending + 5); // one funding, four settlements
    expect(after.payToUsdt).toBe(before.payToUsdt + 4n * AMOUNT);
    for (const a of answers) expect(a.json).toMatchObject({ success: true });
    expect(await fundingRows(payer.address)).toEqual([{ approval_nonce: "0", funded_wei: FUNDING.toString(), state: "approved" }]);
  });

  it("a payer that holds the Permit2 allowance is neither funded nor has its approval relayed", async () => {
    const payer = await gaslessPayer();
    // Signed while it lacks the allowance (the reference client adds no approval once it holds one).
    const body = await sponsoredBody(payer, fixedFee(payer));
    const test = createTestClient({ mode: "anvil", transport: http(net().rpcUrl) });
    await test.setBalance({ address: payer.address, value: 10n ** 16n });
    const own = createWalletClient({ account: payer, transport: http(net().rpcUrl) });
    await chain().waitForTransactionReceipt({ hash: await own.writeContract({ chain: null, address: usdt(), abi: erc20Abi, functionName: "approve", args: [PERMIT2_ADDRESS, maxUint256] }) });
    await test.setBalance({ address: payer.address, value: 0n });
    await resigned(payer, approvalOf(body), { nonce: 1 }); // the payer's next nonce: a valid approval it does not need
    const before = { ...(await onChain(payer.address, signer)), signerPending: await pendingNonce(signer), payerPending: await pendingNonce(payer.address) };
    expect((await postJson(`${facilitators[0]!.url}/verify`, body)).json).toMatchObject({ isValid: true });
    const answer = (await postJson(`${facilitators.at(-1)!.url}/settle`, body)).json;
    const after = await onChain(payer.address, signer);
    expect(after.payerGas).toBe(0n); // not funded
    expect(await pendingNonce(payer.address)).toBe(before.payerPending); // its approval not relayed
    expect(await pendingNonce(signer)).toBe(before.signerPending + 1); // the settlement only
    expect(after.payToUsdt).toBe(before.payToUsdt + AMOUNT);
    expect(answer).toMatchObject({ success: true });
    expect(await fundingRows(payer.address)).toEqual([]);
  });

  it("a payer's fundings stop at the default daily bound (three fundings' worth), with nothing sent past it", async () => {
    const payer = await gaslessPayer();
    // Each approval allows the payment's amount only: the next payment needs a new approval, and gas for it.
    const exactApproval = encodeFunctionData({ abi: erc20Abi, functionName: "approve", args: [PERMIT2_ADDRESS, AMOUNT] });
    let refused: Record<string, unknown> | undefined;
    const approvals: Hex[] = [];
    for (let i = 0; i < 8 && !refused; i++) {
      const body = await sponsoredBody(payer, fixedFee(payer, { data: exactApproval }));
      const nonces = { signer: await pendingNonce(signer), payer: await pendingNonce(payer.address) };
      const answer = (await postJson(`${facilitators[i % facilitators.length]!.url}/settle`, body)).json;
      if (answer.success) {
        approvals.push(keccak256(approvalOf(body).signedTransaction));
        continue;
      }
      refused = answer;
      expect({ signer: await pendingNonce(signer), payer: await pendingNonce(payer.address) }).toEqual(nonces); // nothing funded, relayed or settled
    }
    expect(refused).toMatchObject({ success: false, errorReason: "erc20_approval_daily_bound_reached" });
    const funded = (await fundingRows(payer.address)).reduce((sum, r) => sum + BigInt(r.funded_wei), 0n);
    expect(funded).toBeGreaterThan(0n);
    expect(funded).toBeLessThanOrEqual(3n * FUNDING);
    // What the payer received on chain is what the rows say: its balance plus the gas its approvals burnt.
    let burnt = 0n;
    for (const hash of approvals) {
      const r = await chain().getTransactionReceipt({ hash });
      burnt += r.gasUsed * r.effectiveGasPrice;
    }
    expect((await chain().getBalance({ address: payer.address })) + burnt).toBe(funded);
  });
});
