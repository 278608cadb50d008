// /verify for every scheme, through the router, judged on chain (eip155:56: USDT without EIP-2612 or
// EIP-3009, the devnet's EIP-3009 stand-in USDC3009):
// - common mistakes get the reference @x402/evm codes at /verify, and /settle of them sends nothing;
// - a valid /verify of each kind of payment (exact EIP-3009 and Permit2, upto, a sponsored approval,
//   a batch-settlement deposit) changes nothing on chain: no block, no signer nonce, no balance,
//   no allowance; each of those payments still settles afterwards;
// - what the answers carry: `extra.assetTransferMethod` is the resource server's (never advertised
//   in /supported nor echoed in answers; exact follows the payload, batch deposits the hint) and
//   VerifyResponse carries `extra` (batch channel state) but no `extensions` (docs/facilitator-interface.md).
import { randomBytes } from "node:crypto";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { PaymentRequirements } from "@x402/core/types";
import { PERMIT2_ADDRESS, toClientEvmSigner, toFacilitatorEvmSigner, uptoPermit2WitnessTypes, x402UptoPermit2ProxyAddress } from "@x402/evm";
import { ExactEvmScheme as ExactEvmClient } from "@x402/evm/exact/client";
import { ExactEvmScheme as ReferenceExact } from "@x402/evm/exact/facilitator";
import { BatchSettlementEvmScheme as ReferenceBatch } from "@x402/evm/batch-settlement/facilitator";
import { UptoEvmScheme as UptoEvmClient } from "@x402/evm/upto/client";
import { BatchSettlementEvmScheme as BatchClient, InMemoryClientChannelStorage } from "@x402/evm/batch-settlement/client";
import { createPublicClient, createWalletClient, erc20Abi, getAddress, http, publicActions, toHex, type Address, type Hex } from "viem";
import { generatePrivateKey, privateKeyToAccount, type PrivateKeyAccount } from "viem/accounts";
import { startTestDevnet } from "./helpers/devnet.ts";
import { postJson, signEip3009, signPermit2, type PaymentSpec } from "./helpers/payments.ts";
import { BATCH_SETTLEMENT_ADDRESS } from "../services/devnet/chain-setup.ts";
import type { DevnetNetwork, RunningDevnet } from "../services/devnet/devnet.ts";
import type { AssetInfo } from "../services/x402/networks.ts";

const NETWORK = "eip155:56" as const;
const CHAIN_ID = 56;

let devnet: RunningDevnet & { dir: string };
let net: DevnetNetwork;
let usdt: AssetInfo; // Permit2 only, 18 decimals
let usdc3009: AssetInfo; // EIP-3009 and EIP-2612, 6 decimals
let chain: ReturnType<typeof createPublicClient>;
let facilitatorAddress: Address;
let payTo: Address;
const approved = () => privateKeyToAccount(devnet.info.payers[0]!.privateKey);
const unapproved = () => privateKeyToAccount(devnet.info.payers[1]!.privateKey);
const serverAuthorizer = privateKeyToAccount(generatePrivateKey()).address; // a resource server's own receiver-authorizer key

beforeAll(async () => {
  devnet = await startTestDevnet([NETWORK], { hub: false, wallets: false });
  net = devnet.info.networks[0]!;
  usdt = net.assets.find((a) => a.symbol === "USDT")!;
  usdc3009 = net.assets.find((a) => a.symbol === "USDC3009")!;
  chain = createPublicClient({ transport: http(net.rpcUrl) });
  payTo = devnet.info.receivers[0]!.address;
  const supported = (await (await fetch(`${devnet.info.routerUrl}/supported`)).json()) as Supported;
  facilitatorAddress = getAddress(supported.kinds.find((k) => k.scheme === "upto" && k.network === NETWORK)!.extra!.facilitatorAddress as string);
});
afterAll(() => devnet?.stop());

interface Supported {
  kinds: { x402Version: number; scheme: string; network: string; extra?: Record<string, unknown> }[];
  extensions: string[];
}

