// The payment-identifier extension (an idempotency id from the client), judged on chain: a retried
// /settle with the same id and payment gets the very same answer and moves the money once; the same
// id on a different payment is refused (409) at /verify and /settle and nothing is sent; /verify
// never binds an id (it is read-only), nor does a refused payment; a malformed id is a 400. Ids are
// per payer: another payer's use of the same id never blocks this payer's payment.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createPublicClient, http, type Address } from "viem";
import { privateKeyToAccount } from "viem/accounts";
import { x402Client } from "@x402/core/client";
import type { PaymentPayload, PaymentRequired } from "@x402/core/types";
import { ExactEvmScheme as ExactEvmClient } from "@x402/evm/exact/client";
import { appendPaymentIdentifierToExtensions, declarePaymentIdentifierExtension, generatePaymentId } from "@x402/extensions/payment-identifier";
import type { RunningDevnet } from "../services/devnet/devnet.ts";
import { startTestDevnet } from "./helpers/devnet.ts";
import { balanceOf } from "./helpers/chain.ts";
import { postJson } from "./helpers/payments.ts";

let devnet: RunningDevnet & { dir: string };

beforeAll(async () => {
  devnet = await startTestDevnet(["eip155:8453"], { hub: false, wallets: false });
});

afterAll(async () => {
  await devnet?.stop();
});

const net = () => devnet.info.networks[0]!;
const usdc = () => net().assets.find((a) => a.transferMethods.includes("eip3009"))!;

/** A reference client's payment of `amount` carrying payment identifier `id` (service-contract body), from the devnet's payer `payer`. */
async function payment(amount: string, id: string, payer = 0) {
  const requirements = { scheme: "exact", network: "eip155:8453" as const, asset: usdc().address, amount, payTo: devnet.info.receivers[0]!.address, maxTimeoutSeconds: 300, extra: { name: usdc().eip712!.name, version: usdc().eip712!.version } };
  const paymentRequired = { x402Version: 2, resource: { url: "https://api.example.com/report" }, accepts: [requirements], extensions: { "payment-identifier": declarePaymentIdentifierExtension() } } as unknown as PaymentRequired;
  const client = x402Client.fromConfig({ schemes: [{ network: "eip155:*", client: new ExactEvmClient(privateKeyToAccount(devnet.info.payers[payer]!.privateKey)) }] });
  const paymentPayload: PaymentPayload = await client.createPaymentPayload(paymentRequired);
  paymentPayload.extensions = appendPaymentIdentifierToExtensions({ ...paymentRequired.extensions }, id);
  return { x402Version: 2, paymentPayload, paymentRequirements: requirements };
}

async function chainState() {
  const client = createPublicClient({ transport: http(net().rpcUrl) });
  const nonces = await Promise.all(net().signers.map((s) => client.getTransactionCount({ address: s as Address })));
  return { received: await balanceOf(net().rpcUrl, usdc().address, devnet.info.receivers[0]!.address), sent: nonces.reduce((a, b) => a + b, 0) };
}

describe("the payment-identifier extension", () => {
  it("a retried payment with the same id gets the same answer and moves the money once; the id on another payment is a 409", async () => {
    const router = devnet.info.routerUrl;
    const id = generatePaymentId();
    const body = await payment("4100", id);
    const before = await chainState();
    const first = await postJson(`${router}/settle`, body);
    expect(first.json).toMatchObject({ success: true, transaction: expect.stringMatching(/^0x[0-9a-f]{64}$/) });
    const again = await postJson(`${router}/settle`, body);
    expect(again.json).toEqual(first.json);
    expect((await postJson(`${router}/verify`, body)).status).toBe(200); // the same payment: no conflict
    expect(await chainState()).toEqual({ received: before.received + 4100n, sent: before.sent + 1 });

    // the same id on a different payment: refused at verify and settle, nothing sent
    const other = await payment("4200", id);
    for (const step of ["verify", "settle"]) {
      const r = await postJson(`${router}/${step}`, other);
      expect(r.status, step).toBe(409);
      expect(r.json.error).toBe(`payment_identifier_conflict: payment identifier ${id} was already used for a different payment; a new payment needs a new id`);
    }
    expect(await chainState()).toEqual({ received: before.received + 4100n, sent: before.sent + 1 });
  });

  it("ids are per payer: another payer binding the id first with a payment of its own that settles never blocks this payer's payment", async () => {
    const router = devnet.info.routerUrl;
    const id = generatePaymentId(); // learned by the attacker (a log, a shared client, a guess)
    const before = await chainState();
    const attackers = await postJson(`${router}/settle`, await payment("4700", id, 1));
    expect(attackers.json).toMatchObject({ success: true });
    expect(await chainState()).toEqual({ received: before.received + 4700n, sent: before.sent + 1 });

    // The genuine payer's payment with the same id: verified and settled, its money moved.
    const genuine = await payment("4800", id, 0);
    expect((await postJson(`${router}/verify`, genuine)).json).toMatchObject({ isValid: true });
    const settled = await postJson(`${router}/settle`, genuine);
    expect(settled.status).toBe(200);
    expect(settled.json).toMatchObject({ success: true, payer: devnet.info.payers[0]!.address });
    expect(await chainState()).toEqual({ received: before.received + 4700n + 4800n, sent: before.sent + 2 });

    // Within each payer the id still names one payment: a new payment of either with it is a 409, nothing sent.
    for (const payer of [0, 1]) {
      const r = await postJson(`${router}/settle`, await payment("4900", id, payer));
      expect(r.status, `payer ${payer}`).toBe(409);
    }
    expect(await chainState()).toEqual({ received: before.received + 4700n + 4800n, sent: before.sent + 2 });
  });

  it("/verify is read-only: an id seen only at /verify binds nothing", async () => {
    const router = devnet.info.routerUrl;
    const id = generatePaymentId();
    expect((await postJson(`${router}/verify`, await payment("4300", id))).json.isValid).toBe(true);
    const before = await chainState();
    const settled = await postJson(`${router}/settle`, await payment("4400", id)); // another payment, the same id: its first settle
    expect(settled.json).toMatchObject({ success: true });
    expect(await chainState()).toEqual({ received: before.received + 4400n, sent: before.sent + 1 });
  });

  it("a refused payment never takes an id: a forged body with the genuine payment's id first, then the genuine one settles", async () => {
    const router = devnet.info.routerUrl;
    const id = generatePaymentId();
    const genuine = await payment("4600", id);
    const forged = structuredClone(genuine);
    (forged.paymentPayload.payload as { signature: string }).signature = `0x${"11".repeat(65)}`;
    const before = await chainState();
    expect((await postJson(`${router}/settle`, forged)).json).toMatchObject({ success: false, transaction: "" });
    expect((await postJson(`${router}/settle`, genuine)).json).toMatchObject({ success: true });
    expect(await chainState()).toEqual({ received: before.received + 4600n, sent: before.sent + 1 });
  });

  it("a malformed id is refused with 400 and nothing is sent", async () => {
    const body = await payment("4500", generatePaymentId());
    (body.paymentPayload.extensions!["payment-identifier"] as { info: { id: string } }).info.id = "short";
    const before = await chainState();
    const r = await postJson(`${devnet.info.routerUrl}/settle`, body);
    expect(r.status).toBe(400);
    expect(r.json.error).toMatch(/^invalid_payload: paymentPayload\.extensions\.payment-identifier: /);
    expect(await chainState()).toEqual(before);
  });
});
