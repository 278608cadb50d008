// `x402-fleet doctor`: checks a facilitator configuration against the chain before it takes money,
// and says in plain words what is wrong. Each RPC endpoint answers with the right chain id and is
// at the head (compared across endpoints); Permit2 and the x402 contracts have code at their
// canonical addresses; each asset has code, the configured decimals and EIP-712 domain; each signer
// holds the minimum and has no transactions waiting between `latest` and `pending`; the router's
// routing table lists what this facilitator serves. Nothing is signed or sent.
import { createPublicClient, formatEther, hashDomain, http, isAddressEqual, parseAbi, type Address, type Hex, type PublicClient } from "viem";
import { privateKeyToAccount } from "viem/accounts";
import { x402UptoPermit2ProxyAddress } from "@x402/evm";
import { endpointName } from "../platform/logger.ts";
import { EXACT_PERMIT2_PROXY_ADDRESS, MULTICALL3_ADDRESS, PERMIT2_ADDRESS, chainIdOf, chainKind, networkInfo, type AssetInfo } from "../x402/networks.ts";
import type { RoutingTable } from "../router/routing-table.ts";
import { gasPolicyOf, type FacilitatorConfig } from "./config.ts";
import { maxHeadLagBlocks, minimumSignerBalance } from "./network-policy.ts";
import { BATCH_SETTLEMENT_CONTRACT } from "./settlement/gas-policy.ts";

export interface DoctorFinding {
  /** What was checked: rpc, contracts, asset, signer, routing. */
  check: "rpc" | "contracts" | "asset" | "signer" | "fees" | "routing";
  ok: boolean;
  message: string;
}

export interface DoctorReport {
  network: string;
  ok: boolean;
  findings: DoctorFinding[];
}

export interface DoctorOptions {
  config: FacilitatorConfig;
  /** The router's routing table (the file the operator or devnet writes). */
  routingTable?: RoutingTable;
  /** A running router: its /supported must list this network's schemes. */
  routerUrl?: string;
  rpcTimeoutMs?: number;
  /** How RPC requests leave the process (the operator passes its egress guard). */
  fetchFn?: typeof fetch;
}

const tokenAbi = parseAbi(["function decimals() view returns (uint8)", "function name() view returns (string)", "function DOMAIN_SEPARATOR() view returns (bytes32)"]);

