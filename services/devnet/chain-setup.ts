// Prepares a fresh anvil node as an x402 devnet chain: genuine Permit2 (patched for the chain id),
// our stand-ins for Multicall3, the exact and upto Permit2 proxies, x402BatchSettlement and its two
// deposit collectors at their canonical addresses, devnet tokens at the real asset addresses, ETH
// for gas, token balances for payers and optional Permit2 approvals.
// Everything is sent concurrently with explicit nonces and gas, so one chain takes a few hundred ms.
import {
  createClient,
  encodeAbiParameters,
  erc20Abi,
  encodeFunctionData,
  getAddress,
  getContractAddress,
  http,
  keccak256,
  maxUint256,
  numberToHex,
  pad,
  type Abi,
  type Address,
  type Hex,
} from "viem";
import { privateKeyToAccount } from "viem/accounts";
import { EXACT_PERMIT2_PROXY_ADDRESS, MULTICALL3_ADDRESS, NETWORKS, PERMIT2_ADDRESS, type AssetInfo } from "../x402/networks.ts";
import { DEVNET_ONLY_ASSETS } from "./devnet-assets.ts";
import { DEFAULT_NETWORK_POLICIES } from "../facilitator/network-policy.ts";
import { compileDevnetContracts, devnetContract } from "./compile.ts";
import { permit2DomainSeparator, permit2RuntimeBytecode } from "./permit2.ts";

/** anvil's first default account (mnemonic "test test ... junk"), unlocked on every anvil node. */
export const DEVNET_MINTER_ADDRESS: Address = "0xf39Fd6e51aad88F6F4ce6aB8827279cffFb92266";

export const DEFAULT_GAS_BALANCE = 1000n * 10n ** 18n;

/** Canonical addresses of the x402 upto and batch-settlement contracts (as in @x402/evm). */
export const UPTO_PERMIT2_PROXY_ADDRESS: Address = "0x4020A4f3b7b90ccA423B9fabCc0CE57C6C240002";
export const BATCH_SETTLEMENT_ADDRESS: Address = "0x4020074e9dF2ce1deE5A9C1b5c3f541D02a10003";
export const ERC3009_DEPOSIT_COLLECTOR_ADDRESS: Address = "0x4020806089470a89826cB9fB1f4059150b550004";
export const PERMIT2_DEPOSIT_COLLECTOR_ADDRESS: Address = "0x4020425FAf3B746C082C2f942b4E5159887B0005";
/** Our smart-wallet factory (DevnetSmartWallet.sol): the one ERC-6492 factory the devnet facilitators allow. */
export const SMART_WALLET_FACTORY_ADDRESS: Address = getAddress("0x4020000000000000000000000000000000006492");

/**
 * Our devnet stand-ins (compiled contract name) and the canonical address setupDevnetChain places
 * each at. None has a constructor or storage to initialise: the code alone is the deployment.
 */
export const DEVNET_CANONICAL_CONTRACTS: readonly { contract: string; address: Address }[] = [
  { contract: "DevnetMulticall3", address: MULTICALL3_ADDRESS },
  { contract: "DevnetExactPermit2Proxy", address: EXACT_PERMIT2_PROXY_ADDRESS },
  { contract: "DevnetUptoPermit2Proxy", address: UPTO_PERMIT2_PROXY_ADDRESS },
  { contract: "DevnetBatchSettlement", address: BATCH_SETTLEMENT_ADDRESS },
  { contract: "DevnetERC3009DepositCollector", address: ERC3009_DEPOSIT_COLLECTOR_ADDRESS },
  { contract: "DevnetPermit2DepositCollector", address: PERMIT2_DEPOSIT_COLLECTOR_ADDRESS },
  { contract: "DevnetSmartWalletFactory", address: SMART_WALLET_FACTORY_ADDRESS },
];

/**
 * The devnet's smart wallets of one owner: salt 0 deployed (ERC-1271), salt 1 left counterfactual
 * (ERC-6492), salt 2 counterfactual with creation calls that approve Permit2 (it pays over Permit2:
 * exact and upto).
 */
