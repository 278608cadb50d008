// Slow clients cannot hold our servers: a raw socket that sends half a header and stalls, one that
// sends headers and trickles the body a byte at a time, and one that keeps an idle keep-alive
// connection are all disconnected by the server, on every kind of server we run: the /v2 contract
// app (router and facilitator), the hub, the wallet service and an admin port. The servers run
// with 300 ms bounds; the tests only wait for the close (node's own defaults are 60 s for headers
// and 300 s for a request, far beyond the generous wait), and a normal request still works.
import { connect, type Socket } from "node:net";
import { pino } from "pino";
import { Registry } from "prom-client";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startAdminServer, type RunningAdmin } from "../services/platform/admin.ts";
import { createContractApp } from "../services/platform/http.ts";
import { createMetrics } from "../services/platform/metrics.ts";
import { DEFAULT_SERVER_TIMEOUTS, resolveServerTimeouts, type ServerTimeouts } from "../services/platform/timeouts.ts";
import { startTestHub, type TestHub } from "./helpers/hub.ts";
import { startTestWallets, type TestWallets } from "./helpers/wallets.ts";

const TIMEOUTS: ServerTimeouts = { headersMs: 300, requestMs: 300, keepAliveMs: 300, idleMs: 300_000 };
/** Far above the 300 ms bounds (and the 1 s keep-alive grace node adds), far below node's defaults. */
const CLOSE_WITHIN_MS = 10_000;
const silent = pino({ level: "silent" });

interface Closed {
  /** What the server wrote before closing. */
  received: string;
}

/** Opens a raw connection, runs `act` on it, and resolves when the server closes it (rejects after CLOSE_WITHIN_MS). */
function heldConnection(url: string, act: (s: Socket) => void, trickleBody = false): Promise<Closed> {
  const { hostname, port } = new URL(url);
  return new Promise((resolve, reject) => {
    const s = connect(Number(port), hostname);
    let received = "";
    let trickle: NodeJS.Timeout | undefined;
    const guard = setTimeout(() => {
      clearInterval(trickle);
      s.destroy();
      reject(new Error(`the server kept the connection open for ${CLOSE_WITHIN_MS} ms; received ${JSON.stringify(received)}`));
    }, CLOSE_WITHIN_MS);
    s.on("data", (d) => (received += d.toString()));
    s.on("error", () => undefined); // a reset is a close too
    s.on("close", () => {
      clearTimeout(guard);
      clearInterval(trickle);
      resolve({ received });
    });
    s.on("connect", () => {
      act(s);
      // the trickling client keeps sending a byte every 50 ms: an idle timeout alone never fires
      if (trickleBody) trickle = setInterval(() => s.writable && s.write(" "), 50);
    });
  });
}

const partialHeader = (path: string) => (s: Socket) => s.write(`POST ${path} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\n`);
const headersOnly = (path: string) => (s: Socket) => s.write(`POST ${path} HTTP/1.1\r\nHost: test\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{`);
const oneRequestThenIdle = (path: string) => (s: Socket) => s.write(`GET ${path} HTTP/1.1\r\nHost: test\r\n\r\n`);

/** The three slow clients against one server, and a normal request that still works. */
function slowClientSuite(name: string, server: () => { url: string; path: string; normal: () => Promise<number> }) {
  describe(name, () => {
    it("closes a connection that sent a partial header and stalled (408)", async () => {
      const { url, path } = server();
      const closed = await heldConnection(url, partialHeader(path));
      expect(closed.received === "" || closed.received.startsWith("HTTP/1.1 408"), closed.received).toBe(true);
    });

    it("closes a connection that sent headers and trickles the body (408)", async () => {
      const { url, path } = server();
      const closed = await heldConnection(url, headersOnly(path), true);
      expect(closed.received === "" || closed.received.startsWith("HTTP/1.1 408"), closed.received).toBe(true);
    });

    it("closes an idle keep-alive connection after its answer", async () => {
      const { url, path } = server();
      const closed = await heldConnection(url, oneRequestThenIdle(path));
      expect(closed.received).toMatch(/^HTTP\/1\.1 \d{3}/); // answered first, then closed
    });

    it("still answers a normal request", async () => {
      expect(await server().normal()).toBe(200);
    });
  });
}