export async function runDoctor(opts: DoctorOptions): Promise<DoctorReport> {
  const { config } = opts;
  const findings: DoctorFinding[] = [];
  const ok = (check: DoctorFinding["check"], message: string) => findings.push({ check, ok: true, message });
  const problem = (check: DoctorFinding["check"], message: string) => findings.push({ check, ok: false, message });
  const chainId = chainIdOf(config.network);
  const policy = config.policy;

  // 1. Every endpoint: chain id, head, and what it serves.
  const endpoints = await Promise.all(
    config.rpcUrls.map(async (url) => {
      const name = endpointName(url); // provider URLs embed API keys: the host only
      const client = createPublicClient({ transport: http(url, { timeout: opts.rpcTimeoutMs ?? 10_000, retryCount: 0, fetchFn: opts.fetchFn }) }) as PublicClient;
      try {
        const [id, head] = await Promise.all([client.getChainId(), client.getBlockNumber()]);
        return { name, client, id, head };
      } catch (e) {
        return { name, client, error: (e as Error).name };
      }
    }),
  );
  const good: typeof endpoints = [];
  for (const e of endpoints) {
    if (e.error !== undefined || e.id === undefined) {
      problem("rpc", `RPC ${e.name} did not answer (${e.error})`);
    } else if (e.id !== chainId) {
      const kind = chainKind(e.id);
      const served = networkInfo(config.network);
      const mix = served && kind !== "unknown" && kind !== (served.testnet ? "testnet" : "mainnet") ? `: it is a ${kind}, and testnets and mainnets never mix` : "";
      problem("rpc", `RPC ${e.name} reports chain id ${e.id}, but this facilitator serves ${config.network} (chain id ${chainId})${mix}`);
    } else good.push(e);
  }
  if (good.length > 0) {
    const top = good.reduce((a, b) => (b.head! > a.head! ? b : a));
    const allowed = BigInt(maxHeadLagBlocks(policy));
    for (const e of good) {
      const lag = top.head! - e.head!;
      if (lag > allowed) problem("rpc", `RPC ${e.name} is ${lag} blocks behind ${top.name} (head ${e.head} vs ${top.head}); more than ${allowed} blocks (~10 s at ${policy.blockTimeMs} ms blocks) is lagging`);
      else ok("rpc", `RPC ${e.name} is on ${config.network}, head ${e.head}${good.length > 1 ? ` (${lag} behind the highest)` : ""}`);
    }
    const sync = await supportsSendRawTransactionSync(good[0]!.client);
    if (policy.sendRawTransactionSync && !sync) problem("rpc", `the policy says the endpoint serves eth_sendRawTransactionSync, but ${good[0]!.name} does not`);
    else ok("rpc", `eth_sendRawTransactionSync: ${sync ? "served" : "not served"} by ${good[0]!.name}${policy.sendRawTransactionSync ? "" : " (the policy does not use it)"}`);
  } else {
    problem("rpc", "no RPC endpoint answers for this network: nothing else could be checked");
    return { network: config.network, ok: false, findings };
  }
  // The rest on the highest good endpoint.
  const client = good.reduce((a, b) => (b.head! > a.head! ? b : a)).client;

  // 2. Contracts at their canonical addresses.
  const contracts: { name: string; address: Address }[] = [
    { name: "Permit2", address: PERMIT2_ADDRESS },
    { name: "Multicall3", address: MULTICALL3_ADDRESS },
    ...(config.schemes.includes("exact") ? [{ name: "x402 exact Permit2 proxy", address: EXACT_PERMIT2_PROXY_ADDRESS }] : []),
    ...(config.schemes.includes("upto") ? [{ name: "x402 upto Permit2 proxy", address: x402UptoPermit2ProxyAddress as Address }] : []),
    ...(config.schemes.includes("batch-settlement") ? [{ name: "x402 batch-settlement contract", address: BATCH_SETTLEMENT_CONTRACT }] : []),
  ];
  await Promise.all(
    contracts.map(async (c) => {
      const code = await client.getCode({ address: c.address }).catch(() => undefined);
      if (!code || code === "0x") problem("contracts", `${c.name} has no code at ${c.address}: payments that need it would fail on chain`);
      else ok("contracts", `${c.name} has code at ${c.address}`);
    }),
  );

  // 3. Assets: code, decimals, EIP-712 domain.
  const accepted = config.allowedAssets ?? config.assets.map((a) => a.address);
  await Promise.all(
    accepted.map(async (address) => {
      const asset = config.assets.find((a) => isAddressEqual(a.address, address));
      for (const line of await checkAsset(client, chainId, address, asset)) (line.ok ? ok : problem)("asset", line.message);
    }),
  );

  // 4. Fees and signers: balances cover the costliest transaction at the fee cap; no nonce gap.
  const gasPolicy = gasPolicyOf(config);
  let minimum = config.minSignerBalanceWei;
  try {
    const block = await client.getBlock({ blockTag: "latest" });
    const baseFee = block.baseFeePerGas ?? 0n;
    const tip = gasPolicy.tip(await client.estimateMaxPriorityFeePerGas().catch(() => 0n));
    const cap = gasPolicy.feeCap(baseFee, tip);
    if (cap < baseFee + policy.minPriorityFeePerGasWei) problem("fees", `the fee cap (${cap} wei per gas) is below the chain's floor (base fee ${baseFee} + minimum tip ${policy.minPriorityFeePerGasWei}): every settlement would be refused before signing`);
    else ok("fees", `fee cap ${cap} wei per gas covers the base fee ${baseFee} and the minimum tip ${policy.minPriorityFeePerGasWei}`);
    minimum ??= minimumSignerBalance(gasPolicy.largestCeiling(), cap, policy);
  } catch (e) {
    problem("fees", `could not read the chain's fees (${(e as Error).name})`);
  }
  await Promise.all(
    config.signerKeys.map(async (key) => {
      const address = privateKeyToAccount(key).address;
      const [balance, latest, pending] = await Promise.all([
        client.getBalance({ address }),
        client.getTransactionCount({ address, blockTag: "latest" }),
        client.getTransactionCount({ address, blockTag: "pending" }),
      ]);
      if (minimum !== undefined && balance <= minimum) problem("signer", `signer ${address} holds ${formatEther(balance)} (native), at or below the minimum ${formatEther(minimum)} its costliest transaction may cost: fund it`);
      else ok("signer", `signer ${address} holds ${formatEther(balance)} (native)${minimum !== undefined ? `, above the minimum ${formatEther(minimum)}` : ""}`);
      if (pending > latest) problem("signer", `signer ${address} has ${pending - latest} transaction(s) between latest (nonce ${latest}) and pending (nonce ${pending}): stuck or still in flight`);
      else ok("signer", `signer ${address}: no nonce gap (next nonce ${latest})`);
    }),
  );

  // 5. The router lists what this facilitator serves.
  const signers = config.signerKeys.map((k) => privateKeyToAccount(k).address);
  if (opts.routingTable) {
    const backend = opts.routingTable.backends.find((b) => b.network === config.network);
    if (!backend) problem("routing", `the routing table lists no backend for ${config.network}: the router would answer it unsupported`);
    else {
      const missing = config.schemes.filter((s) => !backend.kinds.some((k) => k.scheme === s && k.network === config.network));
      if (missing.length) problem("routing", `the routing table's ${config.network} backend lacks the scheme(s) ${missing.join(", ")} this facilitator serves`);
      const unknownSigners = signers.filter((s) => !backend.signers.some((b) => b.toLowerCase() === s.toLowerCase()));
      if (unknownSigners.length) problem("routing", `the routing table's ${config.network} backend does not list signer(s) ${unknownSigners.join(", ")}`);
      if (!missing.length && !unknownSigners.length) ok("routing", `the routing table lists ${config.network} at ${endpointName(backend.url)} with ${config.schemes.join(", ")} and every signer`);
    }
  }
  if (opts.routerUrl) {
    try {
      const res = await fetch(`${opts.routerUrl.replace(/\/$/, "")}/supported`, { signal: AbortSignal.timeout(opts.rpcTimeoutMs ?? 10_000) });
      const body = (await res.json()) as { kinds?: { scheme: string; network: string }[] };
      const missing = config.schemes.filter((s) => !(body.kinds ?? []).some((k) => k.scheme === s && k.network === config.network));
      if (missing.length) problem("routing", `the router at ${endpointName(opts.routerUrl)} does not list ${missing.map((s) => `${s}@${config.network}`).join(", ")} in /supported`);
      else ok("routing", `the router at ${endpointName(opts.routerUrl)} lists ${config.schemes.map((s) => `${s}@${config.network}`).join(", ")}`);
    } catch (e) {
      problem("routing", `the router at ${endpointName(opts.routerUrl)} did not answer /supported (${(e as Error).name})`);
    }
  }
  return { network: config.network, ok: findings.every((f) => f.ok), findings };
}