const router = (action: "verify" | "settle", body: unknown) => postJson(`${devnet.info.routerUrl}/${action}`, body);
const now = () => BigInt(Math.floor(Date.now() / 1000));

/** The standard v2 body: the payload as the client sent it, the requirements it accepted. */
const body = (requirements: PaymentRequirements, payload: object, extensions?: Record<string, unknown>) => ({
  x402Version: 2,
  paymentPayload: { x402Version: 2, accepted: requirements, payload, ...(extensions ? { extensions } : {}) },
  paymentRequirements: requirements,
});

const exactRequirements = (asset: AssetInfo, amount: bigint, extra: Record<string, unknown> = {}): PaymentRequirements => ({
  scheme: "exact",
  network: NETWORK,
  asset: asset.address,
  amount: amount.toString(),
  payTo,
  maxTimeoutSeconds: 60,
  extra: { ...(asset.eip712 ?? {}), ...extra },
});
const uptoRequirements = (ceiling: bigint): PaymentRequirements => ({
  scheme: "upto",
  network: NETWORK,
  asset: usdt.address,
  amount: ceiling.toString(),
  payTo,
  maxTimeoutSeconds: 120,
  extra: { facilitatorAddress, assetTransferMethod: "permit2" },
});
const batchRequirements = (asset: AssetInfo, price: bigint, extra: Record<string, unknown> = {}): PaymentRequirements => ({
  scheme: "batch-settlement",
  network: NETWORK,
  asset: asset.address,
  amount: price.toString(),
  payTo,
  maxTimeoutSeconds: 60,
  extra: { ...(asset.eip712 ?? {}), receiverAuthorizer: serverAuthorizer, withdrawDelay: 900, ...extra },
});
const exactSpec = (asset: AssetInfo, account: PrivateKeyAccount | Hex, amount: bigint): PaymentSpec => ({
  network: NETWORK,
  chainId: CHAIN_ID,
  asset,
  payerKey: typeof account === "string" ? account : keyOf(account),
  payTo,
  amount,
});
const keyOf = (account: PrivateKeyAccount): Hex => devnet.info.payers.find((p) => p.address === account.address)!.privateKey;

/** An upto Permit2 ceiling signed field by field (so a test can sign the mistakes a client makes). */
async function signUpto(key: Hex, o: { amount: bigint; to?: Address; deadline?: bigint; validAfter?: bigint }) {
  const account = privateKeyToAccount(key);
  const message = {
    permitted: { token: usdt.address, amount: o.amount },
    spender: x402UptoPermit2ProxyAddress as Address,
    nonce: BigInt(toHex(randomBytes(16))),
    deadline: o.deadline ?? now() + 300n,
    witness: { to: o.to ?? payTo, facilitator: facilitatorAddress, validAfter: o.validAfter ?? now() - 60n },
  };
  const signature = await account.signTypedData({
    domain: { name: "Permit2", chainId: CHAIN_ID, verifyingContract: PERMIT2_ADDRESS },
    types: uptoPermit2WitnessTypes,
    primaryType: "PermitWitnessTransferFrom",
    message,
  });
  return {
    signature,
    permit2Authorization: {
      from: account.address,
      permitted: { token: message.permitted.token, amount: message.permitted.amount.toString() },
      spender: message.spender,
      nonce: message.nonce.toString(),
      deadline: message.deadline.toString(),
      witness: { to: message.witness.to, facilitator: message.witness.facilitator, validAfter: message.witness.validAfter.toString() },
    },
  };
}

/** A batch-settlement deposit as the reference client signs it (a new channel for each call). */
async function batchDeposit(account: PrivateKeyAccount, requirements: PaymentRequirements, signAs: Partial<PaymentRequirements> = {}) {
  const client = new BatchClient(toClientEvmSigner(account, chain), { salt: generatePrivateKey(), storage: new InMemoryClientChannelStorage() });
  const created = await client.createPaymentPayload(2, { ...requirements, ...signAs });
  const p = created.payload as { type: string; deposit: { amount: string; authorization: Record<string, unknown> } };
  expect(p.type).toBe("deposit");
  return { payload: created.payload, extensions: created.extensions, amount: BigInt(p.deposit.amount) };
}

