// An operator's bearer token for a service's admin API (from a file: a mounted Secret). Only its
// SHA-256 is kept in memory and compared in constant time.
import { createHash, timingSafeEqual } from "node:crypto";
import { readFileSync } from "node:fs";

export interface AdminToken {
  matches(token: string): boolean;
}

export function adminTokenFrom(secret: string, service: string): AdminToken {
  const expected = createHash("sha256").update(secret, "utf8").digest();
  if (secret.length < 16) throw new Error(`${service}: the admin token must be at least 16 characters`);
  return { matches: (token) => timingSafeEqual(createHash("sha256").update(token, "utf8").digest(), expected) };
}

export function readAdminTokenFile(path: string, service: string): AdminToken {
  let text: string;
  try {
    text = readFileSync(path, "utf8");
  } catch (e) {
    throw new Error(`${service}: admin token file ${path} cannot be read (${(e as NodeJS.ErrnoException).code ?? "error"})`);
  }
  return adminTokenFrom(text.trim(), service);
}

/** The token of `Authorization: Bearer <token>`, if that is what was sent. */
export function bearerOf(authorization: string | undefined): string | undefined {
  return /^Bearer\s+(\S+)$/i.exec(authorization ?? "")?.[1];
}
