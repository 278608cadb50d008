// Request parsing for the wallet API: one zod schema per body, and the PAYMENT-REQUIRED a resource
// server answered (the header value or its decoded JSON) turned into candidates the policy can judge.
import { z } from "zod";
import { getAddress, isAddress } from "viem";
import { decodePaymentRequiredHeader } from "@x402/core/http";
import type { PaymentRequired, PaymentRequirements } from "@x402/core/types";
import { CAIP2_PATTERN, networkInfo, type Caip2 } from "../x402/networks.ts";
import { WalletError } from "./errors.ts";
import type { Candidate } from "./policy.ts";
import type { Page } from "./store/rows.ts";

function issueText(error: z.ZodError, root = "body"): string {
  return error.issues
    .slice(0, 5)
    .map((i) => `${i.path.length ? i.path.join(".") : root}: ${i.message}`)
    .join("; ");
}

function parseWith<T>(schema: z.ZodType<T, z.ZodTypeDef, unknown>, input: unknown, code: "invalid_request" | "invalid_payment_required" = "invalid_request", root = "body"): T {
  const parsed = schema.safeParse(input === undefined ? {} : input);
  if (!parsed.success) throw new WalletError(code, issueText(parsed.error, root));
  return parsed.data;
}

const hasControl = (s: string) => [...s].some((ch) => ch.charCodeAt(0) < 0x20 || ch.charCodeAt(0) === 0x7f);
const text = (max: number) => z.string().min(1).max(max).refine((s) => !hasControl(s), "no control characters");

// ---- platforms and wallets

export const createPlatformBody = z.object({ name: text(64) }).strict();
export const createApiKeyBody = z.object({ label: text(128).optional() }).strict();
export const createWalletBody = z.object({ label: text(128).optional(), agentId: text(128).optional(), policy: z.unknown().optional() }).strict();

export function parseBody<T>(schema: z.ZodType<T, z.ZodTypeDef, unknown>, body: unknown): T {
  return parseWith(schema, body);
}

const pageQuery = z
  .object({
    limit: z
      .string()
      .regex(/^[1-9][0-9]{0,3}$/, "a number from 1 to 200")
      .transform(Number)
      .refine((n) => n <= 200, "at most 200")
      .optional(),
    cursor: z.string().regex(/^[1-9][0-9]{0,18}$/, "the `next` value of the previous page").optional(),
    agentId: text(128).optional(),
  })
  .strict();

export function parsePage(query: unknown): Page {
  const q = parseWith(pageQuery, query, "invalid_request", "query");
  return { limit: q.limit ?? 50, cursor: q.cursor !== undefined ? BigInt(q.cursor) : undefined, agentId: q.agentId };
}

const networkQuery = z.object({ network: z.string().regex(CAIP2_PATTERN, "an eip155 CAIP-2 id such as eip155:8453").optional() }).strict();
export function parseNetworkQuery(query: unknown): Caip2 | undefined {
  return parseWith(networkQuery, query, "invalid_request", "query").network as Caip2 | undefined;
}

// ---- pay

const requirementSchema = z
  .object({
    scheme: z.string().min(1).max(64),
    network: z.string().min(1).max(64),
    asset: z.string().min(1).max(128),
    amount: z.string().min(1).max(80),
    payTo: z.string().min(1).max(128),
    maxTimeoutSeconds: z.number().int().positive().max(31_536_000),
    extra: z.record(z.unknown()).optional(),
  })
  .passthrough();

const paymentRequiredSchema = z
  .object({
    x402Version: z.literal(2),
    error: z.string().max(4096).optional(),
    resource: z.object({ url: z.string().max(4096) }).passthrough().optional(),
    accepts: z.array(requirementSchema).min(1).max(64),
    extensions: z.record(z.unknown()).optional(),
  })
  .passthrough();

const payBody = z
  .object({
    paymentRequired: z.unknown().optional(),
    paymentRequiredHeader: z.string().min(1).max(65_536).optional(),
    /** The URL the agent requested (checked against the policy's hosts with the declared resource URL). */
    url: z.string().max(4096).optional(),
  })
  .strict()
  .refine((b) => (b.paymentRequired === undefined) !== (b.paymentRequiredHeader === undefined), "give exactly one of paymentRequired (decoded JSON) and paymentRequiredHeader (the PAYMENT-REQUIRED header value)");

export interface PayRequest {
  paymentRequired: PaymentRequired;
  url?: URL;
}

/** A v2 PaymentRequired from its decoded JSON; v1 and anything malformed are refused with a code. */
export function parsePaymentRequired(input: unknown): PaymentRequired {
  const version = (input as { x402Version?: unknown } | null)?.x402Version;
  if (version !== undefined && version !== 2) {
    throw new WalletError("unsupported_version", `x402Version ${JSON.stringify(version)} is not supported; the wallet signs x402 version 2 payments`);
  }
  return parseWith(paymentRequiredSchema, input, "invalid_payment_required", "paymentRequired") as unknown as PaymentRequired;
}

export function decodePaymentRequired(header: string): PaymentRequired {
  let decoded: unknown;
  try {
    decoded = decodePaymentRequiredHeader(header.trim());
  } catch {
    throw new WalletError("invalid_payment_required", "the PAYMENT-REQUIRED value is not base64-encoded JSON");
  }
  return parsePaymentRequired(decoded);
}

export function parseUrl(value: string, what: string): URL {
  let url: URL;
  try {
    url = new URL(value);
  } catch {
    throw new WalletError("invalid_request", `${what} is not an absolute URL`);
  }
  if (url.protocol !== "http:" && url.protocol !== "https:") throw new WalletError("invalid_request", `${what} must be http or https`);
  if (url.username || url.password) throw new WalletError("invalid_request", `${what} must not carry credentials`);
  return url;
}