/**
 * Everything a payment could change on this chain: the block height (anvil mines a block per
 * transaction), the facilitator signers' nonces (mined and pending) and gas, the payers' nonces,
 * gas, token balances and Permit2 allowances, and what the batch-settlement contract holds.
 */
async function chainState(payers: Address[]) {
  const tokens = [usdt.address, usdc3009.address];
  const [blockNumber, signers, accounts, batchHoldings] = await Promise.all([
    chain.getBlockNumber({ cacheTime: 0 }),
    Promise.all(
      net.signers.map(async (address) => ({
        address,
        mined: await chain.getTransactionCount({ address, blockTag: "latest" }),
        pending: await chain.getTransactionCount({ address, blockTag: "pending" }),
        gas: await chain.getBalance({ address }),
      })),
    ),
    Promise.all(
      payers.map(async (address) => ({
        address,
        nonce: await chain.getTransactionCount({ address, blockTag: "pending" }),
        gas: await chain.getBalance({ address }),
        tokens: await Promise.all(
          tokens.map(async (token) => ({
            token,
            balance: await chain.readContract({ address: token, abi: erc20Abi, functionName: "balanceOf", args: [address] }),
            permit2Allowance: await chain.readContract({ address: token, abi: erc20Abi, functionName: "allowance", args: [address, PERMIT2_ADDRESS] }),
          })),
        ),
      })),
    ),
    Promise.all(tokens.map((token) => chain.readContract({ address: token, abi: erc20Abi, functionName: "balanceOf", args: [BATCH_SETTLEMENT_ADDRESS] }))),
  ]);
  return { blockNumber, signers, accounts, batchHoldings };
}

/** The reference mechanisms on a plain viem client (reads only here): what the packages answer for the same body. */
function referenceMechanisms() {
  const wallet = createWalletClient({ account: privateKeyToAccount(generatePrivateKey()), transport: http(net.rpcUrl) }).extend(publicActions);
  const signer = toFacilitatorEvmSigner({
    address: wallet.account.address,
    readContract: (args) => wallet.readContract(args as never),
    verifyTypedData: (args) => wallet.verifyTypedData(args as never),
    writeContract: (args) => wallet.writeContract({ ...(args as object), chain: null } as never),
    sendTransaction: (args) => wallet.sendTransaction({ ...(args as object), chain: null } as never),
    waitForTransactionReceipt: (args) => wallet.waitForTransactionReceipt(args),
    getCode: (args) => wallet.getCode(args),
  });
  return { exact: new ReferenceExact(signer), batch: new ReferenceBatch(signer) };
}

/** A new payer holding USDT and nothing else: no native coin, no allowance. */
async function gaslessPayer(amount: bigint): Promise<PrivateKeyAccount> {
  const payer = privateKeyToAccount(generatePrivateKey());
  const funder = createWalletClient({ account: approved(), transport: http(net.rpcUrl) });
  const hash = await funder.writeContract({ chain: null, address: usdt.address, abi: erc20Abi, functionName: "transfer", args: [payer.address, amount] });
  await chain.waitForTransactionReceipt({ hash });
  return payer;
}

// ------------------------------------------------------------------ common mistakes: reference codes at /verify, nothing sent at /settle