export const SMART_WALLET_SALTS = { deployed: pad("0x00"), counterfactual: pad("0x01"), counterfactualPermit2: pad("0x02") } as const;

export interface SmartWallets {
  owner: Address;
  factory: Address;
  /** Deployed at setup, funded and approved for Permit2 on every asset. */
  deployed: Address;
  /** Funded, never deployed: it pays with ERC-6492 signatures; a settlement deploys it. */
  counterfactual: Address;
  /** What the factory is called with to deploy the counterfactual wallet (its ERC-6492 wrapper carries it). */
  counterfactualFactoryCalldata: Hex;
  /** Funded, never deployed; its deployment approves Permit2 for every devnet token (the same address on every chain). */
  counterfactualPermit2: Address;
  counterfactualPermit2FactoryCalldata: Hex;
}

/** The owner's wallet addresses (CREATE2 through our factory) and the factory call of the counterfactual one. */
export async function smartWalletsOf(owner: Address): Promise<SmartWallets> {
  const contracts = await compileDevnetContracts();
  const wallet = devnetContract(contracts, "DevnetSmartWallet");
  const factory = devnetContract(contracts, "DevnetSmartWalletFactory");
  const initCode = `${wallet.bytecode}${encodeAbiParameters([{ type: "address" }], [owner]).slice(2)}` as Hex;
  const at = (salt: Hex) => getContractAddress({ opcode: "CREATE2", from: SMART_WALLET_FACTORY_ADDRESS, salt, bytecode: initCode });
  // Permit2 approvals of every token any devnet chain has (a call to an address without code on a chain does nothing there).
  const tokens = [...new Set([...NETWORKS.flatMap((n) => n.assets), ...Object.values(DEVNET_ONLY_ASSETS).flat()].map((a) => getAddress(a!.address)))].sort();
  const calls = tokens.map((to) => ({ to, data: encodeFunctionData({ abi: erc20Abi, functionName: "approve", args: [PERMIT2_ADDRESS, maxUint256] }) }));
  const committed = keccak256(encodeAbiParameters([{ type: "bytes32" }, { type: "tuple[]", components: [{ name: "to", type: "address" }, { name: "data", type: "bytes" }] }], [SMART_WALLET_SALTS.counterfactualPermit2, calls]));
  return {
    owner,
    factory: SMART_WALLET_FACTORY_ADDRESS,
    deployed: at(SMART_WALLET_SALTS.deployed),
    counterfactual: at(SMART_WALLET_SALTS.counterfactual),
    counterfactualFactoryCalldata: encodeFunctionData({ abi: factory.abi, functionName: "createWallet", args: [owner, SMART_WALLET_SALTS.counterfactual] }),
    counterfactualPermit2: at(committed),
    counterfactualPermit2FactoryCalldata: encodeFunctionData({ abi: factory.abi, functionName: "createWalletWithCalls", args: [owner, SMART_WALLET_SALTS.counterfactualPermit2, calls] }),
  };
}

/** Batch-settlement withdraw delay bounds enforced on chain (seconds): 15 minutes to 30 days. */
export const BATCH_SETTLEMENT_MIN_WITHDRAW_DELAY = 900;
export const BATCH_SETTLEMENT_MAX_WITHDRAW_DELAY = 2_592_000;

export interface DevnetPayer {
  privateKey: Hex;
  /** Sends approve(PERMIT2, maxUint256) on every asset from the payer's key. */
  permit2Approved: boolean;
}

export interface SetupDevnetChainOptions {
  rpcUrl: string;
  chainId: number;
  assets: readonly AssetInfo[];
  /** Addresses that receive 1000 ETH (facilitator signers, relayers, ...). Payers always get it. */
  gasFunded: readonly Address[];
  payers: readonly DevnetPayer[];
  /** Token amount (base units) minted to each payer; default 1,000,000 whole tokens. */
  payerTokenAmount?: (asset: AssetInfo) => bigint;
  /** A payer (one of `payers`, Permit2-approved) whose smart wallets (smartWalletsOf) are set up too. */
  smartWalletOwner?: Hex;
  /** OP Stack chains (Base): the L1 data fee the stand-in GasPriceOracle quotes for any transaction; default 1 gwei. */
  l1DataFeeWei?: bigint;
}