describe("the timeout settings", () => {
  it("default to 10 s for headers, 30 s for a request, 5 s keep-alive, 120 s idle; the environment and options override them", () => {
    expect(resolveServerTimeouts({}, { env: {} })).toEqual(DEFAULT_SERVER_TIMEOUTS);
    expect(DEFAULT_SERVER_TIMEOUTS).toEqual({ headersMs: 10_000, requestMs: 30_000, keepAliveMs: 5_000, idleMs: 120_000 });
    const env = { HTTP_HEADERS_TIMEOUT_MS: "2000", HTTP_REQUEST_TIMEOUT_MS: "4000", HTTP_KEEP_ALIVE_TIMEOUT_MS: "700", HTTP_IDLE_TIMEOUT_MS: "90000" };
    expect(resolveServerTimeouts({}, { env })).toEqual({ headersMs: 2000, requestMs: 4000, keepAliveMs: 700, idleMs: 90_000 });
    expect(resolveServerTimeouts({ requestMs: 5000 }, { env }).requestMs).toBe(5000);
  });

  it("keep the idle bound above the longest handler wait (a settle's receipt bound); refuse nonsense at start", () => {
    expect(resolveServerTimeouts({}, { env: {}, longestHandlerMs: 200_000 }).idleMs).toBeGreaterThan(200_000);
    expect(() => resolveServerTimeouts({}, { env: { HTTP_IDLE_TIMEOUT_MS: "10000" }, longestHandlerMs: 15_000 })).toThrow(/HTTP_IDLE_TIMEOUT_MS \(10000 ms\) must exceed/);
    expect(() => resolveServerTimeouts({}, { env: { HTTP_HEADERS_TIMEOUT_MS: "soon" } })).toThrow(/HTTP_HEADERS_TIMEOUT_MS must be a positive number/);
    expect(() => resolveServerTimeouts({ headersMs: 5000, requestMs: 1000 }, { env: {} })).toThrow(/cannot exceed the request timeout/);
  });
});

describe("slow clients", () => {
  let contract: Awaited<ReturnType<typeof startContract>> | undefined;
  let hub: TestHub | undefined;
  let wallets: TestWallets | undefined;
  let admin: RunningAdmin | undefined;

  async function startContract() {
    const app = createContractApp({
      logger: silent,
      service: "facilitator",
      metrics: createMetrics("facilitator"),
      timeouts: TIMEOUTS,
      handlers: {
        verify: async () => ({ status: 200, body: { isValid: true } }),
        // A settle that waits (as for a receipt) longer than the request bound: only receiving the
        // request is bounded, so it must still be answered.
        settle: async () => {
          await new Promise((r) => setTimeout(r, 1_000));
          return { status: 200, body: { success: true, transaction: "0x", network: "eip155:8453" } };
        },
        supported: async () => ({ status: 200, body: { kinds: [], extensions: [], signers: {} } }),
      },
    });
    const url = await app.listen({ host: "127.0.0.1", port: 0 });
    return { url, close: () => app.close() };
  }

  beforeAll(async () => {
    [contract, hub, wallets, admin] = await Promise.all([
      startContract(),
      startTestHub("embedded", { httpTimeouts: TIMEOUTS }),
      startTestWallets("embedded", { httpTimeouts: TIMEOUTS }),
      startAdminServer({ host: "127.0.0.1", port: 0, registry: new Registry(), checks: [], logger: silent, timeouts: TIMEOUTS }),
    ]);
  }, 60_000);

  afterAll(async () => {
    await Promise.all([contract?.close(), hub?.stop(), wallets?.stop(), admin?.close()]);
  });

  slowClientSuite("the /v2 contract app (router, facilitator)", () => ({
    url: contract!.url,
    path: "/v2/verify",
    normal: async () => (await fetch(`${contract!.url}/v2/supported`)).status,
  }));

  it("the /v2 contract app answers a settle that waits longer than the request bound", async () => {
    const res = await fetch(`${contract!.url}/v2/settle`, { method: "POST", headers: { "content-type": "application/json" }, body: "{}" });
    expect(res.status).toBe(200);
    expect(((await res.json()) as { success: boolean }).success).toBe(true);
  });

  slowClientSuite("the hub", () => ({ url: hub!.url, path: "/api/upload", normal: async () => (await fetch(`${hub!.url}/api/info`)).status }));
  slowClientSuite("the hub's admin port", () => ({ url: hub!.adminUrl, path: "/healthz", normal: async () => (await fetch(`${hub!.adminUrl}/readyz`)).status }));
  slowClientSuite("the wallet service", () => ({ url: wallets!.url, path: "/v1/wallets", normal: async () => (await fetch(`${wallets!.url}/v1/info`)).status }));
  slowClientSuite("the wallet service's admin port", () => ({ url: wallets!.adminUrl, path: "/healthz", normal: async () => (await fetch(`${wallets!.adminUrl}/healthz`)).status }));
  slowClientSuite("an admin port", () => ({ url: admin!.url, path: "/metrics", normal: async () => (await fetch(`${admin!.url}/metrics`)).status }));
});
