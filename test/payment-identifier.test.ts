// The payment-identifier extension (an idempotency id from the client), judged on chain: a retried
// /settle with the same id and payment gets the very same answer and moves the money once; the same
// id on a different payment is refused (409) at /verify and /settle and nothing is sent; /verify
// never binds an id (it is read-only), nor does a refused payment; a malformed id is a 400. Ids are
// per payer: another payer's use of the same id never blocks this payer's payment, nor does a
// batch-settlement sweep or refund, which someone other than the payer sends.
import { randomBytes } from "node:crypto";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createPublicClient, http, type Address, type Hex } from "viem";
import { generatePrivateKey, privateKeyToAccount, type PrivateKeyAccount } from "viem/accounts";
import { x402Client } from "@x402/core/client";
import type { PaymentPayload, PaymentRequired } from "@x402/core/types";
import { BATCH_SETTLEMENT_DOMAIN, claimBatchTypes, refundTypes } from "@x402/evm";
import { ExactEvmScheme as ExactEvmClient } from "@x402/evm/exact/client";
import { BatchSettlementEvmScheme as BatchClient, InMemoryClientChannelStorage, computeChannelId } from "@x402/evm/batch-settlement/client";
import { appendPaymentIdentifierToExtensions, declarePaymentIdentifierExtension, generatePaymentId } from "@x402/extensions/payment-identifier";
import type { RunningDevnet } from "../services/devnet/devnet.ts";
import { startTestDevnet } from "./helpers/devnet.ts";
import { balanceOf } from "./helpers/chain.ts";
import { postJson } from "./helpers/payments.ts";
import { BATCH_SETTLEMENT_ADDRESS } from "../services/devnet/chain-setup.ts";
import { migrate, openDatabase, type Database } from "../services/platform/storage.ts";
import { SETTLEMENT_MIGRATIONS, createSettlementStore } from "../services/facilitator/settlement/store.ts";
import { DATABASE_URL, ENGINES } from "./helpers/settlement-rig.ts";

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
  return paymentFrom(privateKeyToAccount(devnet.info.payers[payer]!.privateKey), amount, id);
}

