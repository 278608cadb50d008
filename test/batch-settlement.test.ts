// `batch-settlement` end to end on the devnet, through the reference client and server
// (@x402/evm/batch-settlement/client and /server, @x402/express, @x402/fetch) against our router:
// payers open channels with one deposit each, then pay with signed vouchers that cost no
// transaction; the receiver claims every channel in one transaction, sweeps the claimed funds in
// one more, and refunds return the unspent rest to the payers. Then the reference verify codes for
// bad vouchers and deposits, and a facilitator holding the receiver-authorizer key.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import express from "express";
import { createHash, randomBytes } from "node:crypto";
import { writeFile } from "node:fs/promises";
import type { Server } from "node:http";
import type { AddressInfo } from "node:net";
import { join } from "node:path";
import { pino } from "pino";
import { paymentMiddleware, setSettlementOverrides, x402ResourceServer } from "@x402/express";
import { HTTPFacilitatorClient } from "@x402/core/server";
import { decodePaymentRequiredHeader } from "@x402/core/http";
import type { PaymentRequirements } from "@x402/core/types";
import { BATCH_SETTLEMENT_DOMAIN, claimBatchTypes, type AuthorizerSigner, type ChannelConfig } from "@x402/evm";
import { BatchSettlementEvmScheme as BatchServer, InMemoryChannelStorage } from "@x402/evm/batch-settlement/server";
import { BatchSettlementEvmScheme as BatchClient, InMemoryClientChannelStorage, computeChannelId, signVoucher } from "@x402/evm/batch-settlement/client";
import { decodePaymentResponseHeader, wrapFetchWithPayment, x402Client } from "@x402/fetch";
import {
  createPublicClient,
  createTestClient,
  decodeEventLog,
  decodeFunctionData,
  getAddress,
  http,
  recoverTypedDataAddress,
  type Abi,
  type Address,
  type Hex,
  type TransactionReceipt,
} from "viem";
import { generatePrivateKey, privateKeyToAccount, type PrivateKeyAccount } from "viem/accounts";
import { startTestDevnet } from "./helpers/devnet.ts";
import { balanceOf } from "./helpers/chain.ts";
import { postJson } from "./helpers/payments.ts";
import { compileDevnetContracts, devnetContract } from "../services/devnet/compile.ts";
import { BATCH_SETTLEMENT_ADDRESS } from "../services/devnet/chain-setup.ts";
import type { DevnetNetwork } from "../services/devnet/devnet.ts";
import { resolveFacilitatorConfig } from "../services/facilitator/config.ts";
import { startFacilitatorService } from "../services/facilitator/service.ts";
import type { AssetInfo } from "../services/x402/networks.ts";

const NETWORK = "eip155:8453" as const;
const CHAIN_ID = 8453;
const PRICE = 1_000n; // per request, in the 6-decimal devnet USDC ($0.001)
const MIN_DEPOSIT = 100_000n; // announced by the server: one deposit covers every request of a channel
const WITHDRAW_DELAY = 900;

let devnet: Awaited<ReturnType<typeof startTestDevnet>>;
let net: DevnetNetwork;
let usdc: AssetInfo;
let batchAbi: Abi;
let chain: ReturnType<typeof createPublicClient>;
let facilitatorSigner: Address;
const closers: (() => Promise<unknown>)[] = [];

beforeAll(async () => {
  devnet = await startTestDevnet([NETWORK]);
  net = devnet.info.networks[0]!;
  usdc = net.assets.find((a) => a.symbol === "USDC")!;
  facilitatorSigner = net.signers[0]!;
  chain = createPublicClient({ transport: http(net.rpcUrl) });
  batchAbi = devnetContract(await compileDevnetContracts(), "DevnetBatchSettlement").abi;
});

afterAll(async () => {
  for (const close of closers.reverse()) await close().catch(() => undefined);
  await devnet?.stop();
});

// ------------------------------------------------------------------ helpers

