// The fast EIP-3009 verification path answers exactly as the reference mechanism does, case by
// case, on a real chain; and it needs at most one RPC round trip per verify in steady state.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { pino } from "pino";
import { ExactEvmScheme } from "@x402/evm/exact/facilitator";
import { generatePrivateKey, privateKeyToAccount } from "viem/accounts";
import type { Address, Hex } from "viem";
import type { PaymentPayload, PaymentRequirements } from "@x402/core/types";
import { startAnvil, type AnvilNode } from "../services/devnet/anvil.ts";
import { setupDevnetChain } from "../services/devnet/chain-setup.ts";
import { networkInfo } from "../services/x402/networks.ts";
import { createChainClient } from "../services/facilitator/chain.ts";
import { createMetrics } from "../services/platform/metrics.ts";
import { openDatabase, migrate, type Database } from "../services/platform/storage.ts";
import { SETTLEMENT_MIGRATIONS, createSettlementStore } from "../services/facilitator/settlement/store.ts";
import { createOutboxSigner, type OutboxSigner } from "../services/facilitator/settlement/outbox-signer.ts";
import { createFastExactVerifier } from "../services/facilitator/fast-exact.ts";
import { normalizeRequest } from "../services/x402/wire.ts";
import { signEip3009, standardShape, type PaymentSpec } from "./helpers/payments.ts";

const net = networkInfo("eip155:8453")!;
let anvil: AnvilNode;
let db: Database;
let signer: OutboxSigner;
let fast: ReturnType<typeof createFastExactVerifier>;
let reference: ExactEvmScheme;
let metrics: ReturnType<typeof createMetrics>;
const payerKey = generatePrivateKey();
const payTo = privateKeyToAccount(generatePrivateKey()).address;

beforeAll(async () => {
  anvil = await startAnvil({ chainId: net.chainId });
  const signerKey = generatePrivateKey();
  await setupDevnetChain({ rpcUrl: anvil.rpcUrl, chainId: net.chainId, assets: net.assets, gasFunded: [privateKeyToAccount(signerKey).address], payers: [{ privateKey: payerKey, permit2Approved: true }] });
  metrics = createMetrics("facilitator");
  const chain = createChainClient({ chainId: net.chainId, rpcUrls: [anvil.rpcUrl], metrics });
  db = await openDatabase();
  await migrate(db, SETTLEMENT_MIGRATIONS);
  signer = createOutboxSigner({ chain, accounts: [privateKeyToAccount(signerKey)], store: createSettlementStore(db, net.network), receiptTimeoutMs: 5000, confirmations: 1, isFunded: () => true, logger: pino({ level: "silent" }) });
  fast = createFastExactVerifier({ chain, signer });
  reference = new ExactEvmScheme(signer);
});
afterAll(async () => {
  await db?.close();
  await anvil?.stop();
});

const spec = (o: Partial<PaymentSpec> = {}): PaymentSpec => ({ network: net.network, chainId: net.chainId, asset: net.assets[0]!, payerKey, payTo, amount: 1234n, ...o });
const now = () => BigInt(Math.floor(Date.now() / 1000));
function request(body: unknown): { payload: PaymentPayload; requirements: PaymentRequirements } {
  const r = normalizeRequest(body);
  return { payload: r.paymentPayload, requirements: r.paymentRequirements };
}
/** The fast path as the facilitator calls it: the asset's code read first, a watch of its own. */
async function fastVerify(payload: PaymentPayload, requirements: PaymentRequirements) {
  return fast.verify(payload, requirements, { assetCode: await signer.getCode({ address: requirements.asset as Address }), watch: { failed: false } });
}
const withSig = (p: Awaited<ReturnType<typeof signEip3009>>, signature: string) => ({ ...p, signature: signature as Hex });

/** The address with the case of its first letter flipped: no longer its EIP-55 checksum. */
function badChecksum(address: string): string {
  const i = [...address].findIndex((c, k) => k > 1 && /[a-fA-F]/.test(c));
  const c = address[i]!;
  return address.slice(0, i) + (c === c.toUpperCase() ? c.toLowerCase() : c.toUpperCase()) + address.slice(i + 1);
}

