// The devnet stand-ins for the x402 upto Permit2 proxy, x402BatchSettlement and its ERC-3009 and
// Permit2 deposit collectors on a real anvil: interfaces against the ABIs and EIP-712 types shipped
// in @x402/evm, happy paths, every revert, and the reference @x402/evm upto client/facilitator and
// batch-settlement client/facilitator running unmodified against them.
// The timed-withdrawal tests move the chain clock forward, so they run last.
import { readdirSync, readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { pathToFileURL } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  BaseError,
  ContractFunctionRevertedError,
  createPublicClient,
  createTestClient,
  createWalletClient,
  decodeEventLog,
  defineChain,
  encodeAbiParameters,
  encodeFunctionData,
  hashTypedData,
  http,
  keccak256,
  parseAbi,
  parseSignature,
  publicActions,
  toFunctionSelector,
  toHex,
  zeroAddress,
  getAddress,
  type Abi,
  type AbiItem,
  type Address,
  type Hex,
  type TransactionReceipt,
} from "viem";
import { formatAbiItem, formatAbiParams } from "viem/utils";
import { generatePrivateKey, privateKeyToAccount, type PrivateKeyAccount } from "viem/accounts";
import {
  BATCH_SETTLEMENT_ADDRESS as REF_BATCH_SETTLEMENT_ADDRESS,
  BATCH_SETTLEMENT_DOMAIN,
  ERC3009_DEPOSIT_COLLECTOR_ADDRESS as REF_ERC3009_DEPOSIT_COLLECTOR_ADDRESS,
  claimBatchTypes,
  refundTypes,
  toClientEvmSigner,
  toFacilitatorEvmSigner,
  uptoPermit2WitnessTypes,
  voucherTypes,
  x402UptoPermit2ProxyABI,
  x402UptoPermit2ProxyAddress,
  type AuthorizerSigner,
  type FacilitatorEvmSigner,
} from "@x402/evm";
import { UptoEvmScheme as UptoEvmClientScheme } from "@x402/evm/upto/client";
import { UptoEvmScheme as UptoEvmFacilitatorScheme } from "@x402/evm/upto/facilitator";
import {
  BatchSettlementEvmScheme as BatchClientScheme,
  InMemoryClientChannelStorage,
  computeChannelId,
  updateChannelFromSettle,
} from "@x402/evm/batch-settlement/client";
import { BatchSettlementEvmScheme as BatchFacilitatorScheme } from "@x402/evm/batch-settlement/facilitator";
import { startAnvil, type AnvilNode } from "../services/devnet/anvil.ts";
import { compileDevnetContracts, devnetContract, type CompiledContracts } from "../services/devnet/compile.ts";
import {
  BATCH_SETTLEMENT_ADDRESS,
  BATCH_SETTLEMENT_MAX_WITHDRAW_DELAY,
  BATCH_SETTLEMENT_MIN_WITHDRAW_DELAY,
  DEVNET_CANONICAL_CONTRACTS,
  ERC3009_DEPOSIT_COLLECTOR_ADDRESS,
  PERMIT2_DEPOSIT_COLLECTOR_ADDRESS,
  UPTO_PERMIT2_PROXY_ADDRESS,
  setupDevnetChain,
} from "../services/devnet/chain-setup.ts";
import { EXACT_PERMIT2_PROXY_ADDRESS, MULTICALL3_ADDRESS, NETWORKS, PERMIT2_ADDRESS, type AssetInfo } from "../services/x402/networks.ts";

const CHAIN_ID = 84532;
const NETWORK = `eip155:${CHAIN_ID}` as const;
const MINTER_KEY: Hex = "0xac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80"; // anvil #0
const WITHDRAW_DELAY = 900;

const network = NETWORKS.find((n) => n.chainId === CHAIN_ID)!;
const USDC = network.assets[0]!; // EIP-3009 + EIP-2612 stablecoin "USDC"/"2", 6 decimals
const USDT = NETWORKS.find((n) => n.chainId === 56)!.assets.find((a) => a.symbol === "USDT")!; // Permit2-only, 18 decimals

const chain = defineChain({
  id: CHAIN_ID,
  name: `devnet-${CHAIN_ID}`,
  nativeCurrency: { name: "Ether", symbol: "ETH", decimals: 18 },
  rpcUrls: { default: { http: [] } },
  contracts: { multicall3: { address: MULTICALL3_ADDRESS } },
});

// Errors of the genuine Permit2 (published interface), so reverts bubbling out of it decode by name.
const permit2Abi = parseAbi([
  "error InvalidSigner()",
  "error InvalidNonce()",
  "error InvalidSignature()",
  "error InvalidSignatureLength()",
  "error SignatureExpired(uint256 signatureDeadline)",
]);
// What the deployed x402BatchSettlement and its deposit collectors show from outside beyond the
// published batchSettlementABI (which carries functions and one event, no errors): their events,
// custom errors and getters, as facts from their published source. Logs and reverts in these
// tests decode with these and the published ABIs, never with our contracts' own ABI, so a stand-in
// that drifts (another name, argument or order) fails a test.
// What the deployed x402 Permit2 proxies show beyond their published ABIs: the base contract's
// InvalidAmount (a zero settlement) and its events for a failed EIP-2612 permit.
const deployedProxyFacts = parseAbi([
  "error InvalidAmount()",
  "event EIP2612PermitFailedWithReason(address indexed token, address indexed owner, string reason)",
  "event EIP2612PermitFailedWithPanic(address indexed token, address indexed owner, uint256 errorCode)",
  "event EIP2612PermitFailedWithData(address indexed token, address indexed owner, bytes data)",
]);
const CHANNEL_CONFIG = "(address payer,address payerAuthorizer,address receiver,address receiverAuthorizer,address token,uint40 withdrawDelay,bytes32 salt)";
const deployedBatchFacts = parseAbi([
  `event ChannelCreated(bytes32 indexed channelId, ${CHANNEL_CONFIG} config)`,
  `event ChannelClosed(bytes32 indexed channelId, ${CHANNEL_CONFIG} config)`,
  "event Deposited(bytes32 indexed channelId, address indexed sender, uint128 amount, uint128 newBalance)",
  "event Claimed(bytes32 indexed channelId, address indexed sender, uint128 claimAmount, uint128 newTotalClaimed)",
  "event Settled(address indexed receiver, address indexed token, address indexed sender, uint128 amount)",
  "event Refunded(bytes32 indexed channelId, address indexed sender, uint128 amount)",
  "event WithdrawInitiated(bytes32 indexed channelId, uint128 amount, uint40 finalizeAfter)",
  "event WithdrawFinalized(bytes32 indexed channelId, address indexed sender, uint128 amount)",
  "error InvalidChannel()",
  "error ZeroDeposit()",
  "error DepositOverflow()",
  "error InvalidSignature()",
  "error NotReceiverAuthorizer()",
  "error NotAuthorizedToClaim()",
  "error NotAuthorizedToRefund()",
  "error ClaimExceedsCeiling()",
  "error ClaimExceedsBalance()",
  "error WithdrawalAlreadyPending()",
  "error WithdrawalNotPending()",
  "error NotAuthorizedToFinalizeWithdraw()",
  "error WithdrawDelayNotElapsed()",
  "error NothingToWithdraw()",
  "error WithdrawAmountExceedsAvailable()",
  "error WithdrawDelayOutOfRange()",
  "error EmptyBatch()",
  "error DepositCollectionFailed()",
  "error InvalidCollector()",
  "error InvalidRefundNonce()",
  "error ZeroRefund()",
  // OpenZeppelin's, raised by the deployed contract: ReentrancyGuardTransient, SafeERC20, ECDSA.
  "error ReentrancyGuardReentrantCall()",
  "error SafeERC20FailedOperation(address token)",
  "error ECDSAInvalidSignature()",
  "error ECDSAInvalidSignatureLength(uint256 length)",
  "error ECDSAInvalidSignatureS(bytes32 s)",
  // Getters beyond the published functions: the constants and EIP-5267's eip712Domain (no DOMAIN_SEPARATOR()).
  "function MIN_WITHDRAW_DELAY() view returns (uint40)",
  "function MAX_WITHDRAW_DELAY() view returns (uint40)",
  "function VOUCHER_TYPEHASH() view returns (bytes32)",
  "function REFUND_TYPEHASH() view returns (bytes32)",
  "function CLAIM_ENTRY_TYPEHASH() view returns (bytes32)",
  "function CLAIM_BATCH_TYPEHASH() view returns (bytes32)",
  "function eip712Domain() view returns (bytes1 fields, string name, string version, uint256 chainId, address verifyingContract, bytes32 salt, uint256[] extensions)",
]);
const deployedCollectorFacts = parseAbi([
  "function collect(address payer, address token, uint256 amount, bytes32 channelId, bytes collectorData)",
  "function x402BatchSettlement() view returns (address)",
  "error OnlyX402BatchSettlement()",
  "error InvalidX402BatchSettlementAddress()",
  "error SafeERC20FailedOperation(address token)",
]);
const deployedPermit2CollectorFacts = parseAbi([
  "function PERMIT2() view returns (address)",
  "function DEPOSIT_WITNESS_TYPE_STRING() view returns (string)",
  "function DEPOSIT_WITNESS_TYPEHASH() view returns (bytes32)",
  "error InvalidPermit2Address()",
  "error Permit2612AmountMismatch()",
  "event EIP2612PermitFailedWithReason(address indexed token, address indexed owner, string reason)",
  "event EIP2612PermitFailedWithPanic(address indexed token, address indexed owner, uint256 errorCode)",
  "event EIP2612PermitFailedWithData(address indexed token, address indexed owner, bytes data)",
]);
const permitTypes = {
  Permit: [
    { name: "owner", type: "address" },
    { name: "spender", type: "address" },
    { name: "value", type: "uint256" },
    { name: "nonce", type: "uint256" },
    { name: "deadline", type: "uint256" },
  ],
} as const;
// Our own statement of the channel-config type, checked against the reference computeChannelId.
const channelConfigTypes = {
  ChannelConfig: [
    { name: "payer", type: "address" },
    { name: "payerAuthorizer", type: "address" },
    { name: "receiver", type: "address" },
    { name: "receiverAuthorizer", type: "address" },
    { name: "token", type: "address" },
    { name: "withdrawDelay", type: "uint40" },
    { name: "salt", type: "bytes32" },
  ],
} as const;

// ------------------------------------------------------------------ reference values not exported by name

/**
 * batchSettlementABI, PERMIT2_DEPOSIT_COLLECTOR_ADDRESS, receiveAuthorizationTypes and
 * batchPermit2WitnessTypes ship in @x402/evm's dist chunks but not through its public entry points.
 * Load the chunk that exports them (found by content, as chunk names are hashes).
 */
interface ReferenceBatchInternals {
  batchSettlementABI: Abi;
  PERMIT2_DEPOSIT_COLLECTOR_ADDRESS: Address;
  MIN_WITHDRAW_DELAY: number;
  MAX_WITHDRAW_DELAY: number;
  receiveAuthorizationTypes: { ReceiveWithAuthorization: readonly { name: string; type: string }[] };
  batchPermit2WitnessTypes: Record<string, readonly { name: string; type: string }[]>;
}

async function loadReferenceBatchInternals(): Promise<ReferenceBatchInternals> {
  const require = createRequire(import.meta.url);
  const dist = join(dirname(require.resolve("@x402/evm")), "..", "esm"); // <pkg>/dist/cjs/index.js -> <pkg>/dist/esm
  const exportsOf = (text: string) => /export\s*\{([^}]*)\}\s*;?\s*(\/\/# sourceMappingURL=.*)?\s*$/.exec(text)?.[1]?.split(",").map((s) => s.trim()) ?? [];
  const found: Record<string, unknown> = {};
  const wanted = ["batchSettlementABI", "PERMIT2_DEPOSIT_COLLECTOR_ADDRESS", "MIN_WITHDRAW_DELAY", "MAX_WITHDRAW_DELAY", "receiveAuthorizationTypes", "batchPermit2WitnessTypes"];
  for (const file of readdirSync(dist).filter((f) => f.endsWith(".mjs"))) {
    const names = exportsOf(readFileSync(join(dist, file), "utf8"));
    if (!wanted.some((w) => names.includes(w) && !(w in found))) continue;
    const mod = (await import(pathToFileURL(join(dist, file)).href)) as Record<string, unknown>;
    for (const w of wanted) if (names.includes(w) && !(w in found)) found[w] = mod[w];
  }
  for (const w of wanted) if (!(w in found)) throw new Error(`@x402/evm dist no longer exports ${w} from any chunk`);
  return found as unknown as ReferenceBatchInternals;
}

// ------------------------------------------------------------------ state

let anvil: AnvilNode;
let contracts: CompiledContracts;
let ref: ReferenceBatchInternals;
let tokenAbi: Abi;
let uptoAbi: Abi;
let batchAbi: Abi;
let erc3009CollectorAbi: Abi;
let permit2CollectorAbi: Abi;
let probeAbi: Abi;
let publicClient: ReturnType<typeof makePublicClient>;
let testClient: ReturnType<typeof makeTestClient>;
let relayerWallet: ReturnType<typeof makeWallet>;
let minterWallet: ReturnType<typeof makeWallet>;

