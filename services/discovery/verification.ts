// Proof that a resource takes a declarer's payee: the router asks the resource itself. A settled
// payment proves only who paid whom; anyone can pay a service's payTo (or its own address) and
// declare the service's URL. The resource's own 402 answer is the one thing a declarer cannot
// forge for a URL it does not run, so before a declaration may own an entry, change its text or
// price an option, the router GETs the URL and reads its PAYMENT-REQUIRED header (x402 v2): the
// declaration is proven when an accept there names the scheme, network, asset and payee that were
// paid, and what the catalog then stores is that answer, not the declarer's echo.
//
// Outbound like the wallet service's fetcher: through the SSRF guard (platform/egress.ts: no
// loopback, private, link-local, metadata or cluster-internal destination, checked on the resolved
// addresses), no redirects followed (a 3xx is not a 402), bounded in time; the body is never read
// and the header is bounded by the HTTP client's header limit. Only hosts the operator lists in
// `hosts` (tests, a devnet) are fetched at another origin, past the guard; none by default.
import { decodePaymentRequiredHeader } from "@x402/core/http";
import type { PaymentRequired, PaymentRequirements } from "@x402/core/types";
import { isValidIconUrl } from "@x402/extensions/bazaar";
import { createEgress, DestinationNotAllowed, type Egress } from "../platform/egress.ts";

export interface VerificationOptions {
  /** Bound on one fetch, headers and connection included (default 5 s). */
  timeoutMs?: number;
  /**
   * Resource hosts fetched at another origin, past the SSRF guard: `host[:port]` → origin, e.g.
   * `{"api.example.com": "http://127.0.0.1:4100"}` (tests, a devnet). Read at each fetch.
   */
  hosts?: Record<string, string>;
}

export type VerificationFailure = "not_allowed" | "unreachable" | "not_402" | "no_payment_required" | "not_listed";

export type Verification = { verified: true; paymentRequired: PaymentRequired; accepted: PaymentRequirements } | { verified: false; reason: VerificationFailure };

export interface ResourceVerifier {
  /** Whether the resource at `url` answers 402 listing `paid` (scheme, network, asset, payTo). Never throws. */
  verify(url: string, paid: PaymentRequirements): Promise<Verification>;
  /** Aborts fetches in flight and closes connections. */
  close(): Promise<void>;
}

export const DEFAULT_VERIFICATION_TIMEOUT_MS = 5_000;

const failed = (reason: VerificationFailure): Verification => ({ verified: false, reason });
const sameAddress = (a: unknown, b: string) => typeof a === "string" && a.toLowerCase() === b.toLowerCase();

export function createResourceVerifier(opts: VerificationOptions = {}): ResourceVerifier {
  const timeoutMs = opts.timeoutMs ?? DEFAULT_VERIFICATION_TIMEOUT_MS;
  const guarded = createEgress({ allowPrivateNetworks: false, headersTimeoutMs: timeoutMs, bodyTimeoutMs: timeoutMs });
  let listed: Egress | undefined; // for the operator's listed hosts only, made when first needed
  const closing = new AbortController();

  return {
    async verify(url, paid) {
      // The catalog's own rule for resource URLs: no IP literal, no loopback name, no credentials.
      if (!isValidIconUrl(url)) return failed("not_allowed");
      const target = new URL(url);
      const origin = opts.hosts?.[target.host];
      const egress = origin ? (listed ??= createEgress({ allowPrivateNetworks: true, headersTimeoutMs: timeoutMs, bodyTimeoutMs: timeoutMs })) : guarded;
      let res: Response;
      try {
        res = await egress.fetch(origin ? new URL(`${target.pathname}${target.search}`, origin) : target, { method: "GET", signal: AbortSignal.any([AbortSignal.timeout(timeoutMs), closing.signal]) });
      } catch (e) {
        return failed(e instanceof DestinationNotAllowed ? "not_allowed" : "unreachable");
      }
      void res.body?.cancel().catch(() => undefined); // only the header matters
      if (res.status !== 402) return failed("not_402");
      const header = res.headers.get("payment-required");
      let paymentRequired: PaymentRequired;
      try {
        paymentRequired = decodePaymentRequiredHeader(header ?? "");
      } catch {
        return failed("no_payment_required");
      }
      if (paymentRequired?.x402Version !== 2 || !Array.isArray(paymentRequired.accepts)) return failed("no_payment_required");
      const accepted = paymentRequired.accepts.find((a) => a && a.scheme === paid.scheme && a.network === paid.network && sameAddress(a.asset, paid.asset) && sameAddress(a.payTo, paid.payTo));
      return accepted ? { verified: true, paymentRequired, accepted } : failed("not_listed");
    },

    async close() {
      closing.abort();
      await Promise.all([guarded.close(), listed?.close()]);
    },
  };
}
