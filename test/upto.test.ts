// `upto` end to end on the devnet: the payer signs a Permit2 ceiling, the resource server charges
// the actual usage (0 ≤ charge ≤ ceiling) after its handler ran. First through the reference stack
// (@x402/express + the reference upto server scheme and settlement overrides, HTTPFacilitatorClient
// pointed at our router, @x402/fetch + the reference upto client), then in the service request
// shape posted straight to the router. Every settlement must come from the advertised
// extra.facilitatorAddress, and balances must move by exactly the charge.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import express from "express";
import type { Server } from "node:http";
import type { AddressInfo } from "node:net";
import { paymentMiddleware, setSettlementOverrides, x402ResourceServer } from "@x402/express";
import { HTTPFacilitatorClient } from "@x402/core/server";
import { decodePaymentRequiredHeader } from "@x402/core/http";
import type { PaymentRequirements, SchemeNetworkClient } from "@x402/core/types";
import { UptoEvmScheme as UptoEvmServer } from "@x402/evm/upto/server";
import { UptoEvmScheme as UptoEvmClient } from "@x402/evm/upto/client";
import { decodePaymentResponseHeader, wrapFetchWithPayment, x402Client } from "@x402/fetch";
import { createPublicClient, getAddress, http, type Address, type Hex } from "viem";
import { generatePrivateKey, privateKeyToAccount } from "viem/accounts";
import { startTestDevnet } from "./helpers/devnet.ts";
import { balanceOf } from "./helpers/chain.ts";
import { postJson } from "./helpers/payments.ts";
import { UPTO_PERMIT2_PROXY_ADDRESS } from "../services/devnet/chain-setup.ts";
import type { DevnetNetwork, RunningDevnet } from "../services/devnet/devnet.ts";
import type { AssetInfo } from "../services/x402/networks.ts";

const NETWORK = "eip155:8453" as const;
const CEILING = 50_000n; // "$0.05" in the 6-decimal devnet USDC
const PARTIAL = 12_345n;

let devnet: RunningDevnet;
let net: DevnetNetwork;
let usdc: AssetInfo;
let server: Server;
let resourceUrl: string;
let facilitatorAddress: Address;
let payer: ReturnType<typeof privateKeyToAccount>;
let payTo: Address;
let chain: ReturnType<typeof createPublicClient>;

beforeAll(async () => {
  devnet = await startTestDevnet([NETWORK]);
  net = devnet.info.networks[0]!;
  usdc = net.assets.find((a) => a.symbol === "USDC")!;
  payer = privateKeyToAccount(devnet.info.payers[0]!.privateKey); // approved Permit2 at setup
  payTo = devnet.info.receivers[0]!.address;
  chain = createPublicClient({ transport: http(net.rpcUrl) });

  const supported = (await (await fetch(`${devnet.info.routerUrl}/supported`)).json()) as { kinds: { scheme: string; network: string; extra?: Record<string, unknown> }[] };
  const kind = supported.kinds.find((k) => k.scheme === "upto" && k.network === NETWORK);
  facilitatorAddress = getAddress(kind!.extra!.facilitatorAddress as string);

  const resourceServer = new x402ResourceServer(new HTTPFacilitatorClient({ url: devnet.info.routerUrl })).register(NETWORK, new UptoEvmServer());
  const accepts = { scheme: "upto", price: "$0.05", network: NETWORK, payTo };
  const app = express();
  app.use(
    paymentMiddleware(
      {
        "GET /partial": { accepts, description: "charges less than the ceiling" },
        "GET /free": { accepts, description: "charges nothing" },
        "GET /over": { accepts, description: "tries to charge more than the ceiling" },
      },
      resourceServer,
    ),
  );
  // The reference settlement-override mechanism: the handler names the actual charge.
  app.get("/partial", (_req, res) => {
    setSettlementOverrides(res, { amount: PARTIAL.toString() });
    res.json({ used: PARTIAL.toString() });
  });
  app.get("/free", (_req, res) => {
    setSettlementOverrides(res, { amount: "0" });
    res.json({ used: "0" });
  });
  app.get("/over", (_req, res) => {
    setSettlementOverrides(res, { amount: (CEILING + 1n).toString() });
    res.json({ used: "too much" });
  });
  server = await new Promise<Server>((resolve) => {
    const s = app.listen(0, "127.0.0.1", () => resolve(s));
  });
  resourceUrl = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});

afterAll(async () => {
  await new Promise((r) => server?.close(r));
  await devnet?.stop();
});

