// Facilitator configuration from flags, environment and an optional JSON file (in that order of
// precedence). Signer keys come from a file (a mounted Secret: one 0x-hex key per line).
import { readFileSync } from "node:fs";
import { bytesToHex, getAddress } from "viem";
import { mnemonicToAccount, privateKeyToAccount } from "viem/accounts";
import { z } from "zod";
import { number } from "../platform/flags.ts";
import type { InFlightCaps } from "../platform/http.ts";
import { CAIP2_PATTERN, networkInfo, type AssetInfo, type Caip2 } from "../x402/networks.ts";
import { SCHEMES, type Scheme } from "../x402/wire.ts";
import { webhookUrlProblem } from "../x402/webhooks.ts";
import { DEFAULT_BASE_FEE_MULTIPLIER, createGasPolicy, parseGasCeilings, type GasPolicy, type TransactionKind } from "./settlement/gas-policy.ts";
import { DEFAULT_RECEIPT_POLLING } from "./settlement/receipts.ts";
import { DEFAULT_MAX_FEE_BUMPS } from "./settlement/reconciler.ts";
import { defaultReceiptTimeoutMs, resolveNetworkPolicy, type NetworkPolicy } from "./network-policy.ts";

export interface FacilitatorConfig {
  network: Caip2;
  rpcUrls: string[];
  signerKeys: `0x${string}`[];
  schemes: Scheme[];
  host: string;
  port: number;
  receiptTimeoutMs: number;
  /** Bound of one RPC round trip (the transport retries once after it). */
  rpcTimeoutMs: number;
  /** Quick reads made together go to an endpoint as one JSON-RPC batch of at most this many calls (1: never batch). */
  rpcMaxBatch: number;
  assets: AssetInfo[];
  bodyLimit: number;
  /** Requests held at once, per action: past it a 503 with Retry-After, before any work (load shedding). */
  maxInFlight: InFlightCaps;
  adminPort: number;
  /**
   * A signer with no more than this (wei) counts as unfunded and is not picked. Unset: derived
   * from the largest gas ceiling x the current fee cap (what its next transaction may cost).
   */
  minSignerBalanceWei?: bigint;
  /** How often signer balances are read, in ms. */
  balanceRefreshMs: number;
  /** Gas ceilings per transaction kind, over the defaults (gas-policy.ts). */
  gasCeilings: Partial<Record<TransactionKind, bigint>>;
  /** Gas ceiling of transactions of no known kind. */
  defaultGasCeiling?: bigint;
  /** Relative fee cap: maxFeePerGas <= this x current base fee + tip. */
  feeCapBaseFeeMultiplier: number;
  /** Fee replacements of one stuck transaction at most; past them it waits. */
  maxFeeBumps: number;
  /** Receipt polling of one waited transaction: first interval, cap of the doubling, calls per wait. */
  receiptPollMs: number;
  receiptPollMaxMs: number;
  receiptPollBudget: number;
  /** PostgreSQL URL shared by the replicas of a network; unset → the embedded engine in dataDir. */
  databaseUrl?: string;
  dataDir: string;
  /** Blocks a receipt needs (1 = included) before a settlement counts as final. */
  confirmations: number;
  /** Fee cap per gas in wei; no transaction is signed above it. */
  maxFeePerGasWei?: bigint;
  /** A transaction without a receipt after this long is replaced with higher fees. */
  replaceAfterMs: number;
  /** The key upto payments must name (extra.facilitatorAddress); one of signerKeys, the first by default. */
  uptoFacilitatorAddress: `0x${string}`;
  /** batch-settlement receiver-authorizer key; unset: servers sign their own claims and refunds. */
  receiverAuthorizerKey?: `0x${string}`;
  /** Receivers the authorizer key signs for: `<address> <sha256 of token>` lines (receiver-auth.ts). */
  receiverCredentialsFile?: string;
  /** Tokens (or their digests) a router authenticates with (platform/router-token.ts); set: /settle only from the router. */
  routerTokenFile?: string;
  /** When set, only these token contracts are accepted (checksummed). */
  allowedAssets?: `0x${string}`[];
  /** A deny-list file of payer and payee addresses (screening.ts), re-read when it changes. */
  denyListFile?: string;
  /** ERC-6492 factories a counterfactual payer's wallet may be deployed through during settlement (none: refused). */
  eip6492Factories: `0x${string}`[];
  /** An external screening service (screening-hook.ts); its URL may carry a token: never logged. */
  screening?: { url: string; timeoutMs: number; failOpen: boolean; cacheMs: number; tokenFile?: string };
  /** The chain's fee, data-fee, finality and RPC rules: the network's defaults with the `policy` overrides. */
  policy: NetworkPolicy;
  /**
   * The erc20ApprovalGasSponsoring extension (approval-sponsor.ts), off unless set: the most gas a
   * payer's approval may take, the most one payer is funded with (default: that gas x the fee
   * cap), and the most the network's fundings, and one payer's, may total per UTC day (default:
   * DEFAULT_DAILY_FUNDINGS fundings at that bound).
   */
  approvalSponsoring?: { maxApprovalGas: bigint; maxFundingWei?: bigint; dailyFunding: FundingBound; payerDailyFunding: FundingBound };
  /** Settlement webhooks (settlement/webhooks.ts), off unless a secret is set. */
  webhooks?: WebhookConfig;
}

