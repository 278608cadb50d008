// A hostile payer and a hostile resource server against the router, judged on chain: payees'
// balances, receipts and the facilitator signer's transaction count (what it sent, not what it said).
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { randomBytes } from "node:crypto";
import { createPublicClient, createTestClient, createWalletClient, erc20Abi, http, toHex, type Address, type Hex } from "viem";
import { generatePrivateKey, privateKeyToAccount } from "viem/accounts";
import { startTestDevnet } from "./helpers/devnet.ts";
import { balanceOf } from "./helpers/chain.ts";
import { postJson, serviceShape, signEip3009, type PaymentSpec } from "./helpers/payments.ts";
import { until } from "./helpers/wait.ts";
import { compileDevnetContracts, devnetContract } from "../services/devnet/compile.ts";
import type { DevnetNetwork } from "../services/devnet/devnet.ts";
import type { AssetInfo } from "../services/x402/networks.ts";

let devnet: Awaited<ReturnType<typeof startTestDevnet>>;
let net: DevnetNetwork;
let usdc: AssetInfo;
let chain: ReturnType<typeof createPublicClient>;
let signer: Address;

beforeAll(async () => {
  devnet = await startTestDevnet(["eip155:8453"]);
  net = devnet.info.networks[0]!;
  usdc = net.assets.find((a) => a.transferMethods.includes("eip3009"))!;
  chain = createPublicClient({ transport: http(net.rpcUrl) });
  signer = net.signers[0]!;
});
afterAll(() => devnet?.stop());

const fresh = () => privateKeyToAccount(generatePrivateKey()).address;
const sentBy = (address: Address) => chain.getTransactionCount({ address, blockTag: "pending" });
const settle = async (body: unknown) => (await postJson(`${devnet.info.routerUrl}/settle`, body)).json;
const verify = async (body: unknown) => (await postJson(`${devnet.info.routerUrl}/verify`, body)).json;

function spec(overrides: Partial<PaymentSpec> = {}): PaymentSpec {
  return { network: net.network, chainId: net.chainId, asset: usdc, payerKey: devnet.info.payers[0]!.privateKey, payTo: fresh(), amount: 1000n, ...overrides };
}
async function payment(s: PaymentSpec) {
  return serviceShape(s, await signEip3009(s));
}
async function expectSuccessOnChain(answer: Record<string, unknown>, payTo: Address, amount: bigint) {
  expect(answer).toMatchObject({ success: true });
  const receipt = await chain.getTransactionReceipt({ hash: answer.transaction as Hex });
  expect(receipt.status).toBe("success");
  expect(await balanceOf(net.rpcUrl, usdc.address, payTo)).toBe(amount);
}

