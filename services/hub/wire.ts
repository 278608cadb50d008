// Wire parsing of the hub's endpoints exactly as the existing clients call them: fields come from
// the query string, a JSON body or a form body (merged), field names are case-insensitive (one
// client sends `Owner`, `ID`, `Message`), and every endpoint turns them into one typed request.
import { z } from "zod";
import type { Address } from "viem";
import { HubError } from "./errors.ts";

export const KINDS = ["memory", "knowledgebase"] as const;
export type Kind = (typeof KINDS)[number];

export const MAX_ID_LENGTH = 512;
export const MAX_BUCKET_LENGTH = 256;
/** Page size when `length` is not given, and the largest page served (larger requests are clamped). */
export const DEFAULT_PAGE_LENGTH = 1024;
export const MAX_PAGE_LENGTH = 1024;

/** A form or query field given more than once with different values: ambiguous, refused. */
export class RepeatedField {
  constructor(readonly values: string[]) {}
}

/**
 * Decodes application/x-www-form-urlencoded text (form bodies and query strings alike). A name
 * repeated with the same value counts once; repeated with different values it is ambiguous.
 */
export function parseForm(text: string): Record<string, string | RepeatedField> {
  const out: Record<string, string | RepeatedField> = Object.create(null);
  for (const [name, value] of new URLSearchParams(text)) {
    const prev = out[name];
    if (prev === undefined) out[name] = value;
    else if (prev instanceof RepeatedField) prev.values.push(value);
    else if (prev !== value) out[name] = new RepeatedField([prev, value]);
  }
  return out;
}

const sameValue = (a: unknown, b: unknown) => a === b || (typeof a === "object" && typeof b === "object" && JSON.stringify(a) === JSON.stringify(b));

/**
 * Merges the fields of the query string and the body under lower-cased names. A field that appears
 * twice (in two spellings, or in both query and body) must carry the same value.
 */
export function collectFields(query: unknown, body: unknown): Record<string, unknown> {
  const fields = new Map<string, { name: string; value: unknown }>();
  for (const [where, source] of [
    ["query string", query],
    ["body", body],
  ] as const) {
    if (source === undefined) continue;
    if (source === null || typeof source !== "object" || Array.isArray(source)) {
      throw new HubError("invalid_request", `the ${where} must be a JSON object or form fields`);
    }
    for (const [name, value] of Object.entries(source)) {
      const key = name.toLowerCase();
      if (value instanceof RepeatedField) throw new HubError("invalid_request", `field ${key} is given more than once with different values`);
      const prev = fields.get(key);
      if (!prev) fields.set(key, { name, value });
      else if (!sameValue(prev.value, value)) {
        throw new HubError("invalid_request", `field ${key} is given twice with different values (as "${prev.name}" and "${name}")`);
      }
    }
  }
  const out: Record<string, unknown> = Object.create(null);
  for (const [key, { value }] of fields) out[key] = value;
  return out;
}

// eslint-disable-next-line no-control-regex -- matching control characters is the point
const CONTROL = /[\u0000-\u001f\u007f]/;
const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

/** True when the string has an exact UTF-8 form (no lone surrogates), so stored bytes round-trip. */
export const isWellFormed = (s: string) => !LONE_SURROGATE.test(s);

const name = (max: number) =>
  z
    .string({ invalid_type_error: "expected a string" })
    .min(1, "must not be empty")
    .max(max, `must be at most ${max} characters`)
    .refine((s) => !CONTROL.test(s), "must not contain control characters")
    .refine(isWellFormed, "must be well-formed text (no lone UTF-16 surrogates)");

const ownerSchema = z
  .string({ invalid_type_error: "expected a string" })
  .regex(/^0x[0-9a-fA-F]{40}$/, "expected the owner's 0x-prefixed 20-byte hex wallet address")
  .transform((s) => s.toLowerCase() as Address);
const idSchema = name(MAX_ID_LENGTH);
const bucketSchema = name(MAX_BUCKET_LENGTH);
const messageSchema = z.string({ invalid_type_error: "expected a string (clients serialise documents to a string)" }).refine(isWellFormed, "must be well-formed text (no lone UTF-16 surrogates)");
const kindSchema = z.preprocess(
  (v) => (typeof v === "string" ? v.toLowerCase() : v),
  z.enum(KINDS, { errorMap: () => ({ message: `expected one of ${KINDS.join(", ")}` }) }),
);
const count = (max: number) =>
  z.union([z.number().int().nonnegative().max(max), z.string().regex(/^\d{1,9}$/, "expected a non-negative integer").transform(Number)], {
    errorMap: () => ({ message: "expected a non-negative integer" }),
  });