const relayer = privateKeyToAccount(generatePrivateKey()); // the facilitator key
const otherFacilitator = privateKeyToAccount(generatePrivateKey());
const facilitatorAuthorizer = privateKeyToAccount(generatePrivateKey()); // facilitator-held receiverAuthorizer
const serverAuthorizer = privateKeyToAccount(generatePrivateKey()); // server-held receiverAuthorizer
const stranger = privateKeyToAccount(generatePrivateKey());
// Payers 0, 2, 3, 4 approved Permit2 at setup; 1, 5, 6, 7 did not (each "no allowance" scenario gets its own).
const PAYER_KEYS = Array.from({ length: 8 }, () => generatePrivateKey());
const APPROVED = new Set([0, 2, 3, 4]);
const payers = PAYER_KEYS.map((k) => privateKeyToAccount(k));
const payerA = payers[0]!; // Permit2 approved
const payerB = payers[1]!; // no Permit2 allowance (used up by the upto EIP-2612 test)
const merchant = privateKeyToAccount(generatePrivateKey()).address;
const merchant2 = privateKeyToAccount(generatePrivateKey()).address;
let strangerWallet: ReturnType<typeof makeWallet>;
let otherFacilitatorWallet: ReturnType<typeof makeWallet>;
let serverAuthorizerWallet: ReturnType<typeof makeWallet>;

function makePublicClient(rpcUrl: string) {
  return createPublicClient({ chain, transport: http(rpcUrl, { retryCount: 0 }), pollingInterval: 20 });
}

function makeTestClient(rpcUrl: string) {
  return createTestClient({ chain, mode: "anvil", transport: http(rpcUrl, { retryCount: 0 }) });
}

function makeWallet(rpcUrl: string, account: PrivateKeyAccount) {
  return createWalletClient({ account, chain, transport: http(rpcUrl, { retryCount: 0 }), pollingInterval: 20 }).extend(publicActions);
}

type Wallet = ReturnType<typeof makeWallet>;

// ------------------------------------------------------------------ generic helpers

/** Runs `p`, expects a revert and returns its reason string or custom error name. */
async function revertOf(p: Promise<unknown>): Promise<string> {
  try {
    await p;
  } catch (e) {
    if (e instanceof BaseError) {
      const r = e.walk((x) => x instanceof ContractFunctionRevertedError);
      if (r instanceof ContractFunctionRevertedError) {
        if (r.data?.errorName === "Error") return r.reason ?? "";
        return r.data?.errorName ?? r.reason ?? r.signature ?? "unknown revert";
      }
    }
    throw e;
  }
  throw new Error("expected a revert, but the call succeeded");
}

async function now(): Promise<bigint> {
  return (await publicClient.getBlock()).timestamp;
}

function randomBytes32(): Hex {
  return generatePrivateKey(); // 32 random bytes
}

async function balanceOf(token: Address, who: Address): Promise<bigint> {
  return (await publicClient.readContract({ address: token, abi: tokenAbi, functionName: "balanceOf", args: [who] })) as bigint;
}

async function send(wallet: Wallet, address: Address, abi: Abi, functionName: string, args: readonly unknown[]): Promise<TransactionReceipt> {
  const hash = await wallet.writeContract({ address, abi, functionName, args, chain, account: wallet.account });
  const receipt = await publicClient.waitForTransactionReceipt({ hash });
  expect(receipt.status).toBe("success");
  return receipt;
}

function simulate(address: Address, abi: Abi, functionName: string, args: readonly unknown[], from: Address = relayer.address) {
  return publicClient.simulateContract({ address, abi, functionName, args, account: from });
}

function read<T>(address: Address, abi: Abi, functionName: string, args: readonly unknown[] = []): Promise<T> {
  return publicClient.readContract({ address, abi, functionName, args }) as Promise<T>;
}

function events(receipt: TransactionReceipt, address: Address, abi: Abi): { eventName: string; args: Record<string, unknown> }[] {
  return receipt.logs
    .filter((l) => l.address.toLowerCase() === address.toLowerCase())
    .map((l) => decodeEventLog({ abi, data: l.data, topics: l.topics }) as unknown as { eventName: string; args: Record<string, unknown> });
}

function eventNames(receipt: TransactionReceipt, address: Address, abi: Abi): string[] {
  return events(receipt, address, abi).map((e) => e.eventName);
}

/** Canonical `name(types) mutability returns (types)` lines of one kind of ABI item, sorted. */
function signatures(abi: readonly unknown[], type: "function" | "event" | "error"): string[] {
  return (abi as AbiItem[])
    .filter((i) => i.type === type)
    .map((i) => {
      let line = formatAbiItem(i);
      if (i.type === "function") line += ` ${i.stateMutability} returns (${formatAbiParams(i.outputs)})`;
      if (i.type === "event") line += ` ${i.inputs.map((p) => (p.indexed ? "i" : "-")).join("")}`;
      return line;
    })
    .sort();
}

function errorsOf(abi: Abi): Abi {
  return abi.filter((i) => i.type === "error");
}

function tokenDomain(asset: AssetInfo) {
  return { name: asset.eip712!.name, version: asset.eip712!.version, chainId: CHAIN_ID, verifyingContract: asset.address } as const;
}

const permit2Domain = { name: "Permit2", chainId: CHAIN_ID, verifyingContract: PERMIT2_ADDRESS } as const;
const batchDomain = { ...BATCH_SETTLEMENT_DOMAIN, chainId: CHAIN_ID, verifyingContract: BATCH_SETTLEMENT_ADDRESS } as const;

async function signEip2612(owner: PrivateKeyAccount, asset: AssetInfo, value: bigint, deadline: bigint): Promise<{ v: number; r: Hex; s: Hex }> {
  const nonce = await read<bigint>(asset.address, tokenAbi, "nonces", [owner.address]);
  const signature = await owner.signTypedData({
    domain: tokenDomain(asset),
    types: permitTypes,
    primaryType: "Permit",
    message: { owner: owner.address, spender: PERMIT2_ADDRESS, value, nonce, deadline },
  });
  const { v, r, s } = parseSignature(signature);
  return { v: Number(v), r, s };
}

function facilitatorSigner(wallet: Wallet): FacilitatorEvmSigner {
  // readContract goes through the wallet client, so eth_call carries `from` = the facilitator
  // address: the upto proxy's simulation depends on it (UnauthorizedFacilitator otherwise).
  return toFacilitatorEvmSigner(
    {
      address: wallet.account.address,
      readContract: (args) => wallet.readContract(args as never),
      verifyTypedData: (args) => wallet.verifyTypedData(args as never),
      writeContract: (args) => wallet.writeContract(args as never),
      sendTransaction: (args) => wallet.sendTransaction(args as never),
      waitForTransactionReceipt: (args) => wallet.waitForTransactionReceipt(args),
      getCode: (args) => wallet.getCode(args),
    },
    { confirmationTimeoutMs: 10_000 },
  );
}

function authorizerSigner(account: PrivateKeyAccount): AuthorizerSigner {
  return { address: account.address, signTypedData: (p) => account.signTypedData(p as never) };
}

async function txCount(address: Address): Promise<number> {
  return publicClient.getTransactionCount({ address, blockTag: "latest" });
}

// ------------------------------------------------------------------ setup

beforeAll(async () => {
  const t0 = Date.now();
  [anvil, contracts, ref] = await Promise.all([startAnvil({ chainId: CHAIN_ID }), compileDevnetContracts(), loadReferenceBatchInternals()]);
  tokenAbi = devnetContract(contracts, "DevnetStablecoin").abi;
  // Logs and errors are decoded with the ABIs @x402/evm publishes, never ours (the collectors' errors excepted: none is published).
  uptoAbi = [...x402UptoPermit2ProxyABI, ...permit2Abi];
  erc3009CollectorAbi = deployedCollectorFacts;
  permit2CollectorAbi = [...deployedCollectorFacts, ...deployedPermit2CollectorFacts];
  batchAbi = [...(ref.batchSettlementABI as Abi), ...deployedBatchFacts.filter((i) => !(i.type === "event" && i.name === "Settled")), ...errorsOf(permit2CollectorAbi), ...permit2Abi];
  probeAbi = devnetContract(contracts, "DevnetReentrancyProbe").abi;
  publicClient = makePublicClient(anvil.rpcUrl);
  testClient = makeTestClient(anvil.rpcUrl);
  relayerWallet = makeWallet(anvil.rpcUrl, relayer);
  minterWallet = makeWallet(anvil.rpcUrl, privateKeyToAccount(MINTER_KEY));
  strangerWallet = makeWallet(anvil.rpcUrl, stranger);
  otherFacilitatorWallet = makeWallet(anvil.rpcUrl, otherFacilitator);
  serverAuthorizerWallet = makeWallet(anvil.rpcUrl, serverAuthorizer);
  const t1 = Date.now();
  await setupDevnetChain({
    rpcUrl: anvil.rpcUrl,
    chainId: CHAIN_ID,
    assets: [USDC, USDT],
    gasFunded: [relayer.address, otherFacilitator.address, stranger.address, serverAuthorizer.address],
    payers: PAYER_KEYS.map((privateKey, i) => ({ privateKey, permit2Approved: APPROVED.has(i) })),
  });
  console.log(`devnet v2: anvil + compile ${t1 - t0} ms, setupDevnetChain ${Date.now() - t1} ms`);
});

afterAll(async () => {
  await anvil?.stop();
});

// ------------------------------------------------------------------ placement and interfaces

describe("placement and interfaces", () => {
  it("setupDevnetChain places every stand-in at its canonical address, equal to the reference addresses", async () => {
    for (const c of DEVNET_CANONICAL_CONTRACTS) {
      expect(await publicClient.getCode({ address: c.address }), c.contract).toBe(devnetContract(contracts, c.contract).deployedBytecode);
    }
    expect(UPTO_PERMIT2_PROXY_ADDRESS).toBe(x402UptoPermit2ProxyAddress);
    expect(BATCH_SETTLEMENT_ADDRESS).toBe(REF_BATCH_SETTLEMENT_ADDRESS);
    expect(ERC3009_DEPOSIT_COLLECTOR_ADDRESS).toBe(REF_ERC3009_DEPOSIT_COLLECTOR_ADDRESS);
    expect(PERMIT2_DEPOSIT_COLLECTOR_ADDRESS).toBe(ref.PERMIT2_DEPOSIT_COLLECTOR_ADDRESS);
    expect(BATCH_SETTLEMENT_MIN_WITHDRAW_DELAY).toBe(ref.MIN_WITHDRAW_DELAY);
    expect(BATCH_SETTLEMENT_MAX_WITHDRAW_DELAY).toBe(ref.MAX_WITHDRAW_DELAY);
    // the test-only reentrancy probe is never placed
    expect(DEVNET_CANONICAL_CONTRACTS.map((c) => c.contract)).not.toContain("DevnetReentrancyProbe");
  });

  it("upto proxy implements exactly x402UptoPermit2ProxyABI plus the deployed proxy's InvalidAmount and permit-failure events, with the upto witness type string", async () => {
    const ours = devnetContract(contracts, "DevnetUptoPermit2Proxy").abi;
    for (const type of ["function", "event", "error"] as const) {
      expect(signatures(ours, type)).toEqual(signatures([...x402UptoPermit2ProxyABI, ...deployedProxyFacts], type));
    }
    expect(await read(UPTO_PERMIT2_PROXY_ADDRESS, uptoAbi, "PERMIT2")).toBe(PERMIT2_ADDRESS);
    // the witness type as the reference client signs it: Witness(address to,address facilitator,uint256 validAfter)
    const witnessType = `Witness(${uptoPermit2WitnessTypes.Witness.map((f) => `${f.type} ${f.name}`).join(",")})`;
    expect(witnessType).toBe("Witness(address to,address facilitator,uint256 validAfter)");
    expect(await read(UPTO_PERMIT2_PROXY_ADDRESS, uptoAbi, "WITNESS_TYPEHASH")).toBe(keccak256(toHex(witnessType)));
    expect(await read(UPTO_PERMIT2_PROXY_ADDRESS, uptoAbi, "WITNESS_TYPE_STRING")).toBe(
      `Witness witness)TokenPermissions(address token,uint256 amount)${witnessType}`,
    );
  });

  it("x402BatchSettlement carries every function and event of the reference batchSettlementABI", () => {
    const ours = devnetContract(contracts, "DevnetBatchSettlement").abi;
    for (const type of ["function", "event"] as const) {
      const mine = signatures(ours, type);
      for (const s of signatures(ref.batchSettlementABI, type)) expect(mine, s).toContain(s);
    }
    expect(signatures(ref.batchSettlementABI, "function").length).toBeGreaterThanOrEqual(18);
  });

  it("the stand-ins show exactly the deployed contracts' events and errors (names, arguments, indexing) and their getters", () => {
    const batch = devnetContract(contracts, "DevnetBatchSettlement").abi;
    for (const type of ["event", "error"] as const) expect(signatures(batch, type)).toEqual(signatures(deployedBatchFacts, type));
    // Every function ours has, the deployed one has too (published ABI or getter facts), and no more.
    expect(signatures(batch, "function")).toEqual([...new Set([...signatures(ref.batchSettlementABI, "function"), ...signatures(deployedBatchFacts, "function")])].sort());
    const erc3009 = devnetContract(contracts, "DevnetERC3009DepositCollector").abi;
    const permit2 = devnetContract(contracts, "DevnetPermit2DepositCollector").abi;
    for (const [ours, facts] of [
      [erc3009, deployedCollectorFacts],
      [permit2, [...deployedCollectorFacts, ...deployedPermit2CollectorFacts]],
    ] as const) {
      for (const type of ["function", "event", "error"] as const) {
        const mine = signatures(ours, type);
        for (const s of signatures(facts, type)) expect(mine, s).toContain(s);
      }
      // Nothing beyond the facts but the collector's own escrow helpers' errors from OpenZeppelin.
      const extra = signatures(ours, "error").filter((s) => !signatures([...facts, ...deployedBatchFacts], "error").includes(s));
      expect(extra).toEqual([]);
    }
  });

  it("batch-settlement EIP-712 domain, type hashes and digests equal the reference type definitions", async () => {
    expect(await publicClient.getEip712Domain({ address: BATCH_SETTLEMENT_ADDRESS })).toMatchObject({
      domain: { name: "x402 Batch Settlement", version: "1", chainId: CHAIN_ID, verifyingContract: BATCH_SETTLEMENT_ADDRESS },
    });
    expect(await read(BATCH_SETTLEMENT_ADDRESS, batchAbi, "CHANNEL_CONFIG_TYPEHASH")).toBe(
      keccak256(toHex("ChannelConfig(address payer,address payerAuthorizer,address receiver,address receiverAuthorizer,address token,uint40 withdrawDelay,bytes32 salt)")),
    );

    const config = channelConfig(payerA, { salt: randomBytes32() });
    const channelId = computeChannelId(config, NETWORK);
    expect(await read(BATCH_SETTLEMENT_ADDRESS, batchAbi, "getChannelId", [config])).toBe(channelId);
    expect(channelId).toBe(hashTypedData({ domain: batchDomain, types: channelConfigTypes, primaryType: "ChannelConfig", message: config }));
    // chain-bound: the same config has another id on another chain
    expect(computeChannelId(config, "eip155:8453")).not.toBe(channelId);

    expect(await read(BATCH_SETTLEMENT_ADDRESS, batchAbi, "getVoucherDigest", [channelId, 1234n])).toBe(
      hashTypedData({ domain: batchDomain, types: voucherTypes, primaryType: "Voucher", message: { channelId, maxClaimableAmount: 1234n } }),
    );
    expect(await read(BATCH_SETTLEMENT_ADDRESS, batchAbi, "getRefundDigest", [channelId, 7n, 99n])).toBe(
      hashTypedData({ domain: batchDomain, types: refundTypes, primaryType: "Refund", message: { channelId, nonce: 7n, amount: 99n } }),
    );
    const other = channelConfig(payerB, { salt: randomBytes32(), receiverAuthorizer: serverAuthorizer.address });
    const rows = [claimRow(config, 50n, "0x", 40n), claimRow(other, 9n, "0x", 9n)];
    expect(await read(BATCH_SETTLEMENT_ADDRESS, batchAbi, "getClaimBatchDigest", [rows])).toBe(claimBatchDigest(rows));
    expect(await read(BATCH_SETTLEMENT_ADDRESS, batchAbi, "getClaimBatchDigest", [[]])).toBe(
      hashTypedData({ domain: batchDomain, types: claimBatchTypes, primaryType: "ClaimBatch", message: { claims: [] } }),
    );
  });

  it("deposit collectors: constants and the Permit2 deposit witness type string", async () => {
    expect(await read(ERC3009_DEPOSIT_COLLECTOR_ADDRESS, erc3009CollectorAbi, "x402BatchSettlement")).toBe(BATCH_SETTLEMENT_ADDRESS);
    expect(await read(PERMIT2_DEPOSIT_COLLECTOR_ADDRESS, permit2CollectorAbi, "x402BatchSettlement")).toBe(BATCH_SETTLEMENT_ADDRESS);
    expect(await read(PERMIT2_DEPOSIT_COLLECTOR_ADDRESS, permit2CollectorAbi, "PERMIT2")).toBe(PERMIT2_ADDRESS);
    const witness = ref.batchPermit2WitnessTypes.DepositWitness!;
    const witnessType = `DepositWitness(${witness.map((f) => `${f.type} ${f.name}`).join(",")})`;
    expect(await read(PERMIT2_DEPOSIT_COLLECTOR_ADDRESS, permit2CollectorAbi, "DEPOSIT_WITNESS_TYPEHASH")).toBe(keccak256(toHex(witnessType)));
    expect(await read(PERMIT2_DEPOSIT_COLLECTOR_ADDRESS, permit2CollectorAbi, "DEPOSIT_WITNESS_TYPE_STRING")).toBe(
      `DepositWitness witness)${witnessType}TokenPermissions(address token,uint256 amount)`,
    );
  });
});

