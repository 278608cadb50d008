// One service lifecycle (services/platform/lifecycle.ts): a start that fails releases what it had
// opened (ports listen again, the database pool has no connection left), close runs once, and a
// service never closes a database it was given.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { connect, createServer, type Server, type Socket } from "node:net";
import { randomBytes } from "node:crypto";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pino } from "pino";
import { generatePrivateKey } from "viem/accounts";
import { startService } from "../services/platform/lifecycle.ts";
import { openDatabase, type Database } from "../services/platform/storage.ts";
import { startAnvil, freePort, type AnvilNode } from "../services/devnet/anvil.ts";
import { resolveFacilitatorConfig } from "../services/facilitator/config.ts";
import { startFacilitatorService } from "../services/facilitator/service.ts";
import { startRouterService } from "../services/router/service.ts";
import { startHubService } from "../services/hub/service.ts";
import { PG_URL } from "./helpers/hub.ts";
import { until } from "./helpers/wait.ts";

const silent = pino({ level: "silent" });
let dir: string;
let observer: Database;
beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), "x402-lifecycle-"));
  observer = await openDatabase({ url: PG_URL });
});
afterAll(async () => {
  await observer?.close();
  await rm(dir, { recursive: true, force: true });
});

/** Holds a loopback port the way another process would. */
async function holdPort(): Promise<{ port: number; server: Server }> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return { port: (server.address() as { port: number }).port, server };
}

async function canListen(port: number): Promise<boolean> {
  const server = createServer();
  const ok = await new Promise<boolean>((resolve) => {
    server.once("error", () => resolve(false));
    server.listen(port, "127.0.0.1", () => resolve(true));
  });
  if (ok) await new Promise((r) => server.close(r));
  return ok;
}

/** A database URL whose connections can be counted (pg_stat_activity.application_name). */
function countedUrl(): { url: string; connections: () => Promise<number> } {
  const name = `lifecycle_${randomBytes(6).toString("hex")}`;
  return {
    url: `${PG_URL}?application_name=${name}`,
    connections: async () => Number((await observer.query<{ n: string }>("SELECT count(*) AS n FROM pg_stat_activity WHERE application_name = $1", [name]))[0]!.n),
  };
}

/** Waits until the server side has seen the pool's connections go (their end is asynchronous there). */
const noConnections = (db: ReturnType<typeof countedUrl>) => until(async () => ((await db.connections()) === 0 ? true : undefined), "the pool's connections to close", 5_000);

describe("startService", () => {
  it("releases newest first on close, once however often close is called", async () => {
    const released: string[] = [];
    const running = await startService(async (life) => {
      life.defer(() => released.push("first"));
      life.own({ close: () => released.push("second") });
      life.defer(() => {
        throw new Error("a failing release does not stop the others");
      });
      return { url: "x" };
    });
    await Promise.all([running.close(), running.close()]);
    await running.close();
    expect(released).toEqual(["second", "first"]);
  });

  it("a start that fails releases what it had opened and rejects with its error", async () => {
    const released: string[] = [];
    await expect(
      startService(async (life) => {
        life.defer(() => released.push("opened"));
        throw new Error("listen EADDRINUSE");
      }),
    ).rejects.toThrow("listen EADDRINUSE");
    expect(released).toEqual(["opened"]);
  });
});

describe("a failed start releases everything it started", () => {
  let anvil: AnvilNode;
  beforeAll(async () => {
    anvil = await startAnvil({ chainId: 84532 });
  });
  afterAll(async () => {
    await anvil?.stop();
  });

  it("facilitator: its public port is taken; the admin port listens again and the database pool is closed", async () => {
    const taken = await holdPort();
    const adminPort = await freePort();
    const db = countedUrl();
    const keyFile = join(dir, "facilitator.key");
    await writeFile(keyFile, `${generatePrivateKey()}\n`);
    try {
      const config = resolveFacilitatorConfig({ network: "eip155:84532", rpcUrls: [anvil.rpcUrl], signerKeyFile: keyFile, port: taken.port, adminPort, databaseUrl: db.url });
      await expect(startFacilitatorService(config, silent)).rejects.toThrow(/EADDRINUSE/);
      expect(await canListen(adminPort)).toBe(true);
      await noConnections(db);
    } finally {
      taken.server.close();
    }
  });

  it("router: its public port is taken; the admin port listens again and the API-key database pool is closed", async () => {
    const taken = await holdPort();
    const adminPort = await freePort();
    const db = countedUrl();
    const routingTablePath = join(dir, "routing.json");
    await writeFile(routingTablePath, JSON.stringify({ backends: [] }));
    try {
      await expect(startRouterService({ routingTablePath, host: "127.0.0.1", port: taken.port, adminPort, databaseUrl: db.url, apiKeys: true }, silent)).rejects.toThrow(/EADDRINUSE/);
      expect(await canListen(adminPort)).toBe(true);
      await noConnections(db);
    } finally {
      taken.server.close();
    }
  });

  it("router: its admin port is taken; the public port listens again", async () => {
    const taken = await holdPort();
    const port = await freePort();
    const routingTablePath = join(dir, "routing-admin.json");
    await writeFile(routingTablePath, JSON.stringify({ backends: [] }));
    try {
      await expect(startRouterService({ routingTablePath, host: "127.0.0.1", port, adminPort: taken.port }, silent)).rejects.toThrow(/EADDRINUSE/);
      expect(await canListen(port)).toBe(true);
    } finally {
      taken.server.close();
    }
  });
});