describe("common mistakes get the reference codes at /verify, and /settle of them sends nothing", () => {
  /** /verify answers the code; /settle answers it too with no transaction; nothing on chain moved. */
  async function refusedEverywhere(label: string, b: unknown, reason: string, payers: Address[]) {
    const before = await chainState(payers);
    const verified = await router("verify", b);
    expect([label, verified.status, verified.json]).toEqual([label, 200, expect.objectContaining({ isValid: false, invalidReason: reason })]);
    const settled = await router("settle", b);
    expect([label, settled.status, settled.json]).toEqual([label, 200, expect.objectContaining({ success: false, errorReason: reason, transaction: "", network: NETWORK })]);
    expect([label, await chainState(payers)]).toEqual([label, before]);
  }

  it("upto: Permit2 without allowance, expired, wrong recipient, insufficient balance (reference upto codes)", async () => {
    const CEILING = 10n ** 18n;
    const req = uptoRequirements(CEILING);
    expect(devnet.info.payers[1]!.permit2Approved).toBe(false);
    const cases: [string, Hex, Awaited<ReturnType<typeof signUpto>>, string][] = [
      ["no Permit2 allowance", keyOf(unapproved()), await signUpto(keyOf(unapproved()), { amount: CEILING }), "permit2_allowance_required"],
      ["expired", keyOf(approved()), await signUpto(keyOf(approved()), { amount: CEILING, deadline: now() - 10n }), "permit2_deadline_expired"],
      ["wrong recipient", keyOf(approved()), await signUpto(keyOf(approved()), { amount: CEILING, to: unapproved().address }), "invalid_permit2_recipient_mismatch"],
    ];
    const poorKey = generatePrivateKey(); // no USDT at all (and no allowance: the balance is diagnosed first)
    cases.push(["insufficient balance", poorKey, await signUpto(poorKey, { amount: CEILING }), "permit2_insufficient_balance"]);
    for (const [label, key, payload, reason] of cases) {
      await refusedEverywhere(`upto ${label}`, body(req, payload), reason, [privateKeyToAccount(key).address, payTo]);
    }
    // the same signatures, settled for a partial charge (the settle-time amount): still refused, still nothing sent
    const partial = { ...req, amount: (CEILING / 4n).toString() };
    const before = await chainState([approved().address, unapproved().address, payTo]);
    for (const [label, , payload, reason] of cases) {
      const settled = await router("settle", { ...body(req, payload), paymentRequirements: partial });
      expect([label, settled.json]).toEqual([label, expect.objectContaining({ success: false, errorReason: reason, transaction: "" })]);
    }
    expect(await chainState([approved().address, unapproved().address, payTo])).toEqual(before);
  });

  it("exact: Permit2 without allowance (permit2_allowance_required) is refused at /settle too, nothing sent", async () => {
    const s = exactSpec(usdt, unapproved(), 10n ** 18n);
    await refusedEverywhere("exact permit2 no allowance", body(exactRequirements(usdt, s.amount, { assetTransferMethod: "permit2" }), await signPermit2(s)), "permit2_allowance_required", [unapproved().address, payTo]);
  });

  it("batch-settlement: a Permit2 deposit without allowance gets invalid_batch_settlement_evm_permit2_allowance_required; an expired one its deadline code", async () => {
    const req = batchRequirements(usdt, 10n ** 15n, { assetTransferMethod: "permit2" });
    const noAllowance = await batchDeposit(unapproved(), req);
    const auth = (noAllowance.payload as { deposit: { authorization: { permit2Authorization?: { spender: string } } } }).deposit.authorization.permit2Authorization;
    expect(auth).toBeDefined(); // the deposit goes through Permit2 (the Permit2 deposit collector)
    expect(noAllowance.extensions ?? {}).not.toHaveProperty("eip2612GasSponsoring");
    await refusedEverywhere("batch permit2 no allowance", body(req, noAllowance.payload), "invalid_batch_settlement_evm_permit2_allowance_required", [unapproved().address, payTo]);
    // the reference client signs its deadline from maxTimeoutSeconds: a minute in the past
    const expired = await batchDeposit(approved(), req, { maxTimeoutSeconds: -60 });
    await refusedEverywhere("batch permit2 expired", body(req, expired.payload), "invalid_batch_settlement_evm_permit2_deadline_expired", [approved().address, payTo]);
  });
});

// ------------------------------------------------------------------ /verify is read-only