// ------------------------------------------------------------------ upto

interface PermitTransferFrom {
  permitted: { token: Address; amount: bigint };
  nonce: bigint;
  deadline: bigint;
}

interface UptoWitness {
  to: Address;
  facilitator: Address;
  validAfter: bigint;
}

async function signUpto(
  owner: PrivateKeyAccount,
  token: Address,
  ceiling: bigint,
  witness: Partial<UptoWitness> = {},
  overrides: { deadline?: bigint; spender?: Address } = {},
): Promise<{ permit: PermitTransferFrom; witness: UptoWitness; signature: Hex }> {
  const w: UptoWitness = { to: merchant, facilitator: relayer.address, validAfter: 0n, ...witness };
  const permit = { permitted: { token, amount: ceiling }, nonce: BigInt(randomBytes32()), deadline: overrides.deadline ?? (await now()) + 300n };
  const signature = await owner.signTypedData({
    domain: permit2Domain,
    types: uptoPermit2WitnessTypes,
    primaryType: "PermitWitnessTransferFrom",
    message: { ...permit, spender: overrides.spender ?? UPTO_PERMIT2_PROXY_ADDRESS, witness: w },
  });
  return { permit, witness: w, signature };
}

describe("upto Permit2 proxy", () => {
  function uptoRequirements(asset: AssetInfo, amount: bigint, facilitatorAddress: Address) {
    const extra: Record<string, unknown> = { facilitatorAddress };
    if (asset.eip712) Object.assign(extra, asset.eip712);
    return { scheme: "upto", network: NETWORK, asset: asset.address, amount: amount.toString(), payTo: merchant, maxTimeoutSeconds: 120, extra };
  }

  it("a payload from the reference upto client settles less than the ceiling, sent from witness.facilitator", async () => {
    const facilitator = new UptoEvmFacilitatorScheme(facilitatorSigner(relayerWallet));
    const { facilitatorAddress } = facilitator.getExtra(NETWORK) as { facilitatorAddress: Address };
    expect(facilitatorAddress).toBe(relayer.address);
    const client = new UptoEvmClientScheme(toClientEvmSigner(payerA, publicClient));
    for (const asset of [USDC, USDT]) {
      const ceiling = 5n * 10n ** BigInt(asset.decimals);
      const actual = ceiling / 3n + 17n;
      const req = uptoRequirements(asset, ceiling, facilitatorAddress);
      const created = await client.createPaymentPayload(2, req);
      const auth = (created.payload as { permit2Authorization: { spender: string; witness: { facilitator: string } } }).permit2Authorization;
      expect(auth.spender).toBe(UPTO_PERMIT2_PROXY_ADDRESS);
      expect(auth.witness.facilitator).toBe(relayer.address);
      const payload = { ...created, accepted: req };
      expect(await facilitator.verify(payload, req)).toMatchObject({ isValid: true, payer: payerA.address });
      const [payerBefore, merchantBefore] = [await balanceOf(asset.address, payerA.address), await balanceOf(asset.address, merchant)];
      const settled = await facilitator.settle(payload, { ...req, amount: actual.toString() });
      expect(settled).toMatchObject({ success: true, network: NETWORK, payer: payerA.address, amount: actual.toString() });
      expect(await balanceOf(asset.address, payerA.address)).toBe(payerBefore - actual);
      expect(await balanceOf(asset.address, merchant)).toBe(merchantBefore + actual);
      const receipt = await publicClient.getTransactionReceipt({ hash: settled.transaction as Hex });
      expect(receipt.from.toLowerCase()).toBe(relayer.address.toLowerCase());
      expect(receipt.to?.toLowerCase()).toBe(UPTO_PERMIT2_PROXY_ADDRESS.toLowerCase());
      expect(eventNames(receipt, UPTO_PERMIT2_PROXY_ADDRESS, uptoAbi)).toEqual(["Settled"]);
      // the Permit2 nonce is spent: the rest of the ceiling can never be pulled with this signature
      const again = await facilitator.settle(payload, { ...req, amount: "1" });
      expect(again.success).toBe(false);
    }
  });

  it("reference facilitator: 0 settles nothing, above the ceiling is refused, a foreign witness.facilitator is refused", async () => {
    const facilitator = new UptoEvmFacilitatorScheme(facilitatorSigner(relayerWallet));
    const client = new UptoEvmClientScheme(toClientEvmSigner(payerA, publicClient));
    const req = uptoRequirements(USDC, 1_000_000n, relayer.address);
    const payload = { ...(await client.createPaymentPayload(2, req)), accepted: req };
    const nonceBefore = await txCount(relayer.address);
    const [payerBefore, merchantBefore] = [await balanceOf(USDC.address, payerA.address), await balanceOf(USDC.address, merchant)];
    expect(await facilitator.settle(payload, { ...req, amount: "0" })).toMatchObject({ success: true, transaction: "", amount: "0" });
    expect(await facilitator.settle(payload, { ...req, amount: "1000001" })).toMatchObject({
      success: false,
      transaction: "",
      errorReason: "invalid_upto_evm_payload_settlement_exceeds_amount",
    });
    expect(await txCount(relayer.address)).toBe(nonceBefore);
    expect(await balanceOf(USDC.address, payerA.address)).toBe(payerBefore);
    expect(await balanceOf(USDC.address, merchant)).toBe(merchantBefore);
    // exactly the ceiling is fine
    expect(await facilitator.settle(payload, req)).toMatchObject({ success: true, amount: "1000000" });

    const foreignReq = uptoRequirements(USDC, 1000n, otherFacilitator.address);
    const foreign = { ...(await client.createPaymentPayload(2, foreignReq)), accepted: foreignReq };
    expect(await facilitator.verify(foreign, foreignReq)).toMatchObject({ isValid: false, invalidReason: "upto_facilitator_mismatch" });
    // ... while the facilitator it names settles it
    const theirs = new UptoEvmFacilitatorScheme(facilitatorSigner(otherFacilitatorWallet));
    expect(await theirs.settle(foreign, { ...foreignReq, amount: "400" })).toMatchObject({ success: true, amount: "400" });
  });

  it("reference client + facilitator with EIP-2612 gas sponsoring: settleWithPermit for a payer without allowance", async () => {
    const facilitator = new UptoEvmFacilitatorScheme(facilitatorSigner(relayerWallet));
    const client = new UptoEvmClientScheme(toClientEvmSigner(payerB, publicClient));
    expect(await read(USDC.address, tokenAbi, "allowance", [payerB.address, PERMIT2_ADDRESS])).toBe(0n);
    const req = uptoRequirements(USDC, 2_000_000n, relayer.address);
    const created = await client.createPaymentPayload(2, req, { extensions: { eip2612GasSponsoring: {} } } as never);
    expect(created.extensions).toHaveProperty("eip2612GasSponsoring");
    const payload = { ...created, accepted: req };
    expect(await facilitator.verify(payload, req)).toMatchObject({ isValid: true });
    const before = await balanceOf(USDC.address, merchant);
    const settled = await facilitator.settle(payload, { ...req, amount: "1234567" });
    expect(settled).toMatchObject({ success: true, amount: "1234567" });
    expect(await balanceOf(USDC.address, merchant)).toBe(before + 1_234_567n);
    const receipt = await publicClient.getTransactionReceipt({ hash: settled.transaction as Hex });
    expect(eventNames(receipt, UPTO_PERMIT2_PROXY_ADDRESS, uptoAbi)).toEqual(["SettledWithPermit"]);
  });

  it("settle directly: any amount up to the ceiling, only from witness.facilitator", async () => {
    const { permit, witness, signature } = await signUpto(payerA, USDT.address, 10n ** 18n);
    const args = (amount: bigint, w: UptoWitness = witness) => [permit, amount, payerA.address, w, signature] as const;
    expect(await revertOf(simulate(UPTO_PERMIT2_PROXY_ADDRESS, uptoAbi, "settle", args(1n), stranger.address))).toBe("UnauthorizedFacilitator");
    expect(await revertOf(simulate(UPTO_PERMIT2_PROXY_ADDRESS, uptoAbi, "settle", args(10n ** 18n + 1n)))).toBe("AmountExceedsPermitted");
    // a caller naming itself in the witness breaks the payer's signature
    expect(await revertOf(simulate(UPTO_PERMIT2_PROXY_ADDRESS, uptoAbi, "settle", args(1n, { ...witness, facilitator: stranger.address }), stranger.address))).toBe(
      "InvalidSigner",
    );
    expect(await revertOf(simulate(UPTO_PERMIT2_PROXY_ADDRESS, uptoAbi, "settle", args(1n, { ...witness, to: stranger.address })))).toBe("InvalidSigner");
    const before = await balanceOf(USDT.address, merchant);
    const receipt = await send(relayerWallet, UPTO_PERMIT2_PROXY_ADDRESS, uptoAbi, "settle", args(123n));
    expect(eventNames(receipt, UPTO_PERMIT2_PROXY_ADDRESS, uptoAbi)).toEqual(["Settled"]);
    expect(await balanceOf(USDT.address, merchant)).toBe(before + 123n);
    expect(await revertOf(simulate(UPTO_PERMIT2_PROXY_ADDRESS, uptoAbi, "settle", args(1n)))).toBe("InvalidNonce");
  });

  it("reverts InvalidOwner, InvalidDestination, PaymentTooEarly, Permit2612AmountMismatch, SignatureExpired, InvalidAmount, in the deployed proxy's order", async () => {
    const { permit, witness, signature } = await signUpto(payerA, USDT.address, 100n);
    expect(await revertOf(simulate(UPTO_PERMIT2_PROXY_ADDRESS, uptoAbi, "settle", [permit, 1n, zeroAddress, witness, signature]))).toBe("InvalidOwner");
    expect(await revertOf(simulate(UPTO_PERMIT2_PROXY_ADDRESS, uptoAbi, "settle", [permit, 1n, payerA.address, { ...witness, to: zeroAddress }, signature]))).toBe(
      "InvalidDestination",
    );
    const early = await signUpto(payerA, USDT.address, 100n, { validAfter: (await now()) + 3600n });
    expect(await revertOf(simulate(UPTO_PERMIT2_PROXY_ADDRESS, uptoAbi, "settle", [early.permit, 1n, payerA.address, early.witness, early.signature]))).toBe(
      "PaymentTooEarly",
    );
    const expired = await signUpto(payerA, USDT.address, 100n, {}, { deadline: (await now()) - 1n });
    expect(await revertOf(simulate(UPTO_PERMIT2_PROXY_ADDRESS, uptoAbi, "settle", [expired.permit, 1n, payerA.address, expired.witness, expired.signature]))).toBe(
      "SignatureExpired",
    );
    // a signature made for the exact proxy (or any other spender) does not work here
    const otherSpender = await signUpto(payerA, USDT.address, 100n, {}, { spender: stranger.address });
    expect(
      await revertOf(simulate(UPTO_PERMIT2_PROXY_ADDRESS, uptoAbi, "settle", [otherSpender.permit, 1n, payerA.address, otherSpender.witness, otherSpender.signature])),
    ).toBe("InvalidSigner");
    const p2612 = { value: 101n, deadline: permit.deadline, r: randomBytes32(), s: randomBytes32(), v: 27 };
    expect(await revertOf(simulate(UPTO_PERMIT2_PROXY_ADDRESS, uptoAbi, "settleWithPermit", [p2612, permit, 1n, payerA.address, witness, signature]))).toBe(
      "Permit2612AmountMismatch",
    );
    // settleWithPermit applies the same checks
    const ok2612 = { ...p2612, value: 100n };
    expect(await revertOf(simulate(UPTO_PERMIT2_PROXY_ADDRESS, uptoAbi, "settleWithPermit", [ok2612, permit, 1n, payerA.address, witness, signature], stranger.address))).toBe(
      "UnauthorizedFacilitator",
    );
    expect(await revertOf(simulate(UPTO_PERMIT2_PROXY_ADDRESS, uptoAbi, "settleWithPermit", [ok2612, permit, 101n, payerA.address, witness, signature]))).toBe(
      "AmountExceedsPermitted",
    );
    // The deployed proxy's order of checks: the ceiling, the caller, the 2612 value, then a zero
    // amount (InvalidAmount: raised by the deployed proxy though the published ABI leaves it out),
    // the parties and time. Each case breaks two rules; the first one in that order must answer.
    const upto = (fn: "settle" | "settleWithPermit", args: readonly unknown[], from?: Address) =>
      revertOf(simulate(UPTO_PERMIT2_PROXY_ADDRESS, [...uptoAbi, ...deployedProxyFacts], fn, args, from));
    const nowhere = { ...witness, to: zeroAddress };
    expect(await upto("settle", [permit, 101n, payerA.address, witness, signature], stranger.address)).toBe("AmountExceedsPermitted");
    expect(await upto("settle", [permit, 0n, payerA.address, witness, signature], stranger.address)).toBe("UnauthorizedFacilitator");
    expect(await upto("settle", [permit, 0n, zeroAddress, nowhere, signature])).toBe("InvalidAmount");
    expect(await upto("settle", [early.permit, 1n, payerA.address, { ...early.witness, to: zeroAddress }, early.signature])).toBe("InvalidDestination");
    expect(await upto("settleWithPermit", [p2612, permit, 101n, payerA.address, witness, signature])).toBe("AmountExceedsPermitted");
    expect(await upto("settleWithPermit", [p2612, permit, 0n, payerA.address, witness, signature], stranger.address)).toBe("UnauthorizedFacilitator");
    expect(await upto("settleWithPermit", [p2612, permit, 0n, zeroAddress, witness, signature])).toBe("Permit2612AmountMismatch");
    expect(await upto("settleWithPermit", [ok2612, permit, 0n, zeroAddress, witness, signature])).toBe("InvalidAmount");
    // an invalid 2612 permit is not a revert: the deployed proxy reports it in an event, and with an
    // existing allowance the payment still settles
    const before = await balanceOf(USDT.address, merchant);
    const receipt = await send(relayerWallet, UPTO_PERMIT2_PROXY_ADDRESS, uptoAbi, "settleWithPermit", [ok2612, permit, 60n, payerA.address, witness, signature]);
    expect(await balanceOf(USDT.address, merchant)).toBe(before + 60n);
    const failed = events(receipt, UPTO_PERMIT2_PROXY_ADDRESS, [...uptoAbi, ...deployedProxyFacts]);
    expect(failed.map((e) => e.eventName)).toEqual([expect.stringMatching(/^EIP2612PermitFailedWith(Reason|Panic|Data)$/), "SettledWithPermit"]);
    expect(failed[0]!.args).toMatchObject({ token: getAddress(USDT.address), owner: payerA.address });
  });

  it("settleWithPermit directly: the EIP-2612 permit for the ceiling gives Permit2 the allowance", async () => {
    const payer = payers[5]!; // no Permit2 allowance
    const { permit, witness, signature } = await signUpto(payer, USDC.address, 3_000n);
    const p = await signEip2612(payer, USDC, 3_000n, permit.deadline);
    expect(await revertOf(simulate(UPTO_PERMIT2_PROXY_ADDRESS, uptoAbi, "settle", [permit, 1n, payer.address, witness, signature]))).toMatch(/TRANSFER_FROM_FAILED|allowance/);
    const before = await balanceOf(USDC.address, merchant);
    await send(relayerWallet, UPTO_PERMIT2_PROXY_ADDRESS, uptoAbi, "settleWithPermit", [{ value: 3_000n, deadline: permit.deadline, ...p }, permit, 2_999n, payer.address, witness, signature]);
    expect(await balanceOf(USDC.address, merchant)).toBe(before + 2_999n);
    // Permit2 transferred 2,999 of the 3,000 allowance
    expect(await read(USDC.address, tokenAbi, "allowance", [payer.address, PERMIT2_ADDRESS])).toBe(1n);
  });

  it("reverts InvalidPermit2Address without Permit2 code, ReentrancyGuardReentrantCall on re-entry", async () => {
    const { permit, witness, signature } = await signUpto(payerA, USDT.address, 100n);
    const snapshot = await testClient.snapshot();
    try {
      await testClient.setCode({ address: PERMIT2_ADDRESS, bytecode: "0x" });
      expect(await revertOf(simulate(UPTO_PERMIT2_PROXY_ADDRESS, uptoAbi, "settle", [permit, 1n, payerA.address, witness, signature]))).toBe("InvalidPermit2Address");
    } finally {
      await testClient.revert({ id: snapshot });
    }
    expect(await publicClient.getCode({ address: PERMIT2_ADDRESS })).not.toBe(undefined);

    // A token whose transferFrom calls back into the proxy: the inner settle hits the lock.
    const probe = privateKeyToAccount(generatePrivateKey()).address;
    await testClient.setCode({ address: probe, bytecode: devnetContract(contracts, "DevnetReentrancyProbe").deployedBytecode });
    const inner = await signUpto(payerA, USDT.address, 1n);
    const reenter = encodeFunctionData({ abi: uptoAbi, functionName: "settle", args: [inner.permit, 1n, payerA.address, inner.witness, inner.signature] });
    await send(relayerWallet, probe, probeAbi, "arm", [UPTO_PERMIT2_PROXY_ADDRESS, reenter, false]);
    const outer = await signUpto(payerA, probe, 5n);
    await send(relayerWallet, UPTO_PERMIT2_PROXY_ADDRESS, uptoAbi, "settle", [outer.permit, 5n, payerA.address, outer.witness, outer.signature]);
    expect(await read(probe, probeAbi, "lastRevertData")).toBe(toFunctionSelector("ReentrancyGuardReentrantCall()"));
  });
});

