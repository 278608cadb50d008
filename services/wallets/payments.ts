// The pay flow: from a resource server's PaymentRequired to a signed v2 PaymentPayload and its
// PAYMENT-SIGNATURE header value, within the wallet's policy.
//
//   1. every requirement the wallet can sign (exact/upto on eip155) becomes a candidate;
//   2. the policy judges each (static rules); the first one that passes is checked on chain when an
//      RPC is configured (token balance, Permit2 allowance) — advisory: an RPC failure does not block;
//   3. in one transaction holding the wallet's row lock: the policy is judged again with the amounts
//      signed in the last 24 hours (daily caps hold under concurrency), the first candidate that
//      passes is signed, and the signature is recorded. A refusal rolls back: nothing signed, nothing recorded.
import { randomBytes } from "node:crypto";
import { keccak256, type Address, type Hex } from "viem";
import type { PaymentPayload, PaymentRequirements } from "@x402/core/types";
import { safeMessage, type Logger } from "../platform/logger.ts";
import type { Queryable } from "../platform/storage.ts";
import { reasonLabel, type Metrics } from "../platform/metrics.ts";
import { networkInfo } from "../x402/networks.ts";
import type { ChainAccess } from "./chain.ts";
import { WalletError, type WalletErrorCode } from "./errors.ts";
import type { KeyringSource } from "./keyring.ts";
import { owned, ownedWallet } from "./owned.ts";
import { DAY_MS, evaluate, spendKey, type Candidate } from "./policy.ts";
import { signPayment } from "./signer.ts";
import type { LockedWallet, SignatureOutcome, SignatureRecord, Wallet, WalletStore } from "./store.ts";
import { unlockWallet } from "./unlock.ts";
import { resourceHosts, toCandidate, type PayRequest } from "./wire.ts";

export interface Caller {
  platformId: string;
  apiKeyId: string;
}

export interface PaymentsDeps {
  store: WalletStore;
  keyring: KeyringSource;
  chain?: ChainAccess;
  metrics?: Metrics;
  logger: Logger;
  /** Clock in ms. */
  now: () => number;
  /** Upper bound of an authorisation's validity (validBefore / deadline), whatever the server asks. */
  maxAuthorizationSeconds: number;
}

export interface PayResult {
  walletId: string;
  address: Address;
  /** The PAYMENT-SIGNATURE header value: base64 of paymentPayload. */
  paymentSignature: string;
  paymentPayload: PaymentPayload;
  accepted: PaymentRequirements;
  record: SignatureRecord;
}

/** How far down the rules a refusal got: the most specific one is reported. */
const SPECIFICITY: Partial<Record<WalletErrorCode, number>> = {
  unsupported_requirement: 0,
  scheme_not_allowed: 1,
  network_not_allowed: 2,
  asset_not_allowed: 3,
  payto_not_allowed: 4,
  host_not_allowed: 5,
  amount_over_cap: 6,
  daily_cap_exceeded: 7,
  insufficient_funds: 8,
  permit2_allowance_required: 8,
  policy_expired: 9,
};

interface Verdict {
  label: string;
  code: WalletErrorCode;
  detail: string;
}

const labelOf = (r: PaymentRequirements) => `${r.scheme}@${r.network}`;

function refusal(verdicts: Verdict[]): WalletError {
  const best = [...verdicts].sort((a, b) => (SPECIFICITY[b.code] ?? 0) - (SPECIFICITY[a.code] ?? 0))[0]!;
  if (verdicts.length === 1) return new WalletError(best.code, best.detail);
  const others = verdicts.filter((v) => v !== best).map((v) => `${v.label}: ${v.code}`);
  return new WalletError(best.code, `${best.label}: ${best.detail} (other requirements: ${others.join("; ")})`);
}

/** On-chain prerequisites of one candidate; undefined when met or when they cannot be read. */
async function chainCheck(deps: PaymentsDeps, address: Address, c: Candidate): Promise<{ code: WalletErrorCode; detail: string } | undefined> {
  if (!deps.chain?.has(c.network)) return undefined;
  try {
    const [balance, allowance] = await Promise.all([
      deps.chain.tokenBalance(c.network, c.asset, address),
      c.method === "permit2" ? deps.chain.permit2Allowance(c.network, c.asset, address) : Promise.resolve(undefined),
    ]);
    if (balance < c.amount) return { code: "insufficient_funds", detail: `the wallet holds ${balance} of ${c.asset} on ${c.network}; the payment needs ${c.amount}` };
    if (allowance !== undefined && allowance < c.amount) {
      return {
        code: "permit2_allowance_required",
        detail: `the wallet's Permit2 allowance for ${c.asset} on ${c.network} is ${allowance}; the payment needs ${c.amount}: POST /v1/wallets/{id}/permit2-approval first`,
      };
    }
    return undefined;
  } catch (e) {
    deps.logger.warn({ network: c.network, reason: safeMessage(e) }, "wallets: balance check skipped (RPC failed)");
    return undefined;
  }
}