describe("a database the caller passes stays the caller's", () => {
  it("the hub never closes a shared database: after its close, and after a failed start, the database still answers", async () => {
    const shared = await openDatabase();
    try {
      const hub = await startHubService({ host: "127.0.0.1", port: 0, db: shared, logger: silent });
      await hub.close();
      expect(await shared.query("SELECT 1 AS ok")).toEqual([{ ok: 1 }]);

      const taken = await holdPort();
      try {
        await expect(startHubService({ host: "127.0.0.1", port: taken.port, adminPort: 0, db: shared, logger: silent })).rejects.toThrow(/EADDRINUSE/);
      } finally {
        taken.server.close();
      }
      expect(await shared.query("SELECT 1 AS ok")).toEqual([{ ok: 1 }]);
    } finally {
      await shared.close();
    }
  });
});

describe("a database that goes away is the service being unavailable, never a bug", () => {
  it("node-postgres's code-less failures (a connection cut mid-query, a pool that cannot connect) count as database errors", async () => {
    const { isDatabaseError } = await import("../services/platform/http-kit.ts");
    const target = new URL(PG_URL);
    // A TCP proxy in front of PostgreSQL, so the connection can be cut the way a network or a failover cuts it.
    const sockets = new Set<Socket>();
    const proxy = createServer((client) => {
      const upstream = connect(Number(target.port || 5432), target.hostname);
      sockets.add(client).add(upstream);
      client.pipe(upstream).pipe(client);
      client.on("error", () => {});
      upstream.on("error", () => {});
    });
    await new Promise<void>((resolve) => proxy.listen(0, "127.0.0.1", resolve));
    const via = new URL(PG_URL);
    via.hostname = "127.0.0.1";
    via.port = String((proxy.address() as { port: number }).port);
    const db = await openDatabase({ url: via.toString() });
    try {
      expect(await db.query("SELECT 1 AS one")).toEqual([{ one: 1 }]);
      const query = db.query("SELECT pg_sleep(5)");
      await new Promise((r) => setTimeout(r, 200));
      for (const s of sockets) s.destroy();
      const cut = await query.then(() => undefined, (e: unknown) => e as Error);
      expect(cut).toBeInstanceOf(Error);
      expect(isDatabaseError(cut as Error), String(cut)).toBe(true);
      // A program bug is not one.
      expect(isDatabaseError(new TypeError("Cannot read properties of undefined"))).toBe(false);
    } finally {
      proxy.close();
      await db.close().catch(() => {});
    }
  });
});

describe("the HTTP kit's answer to a failure it does not know", () => {
  it("is a 500 internal_error, and its log line keeps no URL (an RPC URL can carry an API key)", async () => {
    const { createServiceApp } = await import("../services/platform/http-kit.ts");
    const lines: string[] = [];
    const logger = pino({ level: "info" }, { write: (line: string) => void lines.push(line) });
    const app = createServiceApp({ service: "test", logger, bodyLimit: 1024, endpoints: "none" }, (a) => {
      a.get("/boom", async () => {
        throw new Error("fetch failed: https://rpc.example/v2/SECRETKEY123 answered 500\nURL: https://rpc.example/v2/SECRETKEY123");
      });
    });
    const res = await app.inject({ method: "GET", url: "/boom" });
    await app.close();
    expect(res.statusCode).toBe(500);
    expect(res.json()).toEqual({ error: "internal_error: the request could not be processed; see the service logs" });
    expect(lines.some((l) => l.includes("test request failed"))).toBe(true);
    expect(lines.join("")).not.toContain("SECRETKEY123");
  });
});