// ------------------------------------------------------------------ batch settlement: helpers

interface ChannelConfig {
  payer: Address;
  payerAuthorizer: Address;
  receiver: Address;
  receiverAuthorizer: Address;
  token: Address;
  withdrawDelay: number;
  salt: Hex;
}

interface VoucherClaim {
  voucher: { channel: ChannelConfig; maxClaimableAmount: bigint };
  signature: Hex;
  totalClaimed: bigint;
}

function channelConfig(payer: PrivateKeyAccount, overrides: Partial<ChannelConfig> = {}): ChannelConfig {
  return {
    payer: payer.address,
    payerAuthorizer: payer.address,
    receiver: merchant,
    receiverAuthorizer: serverAuthorizer.address,
    token: USDC.address,
    withdrawDelay: WITHDRAW_DELAY,
    salt: randomBytes32(),
    ...overrides,
  };
}

function idOf(config: ChannelConfig): Hex {
  return computeChannelId(config, NETWORK);
}

function signVoucher(signer: PrivateKeyAccount, channelId: Hex, maxClaimableAmount: bigint): Promise<Hex> {
  return signer.signTypedData({ domain: batchDomain, types: voucherTypes, primaryType: "Voucher", message: { channelId, maxClaimableAmount } });
}

function claimRow(channel: ChannelConfig, maxClaimableAmount: bigint, signature: Hex, totalClaimed: bigint): VoucherClaim {
  return { voucher: { channel, maxClaimableAmount }, signature, totalClaimed };
}

async function signedRow(signer: PrivateKeyAccount, channel: ChannelConfig, maxClaimableAmount: bigint, totalClaimed = maxClaimableAmount): Promise<VoucherClaim> {
  return claimRow(channel, maxClaimableAmount, await signVoucher(signer, idOf(channel), maxClaimableAmount), totalClaimed);
}

function claimBatchMessage(rows: VoucherClaim[]) {
  return { claims: rows.map((r) => ({ channelId: idOf(r.voucher.channel), maxClaimableAmount: r.voucher.maxClaimableAmount, totalClaimed: r.totalClaimed })) };
}

function claimBatchDigest(rows: VoucherClaim[]): Hex {
  return hashTypedData({ domain: batchDomain, types: claimBatchTypes, primaryType: "ClaimBatch", message: claimBatchMessage(rows) });
}

function signClaimBatch(signer: PrivateKeyAccount, rows: VoucherClaim[]): Promise<Hex> {
  return signer.signTypedData({ domain: batchDomain, types: claimBatchTypes, primaryType: "ClaimBatch", message: claimBatchMessage(rows) });
}

function signRefund(signer: PrivateKeyAccount, channelId: Hex, nonce: bigint, amount: bigint): Promise<Hex> {
  return signer.signTypedData({ domain: batchDomain, types: refundTypes, primaryType: "Refund", message: { channelId, nonce, amount } });
}

/** collectorData for the ERC-3009 collector: abi.encode(validAfter, validBefore, salt, signature). */
async function erc3009CollectorData(
  payer: PrivateKeyAccount,
  config: ChannelConfig,
  amount: bigint,
  opts: { validAfter?: bigint; validBefore?: bigint; salt?: Hex; boundChannelId?: Hex; asset?: AssetInfo } = {},
): Promise<Hex> {
  const salt = opts.salt ?? randomBytes32();
  const validAfter = opts.validAfter ?? 0n;
  const validBefore = opts.validBefore ?? (await now()) + 300n;
  const nonce = keccak256(encodeAbiParameters([{ type: "bytes32" }, { type: "uint256" }], [opts.boundChannelId ?? idOf(config), BigInt(salt)]));
  const signature = await payer.signTypedData({
    domain: tokenDomain(opts.asset ?? USDC),
    types: ref.receiveAuthorizationTypes,
    primaryType: "ReceiveWithAuthorization",
    message: { from: payer.address, to: ERC3009_DEPOSIT_COLLECTOR_ADDRESS, value: amount, validAfter, validBefore, nonce },
  });
  return encodeAbiParameters([{ type: "uint256" }, { type: "uint256" }, { type: "uint256" }, { type: "bytes" }], [validAfter, validBefore, BigInt(salt), signature]);
}

/** collectorData for the Permit2 collector: abi.encode(nonce, deadline, signature, eip2612PermitData). */
async function permit2CollectorData(
  payer: PrivateKeyAccount,
  config: ChannelConfig,
  amount: bigint,
  opts: { deadline?: bigint; spender?: Address; boundChannelId?: Hex; nonce?: bigint; eip2612?: Hex } = {},
): Promise<Hex> {
  const nonce = opts.nonce ?? BigInt(randomBytes32());
  const deadline = opts.deadline ?? (await now()) + 300n;
  const signature = await payer.signTypedData({
    domain: permit2Domain,
    types: ref.batchPermit2WitnessTypes,
    primaryType: "PermitWitnessTransferFrom",
    message: {
      permitted: { token: config.token, amount },
      spender: opts.spender ?? PERMIT2_DEPOSIT_COLLECTOR_ADDRESS,
      nonce,
      deadline,
      witness: { channelId: opts.boundChannelId ?? idOf(config) },
    },
  });
  return encodeAbiParameters([{ type: "uint256" }, { type: "uint256" }, { type: "bytes" }, { type: "bytes" }], [nonce, deadline, signature, opts.eip2612 ?? "0x"]);
}