/** A reference client's EIP-3009 payment of `amount` from `account`, carrying payment identifier `id`. */
async function paymentFrom(account: PrivateKeyAccount, amount: string, id: string) {
  const requirements = { scheme: "exact", network: "eip155:8453" as const, asset: usdc().address, amount, payTo: devnet.info.receivers[0]!.address, maxTimeoutSeconds: 300, extra: { name: usdc().eip712!.name, version: usdc().eip712!.version } };
  const paymentRequired = { x402Version: 2, resource: { url: "https://api.example.com/report" }, accepts: [requirements], extensions: { "payment-identifier": declarePaymentIdentifierExtension() } } as unknown as PaymentRequired;
  const client = x402Client.fromConfig({ schemes: [{ network: "eip155:*", client: new ExactEvmClient(account) }] });
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

// ------------------------------------------------------------------ batch-settlement payloads

const NETWORK = "eip155:8453" as const;

/** batch-settlement requirements of a channel to `receiver`, whose receiver authorizer the channel's opener names. */
const batchRequirements = (receiver: Address, authorizer: Address) => ({
  scheme: "batch-settlement",
  network: NETWORK,
  asset: usdc().address,
  amount: "1000",
  payTo: receiver,
  maxTimeoutSeconds: 300,
  extra: { ...usdc().eip712!, receiverAuthorizer: authorizer, withdrawDelay: 900 },
});

function batchBody(payload: object, requirements: ReturnType<typeof batchRequirements>, id?: string) {
  const extensions = id ? { extensions: appendPaymentIdentifierToExtensions({ "payment-identifier": declarePaymentIdentifierExtension() }, id) } : {};
  return { x402Version: 2, paymentPayload: { x402Version: 2, accepted: requirements, payload, ...extensions }, paymentRequirements: requirements };
}

const batchDomain = { ...BATCH_SETTLEMENT_DOMAIN, chainId: 8453, verifyingContract: BATCH_SETTLEMENT_ADDRESS };

/** `payer` opens a channel to `receiver` with a deposit (reference client), settled through the router. */
async function openChannel(payer: PrivateKeyAccount, receiver: Address, authorizer: PrivateKeyAccount) {
  const requirements = batchRequirements(receiver, authorizer.address);
  const client = new BatchClient(payer, { salt: generatePrivateKey(), storage: new InMemoryClientChannelStorage() });
  const deposit = (await client.createPaymentPayload(2, requirements)).payload as { channelConfig: Parameters<typeof computeChannelId>[0]; voucher: { channelId: Hex; maxClaimableAmount: string; signature: Hex } };
  expect((await postJson(`${devnet.info.routerUrl}/settle`, batchBody(deposit, requirements))).json).toMatchObject({ success: true });
  return { requirements, config: deposit.channelConfig, voucher: deposit.voucher, id: computeChannelId(deposit.channelConfig, NETWORK) };
}

describe("batch-settlement payloads never bind an id in a payer's scope", () => {
  it("a sweep anyone may send for a receiver does not take that receiver's id: its own EIP-3009 payment with the id settles", async () => {
    const router = devnet.info.routerUrl;
    const victim = privateKeyToAccount(devnet.info.payers[0]!.privateKey); // pays with EIP-3009, and is a batch receiver too
    const attacker = privateKeyToAccount(devnet.info.payers[1]!.privateKey);
    const attackersAuthorizer = privateKeyToAccount(generatePrivateKey()); // a channel's opener names its receiver authorizer
    const id = generatePaymentId(); // the victim's, learned by the attacker

    // The attacker opens a channel to the victim, claims its own voucher and sweeps it to the victim, with the victim's id.
    const ch = await openChannel(attacker, victim.address, attackersAuthorizer);
    const amount = BigInt(ch.voucher.maxClaimableAmount);
    const claimAuthorizerSignature = await attackersAuthorizer.signTypedData({
      domain: batchDomain,
      types: claimBatchTypes,
      primaryType: "ClaimBatch",
      message: { claims: [{ channelId: ch.id, maxClaimableAmount: amount, totalClaimed: amount }] },
    });
    const claims = [{ voucher: { channel: ch.config, maxClaimableAmount: amount.toString() }, signature: ch.voucher.signature, totalClaimed: amount.toString() }];
    expect((await postJson(`${router}/settle`, batchBody({ type: "claim", claims, claimAuthorizerSignature }, ch.requirements))).json).toMatchObject({ success: true });
    const victimBefore = await balanceOf(net().rpcUrl, usdc().address, victim.address);
    const sweep = batchBody({ type: "settle", receiver: victim.address, token: usdc().address }, ch.requirements, id);
    const swept = await postJson(`${router}/settle`, sweep);
    expect(swept.json).toMatchObject({ success: true, transaction: expect.stringMatching(/^0x[0-9a-f]{64}$/) });
    expect(await balanceOf(net().rpcUrl, usdc().address, victim.address)).toBe(victimBefore + amount);

    // A retried sweep with its id is the same settlement: the same answer, nothing sent.
    const before = await chainState();
    expect((await postJson(`${router}/settle`, sweep)).json).toEqual(swept.json);
    expect(await chainState()).toEqual(before);

    // The victim's own payment with its id: verified and settled, the payee paid.
    const genuine = await paymentFrom(victim, "5100", id);
    expect((await postJson(`${router}/verify`, genuine)).json).toMatchObject({ isValid: true });
    const settled = await postJson(`${router}/settle`, genuine);
    expect(settled.status).toBe(200);
    expect(settled.json).toMatchObject({ success: true, payer: victim.address });
    expect(await chainState()).toEqual({ received: before.received + 5100n, sent: before.sent + 1 });
  });

  it("a refund its receiver's authorizer signs does not take the channel payer's id: the payer's EIP-3009 payment with the id settles", async () => {
    const router = devnet.info.routerUrl;
    const payer = privateKeyToAccount(devnet.info.payers[0]!.privateKey);
    const receiver = privateKeyToAccount(generatePrivateKey()).address; // a service the payer paid through a channel
    const receiversAuthorizer = privateKeyToAccount(generatePrivateKey());
    const id = generatePaymentId(); // the payer's, learned by the receiver

    const ch = await openChannel(payer, receiver, receiversAuthorizer);
    const payerBefore = await balanceOf(net().rpcUrl, usdc().address, payer.address);
    // The receiver's authorizer claims 1 of the payer's voucher and refunds 1 of the rest, with the payer's id.
    const max = BigInt(ch.voucher.maxClaimableAmount);
    const claims = [{ voucher: { channel: ch.config, maxClaimableAmount: max.toString() }, signature: ch.voucher.signature, totalClaimed: "1" }];
    const claimAuthorizerSignature = await receiversAuthorizer.signTypedData({ domain: batchDomain, types: claimBatchTypes, primaryType: "ClaimBatch", message: { claims: [{ channelId: ch.id, maxClaimableAmount: max, totalClaimed: 1n }] } });
    const refundAuthorizerSignature = await receiversAuthorizer.signTypedData({ domain: batchDomain, types: refundTypes, primaryType: "Refund", message: { channelId: ch.id, nonce: 0n, amount: 1n } });
    const refund = { type: "refund", channelConfig: ch.config, voucher: ch.voucher, amount: "1", refundNonce: "0", claims, claimAuthorizerSignature, refundAuthorizerSignature };
    expect((await postJson(`${router}/settle`, batchBody(refund, ch.requirements, id))).json).toMatchObject({ success: true, transaction: expect.stringMatching(/^0x[0-9a-f]{64}$/) });
    expect(await balanceOf(net().rpcUrl, usdc().address, payer.address)).toBe(payerBefore + 1n);

    const before = await chainState();
    const genuine = await paymentFrom(payer, "5200", id);
    expect((await postJson(`${router}/verify`, genuine)).json).toMatchObject({ isValid: true });
    const settled = await postJson(`${router}/settle`, genuine);
    expect(settled.status).toBe(200);
    expect(settled.json).toMatchObject({ success: true, payer: payer.address });
    expect(await chainState()).toEqual({ received: before.received + 5200n, sent: before.sent + 1 });
  });
});

// ------------------------------------------------------------------ the store's key, on both engines

describe.each(ENGINES)("identifier scopes in the store (%s)", (engine) => {
  it("migration 011 keeps payers' own bindings under payer:<from> and drops those of sweeps, claims and refunds; scopes never meet", async () => {
    // A database of the test's own, migrated as a release with 010 left it.
    let db: Database;
    let dropDatabase = async () => {};
    const upTo010 = SETTLEMENT_MIGRATIONS.slice(0, SETTLEMENT_MIGRATIONS.findIndex((m) => m.id === "settlement/011_identifier_scope"));
    if (engine === "postgres") {
      const name = `x402_idscope_${randomBytes(6).toString("hex")}`;
      const admin = await openDatabase({ url: DATABASE_URL });
      await admin.query(`CREATE DATABASE ${name}`);
      const url = new URL(DATABASE_URL!);
      url.pathname = `/${name}`;
      db = await openDatabase({ url: url.toString(), migrations: upTo010 });
      dropDatabase = async () => {
        await admin.query(`DROP DATABASE ${name}`);
        await admin.close();
      };
    } else {
      db = await openDatabase({ dataDir: join(devnet.dir, `idscope-${randomBytes(4).toString("hex")}`), migrations: upTo010 });
    }
    try {
      const [payer, receiver] = ["0xaAaAaAaaAaAaAaaAaAAAAAAAAaaaAaAaAaaAaaAa", "0xbBbBBBBbbBBBbbbBbbBbbbbBBbBbbbbBbBbbBBbB"];
      const payment = (id: string, scheme: string, p: string | null, reservedPayer: string | null) =>
        db.query(`INSERT INTO settlement_payments (network, payment_id, scheme, payer, reserved_payer, state, response, digest) VALUES ('n', $1, $2, $3, $4, 'succeeded', '{}', 'd')`, [id, scheme, p, reservedPayer]);
      const binding = (identifier: string, scope: string, paymentId: string) =>
        db.query(`INSERT INTO settlement_payment_identifiers (network, payer, identifier, payment_id, digest) VALUES ('n', $1, $2, $3, 'd')`, [scope, identifier, paymentId]);
      await payment("exact-1", "exact", payer, payer);
      await binding("id-exact", payer.toLowerCase(), "exact-1");
      await payment("deposit-1", "batch-settlement", null, payer);
      await binding("id-deposit", payer.toLowerCase(), "deposit-1");
      await payment("refund-1", "batch-settlement", null, null); // bound under the channel's payer by its receiver
      await binding("id-refund", payer.toLowerCase(), "refund-1");
      await binding("id-sweep", receiver.toLowerCase(), "sweep-1"); // a sweep's binding names no payment row (its row is the unique id)
      await binding("id-claim", "", "claim-1");

      const through011 = SETTLEMENT_MIGRATIONS.slice(0, SETTLEMENT_MIGRATIONS.findIndex((m) => m.id === "settlement/011_identifier_scope") + 1);
      expect(await migrate(db, through011)).toEqual(["settlement/011_identifier_scope"]);
      const rows = await db.query<{ scope: string; identifier: string }>(`SELECT scope, identifier FROM settlement_payment_identifiers WHERE network = 'n' ORDER BY identifier`);
      expect(rows).toEqual([
        { scope: `payer:${payer.toLowerCase()}`, identifier: "id-deposit" },
        { scope: `payer:${payer.toLowerCase()}`, identifier: "id-exact" },
      ]);

      // The same id in a refund's scope and in the payer's: two bindings, neither sees the other.
      const store = createSettlementStore(db, "n");
      const refundScope = `refund:${receiver.toLowerCase()}:${payer.toLowerCase()}`;
      expect(await store.bindIdentifier("id-exact", refundScope, "refund-2", "d2")).toEqual({ paymentId: "refund-2", digest: "d2" });
      expect(await store.identifierBinding("id-exact", `payer:${payer.toLowerCase()}`)).toEqual({ paymentId: "exact-1", digest: "d" });
      expect(await store.identifierBinding("id-exact", refundScope)).toEqual({ paymentId: "refund-2", digest: "d2" });
    } finally {
      await db.close();
      await dropDatabase();
    }
  });
});
