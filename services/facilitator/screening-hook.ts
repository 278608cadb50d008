// An external screening service (a sanctions or risk API run by the platform team), asked at
// /verify and /settle before any RPC call, within a time budget. A verdict answers the question it
// was asked: it is reused briefly for the identical question (network, scheme, asset, amount, payer,
// payee, step) only, unless the service vouches for a wider scope in its answer (a pair, or one
// address), so a risk rule about amounts is never answered from a verdict about a smaller payment.
// When it does not answer in time, or answers nonsense, the configured policy decides: fail closed
// (the default: the request is refused with 503 and nothing is sent; a retry may pass) or fail open
// (the payment proceeds, and the miss is counted and logged).
//
// The protocol (docs/tenants.md): POST <url> with
//   {"network", "scheme", "asset", "amount", "payer", "payee", "step": "verify" | "settle"}
// answered 200 with {"allow": true} or {"allow": false, "denied": "payer" | "payee", "reason": "…"},
// and optionally "scope": "payment" (the default) | "pair" | "address".
import { request } from "undici";
import { getAddress } from "viem";
import { safeMessage, type Logger } from "../platform/logger.ts";
import type { Metrics } from "../platform/metrics.ts";
import { PAYEE_DENIED, PAYER_DENIED, type Refusal, type ScreenedPayment } from "./screening.ts";

export interface ScreeningHookOptions {
  url: string;
  /** The whole call (connect, send, answer) must fit in this. */
  timeoutMs: number;
  /** true: a hook that cannot answer lets the payment through; false: the request is refused. */
  failOpen: boolean;
  /** How long a verdict is reused (for the identical question, or the scope the service vouched for). */
  cacheMs: number;
  /** Sent as Authorization to the hook, when set (a token the platform team gave it). */
  authorization?: string;
  network: string;
  logger: Logger;
  metrics: Metrics;
}

/** The hook could not give a verdict and the policy is to fail closed: not a verdict on the payment (503). */
export class ScreeningUnavailableError extends Error {
  override name = "ScreeningUnavailableError";
}

/**
 * What a verdict vouches for, on this network: "payment" the identical question only; "pair" any
 * payment between this payer and payee (any amount, asset, scheme, step); "address": an allow says
 * the payer and the payee are each clean for any payment, a deny says the denied address is refused
 * in that role whoever the other party is.
 */
type Scope = "payment" | "pair" | "address";
type Verdict = ({ allow: true } | { allow: false; denied: "payer" | "payee"; reason: string }) & { scope: Scope };

/** Entries at most: the oldest go first (an attacker varying amounts only makes the service asked more). */
const MAX_CACHED = 50_000;
const MAX_REASON = 200;
const MAX_ANSWER_BYTES = 16 * 1024;

function verdictOf(body: unknown): Verdict | undefined {
  const b = body as { allow?: unknown; denied?: unknown; reason?: unknown; scope?: unknown } | null;
  // Anything but a scope the protocol names is the narrowest one.
  const scope: Scope = b?.scope === "pair" || b?.scope === "address" ? b.scope : "payment";
  if (b?.allow === true) return { allow: true, scope };
  if (b?.allow !== false) return undefined;
  const denied = b.denied === "payee" ? "payee" : "payer";
  // The hook's words reach the resource server: one printable line, bounded.
  const reason = typeof b.reason === "string" ? b.reason.replace(/[^\x20-\x7e]/g, " ").slice(0, MAX_REASON).trim() : "";
  return { allow: false, denied, reason, scope };
}

/** The cache keys a payment's verdict may be found under, narrowest first. */
function keysOf(p: ScreenedPayment) {
  const payer = (p.payer ?? "").toLowerCase();
  const payee = p.payee.toLowerCase();
  return {
    payment: ["payment", p.network, p.scheme, p.asset.toLowerCase(), p.amount, payer, payee, p.step].join("|"),
    pair: ["pair", p.network, payer, payee].join("|"),
    payer: ["address", p.network, "payer", payer].join("|"),
    payee: ["address", p.network, "payee", payee].join("|"),
  };
}