export interface WebhookConfig {
  /** This facilitator's own receiver of every payment's events; unset: tenants' URLs only. It may carry a token: never logged. */
  url?: string;
  /** The fleet's webhook secret (X402_WEBHOOK_SECRET_FILE): derives the facilitator's own receiver's key and each tenant's. */
  secret: string;
  /** The facilitator's own receiver (`url`) may be on loopback or private addresses, over plain http (in-cluster, tests). Never tenants'. */
  allowPrivateNetworks: boolean;
  /** Tenants' URLs too (X402_WEBHOOK_TENANT_ALLOW_PRIVATE_NETWORKS): tests and devnets only, never a shared deployment. */
  tenantAllowPrivateNetworks?: boolean;
  /** Bound of one POST, headers and body. */
  timeoutMs: number;
  /** Retries back off exponentially from the first delay to the largest, with jitter. */
  retryBaseMs: number;
  retryMaxMs: number;
  /** A delivery is given up (dead) after this many attempts or this long after its event, whichever comes first. */
  maxAttempts: number;
  giveUpAfterMs: number;
  /** How often each process looks for due deliveries. */
  pollMs: number;
}

/** A daily funding bound: wei, or a number of fundings at the per-payer bound (which follows the fee cap, so it is read when used). */
export type FundingBound = { wei: bigint } | { fundings: bigint };

/**
 * Daily funding bounds when none is configured. A payer needs one approval per token; a few cover
 * wallets that approve exact amounts. A hostile payer that lets its approvals land still gets a
 * few fundings a day, and the network's signers lose at most 100 fundings a day to all of them.
 */
export const DEFAULT_DAILY_FUNDINGS = { network: 100n, payer: 3n } as const;

const keyPattern = /^0x[0-9a-fA-F]{64}$/;