async function checkAsset(client: PublicClient, chainId: number, address: Address, asset: AssetInfo | undefined): Promise<{ ok: boolean; message: string }[]> {
  const label = `asset ${asset?.symbol ?? "(allowed)"} ${address}`;
  const code = await client.getCode({ address }).catch(() => undefined);
  if (!code || code === "0x") return [{ ok: false, message: `${label} has no code: it is not a token on this chain` }];
  if (!asset) return [{ ok: true, message: `${label} has code (no decimals or domain configured to compare)` }];
  const out: { ok: boolean; message: string }[] = [];
  const decimals = await client.readContract({ address, abi: tokenAbi, functionName: "decimals" }).catch(() => undefined);
  if (decimals === undefined) out.push({ ok: false, message: `${label} does not answer decimals()` });
  else if (decimals !== asset.decimals) out.push({ ok: false, message: `${label} has ${decimals} decimals, but ${asset.decimals} are configured: amounts would be off by a factor of 10^${Math.abs(Number(decimals) - asset.decimals)}` });
  else out.push({ ok: true, message: `${label} has code and ${decimals} decimals` });
  if (asset.eip712) {
    const expected = hashDomain({ domain: { name: asset.eip712.name, version: asset.eip712.version, chainId: BigInt(chainId), verifyingContract: address }, types: { EIP712Domain: [{ name: "name", type: "string" }, { name: "version", type: "string" }, { name: "chainId", type: "uint256" }, { name: "verifyingContract", type: "address" }] } });
    const actual = (await client.readContract({ address, abi: tokenAbi, functionName: "DOMAIN_SEPARATOR" }).catch(() => undefined)) as Hex | undefined;
    if (actual === undefined) out.push({ ok: false, message: `${label} does not answer DOMAIN_SEPARATOR(): EIP-3009 / EIP-2612 signatures cannot be checked against "${asset.eip712.name}"/"${asset.eip712.version}"` });
    else if (actual.toLowerCase() !== expected.toLowerCase()) {
      const name = await client.readContract({ address, abi: tokenAbi, functionName: "name" }).catch(() => undefined);
      out.push({ ok: false, message: `${label}: its EIP-712 domain is not "${asset.eip712.name}"/"${asset.eip712.version}"${name !== undefined ? ` (the token's name() is "${name}")` : ""}: every signature made for the configured domain would be refused` });
    } else out.push({ ok: true, message: `${label} EIP-712 domain is "${asset.eip712.name}"/"${asset.eip712.version}"` });
  }
  return out;
}

/** Whether the endpoint knows eth_sendRawTransactionSync: a malformed call is refused as bad input, not as an unknown method. */
async function supportsSendRawTransactionSync(client: PublicClient): Promise<boolean> {
  try {
    await client.request({ method: "eth_sendRawTransactionSync" as never, params: ["0x"] as never });
    return true;
  } catch (e) {
    const text = `${(e as { code?: number }).code ?? ""} ${(e as Error).message}`;
    return !/-32601|method not found|does not exist|not supported|unsupported method/i.test(text);
  }
}

/** The report in plain words, one line per finding, problems first. */
export function formatDoctorReport(report: DoctorReport): string {
  const problems = report.findings.filter((f) => !f.ok);
  const lines = [
    `x402-fleet doctor: ${report.network}: ${problems.length === 0 ? "healthy" : `${problems.length} problem(s)`}`,
    ...problems.map((f) => `  PROBLEM  ${f.check}: ${f.message}`),
    ...report.findings.filter((f) => f.ok).map((f) => `  ok       ${f.check}: ${f.message}`),
  ];
  return lines.join("\n") + "\n";
}
