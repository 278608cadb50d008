// The router's side of the discovery catalog: records the bazaar declarations of settled payments
// for their declarer (once per distinct declaration and declarer per minute and replica, so a busy
// resource costs the database little), tells the resource server the outcome in
// EXTENSION-RESPONSES, and answers /v2/discovery/* from a short per-query cache in front of the
// shared store.
//
// A declaration recorded with the answer is unproven (catalog.ts). After it, off the answer's path,
// the router asks the resource itself whether it takes the payee that was paid
// (discovery/verification.ts); when it does, the resource's own answer is recorded as proven. At
// most one such check per (URL, option, tenant) a minute per replica and 16 at once: the next
// payment retries a skipped one.
import { createHash } from "node:crypto";
import type { PaymentPayload, PaymentRequirements } from "@x402/core/types";
import { MAX_PAGE, type Catalog, type CatalogOutcome, type Declarer, type ListParams } from "../discovery/catalog.ts";
import type { ResourceVerifier } from "../discovery/verification.ts";
import type { HandlerResult } from "../platform/http.ts";
import type { Logger } from "../platform/logger.ts";
import type { Metrics } from "../platform/metrics.ts";
import { RequestError } from "../x402/errors.ts";

const RECORD_EVERY_MS = 60_000;
const VERIFY_EVERY_MS = 60_000;
const MAX_VERIFYING = 16;
const ANSWER_CACHE_MS = 1_000;
const MAX_CACHED = 2_000;
const MAX_OFFSET = 1_000_000;
const FILTERS = ["type", "payTo", "scheme", "network", "extensions"] as const;

export interface RouterDiscovery {
  /** After a settle that sent its transaction: the EXTENSION-RESPONSES header, when the payment declared bazaar. */
  afterSettlement(body: unknown, declarer: Declarer): Promise<Record<string, string> | undefined>;
  resources(query: Record<string, unknown>): Promise<HandlerResult>;
  search(query: Record<string, unknown>): Promise<HandlerResult>;
  /** Stops starting checks and waits for those in flight (before the database closes). */
  close(): Promise<void>;
}

/** Whether a request body declares the bazaar extension (cheap: no parsing beyond what is there). */
export function declaresBazaar(body: unknown): boolean {
  const ext = (body as { paymentPayload?: { extensions?: Record<string, unknown> } } | undefined)?.paymentPayload?.extensions;
  return !!ext && typeof ext === "object" && "bazaar" in ext;
}

function text(query: Record<string, unknown>, name: string, max = 200): string | undefined {
  const v = query[name];
  if (v === undefined) return undefined;
  if (typeof v !== "string" || v.length === 0 || v.length > max) throw new RequestError("invalid_request", `${name} must be a string of 1 to ${max} characters`);
  return v;
}

function integer(query: Record<string, unknown>, name: string, min: number, max: number): number | undefined {
  const v = query[name];
  if (v === undefined) return undefined;
  if (typeof v !== "string" || !/^\d{1,7}$/.test(v) || Number(v) < min || Number(v) > max) throw new RequestError("invalid_request", `${name} must be an integer from ${min} to ${max}`);
  return Number(v);
}

/** The filters given, in FILTERS order (the answer cache's key depends on it). */
function filtersOf(query: Record<string, unknown>): ListParams {
  return Object.fromEntries(FILTERS.map((f) => [f, text(query, f)]).filter(([, v]) => v !== undefined));
}