const fileSchema = z
  .object({
    network: z.string().regex(CAIP2_PATTERN),
    rpcUrls: z.array(z.string().url()).min(1),
    signerKeyFile: z.string(),
    signerMnemonicFile: z.string(),
    signerCount: z.number().int().min(1).max(256),
    databaseUrl: z.string().regex(/^postgres(ql)?:\/\//, "expected a postgres:// URL"),
    dataDir: z.string(),
    confirmations: z.number().int().min(1).max(1000),
    maxFeePerGasWei: z.string().regex(/^[0-9]+$/),
    replaceAfterMs: z.number().int().positive(),
    uptoFacilitatorAddress: z.string().regex(/^0x[0-9a-fA-F]{40}$/),
    receiverAuthorizerKeyFile: z.string(),
    receiverCredentialsFile: z.string(),
    denyListFile: z.string(),
    eip6492Factories: z.array(z.string().regex(/^0x[0-9a-fA-F]{40}$/, "expected a 0x-prefixed 20-byte hex address")),
    screeningUrl: z.string().url().regex(/^https?:\/\//, "expected an http(s) URL"),
    screeningTimeoutMs: z.number().int().min(10).max(10_000),
    screeningFailure: z.enum(["closed", "open"]),
    screeningCacheMs: z.number().int().min(0).max(86_400_000),
    screeningTokenFile: z.string(),
    erc20ApprovalSponsoring: z.enum(["on", "off"]),
    erc20ApprovalMaxGas: z.number().int().min(21_000).max(1_000_000),
    erc20ApprovalMaxFundingWei: z.string().regex(/^[0-9]{1,78}$/, "expected wei as a decimal integer"),
    erc20ApprovalDailyFundingWei: z.string().regex(/^[0-9]{1,78}$/, "expected wei as a decimal integer"),
    erc20ApprovalPayerDailyFundingWei: z.string().regex(/^[0-9]{1,78}$/, "expected wei as a decimal integer"),
    webhookUrl: z.string(),
    webhookSecretFile: z.string(),
    webhookAllowPrivateNetworks: z.boolean(),
    webhookTenantAllowPrivateNetworks: z.boolean(),
    webhookTimeoutMs: z.number().int().min(100).max(120_000),
    webhookRetryBaseMs: z.number().int().min(10).max(3_600_000),
    webhookRetryMaxMs: z.number().int().min(10).max(86_400_000),
    webhookMaxAttempts: z.number().int().min(1).max(1000),
    webhookGiveUpAfterMs: z.number().int().min(1000).max(30 * 86_400_000),
    webhookPollMs: z.number().int().min(10).max(60_000),
    routerTokenFile: z.string(),
    allowedAssets: z.array(z.string().regex(/^0x[0-9a-fA-F]{40}$/, "expected a 0x-prefixed 20-byte hex address")),
    schemes: z.array(z.enum(SCHEMES)).min(1),
    host: z.string(),
    port: z.number().int().min(0).max(65535),
    adminPort: z.number().int().min(0).max(65535),
    minSignerBalanceWei: z.string().regex(/^[0-9]+$/),
    balanceRefreshMs: z.number().int().positive(),
    gasCeilings: z.string(),
    defaultGasCeiling: z.string().regex(/^[0-9]+$/),
    feeCapBaseFeeMultiplier: z.number().min(1).max(1000),
    maxFeeBumps: z.number().int().min(0).max(100),
    receiptPollMs: z.number().int().positive(),
    receiptPollMaxMs: z.number().int().positive(),
    receiptPollBudget: z.number().int().min(1),
    receiptTimeoutMs: z.number().int().positive(),
    rpcTimeoutMs: z.number().int().positive(),
    rpcMaxBatch: z.number().int().min(1).max(1000),
    bodyLimit: z.number().int().positive(),
    maxVerifyInFlight: z.number().int().positive(),
    maxSettleInFlight: z.number().int().positive(),
    policy: z.record(z.unknown()),
    assets: z.array(
      z.object({
        symbol: z.string(),
        address: z.string().regex(/^0x[0-9a-fA-F]{40}$/),
        decimals: z.number().int().min(0).max(36),
        eip712: z.object({ name: z.string(), version: z.string() }).optional(),
        transferMethods: z.array(z.enum(["eip3009", "permit2"])),
        eip2612: z.boolean().optional(),
      }),
    ),
  })
  .partial();

export type FacilitatorConfigInput = z.infer<typeof fileSchema> & {
  signerKeys?: string[];
};

/** Parses signer keys: one 0x-prefixed 32-byte hex key per line; blank lines and # comments ignored. */
export function parseSignerKeys(text: string): `0x${string}`[] {
  const keys = text
    .split(/\r?\n/)
    .map((l) => l.trim())
    .filter((l) => l !== "" && !l.startsWith("#"));
  keys.forEach((k, i) => {
    // Never echo the line: it is a secret.
    if (!keyPattern.test(k)) throw new Error(`signer key file: line ${i + 1} is not a 0x-prefixed 32-byte hex key`);
  });
  return keys as `0x${string}`[];
}

const list = (v: string | undefined) => (v ? v.split(",").map((s) => s.trim()).filter(Boolean) : undefined);

export function facilitatorConfigFromEnv(env: NodeJS.ProcessEnv): FacilitatorConfigInput {
  // A number that is not one is refused naming its variable; ranges are the schema's.
  const num = (name: string) => number(name, env[name]);
  return {
    network: env.X402_NETWORK,
    rpcUrls: list(env.X402_RPC_URLS),
    signerKeyFile: env.X402_SIGNER_KEY_FILE,
    signerMnemonicFile: env.X402_SIGNER_MNEMONIC_FILE,
    signerCount: num("X402_SIGNER_COUNT"),
    databaseUrl: env.DATABASE_URL || undefined,
    dataDir: env.X402_DATA_DIR,
    confirmations: num("X402_CONFIRMATIONS"),
    maxFeePerGasWei: env.X402_MAX_FEE_PER_GAS_WEI,
    replaceAfterMs: num("X402_REPLACE_AFTER_MS"),
    uptoFacilitatorAddress: env.X402_UPTO_FACILITATOR_ADDRESS,
    receiverAuthorizerKeyFile: env.X402_RECEIVER_AUTHORIZER_KEY_FILE,
    receiverCredentialsFile: env.X402_RECEIVER_CREDENTIALS_FILE,
    denyListFile: env.X402_DENY_LIST_FILE || undefined,
    eip6492Factories: list(env.X402_EIP6492_FACTORIES),
    screeningUrl: env.X402_SCREENING_URL || undefined,
    screeningTimeoutMs: num("X402_SCREENING_TIMEOUT_MS"),
    screeningFailure: (env.X402_SCREENING_FAILURE || undefined) as "closed" | "open" | undefined,
    screeningCacheMs: num("X402_SCREENING_CACHE_MS"),
    screeningTokenFile: env.X402_SCREENING_TOKEN_FILE || undefined,
    erc20ApprovalSponsoring: (env.X402_ERC20_APPROVAL_SPONSORING || undefined) as "on" | "off" | undefined,
    erc20ApprovalMaxGas: num("X402_ERC20_APPROVAL_MAX_GAS"),
    erc20ApprovalMaxFundingWei: env.X402_ERC20_APPROVAL_MAX_FUNDING_WEI || undefined,
    erc20ApprovalDailyFundingWei: env.X402_ERC20_APPROVAL_DAILY_FUNDING_WEI || undefined,
    erc20ApprovalPayerDailyFundingWei: env.X402_ERC20_APPROVAL_PAYER_DAILY_FUNDING_WEI || undefined,
    webhookUrl: env.X402_WEBHOOK_URL || undefined,
    webhookSecretFile: env.X402_WEBHOOK_SECRET_FILE || undefined,
    webhookAllowPrivateNetworks: env.X402_WEBHOOK_ALLOW_PRIVATE_NETWORKS ? env.X402_WEBHOOK_ALLOW_PRIVATE_NETWORKS === "true" : undefined,
    webhookTenantAllowPrivateNetworks: env.X402_WEBHOOK_TENANT_ALLOW_PRIVATE_NETWORKS ? env.X402_WEBHOOK_TENANT_ALLOW_PRIVATE_NETWORKS === "true" : undefined,
    webhookTimeoutMs: num("X402_WEBHOOK_TIMEOUT_MS"),
    webhookRetryBaseMs: num("X402_WEBHOOK_RETRY_BASE_MS"),
    webhookRetryMaxMs: num("X402_WEBHOOK_RETRY_MAX_MS"),
    webhookMaxAttempts: num("X402_WEBHOOK_MAX_ATTEMPTS"),
    webhookGiveUpAfterMs: num("X402_WEBHOOK_GIVE_UP_AFTER_MS"),
    webhookPollMs: num("X402_WEBHOOK_POLL_MS"),
    allowedAssets: list(env.X402_ASSETS),
    routerTokenFile: env.X402_ROUTER_TOKEN_FILE || undefined,
    schemes: list(env.X402_SCHEMES) as Scheme[] | undefined,
    host: env.HOST,
    port: num("PORT"),
    adminPort: num("ADMIN_PORT"),
    minSignerBalanceWei: env.X402_MIN_SIGNER_BALANCE_WEI,
    balanceRefreshMs: num("X402_BALANCE_REFRESH_MS"),
    gasCeilings: env.X402_GAS_CEILINGS,
    defaultGasCeiling: env.X402_GAS_CEILING_DEFAULT,
    feeCapBaseFeeMultiplier: num("X402_FEE_CAP_BASE_FEE_MULTIPLIER"),
    maxFeeBumps: num("X402_MAX_FEE_BUMPS"),
    receiptPollMs: num("X402_RECEIPT_POLL_MS"),
    receiptPollMaxMs: num("X402_RECEIPT_POLL_MAX_MS"),
    receiptPollBudget: num("X402_RECEIPT_POLL_BUDGET"),
    receiptTimeoutMs: num("X402_RECEIPT_TIMEOUT_MS"),
    rpcTimeoutMs: num("X402_RPC_TIMEOUT_MS"),
    rpcMaxBatch: num("X402_RPC_MAX_BATCH"),
    maxVerifyInFlight: num("X402_MAX_VERIFY_IN_FLIGHT"),
    maxSettleInFlight: num("X402_MAX_SETTLE_IN_FLIGHT"),
    policy: env.X402_POLICY ? parsePolicyEnv(env.X402_POLICY) : undefined,
  };
}

function parsePolicyEnv(text: string): Record<string, unknown> {
  try {
    return JSON.parse(text) as Record<string, unknown>;
  } catch {
    throw new Error("X402_POLICY: not a JSON object of network policy overrides (docs/networks.md)");
  }
}

/** Merges layers (later wins, undefined skipped), validates, and loads the signer keys. */
export function resolveFacilitatorConfig(...layers: FacilitatorConfigInput[]): FacilitatorConfig {
  const merged: FacilitatorConfigInput = {};
  for (const layer of layers) {
    for (const [k, v] of Object.entries(layer)) if (v !== undefined) (merged as Record<string, unknown>)[k] = v;
  }
  const { signerKeys: inlineKeys, ...rest } = merged;
  const parsed = fileSchema.safeParse(rest);
  if (!parsed.success) {
    const issue = parsed.error.issues[0]!;
    throw new Error(`facilitator config: ${issue.path.join(".")}: ${issue.message}`);
  }
  const c = parsed.data;
  if (!c.network) throw new Error("facilitator config: network is required (--network or X402_NETWORK)");
  if (!c.rpcUrls?.length) throw new Error("facilitator config: at least one RPC URL is required (--rpc-url or X402_RPC_URLS)");
  const signerKeys = inlineKeys
    ? parseSignerKeys(inlineKeys.join("\n"))
    : c.signerKeyFile
      ? parseSignerKeys(readKeyFile(c.signerKeyFile))
      : c.signerMnemonicFile
        ? keysFromMnemonic(readKeyFile(c.signerMnemonicFile), c.signerCount ?? 1)
        : [];
  if (signerKeys.length === 0) throw new Error("facilitator config: no signer keys (--signer-key-file / X402_SIGNER_KEY_FILE, or X402_SIGNER_MNEMONIC_FILE with X402_SIGNER_COUNT)");
  const addresses = signerKeys.map((k) => privateKeyToAccount(k).address);
  const policy = resolveNetworkPolicy(c.network, c.policy ?? {});
  const uptoFacilitatorAddress = c.uptoFacilitatorAddress ? getAddress(c.uptoFacilitatorAddress) : addresses[0]!;
  if (!addresses.includes(uptoFacilitatorAddress)) throw new Error(`facilitator config: uptoFacilitatorAddress ${uptoFacilitatorAddress} is not one of the signer keys`);
  let receiverAuthorizerKey: `0x${string}` | undefined;
  if (c.receiverAuthorizerKeyFile) {
    const keys = parseSignerKeys(readKeyFile(c.receiverAuthorizerKeyFile));
    if (keys.length !== 1) throw new Error("facilitator config: the receiver authorizer key file must hold exactly one key");
    receiverAuthorizerKey = keys[0];
  }
  return {
    network: c.network as Caip2,
    rpcUrls: c.rpcUrls,
    signerKeys,
    schemes: c.schemes ?? [...SCHEMES],
    host: c.host ?? "127.0.0.1",
    port: c.port ?? 4021,
    receiptTimeoutMs: c.receiptTimeoutMs ?? defaultReceiptTimeoutMs(policy),
    rpcTimeoutMs: c.rpcTimeoutMs ?? 10_000,
    rpcMaxBatch: c.rpcMaxBatch ?? 10,
    bodyLimit: c.bodyLimit ?? 64 * 1024,
    // A 1,000-payment burst fits with room to spare; a settlement waiting for its block holds tens
    // of kilobytes, so the settle cap keeps memory well under a pod's limit.
    maxInFlight: { verify: c.maxVerifyInFlight ?? 4096, settle: c.maxSettleInFlight ?? 2048 },
    adminPort: c.adminPort ?? (c.port === 0 ? 0 : 9421), // an ephemeral public port implies an ephemeral admin port
    minSignerBalanceWei: c.minSignerBalanceWei !== undefined ? BigInt(c.minSignerBalanceWei) : undefined,
    balanceRefreshMs: c.balanceRefreshMs ?? 15_000,
    gasCeilings: c.gasCeilings ? parseGasCeilings(c.gasCeilings) : {},
    defaultGasCeiling: c.defaultGasCeiling !== undefined ? BigInt(c.defaultGasCeiling) : undefined,
    feeCapBaseFeeMultiplier: c.feeCapBaseFeeMultiplier ?? DEFAULT_BASE_FEE_MULTIPLIER,
    maxFeeBumps: c.maxFeeBumps ?? DEFAULT_MAX_FEE_BUMPS,
    receiptPollMs: c.receiptPollMs ?? DEFAULT_RECEIPT_POLLING.intervalMs,
    receiptPollMaxMs: c.receiptPollMaxMs ?? DEFAULT_RECEIPT_POLLING.maxIntervalMs,
    receiptPollBudget: c.receiptPollBudget ?? DEFAULT_RECEIPT_POLLING.maxCallsPerWait,
    databaseUrl: c.databaseUrl,
    dataDir: c.dataDir ?? `.data/facilitator-${c.network.slice("eip155:".length)}`,
    confirmations: c.confirmations ?? policy.confirmations,
    maxFeePerGasWei: c.maxFeePerGasWei !== undefined ? BigInt(c.maxFeePerGasWei) : undefined,
    replaceAfterMs: c.replaceAfterMs ?? 15_000,
    uptoFacilitatorAddress,
    receiverAuthorizerKey,
    receiverCredentialsFile: c.receiverCredentialsFile,
    denyListFile: c.denyListFile,
    eip6492Factories: (c.eip6492Factories ?? []).map((a) => getAddress(a)),
    screening: c.screeningUrl
      ? { url: c.screeningUrl, timeoutMs: c.screeningTimeoutMs ?? 300, failOpen: c.screeningFailure === "open", cacheMs: c.screeningCacheMs ?? 60_000, tokenFile: c.screeningTokenFile }
      : undefined,
    approvalSponsoring:
      c.erc20ApprovalSponsoring === "on"
        ? {
            maxApprovalGas: BigInt(c.erc20ApprovalMaxGas ?? 100_000),
            maxFundingWei: c.erc20ApprovalMaxFundingWei !== undefined ? BigInt(c.erc20ApprovalMaxFundingWei) : undefined,
            dailyFunding: c.erc20ApprovalDailyFundingWei !== undefined ? { wei: BigInt(c.erc20ApprovalDailyFundingWei) } : { fundings: DEFAULT_DAILY_FUNDINGS.network },
            payerDailyFunding: c.erc20ApprovalPayerDailyFundingWei !== undefined ? { wei: BigInt(c.erc20ApprovalPayerDailyFundingWei) } : { fundings: DEFAULT_DAILY_FUNDINGS.payer },
          }
        : undefined,
    webhooks: webhookConfigOf(c),
    routerTokenFile: c.routerTokenFile,
    allowedAssets: c.allowedAssets?.map((a) => getAddress(a)),
    assets: (c.assets as AssetInfo[] | undefined) ?? networkInfo(c.network)?.assets ?? [],
    policy: c.confirmations !== undefined ? { ...policy, confirmations: c.confirmations } : policy,
  };
}

/** The webhook settings, checked: a URL needs the secret to sign with, and passes the URL rules (never echoed: it may carry a token). */
function webhookConfigOf(c: z.infer<typeof fileSchema>): WebhookConfig | undefined {
  if (!c.webhookSecretFile) {
    if (c.webhookUrl) throw new Error("facilitator config: webhookUrl (X402_WEBHOOK_URL) needs webhookSecretFile (X402_WEBHOOK_SECRET_FILE) to sign its events");
    return undefined;
  }
  const allowPrivateNetworks = c.webhookAllowPrivateNetworks ?? false;
  const problem = c.webhookUrl ? webhookUrlProblem(c.webhookUrl, { allowPrivateNetworks }) : undefined;
  if (problem) throw new Error(`facilitator config: webhookUrl (X402_WEBHOOK_URL): ${problem}`);
  let secret: string;
  try {
    secret = readFileSync(c.webhookSecretFile, "utf8").trim();
  } catch (e) {
    throw new Error(`cannot read webhook secret file ${c.webhookSecretFile}: ${(e as NodeJS.ErrnoException).code ?? "error"}`);
  }
  if (secret.length < 32) throw new Error(`facilitator config: the webhook secret file ${c.webhookSecretFile} holds fewer than 32 characters (e.g. openssl rand -hex 32)`);
  return {
    url: c.webhookUrl,
    secret,
    allowPrivateNetworks,
    tenantAllowPrivateNetworks: c.webhookTenantAllowPrivateNetworks ?? false,
    timeoutMs: c.webhookTimeoutMs ?? 10_000,
    retryBaseMs: c.webhookRetryBaseMs ?? 1000,
    retryMaxMs: c.webhookRetryMaxMs ?? 3_600_000,
    maxAttempts: c.webhookMaxAttempts ?? 40,
    giveUpAfterMs: c.webhookGiveUpAfterMs ?? 86_400_000,
    pollMs: c.webhookPollMs ?? 1000,
  };
}

/** Keys 0..count-1 of the standard Ethereum derivation path of a BIP-39 mnemonic. */
function keysFromMnemonic(text: string, count: number): `0x${string}`[] {
  const mnemonic = text.trim().split(/\s+/).join(" ");
  try {
    return Array.from({ length: count }, (_, addressIndex) => bytesToHex(mnemonicToAccount(mnemonic, { addressIndex }).getHdKey().privateKey!));
  } catch {
    throw new Error("signer mnemonic file: not a valid BIP-39 mnemonic"); // never echo it
  }
}

function readKeyFile(path: string): string {
  try {
    return readFileSync(path, "utf8");
  } catch (e) {
    throw new Error(`cannot read signer key file ${path}: ${(e as NodeJS.ErrnoException).code ?? "error"}`);
  }
}

/** What a key may sign under this configuration: ceilings, fee caps and the chain's floors (one place for the service and doctor). */
export function gasPolicyOf(config: FacilitatorConfig): GasPolicy {
  const { policy } = config;
  return createGasPolicy({
    ceilings: config.gasCeilings,
    defaultCeiling: config.defaultGasCeiling,
    maxFeePerGasWei: config.maxFeePerGasWei,
    baseFeeMultiplier: config.feeCapBaseFeeMultiplier,
    minPriorityFeePerGas: policy.minPriorityFeePerGasWei,
    l1GasAllowance: policy.dataFee.kind === "l1-gas" ? policy.dataFee.gasAllowance : undefined,
  });
}