function payingFetch(scheme: SchemeNetworkClient = new UptoEvmClient(payer)) {
  return wrapFetchWithPayment(fetch, x402Client.fromConfig({ schemes: [{ network: NETWORK, client: scheme }] }));
}

const balances = async () => ({ payer: await balanceOf(net.rpcUrl, usdc.address, payer.address), payTo: await balanceOf(net.rpcUrl, usdc.address, payTo) });
const facilitatorNonce = () => chain.getTransactionCount({ address: facilitatorAddress, blockTag: "latest" });
/** Every key of this network's facilitator, pending transactions included: unchanged means nothing was sent. */
const signerNonces = () => Promise.all(net.signers.map((address) => chain.getTransactionCount({ address, blockTag: "pending" })));

/** The settlement transaction: mined, successful, sent by the advertised facilitator address to the upto proxy. */
async function expectSentByFacilitator(hash: string) {
  const receipt = await chain.getTransactionReceipt({ hash: hash as Hex });
  expect(receipt.status).toBe("success");
  expect(getAddress(receipt.from)).toBe(facilitatorAddress);
  expect(getAddress(receipt.to!)).toBe(UPTO_PERMIT2_PROXY_ADDRESS);
  const tx = await chain.getTransaction({ hash: hash as Hex });
  expect(getAddress(tx.from)).toBe(facilitatorAddress);
}

describe("/supported", () => {
  it("advertises upto with one stable extra.facilitatorAddress, a key of this network's facilitator", async () => {
    expect(net.signers).toContain(facilitatorAddress);
    for (let i = 0; i < 3; i++) {
      const again = (await (await fetch(`${devnet.info.routerUrl}/supported`)).json()) as { kinds: { scheme: string; extra?: { facilitatorAddress?: string } }[] };
      expect(again.kinds.find((k) => k.scheme === "upto")!.extra!.facilitatorAddress).toBe(facilitatorAddress);
    }
  });
});

describe("upto through the reference stack (@x402/express + @x402/fetch → our router)", () => {
  it("the 402 offers the ceiling with our facilitatorAddress; the client signs for exactly that key", async () => {
    const r = await fetch(`${resourceUrl}/partial`);
    expect(r.status).toBe(402);
    const required = decodePaymentRequiredHeader(r.headers.get("payment-required")!);
    const accept = required.accepts.find((a) => a.scheme === "upto")!;
    expect(accept).toMatchObject({ network: NETWORK, asset: usdc.address, amount: CEILING.toString(), payTo });
    expect(accept.extra).toMatchObject({ facilitatorAddress, assetTransferMethod: "permit2" });
    const created = await new UptoEvmClient(payer).createPaymentPayload(2, accept);
    const auth = (created.payload as { permit2Authorization: { spender: string; permitted: { amount: string }; witness: { facilitator: string } } }).permit2Authorization;
    expect(auth.spender).toBe(UPTO_PERMIT2_PROXY_ADDRESS);
    expect(auth.permitted.amount).toBe(CEILING.toString());
    expect(getAddress(auth.witness.facilitator)).toBe(facilitatorAddress);
  });

  it("a server charging less than the ceiling: exactly the charge moves, sent from the advertised facilitator", async () => {
    const before = await balances();
    const r = await payingFetch()(`${resourceUrl}/partial`);
    expect(r.status).toBe(200);
    expect(await r.json()).toEqual({ used: PARTIAL.toString() });
    const settled = decodePaymentResponseHeader(r.headers.get("payment-response")!);
    expect(settled).toMatchObject({ success: true, network: NETWORK, amount: PARTIAL.toString() });
    expect(getAddress(settled.payer!)).toBe(payer.address);
    await expectSentByFacilitator(settled.transaction);
    expect(await balances()).toEqual({ payer: before.payer - PARTIAL, payTo: before.payTo + PARTIAL });
  });

  it("a server charging 0: success with no transaction, nothing moves", async () => {
    const [before, nonce] = [await balances(), await facilitatorNonce()];
    const r = await payingFetch()(`${resourceUrl}/free`);
    expect(r.status).toBe(200);
    expect(await r.json()).toEqual({ used: "0" });
    expect(decodePaymentResponseHeader(r.headers.get("payment-response")!)).toMatchObject({ success: true, transaction: "", amount: "0" });
    expect(await balances()).toEqual(before);
    expect(await facilitatorNonce()).toBe(nonce);
  });

  it("a server charging above the ceiling is refused: no resource, no transaction, nothing moves", async () => {
    const [before, nonce] = [await balances(), await facilitatorNonce()];
    const r = await payingFetch()(`${resourceUrl}/over`);
    expect(r.status).toBe(402);
    const settled = decodePaymentResponseHeader(r.headers.get("payment-response")!);
    expect(settled).toMatchObject({ success: false, errorReason: "invalid_upto_evm_payload_settlement_exceeds_amount" });
    expect(settled.transaction ?? "").toBe("");
    expect(await r.text()).not.toContain("too much");
    expect(await balances()).toEqual(before);
    expect(await facilitatorNonce()).toBe(nonce);
  });

  it("a payment naming another witness.facilitator is refused at verify with upto_facilitator_mismatch", async () => {
    const stranger = privateKeyToAccount(generatePrivateKey()).address;
    // The reference client, signing the witness for someone else than the advertised facilitator.
    class Misdirected extends UptoEvmClient {
      override createPaymentPayload(...[version, req, ctx]: Parameters<UptoEvmClient["createPaymentPayload"]>) {
        return super.createPaymentPayload(version, { ...req, extra: { ...req.extra, facilitatorAddress: stranger } }, ctx);
      }
    }
    const misdirected = new Misdirected(payer);
    const [before, nonce] = [await balances(), await facilitatorNonce()];
    const r = await payingFetch(misdirected)(`${resourceUrl}/partial`);
    expect(r.status).toBe(402);
    expect(decodePaymentRequiredHeader(r.headers.get("payment-required")!).error).toBe("upto_facilitator_mismatch");
    expect(await balances()).toEqual(before);
    expect(await facilitatorNonce()).toBe(nonce);
  });
});

