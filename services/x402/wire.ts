// Wire schemas for the facilitator API and the normaliser that turns both accepted request
// shapes (the service contract's and standard x402 v2) into one internal form, once, at the edge.
import { z } from "zod";
import type { PaymentPayload, PaymentRequirements } from "@x402/core/types";
import { RequestError } from "./errors.ts";
import { CAIP2_PATTERN } from "./networks.ts";

export const SCHEMES = ["exact", "upto", "batch-settlement"] as const;
export type Scheme = (typeof SCHEMES)[number];

const MAX_UINT256 = (1n << 256n) - 1n;

export const hexAddress = z.string().regex(/^0x[0-9a-fA-F]{40}$/, "expected a 0x-prefixed 20-byte hex address");
export const hexBytes = z.string().regex(/^0x(?:[0-9a-fA-F]{2})*$/, "expected 0x-prefixed hex bytes");
export const bytes32 = z.string().regex(/^0x[0-9a-fA-F]{64}$/, "expected 0x-prefixed 32-byte hex");
const UINT_PATTERN = /^(0|[1-9][0-9]*)$/;
export const uintString = z
  .string()
  .regex(UINT_PATTERN, "expected a non-negative decimal integer string")
  .refine((s) => !UINT_PATTERN.test(s) || (s.length <= 78 && BigInt(s) <= MAX_UINT256), "exceeds uint256");
const network = z.string().regex(CAIP2_PATTERN, "expected a CAIP-2 eip155 network such as eip155:8453");
const scheme = z.string().min(1).max(64);

const requirementsSchema = z.object({
  scheme,
  network,
  asset: hexAddress,
  payTo: hexAddress,
  amount: uintString.optional(),
  maxAmountRequired: uintString.optional(),
  // 0 occurs: the reference batch-settlement server sends it on claim and sweep requests.
  maxTimeoutSeconds: z.number().int().min(0).max(31_536_000),
  extra: z.record(z.unknown()).optional(),
  resource: z.string().max(4096).optional(),
  description: z.string().max(4096).optional(),
  mimeType: z.string().max(256).optional(),
});
type RawRequirements = z.infer<typeof requirementsSchema>;

const resourceInfo = z.object({ url: z.string().max(4096), description: z.string().max(4096).optional(), mimeType: z.string().max(256).optional() });

const payloadSchema = z.object({
  x402Version: z.number().int(),
  scheme: scheme.optional(),
  network: network.optional(),
  accepted: requirementsSchema.optional(),
  payload: z.record(z.unknown()),
  resource: z.union([resourceInfo, z.string().max(4096)]).optional(),
  extensions: z.record(z.unknown()).optional(),
});

/** The one internal form everything downstream of the edge sees. */
export interface FacilitatorRequest {
  x402Version: 2;
  paymentPayload: PaymentPayload;
  paymentRequirements: PaymentRequirements;
}

function describeIssue(prefix: string, issue: z.ZodIssue): string {
  const path = [prefix, ...issue.path].filter((p) => p !== "").join(".");
  if (issue.code === "invalid_type" && issue.received === "undefined") return `${path} is required`;
  return `${path}: ${issue.message}`;
}

/** The value `schema` parses, or a RequestError naming the first issue's path under `prefix`. */
export function parseOrThrow<T>(schema: z.ZodType<T>, value: unknown, prefix: string, code: "invalid_request" | "invalid_payload" = "invalid_request"): T {
  const result = schema.safeParse(value);
  if (!result.success) throw new RequestError(code, describeIssue(prefix, result.error.issues[0]!));
  return result.data;
}

function amountOf(req: RawRequirements, where: string): string {
  if (req.amount !== undefined && req.maxAmountRequired !== undefined && req.amount !== req.maxAmountRequired) {
    throw new RequestError("amount_mismatch", `${where}.amount (${req.amount}) and ${where}.maxAmountRequired (${req.maxAmountRequired}) differ`);
  }
  const amount = req.amount ?? req.maxAmountRequired;
  if (amount === undefined) throw new RequestError("invalid_request", `${where}.amount (or maxAmountRequired) is required`);
  return amount;
}