const authorizerSigner = (account: PrivateKeyAccount): AuthorizerSigner => ({ address: account.address, signTypedData: (p) => account.signTypedData(p as never) });
const nonceOf = (address: Address) => chain.getTransactionCount({ address, blockTag: "latest" });
const blockNumber = () => chain.getBlockNumber({ cacheTime: 0 }); // viem caches the block number by default

/** Every transaction mined in the blocks after `from` up to `to` (anvil mines only when a transaction arrives). */
async function transactionsBetween(from: bigint, to: bigint): Promise<{ from: Address; to: Address | null; hash: Hex }[]> {
  const txs: { from: Address; to: Address | null; hash: Hex }[] = [];
  for (let n = from + 1n; n <= to; n++) {
    const block = await chain.getBlock({ blockNumber: n, includeTransactions: true });
    for (const tx of block.transactions) txs.push({ from: getAddress(tx.from), to: tx.to ? getAddress(tx.to) : null, hash: tx.hash });
  }
  return txs;
}

/** The reference facilitator client, sending a bearer token on every call when given one. */
function facilitatorClient(url: string, token?: string): HTTPFacilitatorClient {
  const headers: Record<string, string> = token ? { Authorization: `Bearer ${token}` } : {};
  return new HTTPFacilitatorClient({ url, ...(token ? { createAuthHeaders: async () => ({ verify: headers, settle: headers, supported: headers }) } : {}) });
}

