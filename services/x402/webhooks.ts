// The settlement webhook contract (docs/facilitator-interface.md, "Webhooks"): what a facilitator
// POSTs on every state change of a settlement after it was submitted, how it is signed, and the
// receiver's side of it, `verifyWebhook`, for resource servers to use as is. Pure: node:crypto only.
//
// A delivery carries three headers:
//   x402-webhook-id:        the event's id (the same on every retry of that event)
//   x402-webhook-timestamp: unix seconds when this attempt was signed
//   x402-webhook-signature: v1=<hex HMAC-SHA256(key, timestamp + "." + raw body)>
// A receiver refuses a timestamp more than 5 minutes away from its clock (a replay of a captured
// delivery), compares signatures in constant time, and remembers the ids it accepted for that long.
import { createHmac, timingSafeEqual } from "node:crypto";

export const WEBHOOK_HEADERS = {
  id: "x402-webhook-id",
  timestamp: "x402-webhook-timestamp",
  signature: "x402-webhook-signature",
} as const;

/** How far a delivery's timestamp may be from the receiver's clock, either way. */
export const WEBHOOK_TOLERANCE_SECONDS = 300;

/** A settlement's lifecycle state changes, named as the status API names the states they enter. */
export const SETTLEMENT_EVENT_TYPES = ["submitted", "confirmed", "failed", "reorged"] as const;
export type SettlementEventType = (typeof SETTLEMENT_EVENT_TYPES)[number];

/** The body of a delivery (JSON). Absent fields are unknown for that payment. */
export interface SettlementEvent {
  /** Unique per event; a retry of the same event carries the same id. */
  id: string;
  type: SettlementEventType;
  /** 1, 2, 3… per payment, in the order of its state changes: order a payment's events by it. */
  sequence: number;
  /** The status of x402 PR #3325 the state maps to: pending (submitted, reorged), settled (confirmed), failed. */
  status: "pending" | "settled" | "failed";
  network: string;
  /** The facilitator's id of the payment (the status API finds it by this too). */
  paymentId: string;
  scheme: string;
  payer?: string;
  payTo?: string;
  token?: string;
  /** Atomic units, decimal (upto: what was settled, once confirmed). */
  amount?: string;
  /** submitted, reorged: the latest transaction sent; confirmed, failed: the answer's transaction. */
  transaction?: string;
  errorReason?: string;
  errorMessage?: string;
  /** The API key id it was settled under, when the router requires keys. */
  tenant?: string;
  /** ISO 8601, UTC: when the state changed (not when this attempt was sent). */
  occurredAt: string;
}

/** The label a tenant's webhook key is derived under (see tenantWebhookKey). */
const TENANT_KEY_LABEL = "x402-fleet webhook key:";

/**
 * The key a tenant's events are signed with: hex HMAC-SHA256(fleet secret, label + API key id).
 * The router's admin API shows it to the tenant's admin; the facilitators derive the same one.
 */
export function tenantWebhookKey(fleetSecret: string, apiKeyId: string): string {
  return createHmac("sha256", fleetSecret).update(TENANT_KEY_LABEL + apiKeyId).digest("hex");
}

/** The signature header's value for one attempt. A key is a string; its UTF-8 bytes are the HMAC key. */
export function signWebhook(key: string, timestamp: number, body: string): string {
  return `v1=${createHmac("sha256", key).update(`${timestamp}.${body}`).digest("hex")}`;
}

/** The three headers of one delivery attempt of `body`, signed now. */
export function webhookHeaders(key: string, id: string, body: string, nowMs = Date.now()): Record<string, string> {
  const timestamp = Math.floor(nowMs / 1000);
  return { [WEBHOOK_HEADERS.id]: id, [WEBHOOK_HEADERS.timestamp]: String(timestamp), [WEBHOOK_HEADERS.signature]: signWebhook(key, timestamp, body) };
}

/**
 * The ids of events a receiver handled, remembered for the tolerance window (a replayed delivery
 * older than that is refused for its timestamp): memory holds at most the window's deliveries. An
 * id is remembered only once its event is handled (verifyWebhook's `handled()`): a delivery whose
 * handling failed is retried by the sender and must not be refused as a replay.
 */
export function createReplayGuard(toleranceSeconds = WEBHOOK_TOLERANCE_SECONDS) {
  const seen = new Map<string, number>();
  const expire = (nowSeconds: number) => {
    for (const [old, until] of seen) {
      if (until > nowSeconds) break; // insertion order is expiry order
      seen.delete(old);
    }
  };
  return {
    /** Whether the event was handled before (a replay). */
    has(id: string, nowSeconds: number): boolean {
      expire(nowSeconds);
      return seen.has(id);
    },
    /** Remembers a handled event: a later delivery of it is a replay. */
    remember(id: string, nowSeconds: number): void {
      expire(nowSeconds);
      seen.delete(id);
      seen.set(id, nowSeconds + 2 * toleranceSeconds); // a timestamp may be up to the tolerance ahead, too
    },
  };
}
export type ReplayGuard = ReturnType<typeof createReplayGuard>;