async function depositVia3009(payer: PrivateKeyAccount, config: ChannelConfig, amount: bigint): Promise<TransactionReceipt> {
  return send(relayerWallet, BATCH_SETTLEMENT_ADDRESS, batchAbi, "deposit", [config, amount, ERC3009_DEPOSIT_COLLECTOR_ADDRESS, await erc3009CollectorData(payer, config, amount)]);
}

interface ChannelView {
  balance: bigint;
  totalClaimed: bigint;
  pendingAmount: bigint;
  initiatedAt: number;
  refundNonce: bigint;
}

async function channelState(config: ChannelConfig): Promise<ChannelView> {
  const id = idOf(config);
  const [balance, totalClaimed] = await read<readonly [bigint, bigint]>(BATCH_SETTLEMENT_ADDRESS, batchAbi, "channels", [id]);
  const [pendingAmount, initiatedAt] = await read<readonly [bigint, number]>(BATCH_SETTLEMENT_ADDRESS, batchAbi, "pendingWithdrawals", [id]);
  const refundNonce = await read<bigint>(BATCH_SETTLEMENT_ADDRESS, batchAbi, "refundNonce", [id]);
  return { balance, totalClaimed, pendingAmount, initiatedAt: Number(initiatedAt), refundNonce };
}

async function receiverState(receiver: Address, token: Address): Promise<{ totalClaimed: bigint; totalSettled: bigint }> {
  const [totalClaimed, totalSettled] = await read<readonly [bigint, bigint]>(BATCH_SETTLEMENT_ADDRESS, batchAbi, "receivers", [receiver, token]);
  return { totalClaimed, totalSettled };
}

function batchRequirements(amount: bigint, extra: Record<string, unknown> = {}, asset: AssetInfo = USDC, payTo: Address = merchant) {
  return {
    scheme: "batch-settlement",
    network: NETWORK,
    asset: asset.address,
    amount: amount.toString(),
    payTo,
    maxTimeoutSeconds: 300,
    extra: { receiverAuthorizer: facilitatorAuthorizer.address, withdrawDelay: WITHDRAW_DELAY, ...(asset.eip712 ?? {}), ...extra },
  };
}

// ------------------------------------------------------------------ batch settlement: reference stack

describe("batch settlement through the reference @x402/evm client and facilitator", () => {
  it("3 channels, 30 vouchers with no transaction, one claim transaction for all channels, one settle, refunds", async () => {
    const facilitator = new BatchFacilitatorScheme(facilitatorSigner(relayerWallet), authorizerSigner(facilitatorAuthorizer));
    expect(facilitator.getExtra(NETWORK)).toEqual({ receiverAuthorizer: facilitatorAuthorizer.address });
    const price = 1_000n;
    const req = batchRequirements(price, {}, USDC, merchant2);
    const channels = await Promise.all(
      [payers[2]!, payers[3]!, payers[4]!].map(async (payer) => {
        const storage = new InMemoryClientChannelStorage();
        const client = new BatchClientScheme(toClientEvmSigner(payer, publicClient), { storage, depositPolicy: { depositMultiplier: 20 } });
        const config = client.buildChannelConfig(req) as ChannelConfig;
        return { payer, storage, client, config, id: idOf(config), charged: 0n, last: undefined as { max: string; signature: Hex } | undefined };
      }),
    );
    const relayerTxsBefore = await txCount(relayer.address);

    // first request of each channel: deposit (one transaction each)
    for (const ch of channels) {
      expect(await read(BATCH_SETTLEMENT_ADDRESS, batchAbi, "getChannelId", [ch.config])).toBe(ch.id);
      const created = await ch.client.createPaymentPayload(2, req);
      const p = created.payload as { type: string; deposit: { amount: string }; voucher: { maxClaimableAmount: string; signature: Hex } };
      expect(p.type).toBe("deposit");
      expect(p.deposit.amount).toBe((price * 20n).toString());
      const payload = { ...created, accepted: req };
      expect(await facilitator.verify(payload, req)).toMatchObject({ isValid: true, extra: { channelId: ch.id, balance: "0", totalClaimed: "0" } });
      const settled = await facilitator.settle(payload, req);
      expect(settled).toMatchObject({ success: true, amount: p.deposit.amount, extra: { channelState: { channelId: ch.id, balance: p.deposit.amount } } });
      const receipt = await publicClient.getTransactionReceipt({ hash: settled.transaction as Hex });
      expect(eventNames(receipt, BATCH_SETTLEMENT_ADDRESS, batchAbi)).toEqual(["ChannelCreated", "Deposited"]);
      const charge = price - 100n;
      await updateChannelFromSettle(ch.storage, { server: { chargedAmount: charge.toString() }, local: { channelId: ch.id, requestAmount: req.amount, depositAmount: p.deposit.amount } });
      ch.charged += charge;
      ch.last = { max: p.voucher.maxClaimableAmount, signature: p.voucher.signature };
    }
    expect(await txCount(relayer.address)).toBe(relayerTxsBefore + 3);

    // 30 paid requests: vouchers only, verified against on-chain state, no transaction
    for (let i = 0; i < 10; i++) {
      for (const [j, ch] of channels.entries()) {
        const created = await ch.client.createPaymentPayload(2, req);
        const p = created.payload as { type: string; voucher: { maxClaimableAmount: string; signature: Hex } };
        expect(p.type).toBe("voucher");
        expect(BigInt(p.voucher.maxClaimableAmount)).toBe(ch.charged + price);
        expect(await facilitator.verify({ ...created, accepted: req }, req)).toMatchObject({ isValid: true, extra: { channelId: ch.id } });
        const charge = price - BigInt(i * 10 + j);
        await updateChannelFromSettle(ch.storage, { server: { chargedAmount: charge.toString() }, local: { channelId: ch.id, requestAmount: req.amount } });
        ch.charged += charge;
        ch.last = { max: p.voucher.maxClaimableAmount, signature: p.voucher.signature };
      }
    }
    expect(await txCount(relayer.address)).toBe(relayerTxsBefore + 3);

    // one claim transaction for all three channels (authorizer signature made by the facilitator)
    const claims = channels.map((ch) => ({ voucher: { channel: ch.config, maxClaimableAmount: ch.last!.max }, signature: ch.last!.signature, totalClaimed: ch.charged.toString() }));
    const claimed = await facilitator.settle({ x402Version: 2, accepted: req, payload: { type: "claim", claims } }, req);
    expect(claimed).toMatchObject({ success: true, network: NETWORK });
    const claimReceipt = await publicClient.getTransactionReceipt({ hash: claimed.transaction as Hex });
    expect(eventNames(claimReceipt, BATCH_SETTLEMENT_ADDRESS, batchAbi)).toEqual(["Claimed", "Claimed", "Claimed"]);
    for (const ch of channels) expect((await channelState(ch.config)).totalClaimed).toBe(ch.charged);
    const total = channels.reduce((s, ch) => s + ch.charged, 0n);
    expect(await receiverState(merchant2, USDC.address)).toEqual({ totalClaimed: total, totalSettled: 0n });

    // one settle transaction sweeps everything to the receiver
    const receiverBefore = await balanceOf(USDC.address, merchant2);
    const swept = await facilitator.settle({ x402Version: 2, accepted: req, payload: { type: "settle", receiver: merchant2, token: USDC.address } }, req);
    expect(swept).toMatchObject({ success: true, amount: total.toString() });
    expect(await balanceOf(USDC.address, merchant2)).toBe(receiverBefore + total);
    expect(await receiverState(merchant2, USDC.address)).toEqual({ totalClaimed: total, totalSettled: total });
    // nothing left: the reference refuses without a transaction
    expect(await facilitator.settle({ x402Version: 2, accepted: req, payload: { type: "settle", receiver: merchant2, token: USDC.address } }, req)).toMatchObject({
      success: false,
      errorReason: "invalid_batch_settlement_evm_nothing_to_settle",
    });
    expect(await txCount(relayer.address)).toBe(relayerTxsBefore + 5);

    // refund of channel 0 (no outstanding voucher): the rest goes back to the payer
    const [c0, c1] = [channels[0]!, channels[1]!];
    const s0 = await channelState(c0.config);
    const zeroCharge0 = { channelId: c0.id, maxClaimableAmount: c0.charged.toString(), signature: await signVoucher(c0.payer, c0.id, c0.charged) };
    const refundReq0 = { type: "refund", channelConfig: c0.config, voucher: zeroCharge0 };
    expect(await facilitator.verify({ x402Version: 2, accepted: req, payload: refundReq0 }, req)).toMatchObject({ isValid: true, extra: { refundNonce: "0" } });
    const payerBefore = await balanceOf(USDC.address, c0.payer.address);
    const refunded = await facilitator.settle(
      { x402Version: 2, accepted: req, payload: { ...refundReq0, amount: (s0.balance - s0.totalClaimed).toString(), refundNonce: "0", claims: [] } },
      req,
    );
    expect(refunded).toMatchObject({ success: true, amount: (s0.balance - s0.totalClaimed).toString(), extra: { channelState: { balance: s0.totalClaimed.toString(), refundNonce: "1" } } });
    expect(await balanceOf(USDC.address, c0.payer.address)).toBe(payerBefore + s0.balance - s0.totalClaimed);
    expect(await channelState(c0.config)).toMatchObject({ balance: s0.totalClaimed, totalClaimed: s0.totalClaimed, refundNonce: 1n });

    // channel 1 keeps going, then refunds partially with its outstanding voucher claimed in the same transaction
    const created = await c1.client.createPaymentPayload(2, req);
    const v = (created.payload as { voucher: { maxClaimableAmount: string; signature: Hex } }).voucher;
    expect(await facilitator.verify({ ...created, accepted: req }, req)).toMatchObject({ isValid: true });
    c1.charged += price;
    const s1 = await channelState(c1.config);
    const zeroCharge1 = { channelId: c1.id, maxClaimableAmount: c1.charged.toString(), signature: await signVoucher(c1.payer, c1.id, c1.charged) };
    const partial = 5_000n;
    const refunded1 = await facilitator.settle(
      {
        x402Version: 2,
        accepted: req,
        payload: {
          type: "refund",
          channelConfig: c1.config,
          voucher: zeroCharge1,
          amount: partial.toString(),
          refundNonce: "0",
          claims: [{ voucher: { channel: c1.config, maxClaimableAmount: v.maxClaimableAmount }, signature: v.signature, totalClaimed: c1.charged.toString() }],
        },
      },
      req,
    );
    expect(refunded1).toMatchObject({ success: true, amount: partial.toString() });
    const r1 = await publicClient.getTransactionReceipt({ hash: refunded1.transaction as Hex });
    expect(eventNames(r1, BATCH_SETTLEMENT_ADDRESS, batchAbi)).toEqual(["Claimed", "Refunded"]); // multicall: claim + refund
    expect(await channelState(c1.config)).toMatchObject({ balance: s1.balance - partial, totalClaimed: c1.charged, refundNonce: 1n });
    expect(await txCount(relayer.address)).toBe(relayerTxsBefore + 7);
  });

  it("a server-held receiverAuthorizer signs the claim batch; the facilitator only relays", async () => {
    const facilitator = new BatchFacilitatorScheme(facilitatorSigner(relayerWallet)); // no authorizer key
    expect(facilitator.getExtra(NETWORK)).toBeUndefined();
    const req = batchRequirements(500n, { receiverAuthorizer: serverAuthorizer.address });
    const configs = [channelConfig(payerA, { receiverAuthorizer: serverAuthorizer.address }), channelConfig(payerB, { receiverAuthorizer: serverAuthorizer.address })];
    for (const [i, c] of configs.entries()) await depositVia3009(payers[i]!, c, 10_000n);
    const rows = [await signedRow(payerA, configs[0]!, 800n, 700n), await signedRow(payerB, configs[1]!, 900n)];
    const claims = rows.map((r) => ({ ...r, voucher: { ...r.voucher, maxClaimableAmount: r.voucher.maxClaimableAmount.toString() }, totalClaimed: r.totalClaimed.toString() }));
    // without a signature and without an authorizer key the facilitator refuses
    expect(await facilitator.settle({ x402Version: 2, accepted: req, payload: { type: "claim", claims } }, req)).toMatchObject({
      success: false,
      errorReason: "invalid_batch_settlement_evm_authorizer_not_configured",
    });
    // a signature by someone else fails the facilitator's simulation
    const bad = await signClaimBatch(stranger, rows);
    expect(await facilitator.settle({ x402Version: 2, accepted: req, payload: { type: "claim", claims, claimAuthorizerSignature: bad } }, req)).toMatchObject({
      success: false,
      errorReason: "invalid_batch_settlement_evm_claim_simulation_failed",
    });
    const good = await signClaimBatch(serverAuthorizer, rows);
    expect(await facilitator.settle({ x402Version: 2, accepted: req, payload: { type: "claim", claims, claimAuthorizerSignature: good } }, req)).toMatchObject({ success: true });
    expect((await channelState(configs[0]!)).totalClaimed).toBe(700n);
    expect((await channelState(configs[1]!)).totalClaimed).toBe(900n);
    // a facilitator whose authorizer key is not the channel's refuses to sign for it
    const wrongKey = new BatchFacilitatorScheme(facilitatorSigner(relayerWallet), authorizerSigner(facilitatorAuthorizer));
    expect(await wrongKey.settle({ x402Version: 2, accepted: req, payload: { type: "claim", claims } }, req)).toMatchObject({
      success: false,
      errorReason: "invalid_batch_settlement_evm_authorizer_address_mismatch",
    });
  });

  it("Permit2 deposit through the reference client on the Permit2-only token, and with EIP-2612 for a payer without allowance", async () => {
    const facilitator = new BatchFacilitatorScheme(facilitatorSigner(relayerWallet), authorizerSigner(facilitatorAuthorizer));
    const price = 10n ** 15n;
    const req = batchRequirements(price, { assetTransferMethod: "permit2" }, USDT);
    const client = new BatchClientScheme(toClientEvmSigner(payerA, publicClient), { salt: randomBytes32() });
    const created = await client.createPaymentPayload(2, req);
    const p = created.payload as { type: string; deposit: { amount: string; authorization: { permit2Authorization?: { spender: string } } } };
    expect(p.type).toBe("deposit");
    expect(p.deposit.authorization.permit2Authorization?.spender).toBe(PERMIT2_DEPOSIT_COLLECTOR_ADDRESS);
    const payload = { ...created, accepted: req };
    expect(await facilitator.verify(payload, req)).toMatchObject({ isValid: true });
    const before = await balanceOf(USDT.address, BATCH_SETTLEMENT_ADDRESS);
    expect(await facilitator.settle(payload, req)).toMatchObject({ success: true, amount: (price * 5n).toString() });
    expect(await balanceOf(USDT.address, BATCH_SETTLEMENT_ADDRESS)).toBe(before + price * 5n);

    // a payer without Permit2 allowance on USDC: the reference client adds an EIP-2612 permit
    const reqB = batchRequirements(1_000n, { assetTransferMethod: "permit2" });
    const clientB = new BatchClientScheme(toClientEvmSigner(payers[6]!, publicClient), { salt: randomBytes32() });
    const plain = { ...(await clientB.createPaymentPayload(2, reqB)), accepted: reqB };
    expect(await facilitator.verify(plain, reqB)).toMatchObject({ isValid: false, invalidReason: "invalid_batch_settlement_evm_permit2_allowance_required" });
    const createdB = await clientB.createPaymentPayload(2, reqB, { extensions: { eip2612GasSponsoring: {} } } as never);
    expect(createdB.extensions).toHaveProperty("eip2612GasSponsoring");
    const payloadB = { ...createdB, accepted: reqB };
    expect(await facilitator.verify(payloadB, reqB)).toMatchObject({ isValid: true });
    expect(await facilitator.settle(payloadB, reqB)).toMatchObject({ success: true, amount: "5000" });
    expect((await channelState(clientB.buildChannelConfig(reqB) as ChannelConfig)).balance).toBe(5000n);
  });

  it("reference verify codes: bad voucher signature, above the balance, at or below claimed, unknown channel, expired deposit authorization", async () => {
    const facilitator = new BatchFacilitatorScheme(facilitatorSigner(relayerWallet), authorizerSigner(facilitatorAuthorizer));
    const req = batchRequirements(100n);
    const config = channelConfig(payerA, { receiverAuthorizer: facilitatorAuthorizer.address });
    const id = idOf(config);
    const voucher = async (max: bigint, signer: PrivateKeyAccount = payerA) => ({
      x402Version: 2,
      accepted: req,
      payload: { type: "voucher", channelConfig: config, voucher: { channelId: id, maxClaimableAmount: max.toString(), signature: await signVoucher(signer, id, max) } },
    });
    expect(await facilitator.verify(await voucher(100n), req)).toMatchObject({ isValid: false, invalidReason: "invalid_batch_settlement_evm_channel_not_found" });
    await depositVia3009(payerA, config, 1_000n);
    expect(await facilitator.verify(await voucher(100n), req)).toMatchObject({ isValid: true, extra: { balance: "1000", totalClaimed: "0" } });
    expect(await facilitator.verify(await voucher(100n, payerB), req)).toMatchObject({ isValid: false, invalidReason: "invalid_batch_settlement_evm_voucher_signature" });
    expect(await facilitator.verify(await voucher(1_001n), req)).toMatchObject({ isValid: false, invalidReason: "invalid_batch_settlement_evm_cumulative_exceeds_balance" });
    const row = await signedRow(payerA, config, 300n);
    await send(relayerWallet, BATCH_SETTLEMENT_ADDRESS, batchAbi, "claimWithSignature", [[row], await signClaimBatch(facilitatorAuthorizer, [row])]);
    expect(await facilitator.verify(await voucher(300n), req)).toMatchObject({ isValid: false, invalidReason: "invalid_batch_settlement_evm_cumulative_below_claimed" });
    expect(await facilitator.verify(await voucher(200n), req)).toMatchObject({ isValid: false, invalidReason: "invalid_batch_settlement_evm_cumulative_below_claimed" });
    expect(await facilitator.verify(await voucher(301n), req)).toMatchObject({ isValid: true, extra: { totalClaimed: "300" } });

    // an expired ERC-3009 deposit authorization: refused at verify, and the contract would revert
    const client = new BatchClientScheme(toClientEvmSigner(payerB, publicClient), { salt: randomBytes32() });
    const expiredReq = { ...req, maxTimeoutSeconds: 1 };
    const created = await client.createPaymentPayload(2, expiredReq);
    expect((created.payload as { type: string }).type).toBe("deposit");
    expect(await facilitator.verify({ ...created, accepted: expiredReq }, expiredReq)).toMatchObject({
      isValid: false,
      invalidReason: "invalid_batch_settlement_evm_payload_authorization_valid_before",
    });
    // (the collector tests below show the token itself refusing an expired authorization on chain)
  });
});