describe("a hostile payer", () => {
  it("two authorizations with one nonce for two payees: the first settles, the second is refused and its payee gets nothing", async () => {
    const nonce = toHex(randomBytes(32));
    const [a, b] = [spec({ auth: { nonce } }), spec({ auth: { nonce } })];
    const [first, second] = [await payment(a), await payment(b)];
    expect(await verify(first)).toMatchObject({ isValid: true });
    expect(await verify(second)).toMatchObject({ isValid: true });
    const sent0 = await sentBy(signer);

    const settled = await settle(first);
    await expectSuccessOnChain(settled, a.payTo, a.amount);
    expect(await settle(second)).toMatchObject({ success: false, errorReason: "invalid_exact_evm_nonce_already_used", transaction: "" });
    expect(await balanceOf(net.rpcUrl, usdc.address, b.payTo)).toBe(0n);
    // A retry of the genuine payment still gets its own answer, word for word.
    expect(await settle(first)).toEqual(settled);
    expect(await sentBy(signer)).toBe(sent0 + 1);

    // The same (from, nonce) replayed to another payee, 50,000× the amount, with an all-zero signature.
    const forged = await payment(spec({ amount: a.amount * 50_000n, auth: { nonce }, signature: `0x${"00".repeat(65)}` }));
    expect(await settle(forged)).toMatchObject({ success: false, transaction: "" });
    expect(await verify(forged)).toMatchObject({ isValid: false });
    expect(await balanceOf(net.rpcUrl, usdc.address, forged.paymentRequirements.payTo as Address)).toBe(0n);
    expect(await sentBy(signer)).toBe(sent0 + 1);
  });

  it("four bodies with one nonce settled at once: at most one success, backed by its payee's balance; one transaction", async () => {
    const nonce = toHex(randomBytes(32));
    const specs = [1, 2, 3, 4].map(() => spec({ auth: { nonce } }));
    const bodies = await Promise.all(specs.map(payment));
    const sent0 = await sentBy(signer);
    const answers = await Promise.all(bodies.map(settle));
    const winners = answers.map((r, i) => ({ r, s: specs[i]! })).filter(({ r }) => r.success === true);
    expect(winners).toHaveLength(1);
    await expectSuccessOnChain(winners[0]!.r, winners[0]!.s.payTo, winners[0]!.s.amount);
    for (const [i, r] of answers.entries()) {
      if (r === winners[0]!.r) continue;
      expect(r).toMatchObject({ success: false, transaction: "" });
      expect(await balanceOf(net.rpcUrl, usdc.address, specs[i]!.payTo)).toBe(0n);
    }
    // Every loser, asked again, is still refused; the winner still gets its answer.
    for (const [i, body] of bodies.entries()) {
      const again = await settle(body);
      if (answers[i] === winners[0]!.r) expect(again).toEqual(winners[0]!.r);
      else expect(again).toMatchObject({ success: false, errorReason: "invalid_exact_evm_nonce_already_used", transaction: "" });
    }
    expect(await sentBy(signer)).toBe(sent0 + 1);
  });

  it("authorizations that together exceed the payer's balance: the ones it cannot cover are refused before broadcast, nothing reverts", async () => {
    // A payer holding exactly 1000 signs three payments of 500, settled while none is mined yet.
    const payerKey = generatePrivateKey();
    const payer = privateKeyToAccount(payerKey).address;
    const funder = createWalletClient({ account: privateKeyToAccount(devnet.info.payers[0]!.privateKey), transport: http(net.rpcUrl) });
    const funding = await funder.writeContract({ chain: null, address: usdc.address, abi: erc20Abi, functionName: "transfer", args: [payer, 1000n] });
    expect((await chain.waitForTransactionReceipt({ hash: funding })).status).toBe("success");
    const payTo = fresh();
    const bodies = await Promise.all([1, 2, 3].map(() => payment(spec({ payerKey, payTo, amount: 500n }))));
    const test = createTestClient({ mode: "anvil", transport: http(net.rpcUrl) });
    const sent0 = await sentBy(signer);

    await test.setAutomine(false);
    let answers: Record<string, unknown>[];
    try {
      const settling = bodies.map(settle);
      // Two transactions reach the pool; the third payment is answered without one.
      await until(async () => ((await sentBy(signer)) === sent0 + 2 ? true : undefined), "two settlement transactions in the pool");
      const refused = await Promise.race(settling.map((p) => p.then((r) => (r.success === false ? r : new Promise<never>(() => undefined)))));
      expect(refused).toMatchObject({ success: false, errorReason: "invalid_exact_evm_insufficient_balance", transaction: "" });
      await test.mine({ blocks: 1 });
      answers = await Promise.all(settling);
    } finally {
      await test.setAutomine(true);
    }
    const successes = answers.filter((r) => r.success === true);
    expect(successes).toHaveLength(2);
    for (const r of successes) expect((await chain.getTransactionReceipt({ hash: r.transaction as Hex })).status).toBe("success");
    expect(await balanceOf(net.rpcUrl, usdc.address, payTo)).toBe(1000n);
    expect(await balanceOf(net.rpcUrl, usdc.address, payer)).toBe(0n);
    expect(await sentBy(signer)).toBe(sent0 + 2);
  });
});

