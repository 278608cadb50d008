// Spending policies: what a wallet may sign. Plain data and pure functions: parsing (with the
// asset symbols of our networks resolved to addresses) and the decision for one payment.
//
// Deny by default: a payment is signed only in an asset the policy lists (per network), and every
// restriction that is set must pass: expiry, schemes, networks, payTo addresses, resource hosts,
// the per-payment cap and the cap over any 24 hours (upto counts its ceiling).
import { z } from "zod";
import { getAddress, isAddress, type Address } from "viem";
import { CAIP2_PATTERN, networkInfo, type Caip2 } from "../x402/networks.ts";
import { WalletError, type WalletErrorCode } from "./errors.ts";

export const WALLET_SCHEMES = ["exact", "upto"] as const;
export type WalletScheme = (typeof WALLET_SCHEMES)[number];

/** The window of the daily cap. */
export const DAY_MS = 24 * 60 * 60 * 1000;

export interface AssetLimit {
  network: Caip2;
  asset: Address;
  /** The symbol when the policy named the asset by it (or the asset is one we know). */
  symbol?: string;
  /** Atomic units, decimal; absent: no cap per payment. */
  maxPerPayment?: string;
  /** Atomic units, decimal, over any 24 hours; absent: no daily cap. */
  maxPerDay?: string;
}

export interface Policy {
  /** Allowed networks; absent: the networks of `assets`. */
  networks?: Caip2[];
  /** The assets that may be paid, with their caps. Empty: nothing can be paid. */
  assets: AssetLimit[];
  /** Allowed schemes; absent: exact and upto. */
  schemes?: WalletScheme[];
  /** Allowed recipients; absent: any. */
  payTo?: Address[];
  /** Allowed resource hosts (`api.example.com`, `*.example.com`); absent: any. */
  hosts?: string[];
  /** ISO time after which nothing is signed; absent or null: no expiry. */
  expiresAt?: string | null;
}

export const EMPTY_POLICY: Policy = { assets: [] };