// ------------------------------------------------------------------ batch settlement: contract behaviour

describe("x402BatchSettlement deposits", () => {
  it("ERC-3009 deposit creates the channel, a top-up only adds; the collector forwards everything", async () => {
    const config = channelConfig(payerA);
    const id = idOf(config);
    const [payerBefore, escrowBefore] = [await balanceOf(USDC.address, payerA.address), await balanceOf(USDC.address, BATCH_SETTLEMENT_ADDRESS)];
    const first = await depositVia3009(payerA, config, 5_000n);
    const ev = events(first, BATCH_SETTLEMENT_ADDRESS, batchAbi);
    expect(ev.map((e) => e.eventName)).toEqual(["ChannelCreated", "Deposited"]);
    expect(ev[0]!.args).toEqual({ channelId: id, config });
    expect(ev[1]!.args).toEqual({ channelId: id, sender: relayer.address, amount: 5_000n, newBalance: 5_000n }); // the sender is the caller
    const second = await depositVia3009(payerA, config, 2_500n);
    expect(eventNames(second, BATCH_SETTLEMENT_ADDRESS, batchAbi)).toEqual(["Deposited"]);
    expect(await channelState(config)).toEqual({ balance: 7_500n, totalClaimed: 0n, pendingAmount: 0n, initiatedAt: 0, refundNonce: 0n });
    expect(await balanceOf(USDC.address, payerA.address)).toBe(payerBefore - 7_500n);
    expect(await balanceOf(USDC.address, BATCH_SETTLEMENT_ADDRESS)).toBe(escrowBefore + 7_500n);
    expect(await balanceOf(USDC.address, ERC3009_DEPOSIT_COLLECTOR_ADDRESS)).toBe(0n);
  });

  it("deposit reverts in the deployed order: InvalidChannel, WithdrawDelayOutOfRange, ZeroDeposit, InvalidCollector, DepositOverflow, DepositCollectionFailed", async () => {
    const config = channelConfig(payerA);
    const data = await erc3009CollectorData(payerA, config, 10n);
    const dep = (c: ChannelConfig, amount = 10n, collector: Address = ERC3009_DEPOSIT_COLLECTOR_ADDRESS, d: Hex = data) =>
      revertOf(simulate(BATCH_SETTLEMENT_ADDRESS, batchAbi, "deposit", [c, amount, collector, d]));
    expect(await dep(config, 0n)).toBe("ZeroDeposit");
    for (const field of ["payer", "receiver", "receiverAuthorizer", "token"] as const) expect(await dep({ ...config, [field]: zeroAddress })).toBe("InvalidChannel");
    expect(await dep({ ...config, withdrawDelay: BATCH_SETTLEMENT_MIN_WITHDRAW_DELAY - 1 })).toBe("WithdrawDelayOutOfRange");
    expect(await dep({ ...config, withdrawDelay: BATCH_SETTLEMENT_MAX_WITHDRAW_DELAY + 1 })).toBe("WithdrawDelayOutOfRange");
    expect(await dep(config, 10n, zeroAddress)).toBe("InvalidCollector");
    // the order of the checks: the channel's fields, then the delay, then the amount, then the collector
    expect(await dep({ ...config, payer: zeroAddress, withdrawDelay: 1 }, 0n, zeroAddress)).toBe("InvalidChannel");
    expect(await dep({ ...config, withdrawDelay: 1 }, 0n, zeroAddress)).toBe("WithdrawDelayOutOfRange");
    expect(await dep(config, 0n, zeroAddress)).toBe("ZeroDeposit");
    // a "collector" that accepts the call and delivers nothing
    const lazy = privateKeyToAccount(generatePrivateKey()).address;
    await testClient.setCode({ address: lazy, bytecode: "0x00" });
    expect(await dep(config, 10n, lazy)).toBe("DepositCollectionFailed");
    // both delay bounds are valid
    for (const withdrawDelay of [BATCH_SETTLEMENT_MIN_WITHDRAW_DELAY, BATCH_SETTLEMENT_MAX_WITHDRAW_DELAY]) {
      const c = channelConfig(payerA, { withdrawDelay });
      await depositVia3009(payerA, c, 1n);
    }
    // uint128 balances: a whale fills a channel to the brim
    const whale = privateKeyToAccount(generatePrivateKey());
    await send(minterWallet, USDC.address, tokenAbi, "mint", [whale.address, 2n ** 128n]);
    const full = channelConfig(whale);
    const max = 2n ** 128n - 1n;
    await send(relayerWallet, BATCH_SETTLEMENT_ADDRESS, batchAbi, "deposit", [full, max, ERC3009_DEPOSIT_COLLECTOR_ADDRESS, await erc3009CollectorData(whale, full, max)]);
    expect(await revertOf(simulate(BATCH_SETTLEMENT_ADDRESS, batchAbi, "deposit", [full, 1n, ERC3009_DEPOSIT_COLLECTOR_ADDRESS, await erc3009CollectorData(whale, full, 1n)]))).toBe(
      "DepositOverflow",
    );
  });

  it("ERC-3009 collector: authorization bound to the channel, single use, time window, caller restriction", async () => {
    const config = channelConfig(payerA);
    const other = channelConfig(payerA);
    const dep = async (c: ChannelConfig, d: Hex, amount = 10n) => revertOf(simulate(BATCH_SETTLEMENT_ADDRESS, batchAbi, "deposit", [c, amount, ERC3009_DEPOSIT_COLLECTOR_ADDRESS, d]));
    // signed for another channel id: the nonce differs, so the token sees another message
    expect(await dep(config, await erc3009CollectorData(payerA, config, 10n, { boundChannelId: idOf(other) }))).toBe("FiatTokenV2: invalid signature");
    // signed by someone else / for another amount
    expect(await dep({ ...config }, await erc3009CollectorData(payerB, config, 10n))).toBe("FiatTokenV2: invalid signature");
    expect(await dep(config, await erc3009CollectorData(payerA, config, 10n), 11n)).toBe("FiatTokenV2: invalid signature");
    const t = await now();
    expect(await dep(config, await erc3009CollectorData(payerA, config, 10n, { validBefore: t - 1n }))).toBe("FiatTokenV2: authorization is expired");
    expect(await dep(config, await erc3009CollectorData(payerA, config, 10n, { validAfter: t + 3600n, validBefore: t + 7200n }))).toBe(
      "FiatTokenV2: authorization is not yet valid",
    );
    const once = await erc3009CollectorData(payerA, config, 10n);
    await send(relayerWallet, BATCH_SETTLEMENT_ADDRESS, batchAbi, "deposit", [config, 10n, ERC3009_DEPOSIT_COLLECTOR_ADDRESS, once]);
    expect(await dep(config, once)).toBe("FiatTokenV2: authorization is used or canceled");
    // only the batch-settlement contract may call a collector
    expect(
      await revertOf(simulate(ERC3009_DEPOSIT_COLLECTOR_ADDRESS, erc3009CollectorAbi, "collect", [payerA.address, USDC.address, 10n, idOf(config), await erc3009CollectorData(payerA, config, 10n)])),
    ).toBe("OnlyX402BatchSettlement");
  });

  it("Permit2 collector: deposit, witness bound to the channel, nonce, deadline, spender, EIP-2612 permit, caller restriction", async () => {
    const config = channelConfig(payerA, { token: USDT.address });
    const amount = 10n ** 18n;
    const dep = async (c: ChannelConfig, d: Hex, a = amount) => revertOf(simulate(BATCH_SETTLEMENT_ADDRESS, batchAbi, "deposit", [c, a, PERMIT2_DEPOSIT_COLLECTOR_ADDRESS, d]));
    const other = channelConfig(payerA, { token: USDT.address });
    expect(await dep(config, await permit2CollectorData(payerA, config, amount, { boundChannelId: idOf(other) }))).toBe("InvalidSigner");
    expect(await dep(config, await permit2CollectorData(payerA, config, amount, { spender: EXACT_PERMIT2_PROXY_ADDRESS }))).toBe("InvalidSigner");
    expect(await dep(config, await permit2CollectorData(payerA, config, amount), amount + 1n)).toBe("InvalidSigner");
    expect(await dep(config, await permit2CollectorData(payerA, config, amount, { deadline: (await now()) - 1n }))).toBe("SignatureExpired");
    const data = await permit2CollectorData(payerA, config, amount);
    const receipt = await send(relayerWallet, BATCH_SETTLEMENT_ADDRESS, batchAbi, "deposit", [config, amount, PERMIT2_DEPOSIT_COLLECTOR_ADDRESS, data]);
    expect(eventNames(receipt, BATCH_SETTLEMENT_ADDRESS, batchAbi)).toEqual(["ChannelCreated", "Deposited"]);
    expect((await channelState(config)).balance).toBe(amount);
    expect(await dep(config, data)).toBe("InvalidNonce");
    expect(
      await revertOf(simulate(PERMIT2_DEPOSIT_COLLECTOR_ADDRESS, permit2CollectorAbi, "collect", [payerA.address, USDT.address, amount, idOf(config), await permit2CollectorData(payerA, config, amount)])),
    ).toBe("OnlyX402BatchSettlement");

    // a payer without allowance: the EIP-2612 segment of collectorData grants it in the same transaction
    const unapproved = payers[7]!;
    const cB = channelConfig(unapproved);
    const deadline = (await now()) + 300n;
    const permit = await signEip2612(unapproved, USDC, 777n, deadline);
    const seg = (value: bigint) =>
      encodeAbiParameters([{ type: "uint256" }, { type: "uint256" }, { type: "uint8" }, { type: "bytes32" }, { type: "bytes32" }], [value, deadline, permit.v, permit.r, permit.s]);
    expect(await dep(cB, await permit2CollectorData(unapproved, cB, 777n), 777n)).toMatch(/TRANSFER_FROM_FAILED|allowance/);
    expect(await dep(cB, await permit2CollectorData(unapproved, cB, 777n, { eip2612: seg(778n) }), 777n)).toBe("Permit2612AmountMismatch");
    await send(relayerWallet, BATCH_SETTLEMENT_ADDRESS, batchAbi, "deposit", [cB, 777n, PERMIT2_DEPOSIT_COLLECTOR_ADDRESS, await permit2CollectorData(unapproved, cB, 777n, { eip2612: seg(777n) })]);
    expect((await channelState(cB)).balance).toBe(777n);
    expect(await read(USDC.address, tokenAbi, "allowance", [unapproved.address, PERMIT2_ADDRESS])).toBe(0n);
  });

  it("InvalidPermit2Address without Permit2 code; ReentrancyGuardReentrantCall when a collector re-enters", async () => {
    const config = channelConfig(payerA, { token: USDT.address });
    const data = await permit2CollectorData(payerA, config, 5n);
    const snapshot = await testClient.snapshot();
    try {
      await testClient.setCode({ address: PERMIT2_ADDRESS, bytecode: "0x" });
      expect(await revertOf(simulate(BATCH_SETTLEMENT_ADDRESS, batchAbi, "deposit", [config, 5n, PERMIT2_DEPOSIT_COLLECTOR_ADDRESS, data]))).toBe("InvalidPermit2Address");
    } finally {
      await testClient.revert({ id: snapshot });
    }
    const probe = privateKeyToAccount(generatePrivateKey()).address;
    await testClient.setCode({ address: probe, bytecode: devnetContract(contracts, "DevnetReentrancyProbe").deployedBytecode });
    await send(relayerWallet, probe, probeAbi, "arm", [BATCH_SETTLEMENT_ADDRESS, encodeFunctionData({ abi: batchAbi, functionName: "settle", args: [merchant, USDC.address] }), true]);
    expect(await revertOf(simulate(BATCH_SETTLEMENT_ADDRESS, batchAbi, "deposit", [channelConfig(payerA), 5n, probe, "0x"]))).toBe("ReentrancyGuardReentrantCall");
  });
});