describe("a hostile payer mixing transfer methods", () => {
  it("a Permit2 payment with a decoy EIP-3009 authorization beside it is refused before anything runs", async () => {
    const s = spec();
    const eip3009 = await signEip3009(s);
    const body = serviceShape(s, { ...eip3009, permit2Authorization: { from: s.payTo, permitted: { token: usdc.address, amount: "1000" }, spender: s.payTo, nonce: "1", deadline: "9999999999", witness: { to: s.payTo, validAfter: "0" } } });
    const sent0 = await sentBy(signer);
    for (const endpoint of ["verify", "settle"]) {
      const r = await postJson(`${devnet.info.routerUrl}/${endpoint}`, body);
      expect(r.status).toBe(400);
      expect(r.json.error).toMatch(/^invalid_payload: paymentPayload.payload carries both authorization/);
    }
    expect(await sentBy(signer)).toBe(sent0);
  });
});

describe("a hostile resource server", () => {
  it("a token it deployed itself is refused at /verify and /settle, and no transaction is sent", async () => {
    // A working EIP-3009 token (the devnet's own stablecoin code) at an address of the attacker's choosing.
    const attackerKey = generatePrivateKey();
    const attacker = privateKeyToAccount(attackerKey);
    const token = fresh();
    const stablecoin = devnetContract(await compileDevnetContracts(), "DevnetStablecoin");
    const test = createTestClient({ mode: "anvil", transport: http(net.rpcUrl) });
    await test.setCode({ address: token, bytecode: stablecoin.deployedBytecode });
    await test.setBalance({ address: attacker.address, value: 10n ** 18n });
    const wallet = createWalletClient({ account: attacker, transport: http(net.rpcUrl) });
    for (const [functionName, args] of [["initialize", ["USD Coin", "USDC", "2", 6, attacker.address]], ["mint", [attacker.address, 10n ** 12n]]] as const) {
      const hash = await wallet.writeContract({ chain: null, address: token, abi: stablecoin.abi, functionName, args: args as never });
      expect((await chain.waitForTransactionReceipt({ hash })).status).toBe("success");
    }
    // The attacker pays in its own token: a valid signature, a real balance, our gas.
    const body = await payment(spec({ asset: { ...usdc, address: token }, payerKey: attackerKey, payTo: fresh() }));
    const sent0 = await sentBy(signer);
    for (const endpoint of ["verify", "settle"]) {
      const r = await postJson(`${devnet.info.routerUrl}/${endpoint}`, body);
      expect(r.status).toBe(400);
      expect(r.json.error).toMatch(/^unsupported_asset: /);
    }
    // The same token named inside a batch-settlement payload, under accepted requirements.
    const requirements = { scheme: "batch-settlement", network: net.network, asset: usdc.address, payTo: fresh(), amount: "1000", maxTimeoutSeconds: 60, extra: {} };
    const channel = { payer: attacker.address, payerAuthorizer: attacker.address, receiver: requirements.payTo, receiverAuthorizer: attacker.address, token, withdrawDelay: 900, salt: `0x${"00".repeat(32)}` };
    for (const payload of [
      { type: "deposit", channelConfig: channel, voucher: { channelId: `0x${"11".repeat(32)}`, maxClaimableAmount: "1000", signature: "0x00" }, deposit: { amount: "1000", authorization: {} } },
      { type: "settle", receiver: requirements.payTo, token },
    ]) {
      const r = await postJson(`${devnet.info.routerUrl}/settle`, { x402Version: 2, paymentPayload: { x402Version: 2, accepted: requirements, payload }, paymentRequirements: requirements });
      expect(r.status).toBe(400);
      expect(r.json.error).toMatch(/^unsupported_asset: the payload's token 0x/);
    }
    expect(await sentBy(signer)).toBe(sent0);
  });

  it("a zero-value payment and a payer paying itself are refused before anything is sent", async () => {
    const payer = devnet.info.payers[0]!;
    const bodies = [await payment(spec({ amount: 0n })), await payment(spec({ payTo: payer.address }))];
    const sent0 = await sentBy(signer);
    const before = await balanceOf(net.rpcUrl, usdc.address, payer.address);
    for (const body of bodies) {
      expect(await verify(body)).toMatchObject({ isValid: false, invalidReason: "invalid_payment_requirements" });
      expect(await settle(body)).toMatchObject({ success: false, errorReason: "invalid_payment_requirements", transaction: "" });
    }
    expect(await sentBy(signer)).toBe(sent0);
    expect(await balanceOf(net.rpcUrl, usdc.address, payer.address)).toBe(before);
  });
});
