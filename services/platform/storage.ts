// The one SQL layer of the project: an embedded PostgreSQL (PGlite, persisted under a data
// directory) by default, a real PostgreSQL server when DATABASE_URL is set. Same SQL, same
// versioned migrations, either way.
import { execFile } from "node:child_process";
import { existsSync, mkdirSync } from "node:fs";
import { join } from "node:path";
import { openEngineOnWorker, TRANSACTION_ABORTED } from "./embedded-engine.ts";

export interface Queryable {
  query<T = Record<string, unknown>>(sql: string, params?: unknown[]): Promise<T[]>;
}

export interface Database extends Queryable {
  readonly kind: "embedded" | "postgres";
  /** Runs fn in one transaction; rolls back if it throws. */
  transaction<T>(fn: (tx: Queryable) => Promise<T>): Promise<T>;
  close(): Promise<void>;
}

export interface Migration {
  /** Unique and ordered within its component, e.g. "settlement/001_outbox". */
  id: string;
  sql: string;
}

export interface OpenDatabaseOptions {
  /** postgres://… to use a server; otherwise the embedded engine. */
  url?: string;
  /** Where the embedded engine keeps its files; omit for an in-memory database. */
  dataDir?: string;
  migrations?: Migration[];
}

// A settlement store's working set is small: 16 MB of buffers instead of PostgreSQL's 128 MB (the
// files stay in the OS page cache either way), about 140 MB less resident memory per process.
// Every execution planned with its values: the embedded engine has no autovacuum, so no statistics,
// and a prepared statement's generic plan chose without them (measured in a burst: a reservation's
// sum of a payer's payments in flight took 100 ms a call on its generic plan, 5-7 ms planned afresh).
const EMBEDDED_SETTINGS = ["-c", "shared_buffers=16MB", "-c", "plan_cache_mode=force_custom_plan"];

async function initialiseInChild(dataDir: string, startParams: string[]): Promise<void> {
  const script = `import { PGlite } from ${JSON.stringify(import.meta.resolve("@electric-sql/pglite"))};
const db = await PGlite.create({ dataDir: process.env.X402_INIT_DIR, startParams: JSON.parse(process.env.X402_INIT_PARAMS) });
await db.close();`;
  // Only what it needs: the service's environment may hold RPC URLs with keys and tokens.
  const env = { PATH: process.env.PATH ?? "", X402_INIT_DIR: dataDir, X402_INIT_PARAMS: JSON.stringify(startParams) };
  await new Promise<void>((resolve, reject) =>
    execFile(process.execPath, ["--input-type=module", "-e", script], { env, timeout: 120_000 }, (e, _out, stderr) =>
      e ? reject(new Error(`the embedded database in ${dataDir} could not be initialised: ${String(stderr).trim().split("\n").pop() || e.message}`)) : resolve(),
    ),
  );
}

/** The embedded store's data directory is held by another process (a pod still terminating beside its replacement). */
export class StoreLockedError extends Error {
  override name = "StoreLockedError";
  readonly code = "ELOCKED";
}

// A lock held by a process that died (SIGKILL, a node lost) is taken over once its holder stopped
// refreshing it for this long.
const STORE_LOCK_STALE_MS = 10_000;

/**
 * The data directory for this process alone, until `release`: PGlite opens one directory from two
 * processes without complaint (each its own PostgreSQL over the same files), which is what a
 * replacement pod beside a terminating one on the same volume would do, two signers on one store.
 * A lock directory inside it (`.x402-fleet.lock`: the data directory may be a volume's root, whose
 * parent is a read-only root filesystem), refreshed every second while held. It assumes a local
 * filesystem seen by one node (a ReadWriteOnce volume): times are the holder's, judged by the waiter.
 */
async function lockDataDir(dataDir: string): Promise<() => Promise<void>> {
  const lockfile = await import("proper-lockfile");
  let released = false;
  try {
    const release = await lockfile.lock(dataDir, {
      stale: STORE_LOCK_STALE_MS,
      // refreshed every second: a holder must stall for about 9 s before a waiter may take it over
      update: 1000,
      realpath: false,
      lockfilePath: join(dataDir, ".x402-fleet.lock"),
      // Lost while held (its refresh failed, or another process took it as stale): nothing may write any more.
      onCompromised: (e) => {
        if (released) return; // a refresh that was in flight when the store closed
        process.stderr.write(`x402-fleet: the lock of the embedded store ${dataDir} was lost (${e.message}); exiting so that no two processes write it\n`);
        process.exit(70);
      },
    });
    return () => {
      released = true;
      return release();
    };
  } catch (e) {
    if ((e as { code?: string }).code === "ELOCKED") throw new StoreLockedError(`the embedded store ${dataDir} is held by another process`);
    throw e;
  }
}

async function openEmbedded(dataDir?: string): Promise<Database> {
  const { PGlite } = await import("@electric-sql/pglite");
  const startParams = [...(PGlite as unknown as { defaultStartParams: string[] }).defaultStartParams, ...EMBEDDED_SETTINGS];
  let release = async () => undefined as void;
  if (dataDir) {
    mkdirSync(dataDir, { recursive: true });
    release = await lockDataDir(dataDir);
  }
  try {
    // A new data directory is initialised by initdb, whose memory stays with the process that ran
    // it (~500 MB resident, ~100 MB even after closing): a short-lived child process does it.
    if (dataDir && !existsSync(join(dataDir, "PG_VERSION"))) await initialiseInChild(dataDir, startParams);
    const engine = await openEngineOnWorker(dataDir ? { dataDir, startParams } : { startParams }, MAX_PREPARED);
    return {
      kind: "embedded",
      query: engine.query,
      transaction: engine.transaction,
      close: async () => {
        try {
          await engine.close();
        } finally {
          await release();
        }
      },
    };
  } catch (e) {
    await release();
    throw e;
  }
}