/**
 * Runtime code of a GasPriceOracle stand-in: answers every call (getL1Fee(bytes) included) with
 * one 32-byte word, the fee. PUSH32 fee, PUSH1 0, MSTORE, PUSH1 32, PUSH1 0, RETURN.
 */
export function constantOracleCode(fee: bigint): Hex {
  return `0x7f${fee.toString(16).padStart(64, "0")}60005260206000f3`;
}

/** Whether the devnet places the EIP-3009 stablecoin (else the plain Permit2-only token) at this asset. */
export function usesStablecoin(asset: AssetInfo): boolean {
  return asset.transferMethods.includes("eip3009");
}

export function defaultPayerTokenAmount(asset: AssetInfo): bigint {
  return 1_000_000n * 10n ** BigInt(asset.decimals);
}

const INITIALIZE_GAS = 400_000n;
const MINT_GAS = 120_000n;
const APPROVE_GAS = 100_000n;
const WALLET_DEPLOY_GAS = 1_000_000n;
const RECEIPT_TIMEOUT_MS = 30_000;

type Rpc = <T = unknown>(method: string, params?: unknown[]) => Promise<T>;

interface PendingTx {
  label: string;
  hash: Promise<Hex>;
}

interface RpcReceipt {
  status: Hex;
  transactionHash: Hex;
}

function makeRpc(rpcUrl: string): Rpc {
  // Batching merges concurrent requests into one HTTP round trip; no retries: a failure is a bug.
  const client = createClient({ transport: http(rpcUrl, { batch: { batchSize: 500, wait: 0 }, retryCount: 0, timeout: 20_000 }) });
  const request = client.request as unknown as (args: { method: string; params?: unknown[] }) => Promise<unknown>;
  return <T>(method: string, params: unknown[] = []) => request({ method, params }) as Promise<T>;
}

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

async function waitForReceipts(rpc: Rpc, txs: { label: string; hash: Hex }[]): Promise<void> {
  const pending = new Map(txs.map((t) => [t.hash, t.label]));
  const deadline = Date.now() + RECEIPT_TIMEOUT_MS;
  while (pending.size > 0) {
    const hashes = [...pending.keys()];
    const receipts = await Promise.all(hashes.map((h) => rpc<RpcReceipt | null>("eth_getTransactionReceipt", [h])));
    receipts.forEach((r, i) => {
      const hash = hashes[i]!;
      if (!r) return;
      if (r.status !== "0x1") throw new Error(`devnet setup transaction reverted: ${pending.get(hash)} (${hash})`);
      pending.delete(hash);
    });
    if (pending.size === 0) return;
    if (Date.now() > deadline) {
      throw new Error(`devnet setup: no receipt within ${RECEIPT_TIMEOUT_MS} ms for ${[...pending.values()].join(", ")}`);
    }
    await sleep(5);
  }
}

/**
 * Sets up one devnet chain on a fresh anvil node. Idempotence is not a goal: run it once per node
 * (initialize() of the tokens reverts the second time).
 */