describe("upto in the service request shape, posted to the router", () => {
  const requirements = (): PaymentRequirements => ({
    scheme: "upto",
    network: NETWORK,
    asset: usdc.address,
    amount: CEILING.toString(),
    payTo,
    maxTimeoutSeconds: 120,
    extra: { ...usdc.eip712, facilitatorAddress, assetTransferMethod: "permit2" },
  });

  /** The payer's signed ceiling (reference upto client), e.g. for another witness.facilitator. */
  async function signCeiling(facilitator: Address = facilitatorAddress) {
    const req = requirements();
    return (await new UptoEvmClient(payer).createPaymentPayload(2, { ...req, extra: { ...req.extra, facilitatorAddress: facilitator } })).payload;
  }

  /** paymentPayload.{x402Version,scheme,network,payload}, maxAmountRequired: the contract's shape. */
  const body = (payload: object, maxAmountRequired: bigint) => ({
    paymentPayload: { x402Version: 2, scheme: "upto", network: NETWORK, payload },
    paymentRequirements: {
      scheme: "upto",
      network: NETWORK,
      asset: usdc.address,
      payTo,
      maxAmountRequired: maxAmountRequired.toString(),
      resource: "https://api.example.com/llm",
      maxTimeoutSeconds: 120,
    },
  });
  const verify = (b: unknown) => postJson(`${devnet.info.routerUrl}/verify`, b);
  const settle = (b: unknown) => postJson(`${devnet.info.routerUrl}/settle`, b);

  it("/verify takes the ceiling; /settle takes the actual charge, refuses more than the ceiling, answers with amount", async () => {
    const payload = await signCeiling();
    const atCeiling = await verify(body(payload, CEILING));
    expect(atCeiling.status).toBe(200);
    expect(atCeiling.json).toMatchObject({ isValid: true, payer: payer.address });
    // the ceiling is what was signed: verifying the charge instead is refused
    expect((await verify(body(payload, PARTIAL))).json).toMatchObject({ isValid: false, invalidReason: "permit2_amount_mismatch" });

    const [before, nonce] = [await balances(), await facilitatorNonce()];
    const over = await settle(body(payload, CEILING + 1n));
    expect(over.status).toBe(200);
    expect(over.json).toMatchObject({ success: false, errorReason: "invalid_upto_evm_payload_settlement_exceeds_amount", transaction: "" });
    expect(await facilitatorNonce()).toBe(nonce);
    expect(await balances()).toEqual(before);

    // the refusal spent nothing: the same signature still settles the actual charge
    const charge = 31_337n;
    const settled = await settle(body(payload, charge));
    expect(settled.status).toBe(200);
    expect(settled.json).toMatchObject({ success: true, network: NETWORK, payer: payer.address, amount: charge.toString() });
    await expectSentByFacilitator(settled.json.transaction as string);
    expect(await facilitatorNonce()).toBe(nonce + 1);
    expect(await balances()).toEqual({ payer: before.payer - charge, payTo: before.payTo + charge });

    // a retry answers the recorded outcome (same transaction, same amount) and moves nothing more
    expect((await settle(body(payload, charge))).json).toEqual(settled.json);
    expect(await balances()).toEqual({ payer: before.payer - charge, payTo: before.payTo + charge });
  });

  it("0 settles nothing and succeeds with transaction \"\"", async () => {
    const payload = await signCeiling();
    expect((await verify(body(payload, CEILING))).json).toMatchObject({ isValid: true });
    const [before, nonce] = [await balances(), await facilitatorNonce()];
    const settled = await settle(body(payload, 0n));
    expect(settled.json).toMatchObject({ success: true, transaction: "", network: NETWORK, amount: "0" });
    expect(await facilitatorNonce()).toBe(nonce);
    expect(await balances()).toEqual(before);
  });

  it("the whole ceiling settles too", async () => {
    const payload = await signCeiling();
    const before = await balances();
    const settled = await settle(body(payload, CEILING));
    expect(settled.json).toMatchObject({ success: true, amount: CEILING.toString() });
    await expectSentByFacilitator(settled.json.transaction as string);
    expect(await balances()).toEqual({ payer: before.payer - CEILING, payTo: before.payTo + CEILING });
  });

  it("straight to /settle (no /verify): a tampered signature or a ceiling raised after signing → invalid_permit2_signature, nothing sent; the genuine payment still settles", async () => {
    const payload = (await signCeiling()) as { signature: Hex; permit2Authorization: { permitted: { amount: string } } };
    // one byte of s, then one of r, flipped: still 65 bytes, still shaped like a signature
    const flip = (sig: Hex, byte: number) => `${sig.slice(0, 2 + 2 * byte)}${(parseInt(sig.slice(2 + 2 * byte, 4 + 2 * byte), 16) ^ 0x01).toString(16).padStart(2, "0")}${sig.slice(4 + 2 * byte)}` as Hex;
    const raised = { ...payload, permit2Authorization: { ...payload.permit2Authorization, permitted: { ...payload.permit2Authorization.permitted, amount: (CEILING * 100n).toString() } } };
    const hostile: [string, object, bigint][] = [
      ["s tampered", { ...payload, signature: flip(payload.signature, 40) }, PARTIAL],
      ["r tampered", { ...payload, signature: flip(payload.signature, 7) }, PARTIAL],
      ["ceiling raised, charge above the signed ceiling", raised, CEILING * 2n],
      ["ceiling raised, charge within the signed ceiling", raised, PARTIAL],
    ];
    const [before, nonces] = [await balances(), await signerNonces()];
    for (const [what, tampered, charge] of hostile) {
      const r = await settle(body(tampered, charge));
      expect(r.status, what).toBe(200);
      expect(r.json, what).toMatchObject({ success: false, errorReason: "invalid_permit2_signature", transaction: "" });
      expect(await signerNonces(), what).toEqual(nonces);
      expect(await balances(), what).toEqual(before);
    }
    // the refusals spent nothing (not the nonce, not the id): the payer's own signature settles
    const settled = await settle(body(payload, PARTIAL));
    expect(settled.json).toMatchObject({ success: true, amount: PARTIAL.toString() });
    await expectSentByFacilitator(settled.json.transaction as string);
    const after = { payer: before.payer - PARTIAL, payTo: before.payTo + PARTIAL };
    expect(await balances()).toEqual(after);
    // ... and a raised copy of the settled payment is refused, never answered with its record
    const nonces2 = await signerNonces();
    const copy = await settle(body(raised, CEILING * 2n));
    expect(copy.json).toMatchObject({ success: false, errorReason: "permit2_invalid_nonce", transaction: "" });
    expect(await signerNonces()).toEqual(nonces2);
    expect(await balances()).toEqual(after);
  });

  it("a wrong witness.facilitator → upto_facilitator_mismatch at /verify and /settle, no transaction", async () => {
    const stranger = privateKeyToAccount(generatePrivateKey()).address;
    const payload = await signCeiling(stranger);
    const nonce = await facilitatorNonce();
    expect((await verify(body(payload, CEILING))).json).toMatchObject({ isValid: false, invalidReason: "upto_facilitator_mismatch", payer: payer.address });
    expect((await settle(body(payload, PARTIAL))).json).toMatchObject({ success: false, errorReason: "upto_facilitator_mismatch", transaction: "" });
    expect(await facilitatorNonce()).toBe(nonce);
  });
});