function toRequirements(req: RawRequirements, where: string): PaymentRequirements {
  return {
    scheme: req.scheme,
    network: req.network as PaymentRequirements["network"],
    asset: req.asset,
    amount: amountOf(req, where),
    payTo: req.payTo,
    maxTimeoutSeconds: req.maxTimeoutSeconds,
    extra: req.extra ?? {},
  };
}

export const isObject = (v: unknown): v is Record<string, unknown> => typeof v === "object" && v !== null && !Array.isArray(v);

/** The envelope checks both the router and the facilitator make: objects present, version 2 inside the payload. */
function checkEnvelope(body: unknown): { rawPayload: Record<string, unknown>; rawRequirements: Record<string, unknown> } {
  if (!isObject(body)) throw new RequestError("invalid_request", "body must be a JSON object with paymentPayload and paymentRequirements");
  const rawPayload = body.paymentPayload;
  if (!isObject(rawPayload)) throw new RequestError("invalid_request", "paymentPayload is required and must be an object");
  const rawRequirements = body.paymentRequirements;
  if (!isObject(rawRequirements)) throw new RequestError("invalid_request", "paymentRequirements is required and must be an object");
  const version = rawPayload.x402Version;
  if (version === undefined) {
    const hint = body.x402Version !== undefined ? " (a top-level x402Version is not read: put it inside paymentPayload)" : "";
    throw new RequestError("unsupported_version", `paymentPayload.x402Version is missing${hint}`);
  }
  if (version !== 2) {
    throw new RequestError("unsupported_version", `paymentPayload.x402Version ${JSON.stringify(version)} is not served; this facilitator speaks x402 version 2`);
  }
  return { rawPayload, rawRequirements };
}

const routeSchema = z.object({ scheme, network });

/**
 * What the router needs to dispatch: the envelope checks and the (scheme, network) pair. The
 * facilitator that receives the request normalises and validates the rest, with the same errors.
 */
export function routeOf(body: unknown, byHand = true): { scheme: string; network: string } {
  const { rawRequirements } = checkEnvelope(body);
  const { scheme, network } = rawRequirements;
  // routeSchema's rules by hand (its parse costs more than the rest of routing); zod words the errors.
  // (`byHand` false: the schema alone, for tests.)
  if (byHand && typeof scheme === "string" && scheme.length >= 1 && scheme.length <= 64 && typeof network === "string" && CAIP2_PATTERN.test(network)) return { scheme, network };
  return parseOrThrow(routeSchema, { scheme, network }, "paymentRequirements");
}

// The schemas' rules by hand, for the verify and settle path: zod's parse costs more CPU than the
// rest of a verification's JavaScript. A value these accept, its schema accepts (test/wire.test.ts
// checks it on mutations of every field); anything else goes to the schema, which words the
// error as before. They only read: the request is built from the fields, as from zod's output.
export const isHexAddress = (v: unknown): v is string => typeof v === "string" && /^0x[0-9a-fA-F]{40}$/.test(v);
const isText = (v: unknown, max: number, min = 0): v is string => typeof v === "string" && v.length >= min && v.length <= max;
export const isUint = (v: unknown): v is string => typeof v === "string" && UINT_PATTERN.test(v) && (v.length < 78 || (v.length === 78 && BigInt(v) <= MAX_UINT256));
const optional = (v: unknown, check: (v: unknown) => boolean) => v === undefined || check(v);
/** A z.record: a plain object (zod's copy would drop an own "__proto__" key: such a value goes to the schema). */
const isRecord = (v: unknown): v is Record<string, unknown> => isObject(v) && !Object.hasOwn(v, "__proto__");
const isNetwork = (v: unknown) => typeof v === "string" && CAIP2_PATTERN.test(v);

