// The SQL layer against both engines: the embedded one and the PostgreSQL server of this machine.
import { afterAll, describe, expect, it } from "vitest";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { openDatabase, migrate, describeDatabase, type Database, type Queryable } from "../services/platform/storage.ts";

export const PG_URL = process.env.TEST_DATABASE_URL ?? "postgres://postgres@127.0.0.1:5432/test";
const dirs: string[] = [];
afterAll(async () => Promise.all(dirs.map((d) => rm(d, { recursive: true, force: true }))));

const migrations = (table: string) => [
  { id: `${table}/001`, sql: `CREATE TABLE ${table} (id text PRIMARY KEY, n numeric(78,0) NOT NULL);\nCREATE INDEX ${table}_n ON ${table} (n);` },
  { id: `${table}/002`, sql: `ALTER TABLE ${table} ADD COLUMN note text` },
];

describe.each([
  ["embedded", async (table: string) => {
    const dir = await mkdtemp(join(tmpdir(), "x402-db-"));
    dirs.push(dir);
    return { open: () => openDatabase({ dataDir: dir, migrations: migrations(table) }) };
  }],
  ["postgres", async (table: string) => {
    const db = await openDatabase({ url: PG_URL });
    await db.query(`DROP TABLE IF EXISTS ${table}`);
    await db.query(`DELETE FROM schema_migrations WHERE id LIKE '${table}/%'`).catch(() => undefined);
    await db.close();
    return { open: () => openDatabase({ url: PG_URL, migrations: migrations(table) }) };
  }],
])("%s engine", (kind, prepare) => {
  it("applies migrations once, keeps data across reopen, and keeps uint256 exact", async () => {
    const table = `t_storage_${kind}_${process.pid}`;
    const { open } = await prepare(table);
    let db: Database = await open();
    expect(db.kind).toBe(kind);
    const max = ((1n << 256n) - 1n).toString();
    await db.query(`INSERT INTO ${table} (id, n, note) VALUES ($1, $2, $3)`, ["a", max, "x"]);
    await db.close();
    db = await open();
    expect(await migrate(db, migrations(table))).toEqual([]);
    const rows = await db.query<{ n: string; note: string }>(`SELECT n::text AS n, note FROM ${table} WHERE id = $1`, ["a"]);
    expect(rows).toEqual([{ n: max, note: "x" }]);
    await db.close();
  });

  it("rolls back a failed transaction entirely", async () => {
    const table = `t_tx_${kind}_${process.pid}`;
    const { open } = await prepare(table);
    const db = await open();
    await expect(
      db.transaction(async (tx) => {
        await tx.query(`INSERT INTO ${table} (id, n) VALUES ('b', 1)`);
        await tx.query(`INSERT INTO ${table} (id, n) VALUES ('b', 2)`); // duplicate key
      }),
    ).rejects.toThrow();
    expect(await db.query(`SELECT * FROM ${table}`)).toEqual([]);
    await db.close();
  });

  it("a transaction whose failed statement was caught inside is not reported committed: it throws, and nothing of it stays", async () => {
    const table = `t_caught_${kind}_${process.pid}`;
    const { open } = await prepare(table);
    const db = await open();
    await expect(
      db.transaction(async (tx) => {
        await tx.query(`INSERT INTO ${table} (id, n) VALUES ('c', 1)`);
        await tx.query(`INSERT INTO ${table} (id, n) VALUES ('c', 2)`).catch(() => undefined); // swallowed: the transaction is aborted all the same
        return "done";
      }),
    ).rejects.toMatchObject({ message: expect.stringMatching(/rolled back/), code: "25P02" });
    expect(await db.query(`SELECT * FROM ${table}`)).toEqual([]);
    // A transaction's handle used after its end is refused, never run in whatever holds the engine then.
    let kept: Queryable | undefined;
    await db.transaction(async (tx) => {
      kept = tx;
    });
    const late = kept!.query(`INSERT INTO ${table} (id, n) VALUES ('late', 1)`).then(
      () => "ran",
      () => "refused",
    );
    expect(await late).toBe("refused");
    expect(await db.query(`SELECT * FROM ${table}`)).toEqual([]);
    await db.close();
  });

  it("the same statement many times, with every kind of value the stores send and read: the same rows each time, errors with their SQLSTATE, and the engine serving after them", async () => {
    const table = `t_values_${kind}_${process.pid}`;
    const { open } = await prepare(table);
    const db = await open();
    await db.query(`CREATE TABLE ${table}_v (id text PRIMARY KEY, big numeric(78,0), at timestamptz, doc jsonb, flag boolean, count bigint, tags text[])`);
    const insert = `INSERT INTO ${table}_v (id, big, at, doc, flag, count, tags) SELECT u.id, u.big::numeric, now(), u.doc::jsonb, u.flag, u.count, ARRAY[u.id, 'x,"y\\z'] FROM unnest($1::text[], $2::text[], $3::text[], $4::boolean[], $5::bigint[]) AS u(id, big, doc, flag, count) RETURNING id`;
    const max = ((1n << 256n) - 1n).toString();
    for (let i = 0; i < 12; i++) {
      // past the fifth execution PostgreSQL may switch to a generic plan: results must not change
      const rows = await db.query<{ id: string }>(insert, [[`k${i}`, `k${i}b`], [max, "0"], [JSON.stringify({ i, s: "é\u0000".slice(0, 1) }), "null"], [true, false], [String(2n ** 62n), "-1"]]);
      expect(rows.map((r) => r.id)).toEqual([`k${i}`, `k${i}b`]);
    }
    const [row] = await db.query<{ big: string; at: Date; doc: unknown; flag: boolean; count: string; tags: string[] }>(`SELECT big::text AS big, at, doc, flag, count::text AS count, tags FROM ${table}_v WHERE id = $1`, ["k11"]);
    expect(row).toMatchObject({ big: max, doc: { i: 11, s: "é" }, flag: true, count: String(2n ** 62n), tags: ["k11", 'x,"y\\z'] });
    expect(row!.at).toBeInstanceOf(Date);
    expect(await db.query(`SELECT count(*)::int AS n FROM ${table}_v WHERE id = ANY($1::text[]) AND flag IS NOT DISTINCT FROM $2`, [["k0", "k0b", "nope"], null])).toEqual([{ n: 0 }]);
    const duplicate = await db.query(insert, [["k0"], ["1"], ["{}"], [true], ["1"]]).catch((e: unknown) => e as { code?: string });
    expect(duplicate).toMatchObject({ code: "23505" });
    const syntax = await db.query(`SELEC nothing`).catch((e: unknown) => e as { code?: string });
    expect(syntax).toMatchObject({ code: "42601" });
    expect(await db.query(`SELECT count(*)::int AS n FROM ${table}_v`)).toEqual([{ n: 24 }]);
    await db.close();
  });
});

