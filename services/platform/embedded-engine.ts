// The embedded engine (PGlite) on a worker thread of its own. PGlite runs PostgreSQL in WebAssembly
// synchronously on whatever thread calls it: on the event loop's thread, every statement of a
// settlement burst (about half the facilitator's CPU) held up requests, RPC answers and receipts.
// Here the engine has a thread to itself and the event loop only posts statements and reads rows.
//
// The worker's code is `engineWorker` below, passed as source text (no file to locate: the services
// run from sources, from a bundle and inside an image): it must not use anything from outside its body.
import { Worker } from "node:worker_threads";
import type { Database, Queryable } from "./storage.ts";

/** A transaction whose COMMIT turned out a rollback (a failed statement inside it, its error caught): in_failed_sql_transaction, as PGlite's own transaction() said. Both engines throw it. */
export const TRANSACTION_ABORTED = { message: "the transaction was aborted by a failed statement and rolled back", code: "25P02", severity: "ERROR" } as const;

type Request =
  | { id: number; op: "query"; sql: string; params?: unknown[] }
  | { id: number; op: "begin" }
  | { id: number; op: "tx"; tx: number; sql: string; params?: unknown[] }
  | { id: number; op: "end"; tx: number; commit: boolean }
  | { id: number; op: "close" };
/** A request before it is numbered. */
type Unnumbered = Request extends unknown ? (Request extends infer R ? (R extends Request ? Omit<R, "id"> : never) : never) : never;
type Reply = { id: number; value?: unknown; error?: Record<string, unknown> } | { ready: true } | { failed: Record<string, unknown> };

/**
 * The worker thread. PGlite through named prepared statements: its query() parses and describes the
 * SQL again on every call, in six exchanges with the engine; here a statement is parsed and
 * described once, and each call is one exchange (bind, describe, execute, sync), planned for its
 * values (storage.ts EMBEDDED_SETTINGS). Values are serialised by their parameter types and rows
 * parsed with PGlite's own serialisers and parsers, as its query() does. Every statement holds the
 * engine's lock (runExclusive), a transaction for its whole length.
 */