const offsetSchema = count(1_000_000_000).default(0);
const lengthSchema = count(1_000_000_000)
  .default(DEFAULT_PAGE_LENGTH)
  .transform((n) => Math.min(n, MAX_PAGE_LENGTH));
const versionSchema = count(2_147_483_647).refine((n) => n >= 1, "versions start at 1");

/** Empty strings stand for "not given" in optional fields (form clients send `bucket=`). */
const optional = <T extends z.ZodTypeAny>(schema: T) => z.preprocess((v) => (v === "" || v === null ? undefined : v), schema.optional());

function describeIssue(issue: z.ZodIssue): string {
  const path = issue.path.join(".");
  if (issue.code === "invalid_type" && issue.received === "undefined") return `field ${path} is required`;
  return `field ${path}: ${issue.message}`;
}

function parse<T>(schema: z.ZodType<T, z.ZodTypeDef, unknown>, value: unknown): T {
  const result = schema.safeParse(value);
  if (!result.success) throw new HubError("invalid_request", describeIssue(result.error.issues[0]!));
  return result.data;
}

/** `id`, or its alias `name` (download and conversation); both given must agree. */
function idOrName(fields: Record<string, unknown>): unknown {
  const { id, name } = fields;
  if (id !== undefined && name !== undefined && !sameValue(id, name)) {
    throw new HubError("invalid_request", "fields id and name (its alias) are both given with different values");
  }
  return id ?? name;
}

const uploadSchema = z.object({
  owner: ownerSchema,
  id: idSchema,
  message: messageSchema,
  bucket: optional(bucketSchema),
  kind: optional(kindSchema),
});
/** An upload with its defaults applied: the kind is memory, the bucket derived (deriveBucket). */
export type UploadRequest = Required<z.output<typeof uploadSchema>>;

/**
 * The bucket of a write that names none, as the original derives it: the message's `name` field
 * when the message is a JSON object with a usable one, else the owner (lower-cased).
 */
export function deriveBucket(owner: string, message: string): string {
  try {
    const doc: unknown = JSON.parse(message);
    if (doc && typeof doc === "object" && !Array.isArray(doc)) {
      const candidate = (doc as { name?: unknown }).name;
      if (bucketSchema.safeParse(candidate).success) return candidate as string;
    }
  } catch {
    // not JSON: the owner's default bucket
  }
  return owner.toLowerCase();
}

export function parseUpload(fields: Record<string, unknown>): UploadRequest {
  const r = parse(uploadSchema, fields);
  return { owner: r.owner, id: r.id, message: r.message, kind: r.kind ?? "memory", bucket: r.bucket ?? deriveBucket(r.owner, r.message) };
}

const downloadSchema = z.object({
  owner: ownerSchema,
  id: idSchema,
  /** Our extension: a specific version from the key's history; the latest when absent. */
  version: optional(versionSchema),
});
export type DownloadRequest = z.output<typeof downloadSchema>;

export function parseDownload(fields: Record<string, unknown>): DownloadRequest {
  return parse(downloadSchema, { ...fields, id: idOrName(fields) });
}

const conversationSchema = z.object({
  owner: ownerSchema,
  /** Absent: list the owner's conversation ids. Present: the messages of conversation `id`. */
  id: optional(idSchema),
  bucket: optional(bucketSchema),
  offset: offsetSchema,
  length: lengthSchema,
});
export type ConversationRequest = z.output<typeof conversationSchema>;

export function parseConversation(fields: Record<string, unknown>): ConversationRequest {
  return parse(conversationSchema, { ...fields, id: idOrName(fields) });
}

const historySchema = z.object({ owner: ownerSchema, id: idSchema, offset: offsetSchema, length: lengthSchema });
export type HistoryRequest = z.output<typeof historySchema>;

export function parseHistory(fields: Record<string, unknown>): HistoryRequest {
  return parse(historySchema, { ...fields, id: idOrName(fields) });
}

/** Conversation records are `<conversationId>_<n>`: the part before the last `_`, when n is decimal digits. */
export function conversationOf(id: string): { conversationId: string; index: string } | undefined {
  const m = /^(.+)_(\d+)$/s.exec(id);
  return m ? { conversationId: m[1]!, index: m[2]! } : undefined;
}