/** `requirementsSchema`'s rules. */
export function wellFormedRequirements(r: unknown): r is RawRequirements {
  if (!isObject(r)) return false;
  const t = r.maxTimeoutSeconds;
  return (
    isText(r.scheme, 64, 1) &&
    isNetwork(r.network) &&
    isHexAddress(r.asset) &&
    isHexAddress(r.payTo) &&
    optional(r.amount, isUint) &&
    optional(r.maxAmountRequired, isUint) &&
    typeof t === "number" && Number.isInteger(t) && t >= 0 && t <= 31_536_000 &&
    optional(r.extra, isRecord) &&
    optional(r.resource, (v) => isText(v, 4096)) &&
    optional(r.description, (v) => isText(v, 4096)) &&
    optional(r.mimeType, (v) => isText(v, 256))
  );
}

/** `payloadSchema`'s rules. */
export function wellFormedPayload(p: unknown): p is RawPayload {
  if (!isObject(p)) return false;
  const resource = p.resource;
  return (
    typeof p.x402Version === "number" && Number.isInteger(p.x402Version) &&
    optional(p.scheme, (v) => isText(v, 64, 1)) &&
    optional(p.network, isNetwork) &&
    optional(p.accepted, wellFormedRequirements) &&
    isRecord(p.payload) &&
    optional(resource, (v) => isText(v, 4096) || (isObject(v) && isText(v.url, 4096) && optional(v.description, (d) => isText(d, 4096)) && optional(v.mimeType, (m) => isText(m, 256)))) &&
    optional(p.extensions, isRecord)
  );
}
type RawPayload = z.infer<typeof payloadSchema>;

/** The resource as zod's output has it: its known fields only. */
function resourceOf(resource: RawPayload["resource"]): RawPayload["resource"] {
  if (typeof resource !== "object") return resource;
  const { url, description, mimeType } = resource;
  return { url, ...(description !== undefined && { description }), ...(mimeType !== undefined && { mimeType }) };
}

/**
 * Validates a /verify or /settle body and returns the internal form.
 * Throws RequestError (HTTP 400) for anything malformed. (`byHand` false: the schemas alone, for tests.)
 */
export function normalizeRequest(body: unknown, byHand = true): FacilitatorRequest {
  const { rawPayload, rawRequirements } = checkEnvelope(body);
  const payload = byHand && wellFormedPayload(rawPayload) ? { ...rawPayload, resource: resourceOf(rawPayload.resource) } : parseOrThrow(payloadSchema, rawPayload, "paymentPayload");
  const requirements = toRequirements(byHand && wellFormedRequirements(rawRequirements) ? rawRequirements : parseOrThrow(requirementsSchema, rawRequirements, "paymentRequirements"), "paymentRequirements");

  let accepted: PaymentRequirements;
  if (payload.accepted) {
    accepted = toRequirements(payload.accepted, "paymentPayload.accepted");
  } else if (payload.scheme !== undefined && payload.network !== undefined) {
    // Service shape: the payload names only scheme and network; the rest is what was required.
    accepted = { ...requirements, scheme: payload.scheme, network: payload.network as PaymentRequirements["network"] };
  } else {
    throw new RequestError("invalid_request", "paymentPayload needs either accepted (x402 v2) or scheme and network");
  }

  const resourceUrl = typeof payload.resource === "string" ? payload.resource : payload.resource?.url;
  const resource = payload.resource && typeof payload.resource === "object"
    ? payload.resource
    : resourceUrl !== undefined || typeof rawRequirements.resource === "string"
      ? { url: resourceUrl ?? (rawRequirements.resource as string) }
      : undefined;

  return {
    x402Version: 2,
    paymentPayload: {
      x402Version: 2,
      accepted,
      payload: payload.payload,
      ...(resource && { resource }),
      ...(payload.extensions && { extensions: payload.extensions }),
    },
    paymentRequirements: requirements,
  };
}

export function pairKey(scheme: string, network: string): string {
  return `${scheme}@${network}`;
}