async function engineWorker(): Promise<void> {
  // import() written out of the test runner's reach (vitest rewrites it in the sources it loads, and
  // this body runs where its rewrite does not exist).
  const load = new Function("specifier", "return import(specifier)") as (specifier: string) => Promise<unknown>;
  const { parentPort, workerData } = (await load("node:worker_threads")) as typeof import("node:worker_threads");
  const port = parentPort!;
  const { pglite, options, maxPrepared, aborted } = workerData as { pglite: string; options: Record<string, unknown>; maxPrepared: number; aborted: { message: string; code: string; severity: string } };
  const describe = (e: unknown): Record<string, unknown> => {
    const fields: Record<string, unknown> = { message: e instanceof Error ? e.message : String(e), name: e instanceof Error ? e.name : "Error" };
    if (e && typeof e === "object") for (const [k, v] of Object.entries(e)) if (v === null || ["string", "number", "boolean"].includes(typeof v)) fields[k] = v;
    return fields;
  };
  type Engine = {
    execProtocol(m: Uint8Array, o: { syncToFs: boolean }): Promise<{ messages: { name: string; text?: string }[] }>;
    runExclusive<T>(fn: () => Promise<T>): Promise<T>;
    serializers: Record<number, (v: unknown) => string>;
    parsers: Record<number, unknown>;
    close(): Promise<void>;
  };
  type Protocol = {
    serialize: {
      parse(o: { name: string; text: string }): Uint8Array;
      describe(o: { type: "S" | "P"; name?: string }): Uint8Array;
      bind(o: { statement: string; values: (string | null)[] }): Uint8Array;
      execute(o: object): Uint8Array;
      sync(): Uint8Array;
      query(sql: string): Uint8Array;
    };
  };
  type Parse = { parseDescribeStatementResults(m: unknown[]): number[]; parseResults(m: unknown[], parsers: unknown): { rows: unknown[] }[] };
  let db: Engine;
  let protocol: Protocol;
  let parse: Parse;
  try {
    const module = (await load(pglite)) as { PGlite: { create(o: unknown): Promise<Engine> }; protocol: Protocol; parse: Parse };
    ({ protocol, parse } = module);
    db = await module.PGlite.create(options);
  } catch (e) {
    port.postMessage({ failed: describe(e) });
    return;
  }
  const { serialize } = protocol;
  const join = (parts: Uint8Array[]): Uint8Array => {
    const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
    let at = 0;
    for (const p of parts) {
      out.set(p, at);
      at += p.length;
    }
    return out;
  };
  const prepared = new Map<string, { name: string; types: number[] }>();
  async function statementOf(sql: string, syncToFs: boolean): Promise<{ name: string; types: number[] }> {
    const known = prepared.get(sql);
    if (known) return known;
    // DDL (migrations) is run once and may change what a kept statement returns: never kept. Past
    // maxPrepared texts (SQL built with varying text) a statement is parsed each time.
    const keep = prepared.size < maxPrepared && /^\s*(SELECT|INSERT|UPDATE|DELETE|WITH)\b/i.test(sql);
    const name = keep ? `x402_${prepared.size}` : "";
    const described = await db.execProtocol(join([serialize.parse({ name, text: sql }), serialize.describe({ type: "S", name }), serialize.sync()]), { syncToFs });
    const statement = { name, types: parse.parseDescribeStatementResults(described.messages) };
    if (keep) prepared.set(sql, statement);
    return statement;
  }
  /** One statement; the caller holds the engine's lock. Inside a transaction the files are synced at its end. */
  async function run(sql: string, params: unknown[] | undefined, syncToFs: boolean): Promise<unknown[]> {
    const { name, types } = await statementOf(sql, syncToFs);
    const values = (params ?? []).map((v, i) => {
      if (v === null || v === undefined) return null;
      const serializer = db.serializers[types[i]!];
      return serializer ? serializer(v) : String(v);
    });
    const { messages } = await db.execProtocol(join([serialize.bind({ statement: name, values }), serialize.describe({ type: "P" }), serialize.execute({}), serialize.sync()]), { syncToFs });
    return parse.parseResults(messages, db.parsers)[0]?.rows ?? [];
  }
  const simple = (sql: string, syncToFs: boolean) => db.execProtocol(serialize.query(sql), { syncToFs });

  // Open transactions, by the id of the request that began them: each holds the engine's lock
  // until the main thread ends it; `done` settles once it is committed or rolled back.
  const open = new Map<number, { end: (commit: boolean) => void; done: Promise<void> }>();
  function begin(id: number): Promise<void> {
    return new Promise((started, failed) => {
      let end!: (commit: boolean) => void;
      const ended = new Promise<boolean>((r) => (end = r));
      const done = db.runExclusive(async () => {
        await simple("BEGIN", false);
        started();
        if (!(await ended)) {
          await simple("ROLLBACK", true);
          return;
        }
        // A statement that failed inside (its error caught by the caller) aborted the transaction: its COMMIT is a rollback.
        const { messages } = await simple("COMMIT", true);
        if (messages.some((m) => m.name === "commandComplete" && m.text === "ROLLBACK")) throw Object.assign(new Error(aborted.message), aborted);
      });
      open.set(id, { end, done });
      done.catch((e: unknown) => {
        open.delete(id);
        failed(e); // a BEGIN that failed; later failures are the end's answer
      });
    });
  }

  port.on("message", (m: Request) => {
    const answer = (p: Promise<unknown>) =>
      p.then(
        (value) => port.postMessage({ id: m.id, value }),
        (e: unknown) => port.postMessage({ id: m.id, error: describe(e) }),
      );
    switch (m.op) {
      case "query":
        return void answer(db.runExclusive(() => run(m.sql, m.params, true)));
      case "begin":
        return void answer(begin(m.id).then(() => m.id));
      case "tx":
        // Only inside its own transaction, while that holds the engine: a statement of an ended one
        // would run in whichever transaction holds it now (or outside any).
        if (!open.has(m.tx)) return void answer(Promise.reject(Object.assign(new Error("the transaction has ended"), { code: "25000" })));
        return void answer(run(m.sql, m.params, false));
      case "end": {
        const t = open.get(m.tx);
        open.delete(m.tx);
        if (!t) return void answer(Promise.reject(new Error("no such transaction")));
        t.end(m.commit);
        return void answer(t.done);
      }
      case "close":
        // Answered before the port closes (then the thread ends).
        return void answer(db.close()).then(() => port.close());
    }
  });
  port.postMessage({ ready: true });
}