const amount = z.string().regex(/^(0|[1-9][0-9]{0,77})$/, "an amount is a decimal string of atomic units (no sign, no decimals)");
const network = z.string().regex(CAIP2_PATTERN, "a network is an eip155 CAIP-2 id such as eip155:8453");
const HOST_PATTERN = /^(\*\.)?(?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)*[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$/;

const policyInput = z
  .object({
    networks: z.array(network).max(64).optional(),
    assets: z
      .array(
        z
          .object({
            network,
            asset: z.string().min(1).max(64),
            maxPerPayment: amount.optional(),
            maxPerDay: amount.optional(),
          })
          .strict(),
      )
      .max(256),
    schemes: z.array(z.enum(WALLET_SCHEMES)).min(1).max(2).optional(),
    payTo: z.array(z.string()).max(1000).optional(),
    hosts: z.array(z.string().min(1).max(253)).max(1000).optional(),
    expiresAt: z.string().datetime({ offset: true }).nullable().optional(),
  })
  .strict();

function issueText(error: z.ZodError): string {
  return error.issues.map((i) => `${i.path.length ? i.path.join(".") : "policy"}: ${i.message}`).join("; ");
}

/** Parses a policy as a client sends it; symbols become addresses, addresses become checksummed. */
export function parsePolicy(input: unknown): Policy {
  const parsed = policyInput.safeParse(input);
  if (!parsed.success) throw new WalletError("invalid_policy", issueText(parsed.error));
  const p = parsed.data;
  const seen = new Set<string>();
  const assets = p.assets.map((a, i): AssetLimit => {
    const known = networkInfo(a.network)?.assets;
    let address: Address;
    let symbol: string | undefined;
    if (isAddress(a.asset, { strict: false })) {
      address = getAddress(a.asset);
      symbol = known?.find((k) => k.address.toLowerCase() === address.toLowerCase())?.symbol;
    } else {
      const matches = known?.filter((k) => k.symbol.toLowerCase() === a.asset.toLowerCase()) ?? [];
      if (matches.length !== 1) {
        const names = known?.map((k) => k.symbol).join(", ");
        throw new WalletError("invalid_policy", `assets.${i}.asset: ${JSON.stringify(a.asset)} is neither an address nor ${names ? `a symbol on ${a.network} (${names})` : `a symbol we know on ${a.network}; give the token address`}`);
      }
      address = matches[0]!.address;
      symbol = matches[0]!.symbol;
    }
    const key = `${a.network}|${address.toLowerCase()}`;
    if (seen.has(key)) throw new WalletError("invalid_policy", `assets.${i}: ${a.network} ${address} is listed twice`);
    seen.add(key);
    return { network: a.network as Caip2, asset: address, ...(symbol ? { symbol } : {}), ...(a.maxPerPayment !== undefined ? { maxPerPayment: a.maxPerPayment } : {}), ...(a.maxPerDay !== undefined ? { maxPerDay: a.maxPerDay } : {}) };
  });
  const payTo = p.payTo?.map((x, i) => {
    if (!isAddress(x, { strict: false })) throw new WalletError("invalid_policy", `payTo.${i}: ${JSON.stringify(x.slice(0, 64))} is not an address`);
    return getAddress(x);
  });
  const hosts = p.hosts?.map((h, i) => {
    const host = h.trim().toLowerCase();
    if (!HOST_PATTERN.test(host)) throw new WalletError("invalid_policy", `hosts.${i}: ${JSON.stringify(h.slice(0, 64))} is not a host name (api.example.com) or a pattern (*.example.com)`);
    return host;
  });
  return {
    ...(p.networks ? { networks: [...new Set(p.networks)] as Caip2[] } : {}),
    assets,
    ...(p.schemes ? { schemes: [...new Set(p.schemes)] } : {}),
    ...(payTo ? { payTo: [...new Set(payTo)] } : {}),
    ...(hosts ? { hosts: [...new Set(hosts)] } : {}),
    ...(p.expiresAt ? { expiresAt: new Date(p.expiresAt).toISOString() } : {}),
  };
}

/** One payment the wallet could sign: a requirement of the server, normalised. */
export interface Candidate {
  scheme: WalletScheme;
  network: Caip2;
  asset: Address;
  /** What the signature commits to (exact: the price; upto: the ceiling). */
  amount: bigint;
  payTo: Address;
  method: "eip3009" | "permit2";
}

export interface PolicyContext {
  /** Hosts of the resource (the URL requested and the URL the server declared), lower case. */
  hosts: string[];
  nowMs: number;
  /** Signed in this asset in the last 24 hours. */
  spentToday(network: Caip2, asset: Address): bigint;
}

export type Decision = { ok: true; limit: AssetLimit } | { ok: false; code: WalletErrorCode; detail: string };

export function hostAllowed(patterns: readonly string[], host: string): boolean {
  const h = host.toLowerCase();
  return patterns.some((p) => (p.startsWith("*.") ? h.endsWith(p.slice(1)) && h.length > p.length - 1 : p === h));
}

export const spendKey = (network: string, asset: string) => `${network}|${asset.toLowerCase()}`;

const refuse = (code: WalletErrorCode, detail: string): Decision => ({ ok: false, code, detail });
const expired = (policy: Policy, nowMs: number): Decision | undefined =>
  policy.expiresAt && Date.parse(policy.expiresAt) <= nowMs ? refuse("policy_expired", `the wallet's policy expired at ${policy.expiresAt}`) : undefined;

/** The network and asset rules: the asset's limits, or the first of them that refuses. */
function assetLimit(policy: Policy, network: Caip2, asset: Address): Decision {
  const networks = policy.networks ?? [...new Set(policy.assets.map((a) => a.network))];
  if (!networks.includes(network)) return refuse("network_not_allowed", `network ${network} is not allowed (allowed: ${networks.join(", ") || "none"})`);
  const limit = policy.assets.find((a) => a.network === network && a.asset.toLowerCase() === asset.toLowerCase());
  return limit ? { ok: true, limit } : refuse("asset_not_allowed", `asset ${asset} on ${network} is not in the wallet's policy`);
}

/** The gate for an asset outside a payment (a Permit2 approval): not expired, network allowed, asset listed; no scheme, recipient, host or cap applies. */
export const allowsAsset = (policy: Policy, network: Caip2, asset: Address, nowMs: number): Decision => expired(policy, nowMs) ?? assetLimit(policy, network, asset);

/** The policy's verdict on one candidate: the first rule that refuses it, or the asset's limits. */
export function evaluate(policy: Policy, c: Candidate, ctx: PolicyContext): Decision {
  const early = expired(policy, ctx.nowMs);
  if (early) return early;
  const schemes = policy.schemes ?? WALLET_SCHEMES;
  if (!schemes.includes(c.scheme)) return refuse("scheme_not_allowed", `scheme ${c.scheme} is not allowed (allowed: ${schemes.join(", ")})`);
  const asset = assetLimit(policy, c.network, c.asset);
  if (!asset.ok) return asset;
  const { limit } = asset;
  if (policy.payTo && !policy.payTo.some((p) => p.toLowerCase() === c.payTo.toLowerCase())) return refuse("payto_not_allowed", `payTo ${c.payTo} is not an allowed recipient`);
  if (policy.hosts) {
    if (ctx.hosts.length === 0) return refuse("host_not_allowed", "the payment names no resource URL, and the policy allows only listed hosts");
    const bad = ctx.hosts.find((h) => !hostAllowed(policy.hosts!, h));
    if (bad !== undefined) return refuse("host_not_allowed", `host ${bad} is not allowed (allowed: ${policy.hosts.join(", ")})`);
  }
  if (limit.maxPerPayment !== undefined && c.amount > BigInt(limit.maxPerPayment)) {
    return refuse("amount_over_cap", `${c.amount} exceeds the cap of ${limit.maxPerPayment} per payment for ${limit.symbol ?? c.asset} on ${c.network}`);
  }
  if (limit.maxPerDay !== undefined) {
    const spent = ctx.spentToday(c.network, c.asset);
    if (spent + c.amount > BigInt(limit.maxPerDay)) {
      return refuse("daily_cap_exceeded", `${c.amount} on top of ${spent} signed in the last 24 hours exceeds the daily cap of ${limit.maxPerDay} for ${limit.symbol ?? c.asset} on ${c.network}`);
    }
  }
  return { ok: true, limit };
}