describe("fast EIP-3009 verification", () => {
  it("answers exactly as the reference mechanism on every case", async () => {
    const N = 0xfffffffffffffffffffffffffffffffebaaedce6af48a03bbfd25e8cd0364141n;
    const valid = await signEip3009(spec());
    const sigS = BigInt(`0x${valid.signature.slice(66, 130)}`);
    const v = parseInt(valid.signature.slice(130), 16);
    const highS = `0x${valid.signature.slice(2, 66)}${(N - sigS).toString(16).padStart(64, "0")}${(v === 27 ? 28 : 27).toString(16)}`;
    const ghostAsset = { ...net.assets[0]!, address: "0x00000000000000000000000000000000000b0b0b" as Address };
    const cases: [string, unknown][] = [
      ["valid", standardShape(spec(), valid)],
      ["wrong recipient", standardShape(spec(), await signEip3009(spec({ auth: { to: privateKeyToAccount(generatePrivateKey()).address } })))],
      ["expired", standardShape(spec(), await signEip3009(spec({ auth: { validBefore: now() - 1n } })))],
      ["not yet valid", standardShape(spec(), await signEip3009(spec({ auth: { validAfter: now() + 999n } })))],
      ["value mismatch", standardShape(spec(), await signEip3009(spec({ auth: { value: 1n } })))],
      ["other signer", standardShape(spec(), await signEip3009(spec({ payerKey: generatePrivateKey(), auth: { from: privateKeyToAccount(payerKey).address } })))],
      ["tampered nonce", standardShape(spec(), { ...valid, authorization: { ...valid.authorization, nonce: `0x${"cd".repeat(32)}` } })],
      ["high-s twin", standardShape(spec(), withSig(valid, highS))],
      ["v = 29", standardShape(spec(), withSig(valid, `${valid.signature.slice(0, 130)}1d`))],
      ["zero signature", standardShape(spec(), withSig(valid, `0x${"00".repeat(65)}`))],
      ["no balance", standardShape(spec({ payerKey: generatePrivateKey() }), await signEip3009(spec({ payerKey: generatePrivateKey() })))],
      ["unfunded payer", (() => { const k = generatePrivateKey(); return signEip3009(spec({ payerKey: k })).then((p) => standardShape(spec({ payerKey: k }), p)); })()],
      ["asset without code", standardShape(spec({ asset: ghostAsset }), await signEip3009(spec({ asset: ghostAsset })))],
      ["wrong token name", standardShape(spec({ asset: { ...net.assets[0]!, eip712: { name: "Other", version: "2" } } }), await signEip3009(spec({ asset: { ...net.assets[0]!, eip712: { name: "Other", version: "2" } } })))],
      // A mixed-case recipient with a broken EIP-55 checksum (one letter's case flipped).
      ["bad checksum", standardShape(spec(), { ...valid, authorization: { ...valid.authorization, to: badChecksum(valid.authorization.to) } })],
      ["missing domain", { ...standardShape(spec(), valid), paymentRequirements: { ...standardShape(spec(), valid).paymentRequirements, extra: {} } }],
    ];
    const accepted = standardShape(spec(), valid);
    cases.push(["network mismatch", { ...accepted, paymentPayload: { ...accepted.paymentPayload, accepted: { ...accepted.paymentRequirements, network: "eip155:137" } } }]);
    cases.push(["scheme mismatch", { ...accepted, paymentPayload: { ...accepted.paymentPayload, accepted: { ...accepted.paymentRequirements, scheme: "upto" } } }]);

    const seen = new Set<string>();
    const verdict = (r: { isValid: boolean; invalidReason?: string; payer?: string } | undefined) => r && { isValid: r.isValid, invalidReason: r.invalidReason, payer: r.payer };
    const judged: { name: string; payload: PaymentPayload; requirements: PaymentRequirements; expected: ReturnType<typeof verdict> }[] = [];
    for (const [name, body] of cases) {
      const { payload, requirements } = request(await body);
      const expected = verdict(await reference.verify(payload, requirements));
      const actual = await fastVerify(payload, requirements);
      expect(actual, name).toBeDefined();
      expect(verdict(actual), name).toEqual(expected);
      seen.add(String(expected!.invalidReason));
      judged.push({ name, payload, requirements, expected });
    }
    expect(seen.size).toBeGreaterThanOrEqual(10); // the cases really reach different reasons

    // All at once: their simulations share round trips (JSON-RPC batches); each keeps its own verdict.
    const batches = async () => Number(/method="batch",[^}]*\} (\d+)/.exec(await metrics.registry.getSingleMetricAsString("x402_rpc_requests_total"))?.[1] ?? 0);
    const batchesBefore = await batches();
    const together = await Promise.all(judged.map((j) => fastVerify(j.payload, j.requirements)));
    judged.forEach((j, i) => expect(verdict(together[i]), `${j.name}, verified with the others`).toEqual(j.expected));
    expect(await batches()).toBeGreaterThan(batchesBefore);
  });

  it("leaves contract-wallet signatures and Permit2 to the reference", async () => {
    const valid = await signEip3009(spec());
    const { payload, requirements } = request(standardShape(spec(), { ...valid, signature: `0x${"ab".repeat(100)}` }));
    expect(await fastVerify(payload, requirements)).toBeUndefined();
  });

  it("leaves a domain of anything but strings to the reference, and it never changes a later payment's verdict", async () => {
    const valid = await signEip3009(spec());
    const shaped = standardShape(spec(), valid);
    const { version } = shaped.paymentRequirements.extra as { version: string };
    // ["2"] reads like "2" but hashes as the byte 0x02: once it poisoned the token's cached domain.
    const odd = request({ ...shaped, paymentRequirements: { ...shaped.paymentRequirements, extra: { ...shaped.paymentRequirements.extra, version: [version] } } });
    expect(await fastVerify(odd.payload, odd.requirements)).toBeUndefined();
    const { payload, requirements } = request(shaped);
    expect(await fastVerify(payload, requirements)).toMatchObject({ isValid: true });
  });

  it("needs at most one RPC round trip per verify once the payer is classified", async () => {
    const bodies = await Promise.all(Array.from({ length: 20 }, () => signEip3009(spec()).then((p) => request(standardShape(spec(), p)))));
    await fastVerify(bodies[0]!.payload, bodies[0]!.requirements); // warms the payer's classification
    // The signer's background reads of fees and the head (once a second while payments come in) are not the verification's.
    const background = /method="(eth_getBlockByNumber|eth_maxPriorityFeePerGas)"/;
    const count = async () => (await metrics.registry.getSingleMetricAsString("x402_rpc_requests_total")).split("\n").filter((l) => !l.startsWith("#") && !background.test(l)).reduce((sum, l) => sum + Number(l.split(" ").pop()), 0);
    const before = await count();
    for (const b of bodies) expect((await fastVerify(b.payload, b.requirements))!.isValid).toBe(true);
    expect((await count()) - before).toBeLessThanOrEqual(bodies.length);
  });
});