/** Opens PGlite (`options`: PGlite.create's) on a worker thread; the caller holds the data directory's lock. */
export async function openEngineOnWorker(options: { dataDir?: string; startParams: string[] }, maxPrepared: number): Promise<Pick<Database, "query" | "transaction" | "close">> {
  // (Loaders that keep function names, as tsx does, call a `__name` helper inside the body: given here.)
  const worker = new Worker(`var __name = (f) => f;\n(${engineWorker.toString()})()`, {
    eval: true,
    workerData: { pglite: import.meta.resolve("@electric-sql/pglite"), options, maxPrepared, aborted: TRANSACTION_ABORTED },
    // Only what it needs: the service's environment may hold RPC URLs with keys and tokens.
    env: {},
  });
  let nextId = 1;
  const pending = new Map<number, { resolve: (v: unknown) => void; reject: (e: unknown) => void }>();
  // The engine gone (a crash inside it, or closed): every statement after is refused as a database
  // that cannot serve (SQLSTATE 57P01), never a verdict on a payment (storage.ts isDatabaseUnavailable).
  let gone: Error | undefined;
  let closing = false;
  let started = false;
  // Died under a running service (not closed): nothing would bring the engine back and the process
  // would hold the data directory's lock for ever, looking alive. It exits, as a lost lock makes it
  // (storage.ts), and its supervisor starts it again.
  const died = (why: string) => {
    if (closing || !started) return;
    process.stderr.write(`x402-fleet: the embedded database stopped (${why}); exiting so that the process restarts\n`);
    process.exit(70);
  };
  const stop = (why: string) => {
    gone ??= Object.assign(new Error(`the embedded database stopped: ${why}`), { code: "57P01" });
    for (const p of pending.values()) p.reject(gone);
    pending.clear();
  };
  const ready = new Promise<void>((resolve, reject) => {
    worker.on("message", (m: Reply) => {
      if ("ready" in m) return resolve();
      if ("failed" in m) return reject(Object.assign(new Error(String(m.failed.message)), m.failed));
      const p = pending.get(m.id);
      pending.delete(m.id);
      if (!p) return;
      if (m.error) p.reject(Object.assign(new Error(String(m.error.message)), m.error));
      else p.resolve(m.value);
    });
    worker.on("error", (e) => {
      reject(e);
      stop(e.message);
      died(e.message);
    });
    worker.on("exit", (code) => {
      reject(new Error(`the embedded database's thread exited (${code}) before it was ready`));
      stop(`its thread exited (${code})`);
      died(`its thread exited (${code})`);
    });
  });
  await ready.catch(async (e: unknown) => {
    await worker.terminate();
    throw e;
  });
  started = true;
  const call = <T>(request: Unnumbered): Promise<T> =>
    new Promise<T>((resolve, reject) => {
      if (gone) return reject(gone);
      const id = nextId++;
      pending.set(id, { resolve: resolve as (v: unknown) => void, reject });
      try {
        worker.postMessage({ ...request, id });
      } catch (e) {
        pending.delete(id); // a value that cannot cross the thread boundary: refused here
        reject(e);
      }
    });
  return {
    query: <T>(sql: string, params?: unknown[]) => call<T[]>({ op: "query", sql, params }),
    async transaction<T>(fn: (tx: Queryable) => Promise<T>): Promise<T> {
      const tx = await call<number>({ op: "begin" });
      let result: T;
      try {
        result = await fn({ query: <R>(sql: string, params?: unknown[]) => call<R[]>({ op: "tx", tx, sql, params }) });
      } catch (e) {
        await call({ op: "end", tx, commit: false }).catch(() => undefined);
        throw e;
      }
      await call({ op: "end", tx, commit: true });
      return result;
    },
    async close() {
      closing = true;
      if (!gone) await call({ op: "close" }).catch(() => undefined);
      stop("closed");
      await worker.terminate();
    },
  };
}