export function createScreeningHook(opts: ScreeningHookOptions) {
  const cache = new Map<string, { until: number; verdict: Verdict }>();
  const cached = (key: string) => {
    const hit = cache.get(key);
    if (hit && hit.until > Date.now()) return hit.verdict;
    if (hit) cache.delete(key);
    return undefined;
  };
  const remember = (key: string, verdict: Verdict) => {
    cache.delete(key);
    while (cache.size >= MAX_CACHED) cache.delete(cache.keys().next().value!);
    cache.set(key, { until: Date.now() + opts.cacheMs, verdict });
  };

  /** A verdict this question already has: a refusal of either address, else an allow that covers it. */
  function known(payment: ScreenedPayment): Verdict | undefined {
    const keys = keysOf(payment);
    const payer = payment.payer === undefined ? undefined : cached(keys.payer);
    const payee = cached(keys.payee);
    const candidates = [cached(keys.payment), cached(keys.pair), payer, payee];
    const refusal = candidates.find((v) => v && !v.allow);
    if (refusal) return refusal;
    if (candidates[0] || candidates[1]) return candidates[0] ?? candidates[1];
    // Address allows vouch for one address each: the question is answered only when both are vouched for.
    return payer?.allow && payee?.allow ? payer : undefined;
  }

  /** Stores a verdict under the key of what it vouches for. */
  function rememberFor(payment: ScreenedPayment, verdict: Verdict) {
    if (opts.cacheMs <= 0) return;
    const keys = keysOf(payment);
    // Without a payer a wider scope would name no one: the identical question only.
    if (verdict.scope === "payment" || payment.payer === undefined) return remember(keys.payment, verdict);
    if (verdict.scope === "pair") return remember(keys.pair, verdict);
    if (!verdict.allow) return remember(verdict.denied === "payer" ? keys.payer : keys.payee, verdict);
    remember(keys.payer, verdict);
    remember(keys.payee, verdict);
  }

  const count = (result: string) => opts.metrics.screeningChecks.inc({ network: opts.network, source: "hook", result });

  async function ask(payment: ScreenedPayment): Promise<Verdict> {
    const res = await request(opts.url, {
      method: "POST",
      headers: { "content-type": "application/json", ...(opts.authorization ? { authorization: opts.authorization } : {}) },
      body: JSON.stringify(payment),
      signal: AbortSignal.timeout(opts.timeoutMs),
      maxRedirections: 0,
    } as Parameters<typeof request>[1]);
    // A body cut short (destroyed below, or by the service) must never surface as an uncaught
    // stream error: that would take the facilitator down.
    res.body.on("error", () => undefined);
    if (res.statusCode !== 200) {
      await res.body.dump().catch(() => undefined);
      throw new Error(`the screening service answered HTTP ${res.statusCode}`);
    }
    // A verdict is a few bytes: a service answering more is broken, and is not read into memory.
    let text = "";
    for await (const chunk of res.body) {
      text += chunk;
      if (text.length > MAX_ANSWER_BYTES) {
        res.body.destroy();
        throw new Error(`the screening service answered more than ${MAX_ANSWER_BYTES} bytes`);
      }
    }
    const verdict = verdictOf(JSON.parse(text));
    if (!verdict) throw new Error("the screening service answered without a verdict (allow: true or false)");
    return verdict;
  }

  return {
    async check(payment: ScreenedPayment): Promise<Refusal | undefined> {
      let verdict = known(payment);
      if (!verdict) {
        try {
          verdict = await ask(payment);
        } catch (e) {
          // Never the URL in logs (it may carry a token); the error's type and a short line.
          const why = (e as Error).name === "TimeoutError" || (e as Error).name === "AbortError" ? `no answer within ${opts.timeoutMs} ms` : safeMessage(e);
          opts.logger.warn({ failOpen: opts.failOpen, why }, "screening service unavailable");
          count(opts.failOpen ? "unavailable_open" : "unavailable_closed");
          if (opts.failOpen) return undefined;
          throw new ScreeningUnavailableError(`the screening service gave no verdict (${why}); retry later`);
        }
        rememberFor(payment, verdict);
      }
      count(verdict.allow ? "allowed" : "denied");
      if (verdict.allow) return undefined;
      const who = verdict.denied === "payer" ? payment.payer : payment.payee;
      const address = who && /^0x[0-9a-fA-F]{40}$/.test(who) ? getAddress(who) : who;
      return {
        reason: verdict.denied === "payer" ? PAYER_DENIED : PAYEE_DENIED,
        message: `the ${verdict.denied} ${address} was refused by the screening service${verdict.reason ? `: ${verdict.reason}` : ""}`,
      };
    },
  };
}

export type ScreeningHook = ReturnType<typeof createScreeningHook>;
