// The hub under test on both engines (embedded in a temp directory, and this machine's PostgreSQL),
// signed-write helpers that let a test change any part of a write before or after signing, and
// the exact request bodies the existing Python client produces.
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pino } from "pino";
import type { Address, Hex } from "viem";
import type { PrivateKeyAccount } from "viem/accounts";
import { AUTH_HEADERS, hubMessageHash, hubWriteTypedData, newHubNonce, type HubDomain } from "../../services/hub/auth.ts";
import { startHubService, type HubServiceOptions, type RunningHub } from "../../services/hub/service.ts";
import { openDatabase } from "../../services/platform/storage.ts";
import type { Kind } from "../../services/hub/wire.ts";

export const PG_URL = process.env.TEST_DATABASE_URL ?? "postgres://postgres@127.0.0.1:5432/test";

export type Engine = "embedded" | "postgres";
export const ENGINES: Engine[] = ["embedded", "postgres"];

export interface TestHub extends RunningHub {
  engine: Engine;
  /** Remembers an owner whose rows are deleted when the hub is stopped (PostgreSQL is shared between runs). */
  track(owner: string): void;
  stop(): Promise<void>;
}

/** Starts a hub on a free port on the given engine; `stop()` removes what the test wrote. */
export async function startTestHub(engine: Engine, opts: Omit<HubServiceOptions, "databaseUrl" | "dataDir" | "port" | "host"> = {}): Promise<TestHub & { dataDir?: string }> {
  const dataDir = engine === "embedded" ? await mkdtemp(join(tmpdir(), "x402-hub-")) : undefined;
  let hub: RunningHub;
  try {
    hub = await startHubService({
      ...opts,
      host: "127.0.0.1",
      port: 0,
      databaseUrl: engine === "postgres" ? PG_URL : undefined,
      dataDir,
      logger: opts.logger ?? pino({ level: process.env.TEST_LOG_LEVEL ?? "silent" }),
    });
  } catch (e) {
    if (dataDir) await rm(dataDir, { recursive: true, force: true });
    throw e;
  }
  const owners = new Set<string>();
  return {
    ...hub,
    engine,
    dataDir,
    track: (owner) => owners.add(owner.toLowerCase()),
    async stop() {
      await hub.close();
      if (dataDir) await rm(dataDir, { recursive: true, force: true });
      if (engine === "postgres" && owners.size) await deleteOwners([...owners]);
    },
  };
}

export async function deleteOwners(owners: string[]): Promise<void> {
  const db = await openDatabase({ url: PG_URL });
  try {
    for (const table of ["hub_versions", "hub_keys", "hub_conversations", "hub_nonces", "hub_usage"]) {
      await db.query(`DELETE FROM ${table} WHERE owner = ANY($1::text[])`, [owners]);
    }
  } finally {
    await db.close();
  }
}

export interface WriteFields {
  owner: Address;
  bucket: string;
  id: string;
  message: string;
  kind?: Kind;
}

export interface SignOptions {
  nonce?: Hex;
  expiry?: bigint;
  domain?: HubDomain;
  /** Clock in ms for the default expiry. */
  now?: number;
}

/** The X-Hub-* headers of a write signed by `account` over exactly `fields`. */
export async function signedHeaders(account: PrivateKeyAccount, domain: HubDomain, fields: WriteFields, opts: SignOptions = {}): Promise<Record<string, string>> {
  const nonce = opts.nonce ?? newHubNonce();
  const expiry = opts.expiry ?? BigInt(Math.floor((opts.now ?? Date.now()) / 1000) + 120);
  const signature = await account.signTypedData(
    hubWriteTypedData(opts.domain ?? domain, {
      operation: "upload",
      owner: fields.owner.toLowerCase() as Address,
      bucket: fields.bucket,
      id: fields.id,
      kind: fields.kind ?? "memory",
      messageHash: hubMessageHash(fields.message),
      nonce,
      expiry,
    }),
  );
  return { [AUTH_HEADERS.signature]: signature, [AUTH_HEADERS.nonce]: nonce, [AUTH_HEADERS.expiry]: expiry.toString() };
}

/**
 * Python's `json.dumps(obj)` for a flat object of strings, byte for byte: `", "` and `": "`
 * separators, non-ASCII escaped as lower-case \uXXXX (ensure_ascii).
 */
export function pythonJsonDumps(obj: Record<string, string>): string {
  const str = (s: string) => JSON.stringify(s).replace(/[\u0080-\uffff]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`);
  return `{${Object.entries(obj)
    .map(([k, v]) => `${str(k)}: ${str(v)}`)
    .join(", ")}}`;
}

export interface RawResponse {
  status: number;
  headers: Headers;
  bytes: Buffer;
  text: string;
  json: unknown;
}

/** Sends exactly `body` with exactly these headers; returns the raw bytes and, when JSON, the parsed body. */
export async function send(url: string, init: { method?: string; headers?: Record<string, string>; body?: string } = {}): Promise<RawResponse> {
  const res = await fetch(url, { method: init.method ?? (init.body !== undefined ? "POST" : "GET"), headers: init.headers, body: init.body });
  const bytes = Buffer.from(await res.arrayBuffer());
  const text = bytes.toString("utf8");
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch {
    json = undefined;
  }
  return { status: res.status, headers: res.headers, bytes, text, json };
}

export const JSON_TYPE: Record<string, string> = { "content-type": "application/json" };
export const FORM_TYPE: Record<string, string> = { "content-type": "application/x-www-form-urlencoded" };

/** The error code of a `{"error": "<code>: <detail>"}` body. */
export function errorCode(r: RawResponse): string | undefined {
  const e = (r.json as { error?: unknown } | undefined)?.error;
  return typeof e === "string" ? e.split(":")[0] : undefined;
}
