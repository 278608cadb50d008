// The credential between the router and its facilitators. A facilitator's own port would otherwise
// settle for anyone who reaches it, skipping the router's API keys, quotas and gas budgets, and
// would trust the router-only headers (FLEET_HEADERS) from whoever sends them.
//
// One file (a mounted Secret), one entry a line, `#` comments: a token (at least 32 visible
// characters), or `sha256:<64 hex>`, the digest of one (what the operator writes for facilitator
// pods, so the token itself never leaves the Secret's namespace). The router sends the first line,
// which must be a token; a facilitator accepts every line. Both re-read the file when it changes,
// and a bad edit keeps the last good list. Rotation without downtime: add the new token as a second
// line, let it reach every pod; move it first (the routers switch); drop the old line.
import { createHash, timingSafeEqual } from "node:crypto";
import { readFileSync, unwatchFile, watchFile } from "node:fs";
import type { Logger } from "./logger.ts";

/** A token's digest is published to facilitator pods (a ConfigMap): it must not be guessable. */
export const ROUTER_TOKEN_MIN_LENGTH = 32;

const TOKEN = new RegExp(`^[\\x21-\\x7e]{${ROUTER_TOKEN_MIN_LENGTH},}$`);
const DIGEST = /^sha256:([0-9a-f]{64})$/;

export interface RouterTokenEntry {
  /** The token itself, when the line holds it (the router needs it; a facilitator only its digest). */
  token?: string;
  digest: Buffer;
}

/** The entries of a router token file's text; throws on a bad line, never echoing it (it is a secret). */
export function parseRouterTokens(text: string, file = "router token file"): RouterTokenEntry[] {
  const entries: RouterTokenEntry[] = [];
  text.split(/\r?\n/).forEach((raw, i) => {
    const line = raw.trim();
    if (line === "" || line.startsWith("#")) return;
    const digest = DIGEST.exec(line)?.[1];
    if (digest) entries.push({ digest: Buffer.from(digest, "hex") });
    else if (TOKEN.test(line)) entries.push({ token: line, digest: sha256(line) });
    else throw new Error(`${file}: line ${i + 1} is neither a token of at least ${ROUTER_TOKEN_MIN_LENGTH} visible ASCII characters nor sha256:<64 hex>`);
  });
  if (entries.length === 0) throw new Error(`${file}: no token`);
  return entries;
}

/** `sha256:<hex>` lines for a token file's text: what a facilitator needs, and nothing secret. */
export function routerTokenDigests(text: string): string[] {
  return parseRouterTokens(text).map((e) => `sha256:${e.digest.toString("hex")}`);
}

export interface RouterTokens {
  /** Whether a caller presenting this token is the router (constant time, every entry compared). */
  accepts(presented: string | undefined): boolean;
  close(): void;
}

export interface RouterToken {
  /** The token the router sends now: the file's first line. */
  current(): string;
  close(): void;
}

/** A facilitator's view: every token (or digest) in the file is accepted. */
export function watchRouterTokens(path: string, logger: Logger, pollMs = 1000): RouterTokens {
  const file = watchEntries(path, logger, pollMs);
  return {
    accepts(presented) {
      if (presented === undefined) return false;
      const digest = sha256(presented);
      let ok = false;
      for (const e of file.entries()) ok = timingSafeEqual(digest, e.digest) || ok;
      return ok;
    },
    close: file.close,
  };
}

/** The router's view: the first line, which must be the token itself. */
export function watchRouterToken(path: string, logger: Logger, pollMs = 1000): RouterToken {
  const file = watchEntries(path, logger, pollMs, (entries) => {
    if (!entries[0]!.token) throw new Error(`router token file ${path}: the first line must be the token the router sends, not its sha256 digest`);
  });
  return { current: () => file.entries()[0]!.token!, close: file.close };
}

function watchEntries(path: string, logger: Logger, pollMs: number, check: (entries: RouterTokenEntry[]) => void = () => {}) {
  const read = () => {
    let text: string;
    try {
      text = readFileSync(path, "utf8");
    } catch (e) {
      throw new Error(`router token file ${path} cannot be read (${(e as NodeJS.ErrnoException).code ?? "error"})`);
    }
    const entries = parseRouterTokens(text, `router token file ${path}`);
    check(entries);
    return entries;
  };
  let entries = read(); // at start, a bad file is fatal
  const reload = () => {
    try {
      entries = read();
      logger.info({ tokens: entries.length }, "router tokens reloaded");
    } catch (e) {
      logger.error({ err: { message: (e as Error).message } }, "router tokens not reloaded; the last good list stays in force");
    }
  };
  // Polling, not inotify: a Secret volume swaps a symlink, which watch() does not follow.
  watchFile(path, { interval: pollMs, persistent: false }, reload);
  return { entries: () => entries, close: () => unwatchFile(path, reload) };
}

function sha256(text: string): Buffer {
  return createHash("sha256").update(text, "utf8").digest();
}