describe("x402BatchSettlement claims and settle", () => {
  it("claim by the receiver or the receiver authorizer; claimWithSignature relayed by anyone", async () => {
    const configs = [channelConfig(payerA), channelConfig(payerB), channelConfig(payerA)];
    for (const [i, c] of configs.entries()) await depositVia3009(i === 1 ? payerB : payerA, c, 1_000n);
    const before = await receiverState(merchant, USDC.address);

    // the receiver itself claims (no authorizer signature needed)
    await testClient.setBalance({ address: merchant, value: 10n ** 18n });
    await testClient.impersonateAccount({ address: merchant });
    try {
      const hash = await relayerWallet.writeContract({ address: BATCH_SETTLEMENT_ADDRESS, abi: batchAbi, functionName: "claim", args: [[await signedRow(payerA, configs[0]!, 100n)]], account: merchant, chain });
      expect((await publicClient.waitForTransactionReceipt({ hash })).status).toBe("success");
    } finally {
      await testClient.stopImpersonatingAccount({ address: merchant });
    }
    // the receiver authorizer claims directly
    await send(serverAuthorizerWallet, BATCH_SETTLEMENT_ADDRESS, batchAbi, "claim", [[await signedRow(payerB, configs[1]!, 200n, 150n)]]);
    // anyone relays a batch signed by the receiver authorizer
    const rows = [await signedRow(payerA, configs[0]!, 300n), await signedRow(payerB, configs[1]!, 200n), await signedRow(payerA, configs[2]!, 50n)];
    const receipt = await send(strangerWallet, BATCH_SETTLEMENT_ADDRESS, batchAbi, "claimWithSignature", [rows, await signClaimBatch(serverAuthorizer, rows)]);
    expect(events(receipt, BATCH_SETTLEMENT_ADDRESS, batchAbi).map((e) => [e.eventName, e.args.claimAmount, e.args.newTotalClaimed, e.args.sender])).toEqual([
      ["Claimed", 200n, 300n, stranger.address], // the sender is the relayer
      ["Claimed", 50n, 200n, stranger.address],
      ["Claimed", 50n, 50n, stranger.address],
    ]);
    expect((await channelState(configs[0]!)).totalClaimed).toBe(300n);
    expect((await channelState(configs[1]!)).totalClaimed).toBe(200n);
    expect(await receiverState(merchant, USDC.address)).toEqual({ totalClaimed: before.totalClaimed + 550n, totalSettled: before.totalSettled });
    // replaying the same batch is a no-op: rows at or below totalClaimed change nothing
    const replay = await send(strangerWallet, BATCH_SETTLEMENT_ADDRESS, batchAbi, "claimWithSignature", [rows, await signClaimBatch(serverAuthorizer, rows)]);
    expect(eventNames(replay, BATCH_SETTLEMENT_ADDRESS, batchAbi)).toEqual([]);
    expect(await receiverState(merchant, USDC.address)).toEqual({ totalClaimed: before.totalClaimed + 550n, totalSettled: before.totalSettled });
  });

  it("claim reverts in the deployed order: EmptyBatch, NotAuthorizedToClaim, (already claimed: no-op), ClaimExceedsCeiling, ClaimExceedsBalance, InvalidSignature", async () => {
    const config = channelConfig(payerA);
    await depositVia3009(payerA, config, 1_000n);
    const claim = (rows: VoucherClaim[], from: Address = serverAuthorizer.address) => revertOf(simulate(BATCH_SETTLEMENT_ADDRESS, batchAbi, "claim", [rows], from));
    expect(await claim([])).toBe("EmptyBatch");
    expect(await revertOf(simulate(BATCH_SETTLEMENT_ADDRESS, batchAbi, "claimWithSignature", [[], "0x"]))).toBe("EmptyBatch");
    expect(await claim([await signedRow(payerA, config, 10n)], stranger.address)).toBe("NotAuthorizedToClaim");
    expect(await claim([await signedRow(payerA, config, 10n, 11n)])).toBe("ClaimExceedsCeiling");
    expect(await claim([await signedRow(payerA, config, 1_001n)])).toBe("ClaimExceedsBalance");
    expect(await claim([await signedRow(payerB, config, 10n)])).toBe("InvalidSignature");
    const tampered = await signedRow(payerA, config, 10n);
    expect(await claim([{ ...tampered, voucher: { ...tampered.voucher, maxClaimableAmount: 20n } }])).toBe("InvalidSignature");
    expect(await claim([{ ...tampered, signature: "0x1234" }])).toBe("ECDSAInvalidSignatureLength"); // the payer authorizer's signature is recovered (OpenZeppelin ECDSA)
    // a voucher signed for another channel does not carry over
    const other = channelConfig(payerA);
    expect(await claim([claimRow(config, 10n, await signVoucher(payerA, idOf(other), 10n), 10n)])).toBe("InvalidSignature");
    // one bad row fails the whole batch
    expect(await claim([await signedRow(payerA, config, 10n), await signedRow(payerA, config, 20n, 21n)])).toBe("ClaimExceedsCeiling");
    // the order: the ceiling before the balance before the signature; a row at or below what is claimed is a no-op before any of them
    expect(await claim([claimRow(config, 10n, "0x1234", 2_000n)])).toBe("ClaimExceedsCeiling");
    expect(await claim([claimRow(config, 5_000n, "0x1234", 2_000n)])).toBe("ClaimExceedsBalance");
    await send(serverAuthorizerWallet, BATCH_SETTLEMENT_ADDRESS, batchAbi, "claim", [[await signedRow(payerA, config, 100n)]]);
    await simulate(BATCH_SETTLEMENT_ADDRESS, batchAbi, "claim", [[claimRow(config, 1n, "0x1234", 100n)]], serverAuthorizer.address); // stale row with a bad signature: no revert
  });

  it("voucher signer: payerAuthorizer when set (ECDSA only), the payer itself when zero", async () => {
    const delegate = privateKeyToAccount(generatePrivateKey());
    const withDelegate = channelConfig(payerA, { payerAuthorizer: delegate.address });
    const withoutDelegate = channelConfig(payerA, { payerAuthorizer: zeroAddress });
    await depositVia3009(payerA, withDelegate, 100n);
    await depositVia3009(payerA, withoutDelegate, 100n);
    const claim = (rows: VoucherClaim[]) => simulate(BATCH_SETTLEMENT_ADDRESS, batchAbi, "claim", [rows], serverAuthorizer.address);
    expect(await revertOf(claim([await signedRow(payerA, withDelegate, 10n)]))).toBe("InvalidSignature");
    await claim([await signedRow(delegate, withDelegate, 10n)]);
    await claim([await signedRow(payerA, withoutDelegate, 10n)]);
    expect(await revertOf(claim([await signedRow(delegate, withoutDelegate, 10n)]))).toBe("InvalidSignature");
    // with an authorizer the signature is recovered as OpenZeppelin's ECDSA.recover does: an unusable one reverts with its errors
    const row = await signedRow(delegate, withDelegate, 20n);
    expect(await revertOf(claim([{ ...row, signature: "0x1234" }]))).toBe("ECDSAInvalidSignatureLength");
  });

  it("claimWithSignature reverts: InvalidSignature (checked before the rows), NotReceiverAuthorizer", async () => {
    const a = channelConfig(payerA);
    const b = channelConfig(payerB, { receiverAuthorizer: facilitatorAuthorizer.address });
    await depositVia3009(payerA, a, 100n);
    await depositVia3009(payerB, b, 100n);
    const rows = [await signedRow(payerA, a, 10n)];
    const cws = (r: VoucherClaim[], sig: Hex) => revertOf(simulate(BATCH_SETTLEMENT_ADDRESS, batchAbi, "claimWithSignature", [r, sig]));
    expect(await cws(rows, await signClaimBatch(stranger, rows))).toBe("InvalidSignature");
    expect(await cws(rows, await signClaimBatch(serverAuthorizer, [await signedRow(payerA, a, 10n, 9n)]))).toBe("InvalidSignature");
    expect(await cws(rows, "0x")).toBe("InvalidSignature");
    const mixed = [...rows, await signedRow(payerB, b, 10n)];
    expect(await cws(mixed, await signClaimBatch(serverAuthorizer, mixed))).toBe("NotReceiverAuthorizer");
    // the batch signature is checked before any row: a bad signature over rows that would also fail
    expect(await cws(mixed, "0x")).toBe("InvalidSignature");
  });

  it("settle sweeps claimed funds per receiver and token; nothing to settle is a no-op; permissionless", async () => {
    const receiver = privateKeyToAccount(generatePrivateKey()).address;
    const usdc = channelConfig(payerA, { receiver });
    const usdt = channelConfig(payerA, { receiver, token: USDT.address });
    await depositVia3009(payerA, usdc, 1_000n);
    await send(relayerWallet, BATCH_SETTLEMENT_ADDRESS, batchAbi, "deposit", [usdt, 5_000n, PERMIT2_DEPOSIT_COLLECTOR_ADDRESS, await permit2CollectorData(payerA, usdt, 5_000n)]);
    const rows = [await signedRow(payerA, usdc, 400n, 321n), await signedRow(payerA, usdt, 4_000n)];
    await send(relayerWallet, BATCH_SETTLEMENT_ADDRESS, batchAbi, "claimWithSignature", [rows, await signClaimBatch(serverAuthorizer, rows)]);
    const receipt = await send(strangerWallet, BATCH_SETTLEMENT_ADDRESS, batchAbi, "settle", [receiver, USDC.address]);
    expect(events(receipt, BATCH_SETTLEMENT_ADDRESS, batchAbi)).toEqual([
      { eventName: "Settled", args: { receiver, token: USDC.address, sender: stranger.address, amount: 321n } },
    ]);
    expect(await balanceOf(USDC.address, receiver)).toBe(321n);
    expect(await balanceOf(USDT.address, receiver)).toBe(0n);
    const again = await send(strangerWallet, BATCH_SETTLEMENT_ADDRESS, batchAbi, "settle", [receiver, USDC.address]);
    expect(again.logs).toEqual([]);
    await send(strangerWallet, BATCH_SETTLEMENT_ADDRESS, batchAbi, "settle", [receiver, USDT.address]);
    expect(await balanceOf(USDT.address, receiver)).toBe(4_000n);
    // claimed funds stay counted in the channel balance; only the unclaimed rest is escrow
    expect(await channelState(usdc)).toMatchObject({ balance: 1_000n, totalClaimed: 321n });
  });

  it("multicall batches calls atomically and bubbles the first revert", async () => {
    const config = channelConfig(payerA);
    await depositVia3009(payerA, config, 1_000n);
    const row = await signedRow(payerA, config, 100n);
    const claimCall = encodeFunctionData({ abi: batchAbi, functionName: "claimWithSignature", args: [[row], await signClaimBatch(serverAuthorizer, [row])] });
    const refundCall = encodeFunctionData({ abi: batchAbi, functionName: "refundWithSignature", args: [config, 50n, 0n, await signRefund(serverAuthorizer, idOf(config), 0n, 50n)] });
    const badRefund = encodeFunctionData({ abi: batchAbi, functionName: "refundWithSignature", args: [config, 50n, 5n, await signRefund(serverAuthorizer, idOf(config), 5n, 50n)] });
    expect(await revertOf(simulate(BATCH_SETTLEMENT_ADDRESS, batchAbi, "multicall", [[claimCall, badRefund]]))).toBe("InvalidRefundNonce");
    const receipt = await send(strangerWallet, BATCH_SETTLEMENT_ADDRESS, batchAbi, "multicall", [[claimCall, refundCall]]);
    expect(eventNames(receipt, BATCH_SETTLEMENT_ADDRESS, batchAbi)).toEqual(["Claimed", "Refunded"]);
    expect(await channelState(config)).toMatchObject({ balance: 950n, totalClaimed: 100n, refundNonce: 1n });
  });
});