function count(deps: PaymentsDeps, c: { network: string; scheme: string } | undefined, result: "signed" | "refused", reason: string) {
  deps.metrics?.walletPayments.inc({
    network: c && networkInfo(c.network) ? c.network : "other",
    scheme: c && (c.scheme === "exact" || c.scheme === "upto") ? c.scheme : "other",
    result,
    reason: reasonLabel(reason),
  });
}

type Option = { candidate: Candidate; requirement: PaymentRequirements };

/** What one pay call judges: the resource's hosts, and every refusal so far (the most specific is reported). */
interface Attempt {
  req: PayRequest;
  hosts: string[];
  verdicts: Verdict[];
}

/** A signature for the log under a new id: the signature itself is kept only as its hash. */
export function signatureRecord(
  caller: Caller,
  walletId: string,
  what: Omit<SignatureRecord, "id" | "walletId" | "apiKeyId" | "signatureHash" | "createdAt" | "outcome">,
  signature: Hex,
  atMs: number,
  outcome: SignatureOutcome | null = null,
): SignatureRecord {
  return { id: `sig_${randomBytes(12).toString("hex")}`, walletId, apiKeyId: caller.apiKeyId, ...what, signatureHash: keccak256(signature), createdAt: new Date(atMs).toISOString(), outcome };
}

/** Step 1: the requirements the wallet can sign; a verdict for each it cannot. */
function candidates(a: Attempt): Option[] {
  const options: Option[] = [];
  for (const r of a.req.paymentRequired.accepts) {
    const c = toCandidate(r);
    if (c.ok) options.push(c);
    else a.verdicts.push({ label: labelOf(r), code: "unsupported_requirement", detail: c.detail });
  }
  return options;
}

/** Step 2: static rules, then the on-chain prerequisites of the first candidate that passes them; the candidates the chain does not rule out. */
async function precheck(deps: PaymentsDeps, wallet: Wallet, a: Attempt, options: Option[]): Promise<Option[]> {
  const excluded = new Set<Option>();
  for (const o of options) {
    if (!evaluate(wallet.policy, o.candidate, { hosts: a.hosts, nowMs: deps.now(), spentToday: () => 0n }).ok) continue;
    const unmet = await chainCheck(deps, wallet.address, o.candidate);
    if (!unmet) break;
    excluded.add(o);
    a.verdicts.push({ label: labelOf(o.requirement), ...unmet });
  }
  return options.filter((o) => !excluded.has(o));
}

/** Step 3, holding the wallet's row lock: the policy with the last 24 hours' spend; the first candidate it allows is signed and recorded. */
async function signUnderLock(deps: PaymentsDeps, caller: Caller, a: Attempt, options: Option[], tx: Queryable, locked: LockedWallet) {
  const nowMs = deps.now();
  const spent = await deps.store.spentSince(tx, locked.id, new Date(nowMs - DAY_MS));
  const ctx = { hosts: a.hosts, nowMs, spentToday: (n: string, asset: string) => spent.get(spendKey(n, asset)) ?? 0n };
  const chosen = options.find((o) => {
    const d = evaluate(locked.policy, o.candidate, ctx);
    if (!d.ok) a.verdicts.push({ label: labelOf(o.requirement), code: d.code, detail: d.detail });
    return d.ok;
  });
  if (!chosen) throw a.verdicts.length === 0 ? new WalletError("unsupported_requirement", "the PaymentRequired lists no requirement") : refusal(a.verdicts);
  const { paymentRequired } = a.req;
  const keys = await unlockWallet(deps.keyring, locked);
  const { candidate: c, requirement } = chosen;
  const signed = await signPayment({ address: locked.address, candidate: c, requirement, paymentRequired, maxAuthorizationSeconds: deps.maxAuthorizationSeconds, sign: keys.signDigest });
  const resource = paymentRequired.resource?.url ?? a.req.url?.toString() ?? null;
  const what = { kind: "payment", scheme: c.scheme, network: c.network, asset: c.asset, amount: c.amount.toString(), payTo: c.payTo, method: c.method, resource, nonce: signed.nonce, validBefore: signed.validBefore } as const;
  const record = signatureRecord(caller, locked.id, what, signed.signature, nowMs);
  await deps.store.recordSignature(tx, record);
  return { signed, record, chosen, address: locked.address };
}

export async function payFor(deps: PaymentsDeps, caller: Caller, walletId: string, req: PayRequest): Promise<PayResult> {
  const wallet = await ownedWallet(deps.store, caller, walletId);
  const attempt: Attempt = { req, hosts: resourceHosts(req.paymentRequired, req.url), verdicts: [] };
  const options = candidates(attempt);
  try {
    const eligible = await precheck(deps, wallet, attempt, options);
    const result = await owned(
      deps.store.withLockedWallet(caller.platformId, walletId, (tx, locked) => signUnderLock(deps, caller, attempt, eligible, tx, locked)),
      walletId,
    );
    count(deps, result.chosen.candidate, "signed", "none");
    return { walletId, address: result.address, paymentSignature: result.signed.header, paymentPayload: result.signed.paymentPayload, accepted: result.chosen.requirement, record: result.record };
  } catch (e) {
    if (e instanceof WalletError) count(deps, req.paymentRequired.accepts[0], "refused", e.code);
    throw e;
  }
}