export function parsePayRequest(body: unknown): PayRequest {
  const b = parseWith(payBody, body);
  const paymentRequired = b.paymentRequiredHeader !== undefined ? decodePaymentRequired(b.paymentRequiredHeader) : parsePaymentRequired(b.paymentRequired);
  return { paymentRequired, url: b.url !== undefined ? parseUrl(b.url, "url") : undefined };
}

/** Lower-case host names of a payment's resource: the URL requested and the URL the server declared. */
export function resourceHosts(paymentRequired: PaymentRequired, requested?: URL): string[] {
  const hosts = new Set<string>();
  if (requested) hosts.add(requested.hostname.toLowerCase());
  const declared = paymentRequired.resource?.url;
  if (declared) {
    try {
      hosts.add(new URL(declared).hostname.toLowerCase());
    } catch {
      hosts.add(declared.slice(0, 64)); // not a URL: a host the policy cannot allow
    }
  }
  return [...hosts];
}

export type CandidateResult = { ok: true; candidate: Candidate; requirement: PaymentRequirements } | { ok: false; detail: string };

/** One requirement as a candidate the wallet can sign, or why the wallet cannot sign it at all. */
export function toCandidate(r: PaymentRequirements): CandidateResult {
  const no = (detail: string): CandidateResult => ({ ok: false, detail: `${r.scheme}@${r.network}: ${detail}` });
  if (r.scheme !== "exact" && r.scheme !== "upto") return no(`scheme ${JSON.stringify(r.scheme)} is not supported (exact, upto)`);
  if (!CAIP2_PATTERN.test(r.network)) return no("not an eip155 network");
  if (!isAddress(r.asset, { strict: false })) return no("asset is not an address");
  if (!isAddress(r.payTo, { strict: false })) return no("payTo is not an address");
  if (!/^[1-9][0-9]{0,77}$/.test(r.amount)) return no("amount is not a positive integer of atomic units");
  const extra = (r.extra ?? {}) as Record<string, unknown>;
  let method: Candidate["method"];
  if (r.scheme === "upto") {
    if (typeof extra.facilitatorAddress !== "string" || !isAddress(extra.facilitatorAddress, { strict: false })) return no("upto needs extra.facilitatorAddress");
    method = "permit2";
  } else if (extra.assetTransferMethod === "permit2") {
    method = "permit2";
  } else if (extra.assetTransferMethod === undefined || extra.assetTransferMethod === "eip3009") {
    method = "eip3009";
    const known = networkInfo(r.network)?.assets.find((a) => a.address.toLowerCase() === r.asset.toLowerCase())?.eip712;
    if ((typeof extra.name !== "string" || typeof extra.version !== "string") && !known) return no("EIP-3009 needs the token's EIP-712 name and version in extra");
  } else {
    return no(`assetTransferMethod ${JSON.stringify(extra.assetTransferMethod)} is not supported (eip3009, permit2)`);
  }
  return {
    ok: true,
    requirement: r,
    candidate: { scheme: r.scheme, network: r.network as Caip2, asset: getAddress(r.asset), amount: BigInt(r.amount), payTo: getAddress(r.payTo), method },
  };
}

// ---- fetch on the agent's behalf

export const FETCH_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD"] as const;

const fetchBody = z
  .object({
    url: z.string().min(1).max(4096),
    method: z.enum(FETCH_METHODS).optional(),
    headers: z.record(z.string().max(8192)).optional(),
    body: z.string().max(1_048_576).optional(),
    bodyBase64: z.string().max(1_398_104).optional(),
  })
  .strict()
  .refine((b) => b.body === undefined || b.bodyBase64 === undefined, "give body or bodyBase64, not both");

/** Headers an agent may not set: the transport's own, and the payment header the wallet writes. */
const RESERVED_HEADERS = new Set(["host", "connection", "content-length", "transfer-encoding", "keep-alive", "upgrade", "te", "trailer", "proxy-authorization", "proxy-connection", "payment-signature", "x-payment"]);

export interface FetchRequest {
  url: URL;
  method: (typeof FETCH_METHODS)[number];
  headers: Record<string, string>;
  body?: Buffer;
}

export function parseFetchRequest(body: unknown): FetchRequest {
  const b = parseWith(fetchBody, body);
  const headers: Record<string, string> = {};
  for (const [name, value] of Object.entries(b.headers ?? {})) {
    const n = name.toLowerCase();
    if (!/^[!#$%&'*+.^_`|~0-9a-z-]{1,128}$/.test(n)) throw new WalletError("invalid_request", `headers: ${JSON.stringify(name.slice(0, 64))} is not a header name`);
    if (RESERVED_HEADERS.has(n)) throw new WalletError("invalid_request", `headers: ${n} is set by the wallet service, not by the caller`);
    if (hasControl(value.replace(/\t/g, ""))) throw new WalletError("invalid_request", `headers: the value of ${n} has a control character`);
    headers[n] = value;
  }
  const payload = b.bodyBase64 !== undefined ? Buffer.from(b.bodyBase64, "base64") : b.body !== undefined ? Buffer.from(b.body, "utf8") : undefined;
  const method = b.method ?? "GET";
  if (payload && (method === "GET" || method === "HEAD")) throw new WalletError("invalid_request", `a ${method} request has no body`);
  return { url: parseUrl(b.url, "url"), method, headers, body: payload };
}

// ---- Permit2 approval

export const permit2ApprovalBody = z
  .object({
    network: z.string().regex(CAIP2_PATTERN, "an eip155 CAIP-2 id such as eip155:8453"),
    asset: z.string().min(1).max(64),
    amount: z.string().regex(/^[1-9][0-9]{0,77}$/, "a positive integer of atomic units").optional(),
  })
  .strict();
