// The payment plan (services/facilitator/plan.ts): every address a payment's transactions pay,
// refund or debit is screened before anything is signed, and the signer admits only the
// transactions the plan names. On chain: a batch-settlement deposit whose channel pays a denied
// receiver (the request's payTo is clean) and a sweep to a denied receiver are refused with nothing
// sent (the signer's nonce, the channel's balance and the payer's balance stay). Then the gate
// itself, on calldata the reference client signed: a transfer to an address the plan does not
// name, a funding of someone else, an unplanned kind or a step sent twice are never admitted.
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { pino } from "pino";
import { createPublicClient, createTestClient, encodeFunctionData, http, parseAbi, type Address, type Hex } from "viem";
import { generatePrivateKey, privateKeyToAccount } from "viem/accounts";
import type { PaymentPayload, PaymentRequirements } from "@x402/core/types";
import { BatchSettlementEvmScheme as BatchClient, InMemoryClientChannelStorage, computeChannelId } from "@x402/evm/batch-settlement/client";
import { startTestDevnet } from "./helpers/devnet.ts";
import { balanceOf } from "./helpers/chain.ts";
import { postJson, serviceShape, signEip3009 } from "./helpers/payments.ts";
import type { RunningDevnet } from "../services/devnet/devnet.ts";
import { BATCH_SETTLEMENT_ADDRESS } from "../services/devnet/chain-setup.ts";
import { resolveFacilitatorConfig } from "../services/facilitator/config.ts";
import { startFacilitatorService, type RunningFacilitator } from "../services/facilitator/service.ts";
import { normalizeRequest } from "../services/x402/wire.ts";
import { admit, planPayment } from "../services/facilitator/plan.ts";

const NETWORK = "eip155:8453" as const;
let devnet: RunningDevnet & { dir: string };
let facilitator: RunningFacilitator;
let signer: Address;
let dir: string;
const denied = privateKeyToAccount(generatePrivateKey()).address;
const clean = privateKeyToAccount(generatePrivateKey()).address;

beforeAll(async () => {
  devnet = await startTestDevnet([NETWORK], { hub: false, wallets: false });
  dir = mkdtempSync(join(tmpdir(), "x402-plan-"));
  const listFile = join(dir, "deny-list.txt");
  writeFileSync(listFile, `${denied}\n`);
  const n = devnet.info.networks[0]!;
  const key = generatePrivateKey();
  signer = privateKeyToAccount(key).address;
  await createTestClient({ mode: "anvil", transport: http(n.rpcUrl) }).setBalance({ address: signer, value: 10n ** 21n });
  const config = resolveFacilitatorConfig({ network: n.network, rpcUrls: [n.facilitatorRpcUrl], signerKeys: [key], assets: n.assets, confirmations: 1, port: 0, schemes: ["exact", "batch-settlement"], denyListFile: listFile, dataDir: join(dir, "store") });
  facilitator = await startFacilitatorService(config, pino({ level: "silent" }));
});

afterAll(async () => {
  await facilitator?.close();
  await devnet?.stop();
  if (dir) rmSync(dir, { recursive: true, force: true });
});

const net = () => devnet.info.networks[0]!;
const usdc = () => net().assets.find((a) => a.symbol === "USDC")!;
const nonce = () => createPublicClient({ transport: http(net().rpcUrl) }).getTransactionCount({ address: signer, blockTag: "pending" });
const channelsAbi = parseAbi(["function channels(bytes32) view returns (uint128 balance, uint128 totalClaimed)"]);

function batchRequirements(payTo: Address): PaymentRequirements {
  return { scheme: "batch-settlement", network: NETWORK, asset: usdc().address, amount: "1000", payTo, maxTimeoutSeconds: 300, extra: { ...usdc().eip712, receiverAuthorizer: privateKeyToAccount(generatePrivateKey()).address, withdrawDelay: 900 } };
}