describe("x402BatchSettlement refunds", () => {
  it("refund by the receiver side, capped to the unclaimed escrow; nonce advances even when nothing moves", async () => {
    const config = channelConfig(payerA);
    const id = idOf(config);
    await depositVia3009(payerA, config, 1_000n);
    const row = await signedRow(payerA, config, 400n);
    await send(serverAuthorizerWallet, BATCH_SETTLEMENT_ADDRESS, batchAbi, "claim", [[row]]);
    const before = await balanceOf(USDC.address, payerA.address);
    const r1 = await send(serverAuthorizerWallet, BATCH_SETTLEMENT_ADDRESS, batchAbi, "refund", [config, 100n]);
    expect(events(r1, BATCH_SETTLEMENT_ADDRESS, batchAbi)).toEqual([{ eventName: "Refunded", args: { channelId: id, sender: serverAuthorizer.address, amount: 100n } }]);
    // asking for more than is left returns the rest (500), never claimed funds
    const r2 = await send(serverAuthorizerWallet, BATCH_SETTLEMENT_ADDRESS, batchAbi, "refund", [config, 10_000n]);
    expect(events(r2, BATCH_SETTLEMENT_ADDRESS, batchAbi)).toEqual([{ eventName: "Refunded", args: { channelId: id, sender: serverAuthorizer.address, amount: 500n } }]);
    expect(await balanceOf(USDC.address, payerA.address)).toBe(before + 600n);
    expect(await channelState(config)).toMatchObject({ balance: 400n, totalClaimed: 400n, refundNonce: 2n });
    // nothing left: no transfer, no event, but the nonce still advances
    const r3 = await send(serverAuthorizerWallet, BATCH_SETTLEMENT_ADDRESS, batchAbi, "refund", [config, 1n]);
    expect(r3.logs).toEqual([]);
    expect((await channelState(config)).refundNonce).toBe(3n);
    // the receiver can still settle what it claimed
    expect((await receiverState(merchant, USDC.address)).totalClaimed).toBeGreaterThanOrEqual(400n);
  });

  it("refundWithSignature: the receiver authorizer's signature for the current nonce; a full refund closes the channel", async () => {
    const config = channelConfig(payerA);
    const id = idOf(config);
    await depositVia3009(payerA, config, 300n);
    const rws = (amount: bigint, nonce: bigint, sig: Hex) => simulate(BATCH_SETTLEMENT_ADDRESS, batchAbi, "refundWithSignature", [config, amount, nonce, sig]);
    expect(await revertOf(rws(100n, 1n, await signRefund(serverAuthorizer, id, 1n, 100n)))).toBe("InvalidRefundNonce");
    expect(await revertOf(rws(100n, 0n, await signRefund(stranger, id, 0n, 100n)))).toBe("InvalidSignature");
    expect(await revertOf(rws(101n, 0n, await signRefund(serverAuthorizer, id, 0n, 100n)))).toBe("InvalidSignature");
    expect(await revertOf(rws(0n, 0n, await signRefund(serverAuthorizer, id, 0n, 0n)))).toBe("ZeroRefund");
    // the order: the nonce, then the signature, then the amount
    expect(await revertOf(rws(0n, 1n, "0x"))).toBe("InvalidRefundNonce");
    expect(await revertOf(rws(0n, 0n, "0x"))).toBe("InvalidSignature");
    const sig = await signRefund(serverAuthorizer, id, 0n, 300n);
    const receipt = await send(strangerWallet, BATCH_SETTLEMENT_ADDRESS, batchAbi, "refundWithSignature", [config, 300n, 0n, sig]);
    expect(eventNames(receipt, BATCH_SETTLEMENT_ADDRESS, batchAbi)).toEqual(["Refunded", "ChannelClosed"]);
    expect(await channelState(config)).toMatchObject({ balance: 0n, totalClaimed: 0n, refundNonce: 1n });
    // the signature is spent with its nonce
    expect(await revertOf(rws(300n, 0n, sig))).toBe("InvalidRefundNonce");
    // a re-funded channel is created again
    const again = await depositVia3009(payerA, config, 5n);
    expect(eventNames(again, BATCH_SETTLEMENT_ADDRESS, batchAbi)).toEqual(["ChannelCreated", "Deposited"]);
  });

  it("refund reverts: NotAuthorizedToRefund (before the amount), ZeroRefund", async () => {
    const config = channelConfig(payerA);
    await depositVia3009(payerA, config, 10n);
    expect(await revertOf(simulate(BATCH_SETTLEMENT_ADDRESS, batchAbi, "refund", [config, 1n], stranger.address))).toBe("NotAuthorizedToRefund");
    expect(await revertOf(simulate(BATCH_SETTLEMENT_ADDRESS, batchAbi, "refund", [config, 0n], payerA.address))).toBe("NotAuthorizedToRefund");
    expect(await revertOf(simulate(BATCH_SETTLEMENT_ADDRESS, batchAbi, "refund", [config, 0n], serverAuthorizer.address))).toBe("ZeroRefund");
    await simulate(BATCH_SETTLEMENT_ADDRESS, batchAbi, "refund", [config, 1n], merchant);
  });
});

// These move the chain clock forward (evm_increaseTime): keep them last in the file.
describe("x402BatchSettlement timed withdrawal", () => {
  it("initiate, claim during the grace period, refund shrinks the pending amount, finalize after withdrawDelay", async () => {
    const delegate = privateKeyToAccount(generatePrivateKey());
    await testClient.setBalance({ address: delegate.address, value: 10n ** 18n });
    const delegateWallet = makeWallet(anvil.rpcUrl, delegate);
    const payerWallet = makeWallet(anvil.rpcUrl, payerA);
    const config = channelConfig(payerA, { payerAuthorizer: delegate.address });
    const id = idOf(config);
    await depositVia3009(payerA, config, 1_000n);
    const initiate = (amount: bigint, from: Address) => simulate(BATCH_SETTLEMENT_ADDRESS, batchAbi, "initiateWithdraw", [config, amount], from);
    expect(await revertOf(initiate(10n, stranger.address))).toBe("InvalidChannel");
    expect(await revertOf(initiate(0n, merchant))).toBe("InvalidChannel"); // the caller before the amount
    expect(await revertOf(initiate(0n, payerA.address))).toBe("NothingToWithdraw");
    expect(await revertOf(initiate(1_001n, payerA.address))).toBe("WithdrawAmountExceedsAvailable");
    expect(await revertOf(simulate(BATCH_SETTLEMENT_ADDRESS, batchAbi, "finalizeWithdraw", [config], payerA.address))).toBe("WithdrawalNotPending");
    expect(await revertOf(simulate(BATCH_SETTLEMENT_ADDRESS, batchAbi, "finalizeWithdraw", [config], stranger.address))).toBe("NotAuthorizedToFinalizeWithdraw");

    const receipt = await send(payerWallet, BATCH_SETTLEMENT_ADDRESS, batchAbi, "initiateWithdraw", [config, 900n]);
    const t0 = (await publicClient.getBlock({ blockNumber: receipt.blockNumber })).timestamp;
    expect(events(receipt, BATCH_SETTLEMENT_ADDRESS, batchAbi)).toEqual([
      { eventName: "WithdrawInitiated", args: { channelId: id, amount: 900n, finalizeAfter: Number(t0) + WITHDRAW_DELAY } },
    ]);
    expect(await channelState(config)).toMatchObject({ pendingAmount: 900n, initiatedAt: Number(t0) });
    expect(await revertOf(initiate(1n, delegate.address))).toBe("WithdrawalAlreadyPending");
    // the reference facilitator reports the pending withdrawal to the server
    const facilitator = new BatchFacilitatorScheme(facilitatorSigner(relayerWallet));
    const max = 300n;
    const verified = await facilitator.verify(
      { x402Version: 2, accepted: batchRequirements(1n, { receiverAuthorizer: serverAuthorizer.address }), payload: { type: "voucher", channelConfig: config, voucher: { channelId: id, maxClaimableAmount: max.toString(), signature: await signVoucher(delegate, id, max) } } },
      batchRequirements(1n, { receiverAuthorizer: serverAuthorizer.address }),
    );
    expect(verified).toMatchObject({ isValid: true, extra: { withdrawRequestedAt: Number(t0) } });
    // the receiver claims during the grace period; a refund shrinks the pending withdrawal
    await send(serverAuthorizerWallet, BATCH_SETTLEMENT_ADDRESS, batchAbi, "claim", [[await signedRow(delegate, config, 300n)]]);
    await send(serverAuthorizerWallet, BATCH_SETTLEMENT_ADDRESS, batchAbi, "refund", [config, 100n]);
    expect(await channelState(config)).toMatchObject({ balance: 900n, totalClaimed: 300n, pendingAmount: 800n });
    expect(await revertOf(simulate(BATCH_SETTLEMENT_ADDRESS, batchAbi, "finalizeWithdraw", [config], payerA.address))).toBe("WithdrawDelayNotElapsed");
    expect(await revertOf(simulate(BATCH_SETTLEMENT_ADDRESS, batchAbi, "finalizeWithdraw", [config], stranger.address))).toBe("NotAuthorizedToFinalizeWithdraw");

    await testClient.increaseTime({ seconds: WITHDRAW_DELAY });
    await testClient.mine({ blocks: 1 });
    const before = await balanceOf(USDC.address, payerA.address);
    // finalized by the payer authorizer; capped to the unclaimed escrow (600 < 800)
    const fin = await send(delegateWallet, BATCH_SETTLEMENT_ADDRESS, batchAbi, "finalizeWithdraw", [config]);
    expect(events(fin, BATCH_SETTLEMENT_ADDRESS, batchAbi)).toEqual([{ eventName: "WithdrawFinalized", args: { channelId: id, sender: delegate.address, amount: 600n } }]);
    expect(await balanceOf(USDC.address, payerA.address)).toBe(before + 600n);
    expect(await channelState(config)).toMatchObject({ balance: 300n, totalClaimed: 300n, pendingAmount: 0n, initiatedAt: 0 });
    // later vouchers above the drained balance can no longer be claimed
    expect(await revertOf(simulate(BATCH_SETTLEMENT_ADDRESS, batchAbi, "claim", [[await signedRow(delegate, config, 301n)]], serverAuthorizer.address))).toBe(
      "ClaimExceedsBalance",
    );
  });

  it("a refund covering the pending amount cancels the withdrawal; a full withdrawal closes the channel", async () => {
    const payerWallet = makeWallet(anvil.rpcUrl, payerA);
    const config = channelConfig(payerA);
    await depositVia3009(payerA, config, 500n);
    await send(payerWallet, BATCH_SETTLEMENT_ADDRESS, batchAbi, "initiateWithdraw", [config, 200n]);
    await send(serverAuthorizerWallet, BATCH_SETTLEMENT_ADDRESS, batchAbi, "refund", [config, 250n]);
    expect(await channelState(config)).toMatchObject({ balance: 250n, pendingAmount: 0n, initiatedAt: 0 });
    expect(await revertOf(simulate(BATCH_SETTLEMENT_ADDRESS, batchAbi, "finalizeWithdraw", [config], payerA.address))).toBe("WithdrawalNotPending");

    await send(payerWallet, BATCH_SETTLEMENT_ADDRESS, batchAbi, "initiateWithdraw", [config, 250n]);
    await testClient.increaseTime({ seconds: WITHDRAW_DELAY });
    await testClient.mine({ blocks: 1 });
    const fin = await send(payerWallet, BATCH_SETTLEMENT_ADDRESS, batchAbi, "finalizeWithdraw", [config]);
    expect(eventNames(fin, BATCH_SETTLEMENT_ADDRESS, batchAbi)).toEqual(["WithdrawFinalized", "ChannelClosed"]);
    expect(await channelState(config)).toMatchObject({ balance: 0n, totalClaimed: 0n, pendingAmount: 0n });
  });
});