export function createRouterDiscovery(catalog: Catalog, logger: Logger, opts: { verifier?: ResourceVerifier; metrics?: Metrics } = {}): RouterDiscovery {
  const recorded = new Map<string, { at: number; outcome: CatalogOutcome }>();
  const answers = new Map<string, { at: number; body: unknown }>();
  const checkedAt = new Map<string, number>();
  const checking = new Set<Promise<void>>();
  let closed = false;
  const count = (result: string) => opts.metrics?.discoveryVerifications.inc({ result });

  /** Asks the resource whether it takes the payee that was paid; if so, records its own answer as proven. Never throws, never awaited by a payment. */
  function prove(paymentPayload: PaymentPayload, paid: PaymentRequirements, declarer: Declarer) {
    const url = (paymentPayload.resource as { url?: unknown } | undefined)?.url;
    if (!opts.verifier || typeof url !== "string") return;
    const key = JSON.stringify([url, paid.scheme, paid.network, paid.asset.toLowerCase(), paid.payTo.toLowerCase(), declarer.tenant ?? ""]);
    const last = checkedAt.get(key);
    if (closed || (last !== undefined && Date.now() - last < VERIFY_EVERY_MS) || checking.size >= MAX_VERIFYING) return count("skipped");
    if (checkedAt.size >= MAX_CACHED) checkedAt.clear();
    checkedAt.set(key, Date.now());
    const check = (async () => {
      const proof = await opts.verifier!.verify(url, paid);
      if (!proof.verified) return count(proof.reason);
      const { paymentRequired, accepted } = proof;
      // What is stored is the resource's answer, under the URL that was fetched: the declarer's echo plays no part.
      const own = { x402Version: paymentRequired.x402Version, resource: { ...paymentRequired.resource, url }, accepted, payload: {}, extensions: paymentRequired.extensions } as PaymentPayload;
      const outcome = await catalog.record(own, accepted, declarer, { verified: true });
      count(outcome?.status === "success" ? "verified" : "rejected");
    })()
      .catch((e: unknown) => {
        count("error");
        logger.warn({ err: { name: (e as Error).name } }, "bazaar declaration not proven");
      })
      .finally(() => checking.delete(check));
    checking.add(check);
  }

  async function cached(key: string, fn: () => Promise<unknown>): Promise<HandlerResult> {
    const hit = answers.get(key);
    if (hit && Date.now() - hit.at < ANSWER_CACHE_MS) return { status: 200, body: hit.body };
    let body;
    try {
      body = await fn();
    } catch (e) {
      logger.warn({ err: { name: (e as Error).name } }, "discovery catalog unavailable");
      throw new RequestError("backend_unavailable", "the discovery catalog cannot be read right now; try again");
    }
    if (answers.size >= MAX_CACHED) answers.clear();
    answers.set(key, { at: Date.now(), body });
    return { status: 200, body };
  }

  return {
    async afterSettlement(body, declarer) {
      const { paymentPayload, paymentRequirements } = body as { paymentPayload: PaymentPayload; paymentRequirements: PaymentRequirements };
      const key = createHash("sha256")
        .update(JSON.stringify([declarer.tenant ?? "", paymentPayload.resource, paymentPayload.extensions?.bazaar, paymentRequirements.scheme, paymentRequirements.network, paymentRequirements.asset, paymentRequirements.payTo, paymentRequirements.amount]))
        .digest("base64url");
      const hit = recorded.get(key);
      let outcome = hit && Date.now() - hit.at < RECORD_EVERY_MS ? hit.outcome : undefined;
      if (!outcome) {
        try {
          outcome = await catalog.record(paymentPayload, paymentRequirements, declarer);
          if (!outcome) return undefined;
          if (recorded.size >= MAX_CACHED) recorded.clear();
          recorded.set(key, { at: Date.now(), outcome });
        } catch (e) {
          // Cataloguing is a side effect of a payment: it never fails the payment's answer (and a failure is not remembered).
          logger.warn({ err: { name: (e as Error).name } }, "bazaar declaration not recorded");
          outcome = { status: "rejected", rejectedReason: "the catalog could not be written; the next payment retries" };
        }
      }
      prove(paymentPayload, paymentRequirements, declarer);
      return { "extension-responses": Buffer.from(JSON.stringify({ bazaar: outcome })).toString("base64") };
    },

    resources(query) {
      const params = { ...filtersOf(query), limit: integer(query, "limit", 1, MAX_PAGE), offset: integer(query, "offset", 0, MAX_OFFSET) };
      return cached(`r${JSON.stringify(params)}`, () => catalog.list(params));
    },

    search(query) {
      const q = text(query, "query");
      if (q === undefined) throw new RequestError("invalid_request", "query is required (the words to search for)");
      const params = { ...filtersOf(query), query: q, limit: integer(query, "limit", 1, MAX_PAGE), cursor: text(query, "cursor", 100) };
      return cached(`s${JSON.stringify(params)}`, () => catalog.search(params));
    },

    async close() {
      closed = true;
      await opts.verifier?.close();
      await Promise.allSettled([...checking]);
    },
  };
}
