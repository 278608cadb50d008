// Credentials: API keys of agent platforms (shown once at creation, stored as SHA-256 digests,
// compared in constant time) and the operator's admin token (read from a file, a mounted Secret).
//
//   x402w_<key id: 16 hex>_<secret: 32 random bytes, base64url>
//
// The key id is public (it names the key in listings and audit records); the secret has 256 bits
// of entropy, so a fast digest is enough: nothing to brute-force.
import { createHash, randomBytes, timingSafeEqual } from "node:crypto";
import { WalletError } from "./errors.ts";

const TOKEN_PATTERN = /^x402w_([0-9a-f]{16})_([A-Za-z0-9_-]{43})$/;

export interface NewApiKey {
  id: string;
  /** The whole credential: returned once, never stored. */
  token: string;
  /** What is stored: hex SHA-256 of the token. */
  digest: string;
}

export function digestOf(token: string): string {
  return createHash("sha256").update(token, "utf8").digest("hex");
}

export function newApiKey(): NewApiKey {
  const id = randomBytes(8).toString("hex");
  const token = `x402w_${id}_${randomBytes(32).toString("base64url")}`;
  return { id, token, digest: digestOf(token) };
}

/** The key id of a well-formed token; undefined for anything else. */
export function apiKeyIdOf(token: string): string | undefined {
  return TOKEN_PATTERN.exec(token)?.[1];
}

/** Constant-time comparison of a presented token with a stored digest. */
export function matchesDigest(token: string, storedDigest: string): boolean {
  const a = Buffer.from(digestOf(token), "hex");
  const b = Buffer.from(/^[0-9a-f]{64}$/.test(storedDigest) ? storedDigest : "00".repeat(32), "hex");
  return timingSafeEqual(a, b) && storedDigest.length === 64;
}

/** The bearer token of a request: `Authorization: Bearer <token>` or `X-Api-Key: <token>`. */
export function bearerToken(headers: Record<string, string | string[] | undefined>): string | undefined {
  const auth = headers.authorization;
  if (typeof auth === "string") {
    const m = /^Bearer\s+(\S+)\s*$/i.exec(auth);
    return m?.[1];
  }
  const key = headers["x-api-key"];
  return typeof key === "string" ? key.trim() : undefined;
}

export const UNAUTHORIZED_HEADERS = { "www-authenticate": 'Bearer realm="x402-fleet wallets"' };

export function unauthorized(detail: string): WalletError {
  return new WalletError("unauthorized", detail, UNAUTHORIZED_HEADERS);
}

/** The operator's token: compared by digest, in constant time. */
export type { AdminToken } from "../platform/admin-token.ts";
