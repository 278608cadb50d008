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
import { keccak256, type Address } from "viem";
import type { PaymentPayload, PaymentRequirements } from "@x402/core/types";
import type { Logger } from "../platform/logger.ts";
import { reasonLabel, type Metrics } from "../platform/metrics.ts";
import { networkInfo } from "../x402/networks.ts";
import type { ChainAccess } from "./chain.ts";
import { WalletError, type WalletErrorCode } from "./errors.ts";
import type { KeyringSource } from "./keyring.ts";
import { DAY_MS, evaluate, spendKey, type Candidate, type Decision } from "./policy.ts";
import { signPayment } from "./signer.ts";
import type { SignatureRecord, WalletStore } from "./store.ts";
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
    deps.logger.warn({ network: c.network, reason: (e as Error).message.split("\n")[0] }, "wallets: balance check skipped (RPC failed)");
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

export async function payFor(deps: PaymentsDeps, caller: Caller, walletId: string, req: PayRequest): Promise<PayResult> {
  const wallet = await deps.store.wallet(caller.platformId, walletId);
  if (!wallet) throw new WalletError("not_found", `no wallet ${walletId}`);
  const { paymentRequired } = req;
  const hosts = resourceHosts(paymentRequired, req.url);

  const verdicts: Verdict[] = [];
  const options: { candidate: Candidate; requirement: PaymentRequirements }[] = [];
  for (const r of paymentRequired.accepts) {
    const c = toCandidate(r);
    if (c.ok) options.push(c);
    else verdicts.push({ label: labelOf(r), code: "unsupported_requirement", detail: c.detail });
  }

  try {
    // Static rules first, then on-chain prerequisites of the first candidate that passes them.
    const excluded = new Set<Candidate>();
    const noneSpent = () => 0n;
    for (const o of options) {
      const d = evaluate(wallet.policy, o.candidate, { hosts, nowMs: deps.now(), spentToday: noneSpent });
      if (!d.ok) continue;
      const unmet = await chainCheck(deps, wallet.address, o.candidate);
      if (!unmet) break;
      excluded.add(o.candidate);
      verdicts.push({ label: labelOf(o.requirement), ...unmet });
    }

    const result = await deps.store.withLockedWallet(caller.platformId, walletId, async (tx, locked) => {
      const nowMs = deps.now();
      const spent = await deps.store.spentSince(tx, walletId, new Date(nowMs - DAY_MS));
      const ctx = { hosts, nowMs, spentToday: (n: string, a: string) => spent.get(spendKey(n, a)) ?? 0n };
      let chosen: { candidate: Candidate; requirement: PaymentRequirements } | undefined;
      for (const o of options) {
        if (excluded.has(o.candidate)) continue;
        const d: Decision = evaluate(locked.policy, o.candidate, ctx);
        if (d.ok) {
          chosen = o;
          break;
        }
        verdicts.push({ label: labelOf(o.requirement), code: d.code, detail: d.detail });
      }
      if (!chosen) {
        if (verdicts.length === 0) throw new WalletError("unsupported_requirement", "the PaymentRequired lists no requirement");
        throw refusal(verdicts);
      }
      const keys = await unlockWallet(deps.keyring, locked);
      const signed = await signPayment({
        address: locked.address,
        candidate: chosen.candidate,
        requirement: chosen.requirement,
        paymentRequired,
        maxAuthorizationSeconds: deps.maxAuthorizationSeconds,
        sign: keys.signDigest,
      });
      const record: SignatureRecord = {
        id: `sig_${randomBytes(12).toString("hex")}`,
        walletId,
        apiKeyId: caller.apiKeyId,
        kind: "payment",
        scheme: chosen.candidate.scheme,
        network: chosen.candidate.network,
        asset: chosen.candidate.asset,
        amount: chosen.candidate.amount.toString(),
        payTo: chosen.candidate.payTo,
        method: chosen.candidate.method,
        resource: paymentRequired.resource?.url ?? req.url?.toString() ?? null,
        nonce: signed.nonce,
        validBefore: signed.validBefore,
        signatureHash: keccak256(signed.signature),
        createdAt: new Date(nowMs).toISOString(),
        outcome: null,
      };
      await deps.store.recordSignature(tx, record);
      return { signed, record, chosen, address: locked.address };
    });
    if (!result) throw new WalletError("not_found", `no wallet ${walletId}`);
    count(deps, result.chosen.candidate, "signed", "none");
    return {
      walletId,
      address: result.address,
      paymentSignature: result.signed.header,
      paymentPayload: result.signed.paymentPayload,
      accepted: result.chosen.requirement,
      record: result.record,
    };
  } catch (e) {
    if (e instanceof WalletError) count(deps, paymentRequired.accepts[0], "refused", e.code);
    throw e;
  }
}