export async function setupDevnetChain(opts: SetupDevnetChainOptions): Promise<void> {
  const rpc = makeRpc(opts.rpcUrl);
  const amountOf = opts.payerTokenAmount ?? defaultPayerTokenAmount;
  const payers = opts.payers.map((p) => ({ ...p, account: privateKeyToAccount(p.privateKey) }));

  const [contracts, reportedChainId] = await Promise.all([compileDevnetContracts(), rpc<Hex>("eth_chainId")]);
  const owner = opts.smartWalletOwner ? payers.find((p) => p.privateKey === opts.smartWalletOwner) : undefined;
  if (opts.smartWalletOwner && !owner?.permit2Approved) throw new Error("devnet setup: the smart wallets' owner must be one of the Permit2-approved payers");
  const wallets = owner ? await smartWalletsOf(owner.account.address) : undefined;
  const walletTargets = wallets ? [wallets.deployed, wallets.counterfactual, wallets.counterfactualPermit2] : [];
  if (Number(reportedChainId) !== opts.chainId) {
    throw new Error(`devnet setup: ${opts.rpcUrl} reports chain id ${Number(reportedChainId)}, expected ${opts.chainId}`);
  }
  const stablecoin = devnetContract(contracts, "DevnetStablecoin");
  const plainToken = devnetContract(contracts, "DevnetToken");
  const canonical = DEVNET_CANONICAL_CONTRACTS.map((c) => ({ address: c.address, code: devnetContract(contracts, c.contract).deployedBytecode }));

  // 1. Code and ETH balances (all independent of each other).
  const funded = new Set<string>([...opts.gasFunded, ...payers.map((p) => p.account.address)].map((a) => a.toLowerCase()));
  const senders = [DEVNET_MINTER_ADDRESS, ...payers.filter((p) => p.permit2Approved).map((p) => p.account.address)];
  const [, nonces, latest] = await Promise.all([
    Promise.all([
      rpc("anvil_setCode", [PERMIT2_ADDRESS, permit2RuntimeBytecode(opts.chainId)]),
      ...canonical.map((c) => rpc("anvil_setCode", [c.address, c.code])),
      ...opts.assets.map((a) => rpc("anvil_setCode", [a.address, (usesStablecoin(a) ? stablecoin : plainToken).deployedBytecode])),
      ...[...funded].map((a) => rpc("anvil_setBalance", [a, numberToHex(DEFAULT_GAS_BALANCE)])),
      ...opStackOracle(opts).map((o) => rpc("anvil_setCode", [o.address, o.code])),
    ]),
    Promise.all(senders.map((a) => rpc<Hex>("eth_getTransactionCount", [a, "pending"]))),
    rpc<{ baseFeePerGas?: Hex }>("eth_getBlockByNumber", ["latest", false]),
  ]);

  const nextNonce = new Map<string, number>();
  senders.forEach((a, i) => nextNonce.set(a.toLowerCase(), Number(nonces[i])));
  const takeNonce = (a: Address): number => {
    const n = nextNonce.get(a.toLowerCase());
    if (n === undefined) throw new Error(`no nonce for ${a}`);
    nextNonce.set(a.toLowerCase(), n + 1);
    return n;
  };
  const baseFee = BigInt(latest.baseFeePerGas ?? "0x3b9aca00");
  const maxPriorityFeePerGas = 1_000_000n;
  const maxFeePerGas = baseFee * 4n + 1_000_000_000n;

  const txs: PendingTx[] = [];
  const sendFromMinter = (label: string, to: Address, abi: Abi, functionName: string, args: readonly unknown[], gas: bigint): void => {
    const data = encodeFunctionData({ abi, functionName, args });
    const tx = {
      from: DEVNET_MINTER_ADDRESS,
      to,
      data,
      gas: numberToHex(gas),
      nonce: numberToHex(takeNonce(DEVNET_MINTER_ADDRESS)),
      maxFeePerGas: numberToHex(maxFeePerGas),
      maxPriorityFeePerGas: numberToHex(maxPriorityFeePerGas),
    };
    txs.push({ label, hash: rpc<Hex>("eth_sendTransaction", [tx]) });
  };

  // 2. Initialise each token, then mint (same sender: nonce order guarantees initialise first).
  for (const asset of opts.assets) {
    const abi = usesStablecoin(asset) ? stablecoin.abi : plainToken.abi;
    const name = asset.eip712?.name ?? asset.symbol;
    const version = asset.eip712?.version ?? "1";
    sendFromMinter(`initialize ${asset.symbol} ${asset.address}`, asset.address, abi, "initialize", [name, asset.symbol, version, asset.decimals, DEVNET_MINTER_ADDRESS], INITIALIZE_GAS);
    for (const p of payers) {
      sendFromMinter(`mint ${asset.symbol} to ${p.account.address}`, asset.address, abi, "mint", [p.account.address, amountOf(asset)], MINT_GAS);
    }
    for (const w of walletTargets) sendFromMinter(`mint ${asset.symbol} to smart wallet ${w}`, asset.address, abi, "mint", [w, amountOf(asset)], MINT_GAS);
  }
  if (wallets) {
    const factory = devnetContract(contracts, "DevnetSmartWalletFactory");
    sendFromMinter("deploy the devnet smart wallet", SMART_WALLET_FACTORY_ADDRESS, factory.abi, "createWallet", [wallets.owner, SMART_WALLET_SALTS.deployed], WALLET_DEPLOY_GAS);
  }

  // 3. Permit2 approvals, signed locally with each payer's key.
  for (const p of payers.filter((x) => x.permit2Approved)) {
    for (const asset of opts.assets) {
      const nonce = takeNonce(p.account.address);
      const data = encodeFunctionData({ abi: plainToken.abi, functionName: "approve", args: [PERMIT2_ADDRESS, maxUint256] });
      const hash = p.account
        .signTransaction({ type: "eip1559", chainId: opts.chainId, to: asset.address, data, gas: APPROVE_GAS, nonce, maxFeePerGas, maxPriorityFeePerGas })
        .then((raw) => rpc<Hex>("eth_sendRawTransaction", [raw]));
      txs.push({ label: `approve Permit2 for ${asset.symbol} from ${p.account.address}`, hash });
    }
  }

  // 4. Permit2 sanity check runs while the transactions are mined.
  const domainCheck = rpc<Hex>("eth_call", [{ to: PERMIT2_ADDRESS, data: "0x3644e515" /* DOMAIN_SEPARATOR() */ }, "latest"]);

  const sent = await Promise.all(
    txs.map(async (t) => {
      try {
        return { label: t.label, hash: await t.hash };
      } catch (e) {
        throw new Error(`devnet setup: sending "${t.label}" failed: ${(e as Error).message.split("\n")[0]}`);
      }
    }),
  );
  const separator = await domainCheck;
  const expected = permit2DomainSeparator(opts.chainId);
  if (separator.toLowerCase() !== expected.toLowerCase()) {
    throw new Error(`devnet setup: Permit2 DOMAIN_SEPARATOR() is ${separator}, expected ${expected} for chain ${opts.chainId}`);
  }
  await waitForReceipts(rpc, sent);

  // 5. The deployed smart wallet approves Permit2 on every asset (its owner acts through execute).
  if (wallets && owner) {
    const wallet = devnetContract(contracts, "DevnetSmartWallet");
    const approvals = opts.assets.map(async (asset) => {
      const approve = encodeFunctionData({ abi: plainToken.abi, functionName: "approve", args: [PERMIT2_ADDRESS, maxUint256] });
      const data = encodeFunctionData({ abi: wallet.abi, functionName: "execute", args: [asset.address, 0n, approve] });
      const raw = await owner.account.signTransaction({ type: "eip1559", chainId: opts.chainId, to: wallets.deployed, data, gas: APPROVE_GAS * 2n, nonce: takeNonce(owner.account.address), maxFeePerGas, maxPriorityFeePerGas });
      return { label: `approve Permit2 for ${asset.symbol} from smart wallet ${wallets.deployed}`, hash: await rpc<Hex>("eth_sendRawTransaction", [raw]) };
    });
    await waitForReceipts(rpc, await Promise.all(approvals));
  }
}

/** An OP Stack chain's GasPriceOracle stand-in (the facilitator quotes each transaction's L1 data fee there). */
function opStackOracle(opts: SetupDevnetChainOptions): { address: Address; code: Hex }[] {
  const model = DEFAULT_NETWORK_POLICIES[`eip155:${opts.chainId}`]?.dataFee;
  return model?.kind === "op-l1-fee" ? [{ address: model.oracle, code: constantOracleCode(opts.l1DataFeeWei ?? 1_000_000_000n) }] : [];
}
