// The wallet service under test: started on a free port on the embedded engine (a temp data dir) or,
// when DATABASE_URL is set, PostgreSQL; a master key file and an admin token of its own; helpers to
// call the API and to remove what a test wrote from the shared PostgreSQL database.
import { randomBytes } from "node:crypto";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Writable } from "node:stream";
import { pino } from "pino";
import { recoverTypedDataAddress, type Address, type Hex } from "viem";
import { decodePaymentSignatureHeader } from "@x402/core/http";
import { authorizationTypes, permit2WitnessTypes, uptoPermit2WitnessTypes } from "@x402/evm";
import { PERMIT2_ADDRESS } from "../../services/x402/networks.ts";
import { openDatabase } from "../../services/platform/storage.ts";
import { startWalletsService, type RunningWallets, type WalletsServiceOptions } from "../../services/wallets/service.ts";

export const DATABASE_URL = process.env.DATABASE_URL || undefined;
export type Engine = "embedded" | "postgres";
export const ENGINES: Engine[] = DATABASE_URL ? ["embedded", "postgres"] : ["embedded"];

export const ADMIN_TOKEN = "test-admin-token-0123456789";

/** A master key line with an id unique to this run (the PostgreSQL database is shared between runs). */
export function masterKeyLine(label = "k"): { id: string; line: string; hex: string } {
  const id = `${label}-${randomBytes(6).toString("hex")}`;
  const hex = randomBytes(32).toString("hex");
  return { id, hex, line: `${id}:${hex}` };
}

export interface TestWallets extends RunningWallets {
  engine: Engine;
  dir: string;
  dataDir?: string;
  keyFile: string;
  /** Every log line the service wrote (level trace). */
  logs: () => string;
  /** Closes the service, keeps the data (restart with `restart`). */
  close(): Promise<void>;
  restart(opts?: Partial<WalletsServiceOptions>): Promise<TestWallets>;
  /** Closes and removes everything this service wrote. */
  stop(): Promise<void>;
}

interface Shared {
  dir: string;
  platforms: Set<string>;
  masterKeyIds: Set<string>;
  logText: { value: string };
}

async function start(engine: Engine, shared: Shared, keyFile: string, opts: Partial<WalletsServiceOptions>): Promise<TestWallets> {
  const dataDir = engine === "embedded" ? join(shared.dir, "db") : undefined;
  const sink = new Writable({
    write(chunk: Buffer, _enc, done) {
      shared.logText.value += chunk.toString();
      done();
    },
  });
  const running = await startWalletsService({
    host: "127.0.0.1",
    port: 0,
    databaseUrl: engine === "postgres" ? DATABASE_URL : undefined,
    dataDir,
    masterKeyFile: keyFile,
    masterKeyPollMs: 100,
    adminToken: ADMIN_TOKEN,
    logger: pino({ level: "trace" }, sink),
    ...opts,
  });
  const self: TestWallets = {
    ...running,
    engine,
    dir: shared.dir,
    dataDir,
    keyFile,
    logs: () => shared.logText.value,
    close: running.close,
    restart: (next = {}) => start(engine, shared, keyFile, { ...opts, ...next }),
    async stop() {
      await running.close();
      if (engine === "postgres") await cleanPostgres([...shared.platforms], [...shared.masterKeyIds]);
      await rm(shared.dir, { recursive: true, force: true });
    },
  };
  trackers.set(self, shared);
  return self;
}

const trackers = new WeakMap<TestWallets, Shared>();

/** Remembers a platform (and master key ids) whose rows are deleted from PostgreSQL at stop(). */
export function track(w: TestWallets, what: { platformId?: string; masterKeyIds?: string[] }): void {
  const s = trackers.get(w)!;
  if (what.platformId) s.platforms.add(what.platformId);
  for (const id of what.masterKeyIds ?? []) s.masterKeyIds.add(id);
}

export async function startTestWallets(engine: Engine, opts: Partial<WalletsServiceOptions> & { keyLines?: string[] } = {}): Promise<TestWallets & { masterKeyId: string }> {
  const dir = await mkdtemp(join(tmpdir(), "x402-wallets-"));
  const key = masterKeyLine();
  const keyFile = join(dir, "master.keys");
  await writeFile(keyFile, `${(opts.keyLines ?? [key.line]).join("\n")}\n`, { mode: 0o600 });
  const shared: Shared = { dir, platforms: new Set(), masterKeyIds: new Set([key.id]), logText: { value: "" } };
  const { keyLines: _k, ...rest } = opts;
  try {
    const w = await start(engine, shared, keyFile, rest);
    return Object.assign(w, { masterKeyId: key.id });
  } catch (e) {
    await rm(dir, { recursive: true, force: true });
    throw e;
  }
}

export async function cleanPostgres(platformIds: string[], masterKeyIds: string[]): Promise<void> {
  if (!DATABASE_URL) return;
  const db = await openDatabase({ url: DATABASE_URL });
  try {
    const wallets = "SELECT id FROM wallets WHERE platform_id = ANY($1::text[])";
    await db.query(`DELETE FROM wallet_signatures WHERE wallet_id IN (${wallets})`, [platformIds]);
    await db.query(`DELETE FROM wallet_policy_audit WHERE wallet_id IN (${wallets})`, [platformIds]);
    await db.query(`DELETE FROM wallet_keys WHERE wallet_id IN (${wallets})`, [platformIds]);
    await db.query("DELETE FROM wallets WHERE platform_id = ANY($1::text[])", [platformIds]);
    await db.query("DELETE FROM wallet_api_keys WHERE platform_id = ANY($1::text[])", [platformIds]);
    await db.query("DELETE FROM wallet_platforms WHERE id = ANY($1::text[])", [platformIds]);
    await db.query("DELETE FROM wallet_master_keys WHERE id = ANY($1::text[])", [masterKeyIds]);
  } finally {
    await db.close();
  }
}