// Statements kept prepared per process: the store's SQL is a few dozen fixed texts; past this many
// (SQL built with varying text) a statement is parsed each time, as PGlite's own query() does.
const MAX_PREPARED = 500;

async function openPostgres(url: string): Promise<Database> {
  const { default: pg } = await import("pg");
  // int8 and numeric come back as strings (amounts and nonces must not lose precision).
  const pool = new pg.Pool({ connectionString: url, max: 10 });
  pool.on("error", () => undefined); // an idle client dropping is not fatal; the next query reconnects
  return {
    kind: "postgres",
    query: async (sql, params) => (await pool.query(sql, params as unknown[])).rows,
    async transaction(fn) {
      const client = await pool.connect();
      // A checked-out client is not the pool's to watch: the server going away mid-transaction
      // emits 'error' on it, which without a listener is an uncaught exception. The query in
      // flight fails with it too; the client is then destroyed, not returned to the pool.
      let broken: Error | undefined;
      let ended = false;
      const onError = (e: Error) => (broken = e);
      client.on("error", onError);
      try {
        await client.query("BEGIN");
        const result = await fn({
          query: async (sql, params) => {
            // A handle kept past its transaction's end would run on a client back in the pool.
            if (ended) throw Object.assign(new Error("the transaction has ended"), { code: "25000" });
            return (await client.query(sql, params as unknown[])).rows;
          },
        });
        // A statement that failed inside (its error caught by fn) aborted the transaction: its COMMIT is a rollback.
        if ((await client.query("COMMIT")).command === "ROLLBACK") throw Object.assign(new Error(TRANSACTION_ABORTED.message), TRANSACTION_ABORTED);
        return result;
      } catch (e) {
        if (!broken) await client.query("ROLLBACK").catch((r: Error) => (broken = r));
        throw e;
      } finally {
        ended = true;
        client.off("error", onError);
        client.release(broken);
      }
    },
    close: () => pool.end(),
  };
}

/**
 * A database that cannot serve right now (down, restarting, starting up, out of connections, a
 * transaction it had to abort), as opposed to one that answered with an error about the request
 * (bad data, a constraint, wrong credentials): worth waiting for and retrying, never a verdict and
 * never a reason to exit.
 */
export function isDatabaseUnavailable(e: unknown): boolean {
  const { code, message } = (e ?? {}) as { code?: unknown; message?: unknown };
  if (typeof code === "string" && (["ECONNREFUSED", "ECONNRESET", "ETIMEDOUT", "EPIPE", "EHOSTUNREACH", "ENOTFOUND", "EAI_AGAIN", "57P01", "57P02", "57P03", "53300", "40001", "40P01"].includes(code) || code.startsWith("08"))) return true;
  return typeof message === "string" && /^(Connection terminated|timeout exceeded when trying to connect)/.test(message);
}

/**
 * Unavailable in a way a wrong DATABASE_URL also looks (a host name that does not resolve, a port
 * where something else than PostgreSQL answers): waited for a while only (a Service's DNS may come
 * late), then reported as a configuration error.
 */
export function mayBeMisconfigured(e: unknown): boolean {
  const { code, message } = (e ?? {}) as { code?: unknown; message?: unknown };
  return code === "ENOTFOUND" || code === "EAI_AGAIN" || (typeof message === "string" && message.startsWith("Connection terminated"));
}

/** Applies migrations not yet applied, in order, each in its own transaction; safe to run from several processes at once. */
export async function migrate(db: Database, migrations: Migration[]): Promise<string[]> {
  // Under the migrators' lock too: two replicas starting at once race on CREATE TABLE IF NOT EXISTS
  // (PostgreSQL's catalog answers one of them with a duplicate-key error, and it exited).
  await db.transaction(async (tx) => {
    await tx.query("SELECT pg_advisory_xact_lock(402402)");
    await tx.query("CREATE TABLE IF NOT EXISTS schema_migrations (id text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())");
  });
  const applied: string[] = [];
  for (const m of migrations) {
    const done = await db.transaction(async (tx) => {
      // Serialise concurrent migrators (several replicas starting at once) on one advisory lock.
      await tx.query("SELECT pg_advisory_xact_lock(402402)");
      const seen = await tx.query("SELECT 1 FROM schema_migrations WHERE id = $1", [m.id]);
      if (seen.length) return false;
      for (const statement of splitStatements(m.sql)) await tx.query(statement);
      await tx.query("INSERT INTO schema_migrations (id) VALUES ($1)", [m.id]);
      return true;
    });
    if (done) applied.push(m.id);
  }
  return applied;
}

/** Splits a migration into statements (parameterised query APIs take one at a time). */
function splitStatements(sql: string): string[] {
  return sql
    .split(/;\s*(?:\n|$)/)
    .map((s) => s.trim())
    .filter(Boolean);
}

export async function openDatabase(opts: OpenDatabaseOptions = {}): Promise<Database> {
  const db = opts.url ? await openPostgres(opts.url) : await openEmbedded(opts.dataDir);
  try {
    if (opts.migrations?.length) await migrate(db, opts.migrations);
  } catch (e) {
    await db.close();
    throw e;
  }
  return db;
}

/** Safe to log: the scheme, host and database of a URL, never its credentials. */
export function describeDatabase(url?: string): string {
  if (!url) return "embedded";
  try {
    const u = new URL(url);
    return `${u.protocol}//${u.hostname}${u.port ? `:${u.port}` : ""}${u.pathname}`;
  } catch {
    return "postgres";
  }
}