describe("describeDatabase", () => {
  it("never shows credentials", () => {
    expect(describeDatabase("postgres://user:s3cret@db.internal:5432/x402")).toBe("postgres://db.internal:5432/x402");
    expect(describeDatabase(undefined)).toBe("embedded");
  });
});

describe("the embedded engine's memory", () => {
  it("a new data directory is initialised, then opened again, with 16 MB of shared buffers; its data survive", async () => {
    const dir = await mkdtemp(join(tmpdir(), "x402-embedded-"));
    try {
      const db = await openDatabase({ dataDir: join(dir, "db") });
      expect(await db.query("SHOW shared_buffers")).toEqual([{ shared_buffers: "16MB" }]);
      // no statistics without autovacuum: every execution is planned with its values, never a generic plan
      expect(await db.query("SHOW plan_cache_mode")).toEqual([{ plan_cache_mode: "force_custom_plan" }]);
      await db.query("CREATE TABLE t (v text)");
      await db.query("INSERT INTO t VALUES ('kept')");
      await db.close();
      const again = await openDatabase({ dataDir: join(dir, "db") });
      expect(await again.query("SELECT v FROM t")).toEqual([{ v: "kept" }]);
      await again.close();
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
});

describe("a PostgreSQL server that goes away mid-transaction", () => {
  it("fails that transaction's query, never the process (no uncaught 'error' of the checked-out client); the next query reconnects", async () => {
    const { startTcpProxy } = await import("./helpers/tcp-proxy.ts");
    const server = new URL(PG_URL);
    const proxy = await startTcpProxy(Number(server.port || 5432));
    const db = await openDatabase({ url: `postgres://${server.username}@127.0.0.1:${proxy.port}${server.pathname}` });
    const uncaught: unknown[] = [];
    const onUncaught = (e: unknown) => uncaught.push(e);
    process.on("uncaughtException", onUncaught);
    try {
      const inFlight = db.transaction(async (tx) => {
        await tx.query("SELECT 1");
        await tx.query("SELECT pg_sleep(5)"); // the server goes away while this runs
      });
      await new Promise((r) => setTimeout(r, 300));
      await proxy.down();
      await expect(inFlight).rejects.toThrow();
      await new Promise((r) => setTimeout(r, 200)); // a late 'error' event would surface by now
      expect(uncaught).toEqual([]);
      await proxy.up();
      expect(await db.query<{ ok: number }>("SELECT 1 AS ok")).toEqual([{ ok: 1 }]);
      expect(await db.transaction((tx) => tx.query<{ ok: number }>("SELECT 2 AS ok"))).toEqual([{ ok: 2 }]);
    } finally {
      process.off("uncaughtException", onUncaught);
      await db.close().catch(() => undefined);
      await proxy.close();
    }
  });
});

describe("waiting for a database at start-up", () => {
  it("a host name that never resolves (a wrong DATABASE_URL) ends the wait with an error naming it", async () => {
    const { serviceDatabase, startService } = await import("../services/platform/lifecycle.ts");
    const { pino } = await import("pino");
    const logger = pino({ level: "silent" });
    const started = Date.now();
    await expect(startService(async (life) => ({ db: await serviceDatabase(life, { databaseUrl: "postgres://postgres@no-such-host.invalid:5432/test" }, [{ id: "wait/001", sql: "SELECT 1" }], { logger, misconfiguredAfterMs: 1500 }) }))).rejects.toThrow(
      /postgres:\/\/no-such-host\.invalid:5432\/test was not reachable for 1\.5 s .*check DATABASE_URL/,
    );
    expect(Date.now() - started).toBeGreaterThanOrEqual(1500);
  });
});

describe("replicas starting together on a fresh PostgreSQL database", () => {
  it("six migrators at once all open it (CREATE TABLE IF NOT EXISTS raced in PostgreSQL's catalog and one exited)", async () => {
    const schema = `fresh_${Date.now().toString(36)}`;
    const admin = await openDatabase({ url: PG_URL });
    try {
      for (let round = 0; round < 3; round++) {
        await admin.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
        await admin.query(`CREATE SCHEMA ${schema}`);
        const url = `${PG_URL}?options=-c%20search_path%3D${schema}`;
        const dbs = await Promise.all(Array.from({ length: 6 }, () => openDatabase({ url, migrations: [{ id: `${schema}/001`, sql: `CREATE TABLE ${schema}_t (id int)` }] })));
        expect(await dbs[0]!.query<{ id: string }>("SELECT id FROM schema_migrations")).toEqual([{ id: `${schema}/001` }]);
        for (const d of dbs) await d.close();
      }
    } finally {
      await admin.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
      await admin.close();
    }
  });
});

describe("one embedded store, one process", () => {
  it("a second process opening the same data directory waits, unready, until the first closes it; a holder killed with SIGKILL is taken over once its lock goes stale", async () => {
    const { spawn } = await import("node:child_process");
    const { serviceDatabase, startService } = await import("../services/platform/lifecycle.ts");
    const { StoreLockedError } = await import("../services/platform/storage.ts");
    const { pino } = await import("pino");
    const dir = await mkdtemp(join(tmpdir(), "x402-store-lock-"));
    dirs.push(dir);
    const dataDir = join(dir, "store");
    const first = await openDatabase({ dataDir, migrations: migrations("held") });
    await first.query("INSERT INTO held (id, n) VALUES ('a', 1)");
    // the engine itself would open it a second time (two PostgreSQLs over one directory): refused
    await expect(openDatabase({ dataDir })).rejects.toBeInstanceOf(StoreLockedError);

    // a service starting meanwhile waits (it logs why) and opens the store once the first closes it
    const lines: string[] = [];
    const logger = pino({ level: "warn" }, { write: (l: string) => void lines.push(l) });
    let opened = false;
    const second = startService(async (life) => {
      const db = await serviceDatabase(life, { dataDir }, migrations("held"), { logger });
      opened = true;
      return { db, rows: await db.query<{ id: string }>("SELECT id FROM held") };
    });
    await new Promise((r) => setTimeout(r, 1500));
    expect(opened).toBe(false);
    expect(lines.join("")).toContain("the embedded store is held by another process");
    await first.close();
    const running = await second;
    expect(running.rows).toEqual([{ id: "a" }]);
    await running.close();

    // a holder that dies without closing (SIGKILL: a container killed) leaves its lock, taken over once stale
    const script = `const { openDatabase } = await import(${JSON.stringify(new URL("../services/platform/storage.ts", import.meta.url).href)});
await openDatabase({ dataDir: process.env.DATA_DIR });
process.stdout.write("open\\n");
setInterval(() => undefined, 1000);`;
    const holder = spawn(process.execPath, ["--import", "tsx", "--input-type=module", "-e", script], { env: { ...process.env, DATA_DIR: dataDir }, stdio: ["ignore", "pipe", "inherit"] });
    await new Promise<void>((resolve, reject) => {
      holder.stdout!.on("data", (d: Buffer) => d.toString().includes("open") && resolve());
      holder.once("exit", (code) => reject(new Error(`the holder exited (${code})`)));
    });
    await expect(openDatabase({ dataDir })).rejects.toBeInstanceOf(StoreLockedError);
    holder.kill("SIGKILL");
    await new Promise((r) => holder.once("exit", r));
    const after = startService(async (life) => ({ db: await serviceDatabase(life, { dataDir }, [], { logger }) }));
    const taken = await after;
    expect(await taken.db.query("SELECT count(*)::int AS n FROM held")).toEqual([{ n: 1 }]);
    await taken.close();
  }, 60_000);
});