export type WebhookHeaderSource = Headers | Record<string, string | string[] | undefined>;

export type WebhookVerification =
  /** `handled()`: call once the event is handled, so a later delivery of it is refused as a replay. */
  | { ok: true; event: SettlementEvent; handled(): void }
  | { ok: false; reason: "missing_headers" | "stale_timestamp" | "bad_signature" | "replayed" | "invalid_body" };

export interface VerifyWebhookInput {
  /** The raw body exactly as received (bytes or text): never a re-serialised object. */
  body: string | Uint8Array;
  headers: WebhookHeaderSource;
  /** The key (or keys, while one is being replaced) the sender signs with. */
  secret: string | readonly string[];
  /** Milliseconds since the epoch; the receiver's clock by default. */
  now?: number;
  toleranceSeconds?: number;
  /** Remembers accepted ids: without it, replays inside the window are not detected. */
  replay?: ReplayGuard;
}

const header = (headers: WebhookHeaderSource, name: string): string | undefined => {
  if (typeof (headers as Headers).get === "function") return (headers as Headers).get(name) ?? undefined;
  const v = (headers as Record<string, string | string[] | undefined>)[name];
  return Array.isArray(v) ? v[0] : v;
};

/**
 * Checks one delivery: signed with the key over this very body and timestamp, the timestamp within
 * the tolerance, the id not accepted before. A replay of an event already handled (`replayed`) is
 * best answered 2xx without handling it again: the sender retries what it believes lost.
 */
export function verifyWebhook(input: VerifyWebhookInput): WebhookVerification {
  const id = header(input.headers, WEBHOOK_HEADERS.id);
  const timestamp = header(input.headers, WEBHOOK_HEADERS.timestamp);
  const signatures = header(input.headers, WEBHOOK_HEADERS.signature);
  if (!id || !timestamp || !signatures || !/^\d{1,12}$/.test(timestamp)) return { ok: false, reason: "missing_headers" };
  const nowSeconds = Math.floor((input.now ?? Date.now()) / 1000);
  if (Math.abs(nowSeconds - Number(timestamp)) > (input.toleranceSeconds ?? WEBHOOK_TOLERANCE_SECONDS)) return { ok: false, reason: "stale_timestamp" };
  const body = typeof input.body === "string" ? input.body : Buffer.from(input.body).toString("utf8");
  const keys = typeof input.secret === "string" ? [input.secret] : input.secret;
  // An empty key would accept what anyone signs with it: a receiver missing its key is misconfigured, loudly.
  if (keys.length === 0 || keys.some((k) => typeof k !== "string" || k.length === 0)) throw new TypeError("verifyWebhook: an empty webhook key verifies nothing; configure the key you were given");
  // Only well-formed signatures are compared (a header's bytes arrive as Latin-1: a non-ASCII one must not reach the comparison).
  const presented = signatures.split(/[\s,]+/).filter((s) => /^v1=[0-9a-f]{64}$/.test(s));
  const matches = keys.some((key) => {
    const expected = Buffer.from(signWebhook(key, Number(timestamp), body), "ascii");
    return presented.some((s) => timingSafeEqual(Buffer.from(s, "ascii"), expected));
  });
  if (!matches) return { ok: false, reason: "bad_signature" };
  let event: SettlementEvent;
  try {
    event = JSON.parse(body) as SettlementEvent;
  } catch {
    return { ok: false, reason: "invalid_body" };
  }
  // The signed headers name the event the body is: a body of another event under this id is refused.
  if (event?.id !== id) return { ok: false, reason: "invalid_body" };
  if (input.replay?.has(id, nowSeconds)) return { ok: false, reason: "replayed" };
  return { ok: true, event, handled: () => input.replay?.remember(id, nowSeconds) };
}

/**
 * Why a webhook URL is refused, or undefined: https only, http only where private networks are
 * allowed (an in-cluster receiver); no credentials in the authority. Where it may connect is the
 * egress guard's to decide, at each connection (platform/egress.ts).
 */
export function webhookUrlProblem(url: string, opts: { allowPrivateNetworks: boolean }): string | undefined {
  if (url.length > 2048) return "longer than 2048 characters";
  // It travels in a header between the router and the facilitators: printable ASCII only (percent-encode the rest).
  if (!/^[\x21-\x7e]+$/.test(url)) return "has spaces, control or non-ASCII characters (percent-encode them)";
  let parsed: URL;
  try {
    parsed = new URL(url);
  } catch {
    return "not a URL";
  }
  if (parsed.protocol !== "https:" && !(parsed.protocol === "http:" && opts.allowPrivateNetworks)) return opts.allowPrivateNetworks ? "not an http(s) URL" : "not an https URL";
  if (parsed.username || parsed.password) return "carries credentials before its host (put a token in the path or query)";
  return undefined;
}

/** What of a webhook URL may be logged: its origin (a path or query may carry a token). */
export const webhookOrigin = (url: string): string => {
  try {
    return new URL(url).origin;
  } catch {
    return "(invalid URL)";
  }
};