describe("screening sees every address a batch-settlement transaction pays", () => {
  it("refuses a deposit into a channel whose receiver is denied, though the request's payTo is clean", async () => {
    const payer = privateKeyToAccount(devnet.info.payers[0]!.privateKey);
    const client = new BatchClient(payer, { salt: generatePrivateKey(), storage: new InMemoryClientChannelStorage() });
    // The payer's signed channel pays `denied`; the request names a clean payTo.
    const signed = await client.createPaymentPayload(2, batchRequirements(denied));
    const requirements = batchRequirements(clean);
    const body = { x402Version: 2, paymentPayload: { x402Version: 2, accepted: requirements, payload: signed.payload }, paymentRequirements: requirements };
    const config = (signed.payload as { channelConfig: Parameters<typeof computeChannelId>[0] }).channelConfig;
    expect(config.receiver).toBe(denied);
    const channel = computeChannelId(config, NETWORK);
    const before = { nonce: await nonce(), payer: await balanceOf(net().rpcUrl, usdc().address, payer.address) };

    const verified = (await postJson(`${facilitator.url}/verify`, body)).json;
    expect(verified).toMatchObject({ isValid: false, invalidReason: "payee_denied", invalidMessage: `the payee ${denied} is on this facilitator's deny-list` });
    const settled = (await postJson(`${facilitator.url}/settle`, body)).json;
    expect(settled).toMatchObject({ success: false, errorReason: "payee_denied", transaction: "" });

    // On chain: nothing sent, nothing deposited, nothing taken from the payer.
    expect(await nonce()).toBe(before.nonce);
    const [balance] = await createPublicClient({ transport: http(net().rpcUrl) }).readContract({ address: BATCH_SETTLEMENT_ADDRESS, abi: channelsAbi, functionName: "channels", args: [channel] });
    expect(balance).toBe(0n);
    expect(await balanceOf(net().rpcUrl, usdc().address, payer.address)).toBe(before.payer);
  });

  it("refuses a sweep to a denied receiver", async () => {
    const requirements = batchRequirements(clean);
    const body = { x402Version: 2, paymentPayload: { x402Version: 2, accepted: requirements, payload: { type: "settle", receiver: denied, token: usdc().address } }, paymentRequirements: requirements };
    const before = await nonce();
    expect((await postJson(`${facilitator.url}/settle`, body)).json).toMatchObject({ success: false, errorReason: "payee_denied", transaction: "" });
    expect(await nonce()).toBe(before);
  });
});

describe("the signer admits only what the plan names", () => {
  const eip3009Abi = parseAbi(["function transferWithAuthorization(address from, address to, uint256 value, uint256 validAfter, uint256 validBefore, bytes32 nonce, bytes signature)"]);

  async function exactPlan() {
    const spec = { network: NETWORK, chainId: net().chainId, asset: usdc(), payerKey: devnet.info.payers[0]!.privateKey, payTo: devnet.info.receivers[0]!.address, amount: 1000n };
    const { paymentPayload, paymentRequirements } = normalizeRequest(serviceShape(spec, await signEip3009(spec)));
    const a = (paymentPayload as PaymentPayload).payload.authorization as { from: Address; to: Address; value: string; validAfter: string; validBefore: string; nonce: Hex };
    const p = (paymentPayload as PaymentPayload).payload as { signature: Hex };
    const transfer = (to: Address) => encodeFunctionData({ abi: eip3009Abi, functionName: "transferWithAuthorization", args: [a.from, to, BigInt(a.value), BigInt(a.validAfter), BigInt(a.validBefore), a.nonce, p.signature] });
    return { plan: planPayment(paymentPayload, paymentRequirements, { walletDeployment: false, gasFunding: true }), transfer, payer: a.from, payTo: a.to };
  }

  it("admits the payment's own transfer once, and nothing else", async () => {
    const { plan, transfer, payer, payTo } = await exactPlan();
    const token = usdc().address;
    expect(admit(plan, { kind: "eip3009_transfer", to: token, data: transfer(clean), value: 0n })).toMatch(`pays or debits ${clean}, which this payment's plan does not name`);
    expect(admit(plan, { kind: "gas_funding", to: payer, data: "0x", value: 1n })).toMatch("a gas_funding transaction is not in this payment's plan");
    expect(admit(plan, { kind: "eip3009_transfer", to: token, data: transfer(payTo), value: 5n })).toMatch("may not carry value");
    expect(admit(plan, { kind: "eip3009_transfer", to: token, data: "0xe3ee160e00", value: 0n })).toMatch("cannot be read");
    expect(admit(plan, { kind: "eip3009_transfer", to: token, data: transfer(payTo), value: 0n })).toBeUndefined();
    expect(admit(plan, { kind: "eip3009_transfer", to: token, data: transfer(payTo), value: 0n })).toMatch("not in this payment's plan"); // a step is sent once
  });

  it("lets a sponsored Permit2 payment fund only its own payer", () => {
    const requirements = { scheme: "exact", network: NETWORK, asset: usdc().address, amount: "1000", payTo: clean, maxTimeoutSeconds: 60, extra: {} } as PaymentRequirements;
    const payer = devnet.info.payers[1]!.address;
    const payload = { x402Version: 2, accepted: requirements, payload: { signature: "0x", permit2Authorization: { from: payer, witness: { to: clean } } }, extensions: { erc20ApprovalGasSponsoring: {} } } as unknown as PaymentPayload;
    const plan = planPayment(payload, requirements, { walletDeployment: false, gasFunding: true });
    expect(admit(plan, { kind: "gas_funding", to: denied, data: "0x", value: 1n })).toMatch("a gas funding may only pay the payment's payer");
    expect(admit(plan, { kind: "gas_funding", to: payer, data: "0x", value: 1n })).toBeUndefined();
    expect(admit(plan, { kind: "gas_funding", to: payer, data: "0x", value: 1n })).toMatch("not in this payment's plan"); // funded once
    // Without the extension, no funding is planned at all.
    const plain = planPayment({ ...payload, extensions: {} }, requirements, { walletDeployment: false, gasFunding: true });
    expect(admit(plain, { kind: "gas_funding", to: payer, data: "0x", value: 1n })).toMatch("not in this payment's plan");
  });
});
