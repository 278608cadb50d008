// How every service starts and stops (router, facilitator, hub, wallets). What a start opens goes
// on a stack; a start that fails releases what it had opened, newest first, and close() runs the
// stack once however often it is called. A database the caller passes stays the caller's to close.
import type { FastifyInstance } from "fastify";
import type { Registry } from "prom-client";
import { startAdminServer, type AdminOptions, type RunningAdmin } from "./admin.ts";
import { safeMessage, type Logger } from "./logger.ts";
import { StoreLockedError, describeDatabase, isDatabaseUnavailable, mayBeMisconfigured, migrate, openDatabase, type Database, type Migration } from "./storage.ts";
import type { ServerTimeouts } from "./timeouts.ts";

export interface Lifecycle {
  /** Runs `release` on close, or when the start fails, before what was deferred earlier. */
  defer(release: () => unknown): void;
  /** Defers `thing.close()` and returns `thing`. */
  own<T extends { close(): unknown }>(thing: T): T;
}

export async function startService<T extends object>(start: (life: Lifecycle) => Promise<T>): Promise<T & { close(): Promise<void> }> {
  const stack: (() => unknown)[] = [];
  let closing: Promise<void> | undefined;
  const close = () =>
    (closing ??= (async () => {
      // One failing release does not keep the others from running.
      for (const release of stack.reverse()) await (async () => release())().catch(() => undefined);
    })());
  const life: Lifecycle = {
    defer: (release) => void stack.push(release),
    own: (thing) => (stack.push(() => thing.close()), thing),
  };
  try {
    return { ...(await start(life)), close };
  } catch (e) {
    await close();
    throw e;
  }
}

/** What a service started from code takes besides its own settings. */
export interface ServiceOptions {
  host?: string;
  /** Default: the service's own port. */
  port?: number;
  /** /metrics, /healthz, /readyz; default: the service's own, or a free port when `port` is 0. */
  adminPort?: number;
  /** Connection bounds of the public and admin ports; unset ones come from HTTP_*_TIMEOUT_MS or the defaults. */
  httpTimeouts?: Partial<ServerTimeouts>;
  logger?: Logger;
  /** Clock in ms (tests pass their own). */
  now?: () => number;
}

export interface RunningService {
  /** Base URL of the public port. */
  url: string;
  adminUrl: string;
  close(): Promise<void>;
}

/** Where a service keeps its data. */
export interface DatabaseOptions {
  /** postgres://… to use a server; otherwise the embedded engine. */
  databaseUrl?: string;
  /** Where the embedded engine keeps its files; omit for an in-memory store. */
  dataDir?: string;
  /** A database shared with other components (the devnet's one engine): migrated here, never closed here. */
  db?: Database;
}

/** The service's database with its migrations applied: the shared one, or one it opens and closes itself. */
export async function serviceDatabase(life: Lifecycle, opts: DatabaseOptions, migrations: Migration[], wait?: DatabaseWait): Promise<Database> {
  if (opts.db) {
    await migrate(opts.db, migrations);
    return opts.db;
  }
  // A database server that is not up yet (a replica starting during an outage, or before the
  // database in a fresh install) is waited for, with a bounded back-off: exiting would put a pod in
  // CrashLoopBackOff with a growing delay after the database returns.
  let waitingAdmin: RunningAdmin | undefined;
  let delayMs = 250;
  let suspectSince: number | undefined;
  try {
    for (let attempt = 1; ; attempt++) {
      try {
        return life.own(await openDatabase({ url: opts.databaseUrl, dataDir: opts.databaseUrl ? undefined : opts.dataDir, migrations }));
      } catch (e) {
        const held = e instanceof StoreLockedError; // another process's embedded store until it exits
        if (!wait || !(held || (opts.databaseUrl && isDatabaseUnavailable(e)))) throw e;
        const err = { code: (e as { code?: unknown }).code, message: safeMessage(e) };
        const database = describeDatabase(opts.databaseUrl);
        // A host that never resolves, or a port where something else answers, is most likely a wrong
        // DATABASE_URL: waited for a while (DNS may come late), then an error that names it.
        if (mayBeMisconfigured(e)) {
          suspectSince ??= Date.now();
          const bound = wait.misconfiguredAfterMs ?? MISCONFIGURED_AFTER_MS;
          if (Date.now() - suspectSince > bound) throw new Error(`the database ${database} was not reachable for ${bound / 1000} s (${err.message}): check DATABASE_URL`);
        } else suspectSince = undefined;
        if (held) wait.logger.warn({ attempt, err, retryInMs: delayMs }, "the embedded store is held by another process (one terminating beside this one?); waiting for it, unready");
        else wait.logger[suspectSince ? "error" : "warn"]({ attempt, err, retryInMs: delayMs, database }, suspectSince ? "the database host does not resolve or is not PostgreSQL; is DATABASE_URL right? waiting, unready" : "the database cannot be reached; waiting for it, unready");
        // Alive and unready meanwhile: probes see /healthz answer and /readyz refuse, so nothing restarts the process.
        if (wait.admin && !waitingAdmin) {
          waitingAdmin = await startAdminServer({ ...wait.admin, logger: wait.logger, checks: [{ name: "store", check: async () => false }] }).catch(() => undefined);
        }
        await new Promise((r) => setTimeout(r, delayMs));
        delayMs = Math.min(delayMs * 2, 5000);
      }
    }
  } finally {
    await waitingAdmin?.close();
  }
}

/** How long a database that looks misconfigured (mayBeMisconfigured) is waited for before start-up fails. */
const MISCONFIGURED_AFTER_MS = 120_000;

/** How a service waits for a database server that is not reachable yet. */
export interface DatabaseWait {
  logger: Logger;
  /** While waiting, an admin server on the service's admin port: /healthz answers, /readyz says the store is not ready. */
  admin?: { host: string; port: number; registry: Registry };
  /** How long a database that looks misconfigured is waited for (default 2 minutes). */
  misconfiguredAfterMs?: number;
}

/** For the start-up log line: never a URL's credentials. */
export function databaseLabel(opts: DatabaseOptions): { database: string; dataDir?: string } {
  return { database: opts.db ? `${opts.db.kind} (shared)` : describeDatabase(opts.databaseUrl), dataDir: opts.db || opts.databaseUrl ? undefined : (opts.dataDir ?? "(in memory)") };
}

/**
 * Serves `app` on the public port, then the admin port; both close with the service. The public
 * port comes first: when it is taken (another instance runs), nothing else was announced.
 */
export async function serve(life: Lifecycle, app: FastifyInstance, ports: Required<Pick<ServiceOptions, "host" | "port" | "adminPort">>, admin: Omit<AdminOptions, "host" | "port">): Promise<{ url: string; adminUrl: string }> {
  life.own(app);
  const url = await app.listen({ host: ports.host, port: ports.port });
  const { url: adminUrl } = life.own(await startAdminServer({ ...admin, host: ports.host, port: ports.adminPort }));
  return { url, adminUrl };
}