/** A paid resource: charges what the caller asks for (≤ the price) through the reference settlement override. */
async function startResourceServer(opts: { facilitatorUrl: string; receiver: Address; scheme: BatchServer; token?: string }): Promise<string> {
  const resourceServer = new x402ResourceServer(facilitatorClient(opts.facilitatorUrl, opts.token)).register(NETWORK, opts.scheme);
  const app = express();
  app.use(
    paymentMiddleware(
      {
        "GET /api": {
          accepts: {
            scheme: "batch-settlement",
            network: NETWORK,
            payTo: opts.receiver,
            price: { asset: usdc.address, amount: PRICE.toString(), extra: { ...usdc.eip712, minDeposit: MIN_DEPOSIT.toString() } },
          },
          description: "metered api",
        },
      },
      resourceServer,
    ),
  );
  app.get("/api", (req, res) => {
    const charge = typeof req.query.charge === "string" ? req.query.charge : undefined;
    if (charge !== undefined) setSettlementOverrides(res, { amount: charge });
    res.json({ charged: charge ?? PRICE.toString() });
  });
  const server = await new Promise<Server>((resolve) => {
    const s = app.listen(0, "127.0.0.1", () => resolve(s));
  });
  closers.push(() => new Promise((r) => server.close(r)));
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}/api`;
}

interface Channel {
  payer: PrivateKeyAccount;
  client: BatchClient;
  pay: typeof fetch;
  id: Hex;
  config: ChannelConfig;
  charged: bigint;
}

/** One payer's channel: the reference client with its own salt and storage, behind @x402/fetch. */
function openClient(payer: PrivateKeyAccount, salt: Hex): Omit<Channel, "id" | "config"> {
  const client = new BatchClient(payer, { salt, storage: new InMemoryClientChannelStorage() });
  const pay = wrapFetchWithPayment(fetch, x402Client.fromConfig({ schemes: [{ network: NETWORK, client }] }));
  return { payer, client, pay, charged: 0n };
}

/** One paid request charging `charge`: 200, the resource, and a successful PAYMENT-RESPONSE. */
async function paidRequest(ch: Omit<Channel, "id" | "config">, url: string, charge: bigint) {
  const r = await ch.pay(`${url}?charge=${charge}`);
  expect(r.status).toBe(200);
  expect(await r.json()).toEqual({ charged: charge.toString() });
  const settled = decodePaymentResponseHeader(r.headers.get("payment-response")!);
  expect(settled.success).toBe(true);
  ch.charged += charge;
  return settled;
}

async function channelState(id: Hex): Promise<{ balance: bigint; totalClaimed: bigint }> {
  const [balance, totalClaimed] = (await chain.readContract({ address: BATCH_SETTLEMENT_ADDRESS, abi: batchAbi, functionName: "channels", args: [id] })) as [bigint, bigint];
  return { balance, totalClaimed };
}

function batchEvents(receipt: TransactionReceipt) {
  return receipt.logs
    .filter((l) => getAddress(l.address) === BATCH_SETTLEMENT_ADDRESS)
    .map((l) => decodeEventLog({ abi: batchAbi, data: l.data, topics: l.topics }) as unknown as { eventName: string; args: Record<string, unknown> });
}

/** Who signed the ClaimBatch of a claimWithSignature transaction (the receiver authorizer the contract accepted). */
async function claimBatchSigner(hash: Hex): Promise<{ functionName: string; rows: number; signer?: Address }> {
  const tx = await chain.getTransaction({ hash });
  const call = decodeFunctionData({ abi: batchAbi, data: tx.input });
  if (call.functionName !== "claimWithSignature") return { functionName: call.functionName, rows: 0 };
  const [rows, signature] = call.args as unknown as [{ voucher: { channel: ChannelConfig; maxClaimableAmount: bigint }; totalClaimed: bigint }[], Hex];
  const signer = await recoverTypedDataAddress({
    domain: { ...BATCH_SETTLEMENT_DOMAIN, chainId: CHAIN_ID, verifyingContract: BATCH_SETTLEMENT_ADDRESS },
    types: claimBatchTypes,
    primaryType: "ClaimBatch",
    message: { claims: rows.map((r) => ({ channelId: computeChannelId(r.voucher.channel, NETWORK), maxClaimableAmount: r.voucher.maxClaimableAmount, totalClaimed: r.totalClaimed })) },
    signature,
  });
  return { functionName: call.functionName, rows: rows.length, signer };
}

/** Valid verifications of batch-settlement payloads counted by this network's facilitator. */
async function validBatchVerifies(): Promise<number> {
  const text = await (await fetch(`${net.adminUrl}/metrics`)).text();
  return text
    .split("\n")
    .filter((l) => l.startsWith("x402_verify_total{") && l.includes('scheme="batch-settlement"') && l.includes('result="valid"'))
    .reduce((sum, l) => sum + Number(l.slice(l.lastIndexOf(" ") + 1)), 0);
}

// ------------------------------------------------------------------ the server-held authorizer (default facilitator)

describe("batch-settlement through the reference client and server, against our router", () => {
  const receiver = privateKeyToAccount(generatePrivateKey()).address; // starts with nothing
  const serverAuthorizer = privateKeyToAccount(generatePrivateKey());
  let scheme: BatchServer;
  let url: string;
  const channels: Channel[] = [];

  beforeAll(async () => {
    // Our facilitator advertises no receiverAuthorizer by default, so the server holds that key.
    // A negative onchainStateTtlMs: the server never trusts its mirror of the channel (by default it
    // checks vouchers itself for a while after a deposit), so every voucher is verified by our facilitator.
    scheme = new BatchServer(receiver, { storage: new InMemoryChannelStorage(), receiverAuthorizerSigner: authorizerSigner(serverAuthorizer), onchainStateTtlMs: -1 });
    url = await startResourceServer({ facilitatorUrl: devnet.info.routerUrl, receiver, scheme });
  });

  it("/supported lists batch-settlement without extra.receiverAuthorizer (no authorizer key configured)", async () => {
    const supported = (await (await fetch(`${devnet.info.routerUrl}/supported`)).json()) as { kinds: { scheme: string; extra?: Record<string, unknown> }[] };
    const kind = supported.kinds.find((k) => k.scheme === "batch-settlement");
    expect(kind).toBeDefined();
    expect(kind!.extra?.receiverAuthorizer).toBeUndefined();
    const r = await fetch(url);
    expect(r.status).toBe(402);
    const accept = decodePaymentRequiredHeader(r.headers.get("payment-required")!).accepts[0]!;
    expect(accept).toMatchObject({ scheme: "batch-settlement", amount: PRICE.toString(), payTo: receiver });
    expect(accept.extra).toMatchObject({ receiverAuthorizer: serverAuthorizer.address, withdrawDelay: WITHDRAW_DELAY, minDeposit: MIN_DEPOSIT.toString() });
  });

  it("4 channels, 100 paid requests: one deposit transaction per channel, none per request; one claim and one settle for all", async () => {
    const payers = devnet.info.payers.map((p) => privateKeyToAccount(p.privateKey));
    const salts = [generatePrivateKey(), generatePrivateKey()];
    const clients = payers.flatMap((p) => salts.map((s) => openClient(p, s))); // 2 payers × 2 channel configs
    const requirements = decodePaymentRequiredHeader((await fetch(url)).headers.get("payment-required")!).accepts[0]!;
    const charge = (c: number, k: number) => PRICE - BigInt((k * 37 + c * 11) % 600); // varies, 401..1000
    const payerBefore = await Promise.all(payers.map((p) => balanceOf(net.rpcUrl, usdc.address, p.address)));
    const [nonce0, block0, verifies0] = [await nonceOf(facilitatorSigner), await blockNumber(), await validBatchVerifies()];

    // Request 1 of each channel opens it: the reference client signs an ERC-3009 deposit of the announced minimum.
    await Promise.all(
      clients.map(async (cl, c) => {
        const settled = await paidRequest(cl, url, charge(c, 0));
        expect(settled.transaction).toMatch(/^0x[0-9a-f]{64}$/);
        const config = cl.client.buildChannelConfig(requirements);
        const id = computeChannelId(config, NETWORK);
        channels[c] = { ...cl, config, id };
        expect(await channelState(id)).toEqual({ balance: MIN_DEPOSIT, totalClaimed: 0n });
      }),
    );
    expect(new Set(channels.map((ch) => ch.id)).size).toBe(4);
    const [nonce1, block1] = [await nonceOf(facilitatorSigner), await blockNumber()];
    expect(nonce1 - nonce0).toBe(4); // the 4 deposits, and nothing else on the chain
    const deposits = await transactionsBetween(block0, block1);
    expect(deposits).toHaveLength(4);
    for (const tx of deposits) expect(tx).toMatchObject({ from: facilitatorSigner, to: BATCH_SETTLEMENT_ADDRESS });

    // Requests 2..25 of each channel: vouchers only, each verified by our facilitator, no transaction.
    await Promise.all(
      channels.map(async (ch, c) => {
        for (let k = 1; k < 25; k++) {
          const settled = await paidRequest(ch, url, charge(c, k));
          expect(settled.transaction).toBe("");
        }
      }),
    );
    expect(await nonceOf(facilitatorSigner)).toBe(nonce1);
    expect(await blockNumber()).toBe(block1);
    expect((await validBatchVerifies()) - verifies0).toBe(100); // 4 deposits + 96 vouchers
    const total = channels.reduce((s, ch) => s + ch.charged, 0n);
    expect(channels.map((ch) => ch.charged).every((x) => x > 24n * 400n && x <= 25n * PRICE)).toBe(true);
    // the payers paid their deposits, nothing else; the receiver has received nothing yet
    for (const [i, p] of payers.entries()) expect(await balanceOf(net.rpcUrl, usdc.address, p.address)).toBe(payerBefore[i]! - 2n * MIN_DEPOSIT);
    expect(await balanceOf(net.rpcUrl, usdc.address, receiver)).toBe(0n);

    // One claim transaction for all 4 channels, relayed by our facilitator with the server authorizer's signature.
    const manager = scheme.createChannelManager(new HTTPFacilitatorClient({ url: devnet.info.routerUrl }), NETWORK, usdc.address);
    const claims = await manager.claim();
    expect(claims).toHaveLength(1);
    expect(claims[0]!.vouchers).toBe(4);
    const claimReceipt = await chain.getTransactionReceipt({ hash: claims[0]!.transaction as Hex });
    expect(claimReceipt.status).toBe("success");
    expect(getAddress(claimReceipt.from)).toBe(facilitatorSigner);
    expect(batchEvents(claimReceipt).map((e) => e.eventName)).toEqual(["Claimed", "Claimed", "Claimed", "Claimed"]);
    expect(await claimBatchSigner(claimReceipt.transactionHash)).toEqual({ functionName: "claimWithSignature", rows: 4, signer: serverAuthorizer.address });
    for (const ch of channels) expect(await channelState(ch.id)).toEqual({ balance: MIN_DEPOSIT, totalClaimed: ch.charged });
    console.log(`batch-settlement: one claim of 4 channels used ${claimReceipt.gasUsed} gas (${claimReceipt.gasUsed / 4n} per channel)`);

    // One settle (sweep) transaction: the receiver gets exactly the sum of the charges.
    const swept = await manager.settle();
    const settleReceipt = await chain.getTransactionReceipt({ hash: swept.transaction as Hex });
    expect(settleReceipt.status).toBe("success");
    expect(batchEvents(settleReceipt)).toEqual([{ eventName: "Settled", args: expect.objectContaining({ receiver, token: usdc.address, amount: total }) }]);
    expect(await balanceOf(net.rpcUrl, usdc.address, receiver)).toBe(total);
    expect(await nonceOf(facilitatorSigner)).toBe(nonce1 + 2);
    expect((await transactionsBetween(block1, await blockNumber())).map((tx) => tx.hash)).toEqual([claimReceipt.transactionHash, settleReceipt.transactionHash]);
    console.log(`batch-settlement: 100 paid requests, ${nonce1 + 2 - nonce0} facilitator transactions (4 deposits, 1 claim, 1 settle); settle used ${settleReceipt.gasUsed} gas`);
  });

  it("refunds return the unspent rest to the payer: asked by the payer (reference client) and by the server", async () => {
    expect(channels).toHaveLength(4);
    const nonce0 = await nonceOf(facilitatorSigner);

    // The payer asks the resource server for its money back (reference client refund flow).
    const ch0 = channels[0]!;
    const rest0 = MIN_DEPOSIT - ch0.charged;
    const before0 = await balanceOf(net.rpcUrl, usdc.address, ch0.payer.address);
    const refunded = await ch0.client.refund(url);
    expect(refunded).toMatchObject({ success: true, network: NETWORK });
    expect(await balanceOf(net.rpcUrl, usdc.address, ch0.payer.address)).toBe(before0 + rest0);
    expect(await channelState(ch0.id)).toEqual({ balance: ch0.charged, totalClaimed: ch0.charged });
    const r0 = await chain.getTransactionReceipt({ hash: refunded.transaction as Hex });
    expect(batchEvents(r0).map((e) => e.eventName)).toContain("Refunded");

    // The server refunds an idle channel of the other payer (reference channel manager).
    const ch2 = channels[2]!;
    expect(ch2.payer.address).not.toBe(ch0.payer.address);
    const rest2 = MIN_DEPOSIT - ch2.charged;
    const before2 = await balanceOf(net.rpcUrl, usdc.address, ch2.payer.address);
    const manager = scheme.createChannelManager(new HTTPFacilitatorClient({ url: devnet.info.routerUrl }), NETWORK, usdc.address);
    const results = await manager.refund([ch2.id]);
    expect(results).toHaveLength(1);
    expect(await balanceOf(net.rpcUrl, usdc.address, ch2.payer.address)).toBe(before2 + rest2);
    expect(await channelState(ch2.id)).toEqual({ balance: ch2.charged, totalClaimed: ch2.charged });

    expect(await nonceOf(facilitatorSigner)).toBe(nonce0 + 2);
  });

  it("reference verify codes: bad voucher signature, above the channel balance, at or below claimed, expired deposit authorization", async () => {
    const ch = channels[1]!; // claimed, not refunded: balance MIN_DEPOSIT, totalClaimed = its charges
    const state = await channelState(ch.id);
    expect(state).toEqual({ balance: MIN_DEPOSIT, totalClaimed: ch.charged });
    const req: PaymentRequirements = {
      scheme: "batch-settlement",
      network: NETWORK,
      asset: usdc.address,
      amount: PRICE.toString(),
      payTo: receiver,
      maxTimeoutSeconds: 60,
      extra: { ...usdc.eip712, receiverAuthorizer: serverAuthorizer.address, withdrawDelay: WITHDRAW_DELAY },
    };
    const body = (payload: object, requirements = req) => ({ x402Version: 2, paymentPayload: { x402Version: 2, accepted: requirements, payload }, paymentRequirements: requirements });
    const voucher = async (max: bigint, signer: PrivateKeyAccount = ch.payer) =>
      body({ type: "voucher", channelConfig: ch.config, voucher: await signVoucher(signer, ch.id, max.toString(), NETWORK) });
    const verify = async (b: unknown) => (await postJson(`${devnet.info.routerUrl}/verify`, b)).json;
    const nonce0 = await nonceOf(facilitatorSigner);

    expect(await verify(await voucher(state.totalClaimed + 1n))).toMatchObject({
      isValid: true,
      extra: { channelId: ch.id, balance: MIN_DEPOSIT.toString(), totalClaimed: state.totalClaimed.toString() },
    });
    const stranger = privateKeyToAccount(generatePrivateKey());
    expect(await verify(await voucher(state.totalClaimed + 1n, stranger))).toMatchObject({ isValid: false, invalidReason: "invalid_batch_settlement_evm_voucher_signature" });
    expect(await verify(await voucher(state.balance + 1n))).toMatchObject({ isValid: false, invalidReason: "invalid_batch_settlement_evm_cumulative_exceeds_balance" });
    expect(await verify(await voucher(state.totalClaimed))).toMatchObject({ isValid: false, invalidReason: "invalid_batch_settlement_evm_cumulative_below_claimed" });
    expect(await verify(await voucher(state.totalClaimed - 1n))).toMatchObject({ isValid: false, invalidReason: "invalid_batch_settlement_evm_cumulative_below_claimed" });

    // ERC-3009 deposit authorizations (reference client) that expired a minute ago, or expire within a
    // second (before a transaction could be mined): refused at /verify and /settle.
    for (const window of [-60, 1]) {
      const fresh = new BatchClient(ch.payer, { salt: generatePrivateKey(), storage: new InMemoryClientChannelStorage() });
      const deposit = await fresh.createPaymentPayload(2, { ...req, maxTimeoutSeconds: window });
      const p = deposit.payload as { type: string; deposit: { authorization: { erc3009Authorization: { validBefore: string } } } };
      expect(p.type).toBe("deposit");
      expect(Number(p.deposit.authorization.erc3009Authorization.validBefore)).toBeLessThanOrEqual(Math.floor(Date.now() / 1000) + window);
      expect(await verify(body(deposit.payload))).toMatchObject({ isValid: false, invalidReason: "invalid_batch_settlement_evm_payload_authorization_valid_before" });
      const settled = (await postJson(`${devnet.info.routerUrl}/settle`, body(deposit.payload))).json;
      expect(settled).toMatchObject({ success: false, errorReason: "invalid_batch_settlement_evm_payload_authorization_valid_before", transaction: "" });
    }

    expect(await nonceOf(facilitatorSigner)).toBe(nonce0); // nothing refused cost a transaction
  });
});

// ------------------------------------------------------------------ a facilitator holding the receiver-authorizer key

describe("a facilitator configured with a receiver-authorizer key", () => {
  it("advertises extra.receiverAuthorizer and signs claims and refunds only for the receiver, authenticated by its token", async () => {
    // A fresh signer key (funded for gas) and a receiver-authorizer key in a file, as from a mounted Secret.
    const signerKey = generatePrivateKey();
    const signer = privateKeyToAccount(signerKey).address;
    await createTestClient({ mode: "anvil", transport: http(net.rpcUrl) }).setBalance({ address: signer, value: 10n ** 20n });
    const authorizerKey = generatePrivateKey();
    const auth = privateKeyToAccount(authorizerKey);
    const keyFile = join(devnet.dir, "receiver-authorizer.key");
    await writeFile(keyFile, `${authorizerKey}\n`, { mode: 0o600 });
    // The receiver's bearer token, registered by its SHA-256 only.
    const receiver = privateKeyToAccount(generatePrivateKey()).address;
    const token = randomBytes(32).toString("base64url");
    const credentialsFile = join(devnet.dir, "receiver-credentials");
    await writeFile(credentialsFile, `# receiver  sha256(token)\n${receiver} ${createHash("sha256").update(token).digest("hex")}\n`, { mode: 0o600 });
    const config = resolveFacilitatorConfig({
      network: NETWORK,
      rpcUrls: [net.rpcUrl],
      signerKeys: [signerKey],
      receiverAuthorizerKeyFile: keyFile,
      receiverCredentialsFile: credentialsFile,
      host: "127.0.0.1",
      port: 0,
      dataDir: join(devnet.dir, "authorizer-facilitator"),
    });
    expect(config.receiverAuthorizerKey).toBe(authorizerKey);
    const facilitator = await startFacilitatorService(config, pino({ level: "silent" }));
    closers.push(() => facilitator.close());

    const supported = (await (await fetch(`${facilitator.url}/supported`)).json()) as { kinds: { scheme: string; extra?: Record<string, unknown> }[] };
    expect(supported.kinds.find((k) => k.scheme === "batch-settlement")).toMatchObject({ network: NETWORK, extra: { receiverAuthorizer: auth.address } });
    expect(supported.kinds.find((k) => k.scheme === "upto")).toMatchObject({ extra: { facilitatorAddress: signer } });

    // The server delegates the receiver-authorizer role: no key of its own, only its token.
    const scheme = new BatchServer(receiver, { storage: new InMemoryChannelStorage() });
    const url = await startResourceServer({ facilitatorUrl: facilitator.url, receiver, scheme, token });
    const accept = decodePaymentRequiredHeader((await fetch(url)).headers.get("payment-required")!).accepts[0]!;
    expect(accept.extra).toMatchObject({ receiverAuthorizer: auth.address });

    const payer = privateKeyToAccount(devnet.info.payers[1]!.privateKey);
    const ch = openClient(payer, generatePrivateKey());
    for (const c of [900n, 750n, 1000n, 500n, 650n]) await paidRequest(ch, url, c);
    const id = computeChannelId(ch.client.buildChannelConfig(accept), NETWORK);
    expect(await channelState(id)).toEqual({ balance: MIN_DEPOSIT, totalClaimed: 0n });
    const nonce0 = await nonceOf(signer);

    // Without the receiver's token (or with another's), the key signs nothing and nothing is sent.
    for (const [client, status] of [[facilitatorClient(facilitator.url), "401"], [facilitatorClient(facilitator.url, "not-the-token"), "403"]] as const) {
      await expect(scheme.createChannelManager(client, NETWORK, usdc.address).claim()).rejects.toThrow(status);
    }
    expect(await nonceOf(signer)).toBe(nonce0);

    const manager = scheme.createChannelManager(facilitatorClient(facilitator.url, token), NETWORK, usdc.address);
    const claims = await manager.claim();
    expect(claims).toHaveLength(1);
    const claimHash = claims[0]!.transaction as Hex;
    expect(getAddress((await chain.getTransactionReceipt({ hash: claimHash })).from)).toBe(signer);
    // the ClaimBatch signature in the transaction is the facilitator's authorizer key's
    expect(await claimBatchSigner(claimHash)).toEqual({ functionName: "claimWithSignature", rows: 1, signer: auth.address });
    expect(await channelState(id)).toEqual({ balance: MIN_DEPOSIT, totalClaimed: ch.charged });

    await manager.settle();
    expect(await balanceOf(net.rpcUrl, usdc.address, receiver)).toBe(ch.charged);

    // the refund is authorized by the facilitator's key too
    const before = await balanceOf(net.rpcUrl, usdc.address, payer.address);
    expect(await ch.client.refund(url)).toMatchObject({ success: true });
    expect(await balanceOf(net.rpcUrl, usdc.address, payer.address)).toBe(before + MIN_DEPOSIT - ch.charged);
    expect(await nonceOf(signer)).toBe(nonce0 + 3); // claim, settle, refund
  });
});