describe("/verify is strictly read-only across schemes", () => {
  it("valid payments of every kind verify without changing anything on chain, and each still settles afterwards", async () => {
    const gasless = await gaslessPayer(10n ** 17n);
    const payers = [approved().address, gasless.address, payTo];

    // exact EIP-3009 (USDC3009)
    const eip3009Req = exactRequirements(usdc3009, 12_345n);
    const eip3009 = body(eip3009Req, await signEip3009(exactSpec(usdc3009, approved(), 12_345n)));
    // exact Permit2 (USDT)
    const permit2Req = exactRequirements(usdt, 10n ** 16n, { assetTransferMethod: "permit2" });
    const permit2 = body(permit2Req, await signPermit2(exactSpec(usdt, approved(), 10n ** 16n)));
    // upto (reference client, USDT)
    const uptoReq = uptoRequirements(10n ** 16n);
    const upto = body(uptoReq, (await new UptoEvmClient(approved()).createPaymentPayload(2, uptoReq)).payload);
    // a payer with no gas and no allowance: its approval rides in erc20ApprovalGasSponsoring (reference client)
    const sponsoredReq = exactRequirements(usdt, 10n ** 16n, { assetTransferMethod: "permit2" });
    const created = await new ExactEvmClient(toClientEvmSigner(gasless, chain)).createPaymentPayload(2, sponsoredReq, { extensions: { erc20ApprovalGasSponsoring: {} } } as never);
    expect(created.extensions).toHaveProperty("erc20ApprovalGasSponsoring");
    const sponsored = body(sponsoredReq, created.payload, created.extensions);
    // a batch-settlement deposit (ERC-3009, reference client, USDC3009)
    const batchReq = batchRequirements(usdc3009, 1_000n);
    const deposit = await batchDeposit(approved(), batchReq);
    const batch = body(batchReq, deposit.payload);

    const payments = { eip3009, permit2, upto, sponsored, batch };
    const before = await chainState(payers);
    expect(before.accounts[1]).toMatchObject({ nonce: 0, gas: 0n });
    // twice over, to be sure no verification leaves anything pending for the next
    for (let round = 0; round < 2; round++) {
      for (const [name, b] of Object.entries(payments)) {
        const r = await router("verify", b);
        expect([name, r.status, r.json.isValid, r.json.invalidReason]).toEqual([name, 200, true, undefined]);
      }
    }
    expect(await chainState(payers)).toEqual(before);
    expect(await chain.getTransactionCount({ address: facilitatorAddress, blockTag: "pending" })).toBe(before.signers.find((s) => s.address === facilitatorAddress)!.pending);

    // None of them was spent by its verification: each settles now.
    for (const [name, b] of Object.entries(payments)) {
      const r = await router("settle", b);
      expect([name, r.json.success, r.json.errorReason]).toEqual([name, true, undefined]);
    }
    const after = await chainState(payers);
    expect(after.accounts[1]!.tokens[0]!.permit2Allowance).toBeGreaterThan(0n); // the sponsored approval landed at /settle, not before
    expect(after.batchHoldings[1]).toBe(before.batchHoldings[1]! + deposit.amount);
  });
});

// ------------------------------------------------------------------ what the answers carry