export interface Reply<T = Record<string, unknown>> {
  status: number;
  json: T;
  headers: Headers;
}

/** Calls the API with a bearer token; the JSON body (or undefined). */
export async function call<T = Record<string, unknown>>(url: string, token: string | undefined, method: string, path: string, body?: unknown, headers: Record<string, string> = {}): Promise<Reply<T>> {
  const res = await fetch(`${url}${path}`, {
    method,
    headers: { ...(token ? { authorization: `Bearer ${token}` } : {}), ...(body !== undefined ? { "content-type": "application/json" } : {}), ...headers },
    body: body === undefined ? undefined : typeof body === "string" ? body : JSON.stringify(body),
  });
  const text = await res.text();
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch {
    json = undefined;
  }
  return { status: res.status, json: json as T, headers: res.headers };
}

/** A new agent platform and its API key, remembered for clean-up. */
export async function createPlatform(w: TestWallets, name = `p-${randomBytes(3).toString("hex")}`): Promise<{ platformId: string; apiKey: string; apiKeyId: string }> {
  const r = await call<{ platform: { id: string }; apiKey: { id: string; key: string } }>(w.url, ADMIN_TOKEN, "POST", "/v1/admin/platforms", { name });
  if (r.status !== 201) throw new Error(`platform not created: ${r.status} ${JSON.stringify(r.json)}`);
  track(w, { platformId: r.json.platform.id });
  return { platformId: r.json.platform.id, apiKey: r.json.apiKey.key, apiKeyId: r.json.apiKey.id };
}

export interface WalletView {
  id: string;
  address: `0x${string}`;
  label: string | null;
  agentId: string | null;
  policy: Record<string, unknown>;
  policyVersion: number;
}

export async function createWallet(w: { url: string }, apiKey: string, body: Record<string, unknown> = {}): Promise<WalletView> {
  const r = await call<WalletView>(w.url, apiKey, "POST", "/v1/wallets", body);
  if (r.status !== 201) throw new Error(`wallet not created: ${r.status} ${JSON.stringify(r.json)}`);
  return r.json;
}

export const errorCode = (r: Reply): string | undefined => (r.json as { error?: string } | undefined)?.error?.split(":")[0];

/** A PaymentRequired as a resource server sends it (exact, EIP-3009, Base USDC by default). */
export function paymentRequired(over: { url?: string; accepts?: Record<string, unknown>[]; amount?: string; payTo?: string } = {}) {
  return {
    x402Version: 2,
    resource: { url: over.url ?? "https://api.example.com/weather", description: "weather" },
    accepts: over.accepts ?? [
      {
        scheme: "exact",
        network: "eip155:8453",
        asset: "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913",
        amount: over.amount ?? "10000",
        payTo: over.payTo ?? "0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC",
        maxTimeoutSeconds: 60,
        extra: { name: "USD Coin", version: "2" },
      },
    ],
  };
}

export const randomHex = (bytes: number) => `0x${randomBytes(bytes).toString("hex")}`;

/** Recovers the signer of a PAYMENT-SIGNATURE value: exact (EIP-3009 or Permit2) or upto (Permit2). */
export async function signerOfPayment(header: string): Promise<Address> {
  const p = decodePaymentSignatureHeader(header) as unknown as {
    accepted: { scheme: string; asset: Address; network: string; extra?: { name?: string; version?: string } };
    payload: {
      signature: Hex;
      authorization?: { from: Address; to: Address; value: string; validAfter: string; validBefore: string; nonce: Hex };
      permit2Authorization?: { permitted: { token: Address; amount: string }; spender: Address; nonce: string; deadline: string; witness: { to: Address; validAfter: string; facilitator?: Address } };
    };
  };
  const chainId = Number(p.accepted.network.split(":")[1]);
  const a = p.payload.authorization;
  if (a) {
    return recoverTypedDataAddress({
      domain: { name: p.accepted.extra!.name!, version: p.accepted.extra!.version!, chainId, verifyingContract: p.accepted.asset },
      types: authorizationTypes,
      primaryType: "TransferWithAuthorization",
      message: { ...a, value: BigInt(a.value), validAfter: BigInt(a.validAfter), validBefore: BigInt(a.validBefore) },
      signature: p.payload.signature,
    });
  }
  const q = p.payload.permit2Authorization!;
  const upto = p.accepted.scheme === "upto";
  const message = {
    permitted: { token: q.permitted.token, amount: BigInt(q.permitted.amount) },
    spender: q.spender,
    nonce: BigInt(q.nonce),
    deadline: BigInt(q.deadline),
    witness: upto ? { to: q.witness.to, facilitator: q.witness.facilitator!, validAfter: BigInt(q.witness.validAfter) } : { to: q.witness.to, validAfter: BigInt(q.witness.validAfter) },
  };
  const typed = {
    domain: { name: "Permit2", chainId, verifyingContract: PERMIT2_ADDRESS },
    types: upto ? uptoPermit2WitnessTypes : permit2WitnessTypes,
    primaryType: "PermitWitnessTransferFrom",
    message,
    signature: p.payload.signature,
  };
  return recoverTypedDataAddress(typed as unknown as Parameters<typeof recoverTypedDataAddress>[0]);
}