describe("what /supported and the answers carry", () => {
  it("/supported advertises no assetTransferMethod or paymentFlow: they are the resource server's reserved keys of extra", async () => {
    const supported = (await (await fetch(`${devnet.info.routerUrl}/supported`)).json()) as Supported;
    const ours = supported.kinds.filter((k) => k.network === NETWORK);
    expect(ours.map((k) => k.scheme).sort()).toEqual(["batch-settlement", "exact", "upto"]);
    for (const kind of ours) {
      expect([kind.scheme, kind.extra ?? {}]).not.toEqual([kind.scheme, expect.objectContaining({ assetTransferMethod: expect.anything() })]);
      expect([kind.scheme, kind.extra ?? {}]).not.toEqual([kind.scheme, expect.objectContaining({ paymentFlow: expect.anything() })]);
    }
    // the reference kinds' extra, exactly: none for exact, the one upto key, none for batch-settlement without an authorizer key
    expect(ours.find((k) => k.scheme === "exact")!.extra).toBeUndefined();
    expect(ours.find((k) => k.scheme === "upto")!.extra).toEqual({ facilitatorAddress });
    expect(ours.find((k) => k.scheme === "batch-settlement")!.extra).toBeUndefined();
  });

  it("exact: the transfer method is read from the payload (as the packages do); answers never echo assetTransferMethod and carry no extensions", async () => {
    // assetTransferMethod absent (what the reference server sends for EIP-3009, the default), "eip3009", and
    // "permit2" named by the requirements while the payer signed an EIP-3009 authorization
    const reference = referenceMechanisms();
    for (const extra of [{}, { assetTransferMethod: "eip3009" }, { assetTransferMethod: "permit2" }]) {
      const req = exactRequirements(usdc3009, 1_000n, extra);
      const b = body(req, await signEip3009(exactSpec(usdc3009, approved(), 1_000n)));
      expect(await reference.exact.verify(b.paymentPayload as never, req)).toMatchObject({ isValid: true, payer: approved().address });
      expect((await router("verify", b)).json).toEqual({ isValid: true, payer: approved().address });
      const settled = (await router("settle", b)).json;
      expect(settled).toMatchObject({ success: true, network: NETWORK, payer: approved().address });
      expect(Object.keys(settled).sort()).toEqual(["network", "payer", "success", "transaction"]);
    }
    // a Permit2 payment without any assetTransferMethod (the spec's default order: EIP-3009 when possible, else Permit2)
    const req = exactRequirements(usdt, 10n ** 15n);
    const b = body(req, await signPermit2(exactSpec(usdt, approved(), 10n ** 15n)));
    expect((await router("verify", b)).json).toEqual({ isValid: true, payer: approved().address });
    expect(Object.keys((await router("settle", b)).json).sort()).toEqual(["network", "payer", "success", "transaction"]);
  });

  it("upto answers carry amount at /settle, nothing else; batch-settlement verify carries the channel state in extra, and its assetTransferMethod hint decides the deposit method", async () => {
    const req = uptoRequirements(10n ** 15n);
    const b = body(req, (await new UptoEvmClient(approved()).createPaymentPayload(2, req)).payload);
    expect((await router("verify", b)).json).toEqual({ isValid: true, payer: approved().address });
    const settled = (await router("settle", b)).json;
    expect(Object.keys(settled).sort()).toEqual(["amount", "network", "payer", "success", "transaction"]);

    const batchReq = batchRequirements(usdc3009, 1_000n);
    const deposit = await batchDeposit(approved(), batchReq);
    const verified = (await router("verify", body(batchReq, deposit.payload))).json;
    expect(verified).toEqual({ isValid: true, payer: approved().address, extra: { channelId: expect.stringMatching(/^0x[0-9a-f]{64}$/), balance: "0", totalClaimed: "0", withdrawRequestedAt: 0, refundNonce: "0" } });
    // the same ERC-3009 deposit under requirements that name Permit2: the reference refuses the payload type
    const before = await chainState([approved().address]);
    const hinted = { ...batchReq, extra: { ...batchReq.extra, assetTransferMethod: "permit2" } };
    expect(await referenceMechanisms().batch.verify(body(hinted, deposit.payload).paymentPayload as never, hinted)).toMatchObject({ isValid: false, invalidReason: "invalid_batch_settlement_evm_payload_type" });
    expect((await router("verify", body(hinted, deposit.payload))).json).toMatchObject({ isValid: false, invalidReason: "invalid_batch_settlement_evm_payload_type" });
    expect((await router("settle", body(hinted, deposit.payload))).json).toMatchObject({ success: false, errorReason: "invalid_batch_settlement_evm_payload_type", transaction: "" });
    expect(await chainState([approved().address])).toEqual(before);
  });
});
