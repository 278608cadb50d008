// What the router sends its facilitators, against stub facilitators (no chain): the network it
// routes on is the one the facilitator reads (JSON.parse: the last of duplicate keys, escapes
// decoded, nothing from inside strings or other objects), the request goes on byte for byte with
// the caller's credentials, and the answer comes back byte for byte with Server-Timing.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { createServer, type IncomingHttpHeaders, type Server, type ServerResponse } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pino } from "pino";
import { startRouterService, type RunningRouter } from "../services/router/service.ts";
import { createServiceApp } from "../services/platform/http-kit.ts";
import { createMetrics } from "../services/platform/metrics.ts";
import { createRouter } from "../services/router/router.ts";
import { RequestError } from "../services/x402/errors.ts";

interface Received {
  network: string;
  method: string;
  url: string;
  headers: IncomingHttpHeaders;
  body: string;
}

const NETWORKS = ["eip155:8453", "eip155:56", "eip155:10"];
/** How the eip155:10 stand-in answers (the others answer a fixed JSON text). */
let odd: (res: ServerResponse) => void = () => undefined;
const received: Received[] = [];
const stubs: Server[] = [];
const stubUrls: string[] = [];
let router: RunningRouter;
let dir: string;

/** A facilitator stand-in for one network: records what it gets, answers with a fixed JSON text. */
async function stub(network: string): Promise<string> {
  const server = createServer((req, res) => {
    let body = "";
    req.on("data", (c: Buffer) => (body += c.toString()));
    req.on("end", () => {
      // The router's probes (GET …/supported) are not what is under test.
      if (req.method !== "GET") received.push({ network, method: req.method!, url: req.url!, headers: req.headers, body });
      if (network === "eip155:10" && req.method !== "GET") return odd(res);
      res.writeHead(200, { "content-type": "application/json" });
      res.end(`{"isValid":true,  "answeredBy":"${network}"}`);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  stubs.push(server);
  return `http://127.0.0.1:${(server.address() as { port: number }).port}/base/v2`;
}

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), "x402-router-fwd-"));
  const backends = [];
  for (const network of NETWORKS) {
    stubUrls.push(await stub(network));
    backends.push({ network, url: stubUrls.at(-1)!, kinds: [{ x402Version: 2, scheme: "exact", network }] });
  }
  await writeFile(join(dir, "routing.json"), JSON.stringify({ backends }));
  router = await startRouterService({ routingTablePath: join(dir, "routing.json"), host: "127.0.0.1", port: 0, adminPort: 0 }, pino({ level: "silent" }));
});

afterAll(async () => {
  await router?.close();
  for (const s of stubs) {
    s.closeAllConnections();
    s.close();
  }
  if (dir) await rm(dir, { recursive: true, force: true });
});

const requirements = (network: string) => `{"scheme":"exact","network":"${network}","asset":"0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913","payTo":"0x000000000000000000000000000000000000dEaD","amount":"1000","maxTimeoutSeconds":60}`;
const payload = `{"x402Version":2,"payload":{"signature":"0x"},"accepted":${requirements("eip155:8453")}}`;

/** Posts `raw` as is; returns the status, the answer's text and headers, and what the stubs received. */
async function post(raw: string, headers: Record<string, string> = {}, action = "verify") {
  received.length = 0;
  const res = await fetch(`${router.url}/${action}`, { method: "POST", headers: { "content-type": "application/json", ...headers }, body: raw });
  return { status: res.status, text: await res.text(), headers: res.headers, received: [...received] };
}

describe("the network the router routes on is the one the facilitator reads", () => {
  it.each([
    ["a duplicate network key: the last one", `{"paymentPayload":${payload},"paymentRequirements":{"scheme":"exact","network":"eip155:8453","network":"eip155:56","asset":"0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913"}}`, "eip155:56"],
    ["a duplicate network key, the other way round", `{"paymentPayload":${payload},"paymentRequirements":{"network":"eip155:56","scheme":"exact","network":"eip155:8453"}}`, "eip155:8453"],
    ["a duplicate paymentRequirements: the last one", `{"paymentRequirements":${requirements("eip155:8453")},"paymentPayload":${payload},"paymentRequirements":${requirements("eip155:56")}}`, "eip155:56"],
    ["an escaped key", `{"paymentPayload":${payload},"paymentRequirements":{"scheme":"exact","network":"eip155:8453","\\u006eetwork":"eip155:56"}}`, "eip155:56"],
    ["an escaped value", `{"paymentPayload":${payload},"paymentRequirements":{"scheme":"exact","network":"eip155:\\u0035\\u0036"}}`, "eip155:56"],
    ["the network of accepted differs", `{"paymentPayload":${payload.replace('"network":"eip155:8453"', '"network":"eip155:56"')},"paymentRequirements":${requirements("eip155:8453")}}`, "eip155:8453"],
    ["another network inside a string", `{"paymentPayload":${payload},"paymentRequirements":{"description":"\\"network\\":\\"eip155:56\\"","scheme":"exact","network":"eip155:8453","extra":{"network":"eip155:56"}}}`, "eip155:8453"],
    ["a network key nested deeper, before the real one", `{"paymentPayload":${payload},"paymentRequirements":{"extra":{"paymentRequirements":{"network":"eip155:56"}},"scheme":"exact","network":"eip155:8453"}}`, "eip155:8453"],
  ])("%s", async (_name, raw, network) => {
    const r = await post(raw);
    expect(r.status).toBe(200);
    expect(r.received.map((x) => x.network)).toEqual([network]);
    expect(JSON.parse(r.received[0]!.body).paymentRequirements.network).toBe(network);
    expect(r.received[0]!.body).toBe(raw);
  });

  it.each([
    ["paymentRequirements only under __proto__", `{"paymentPayload":${payload},"__proto__":{"paymentRequirements":${requirements("eip155:56")}}}`, "invalid_request: paymentRequirements is required"],
    ["a network only under __proto__", `{"paymentPayload":${payload},"paymentRequirements":{"scheme":"exact","__proto__":{"network":"eip155:56"}}}`, "invalid_request: paymentRequirements.network is required"],
    ["a null network after a good one", `{"paymentPayload":${payload},"paymentRequirements":{"scheme":"exact","network":"eip155:56","network":null}}`, "invalid_request: paymentRequirements.network: Expected string, received null"],
    ["an unrouted network after a routed one", `{"paymentPayload":${payload},"paymentRequirements":{"scheme":"exact","network":"eip155:56","network":"eip155:1"}}`, "unsupported_scheme_network: no facilitator for exact@eip155:1;"],
    ["a network with a trailing newline", `{"paymentPayload":${payload},"paymentRequirements":{"scheme":"exact","network":"eip155:56\\n"}}`, "invalid_request: paymentRequirements.network: expected a CAIP-2"],
    ["duplicate bodies in one", `{"paymentPayload":${payload},"paymentRequirements":${requirements("eip155:56")}}{"x":1}`, "invalid_json: "],
  ])("%s is refused, nothing forwarded", async (_name, raw, error) => {
    const r = await post(raw);
    expect(r.status).toBe(400);
    expect(JSON.parse(r.text).error).toContain(error);
    expect(r.received).toEqual([]);
  });
});

describe("what goes to the facilitator and what comes back", () => {
  it.each(["verify", "settle"])("%s: the body byte for byte, JSON, the caller's Authorization; the answer byte for byte with Server-Timing", async (action) => {
    const raw = ` {"paymentPayload":${payload},  "paymentRequirements":${requirements("eip155:56")}}\n`;
    const r = await post(raw, { authorization: "Bearer receiver-token" }, action);
    expect(r.status).toBe(200);
    expect(r.text).toBe('{"isValid":true,  "answeredBy":"eip155:56"}');
    expect(r.headers.get("content-type")).toBe("application/json; charset=utf-8");
    expect(r.headers.get("server-timing")).toMatch(/^upstream;dur=\d+\.\d\d$/);
    expect(r.received).toHaveLength(1);
    const got = r.received[0]!;
    expect([got.network, got.method, got.url, got.body]).toEqual(["eip155:56", "POST", `/base/v2/${action}`, raw]);
    expect(got.headers["content-type"]).toBe("application/json");
    expect(got.headers.authorization).toBe("Bearer receiver-token");
    expect(got.headers["x402-fleet-gas-allowance"]).toBeUndefined();
  });

  it("our own API key (x402k_…) is never forwarded; without Authorization none is sent", async () => {
    const raw = `{"paymentPayload":${payload},"paymentRequirements":${requirements("eip155:8453")}}`;
    expect((await post(raw, { authorization: "Bearer x402k_abc" })).received[0]!.headers.authorization).toBeUndefined();
    expect((await post(raw)).received[0]!.headers.authorization).toBeUndefined();
  });
});

describe("how a facilitator's answer is read", () => {
  const raw = `{"paymentPayload":${payload},"paymentRequirements":${requirements("eip155:10")}}`;

  it("an answer in many pieces, a character split between two, comes back whole", async () => {
    const answer = Buffer.from(`{"isValid":false,"invalidMessage":"${"é😀".repeat(3000)}"}`);
    odd = (res) => {
      res.writeHead(200, { "content-type": "application/json" });
      for (let i = 0; i < answer.length; i += 1001) res.write(answer.subarray(i, i + 1001));
      res.end();
    };
    const r = await post(raw);
    expect([r.status, r.text]).toEqual([200, answer.toString()]);
  });

  it("a byte order mark before the JSON is dropped, other status codes come through", async () => {
    odd = (res) => {
      res.writeHead(400, { "content-type": "application/json" });
      res.end('\ufeff{"error":"invalid_request: from the facilitator"}');
    };
    const r = await post(raw);
    expect([r.status, r.text]).toEqual([400, '{"error":"invalid_request: from the facilitator"}']);
  });

  it.each([
    ["a non-JSON answer", (res: ServerResponse) => res.writeHead(502, { "content-type": "text/html" }).end("<html>bad gateway</html>"), "backend_unavailable: the facilitator for eip155:10 answered HTTP 502 without a JSON body"],
    ["a non-JSON answer that breaks off", (res: ServerResponse) => {
      res.writeHead(502, { "content-type": "text/html", "content-length": "100" });
      res.write("<html>");
      setImmediate(() => res.socket?.destroy());
    }, "backend_unavailable: the facilitator for eip155:10 answered HTTP 502 without a JSON body"],
    ["a JSON answer that breaks off", (res: ServerResponse) => {
      res.writeHead(200, { "content-type": "application/json", "content-length": "100" });
      res.write('{"isValid":');
      setImmediate(() => res.socket?.destroy());
    }, "backend_unavailable: the facilitator for eip155:10 cannot be reached"],
    ["no answer at all", (res: ServerResponse) => res.socket?.destroy(), "backend_unavailable: the facilitator for eip155:10 cannot be reached"],
  ])("%s is a 503", async (_name, answer, error) => {
    odd = answer;
    const r = await post(raw);
    expect(r.status).toBe(503);
    expect(JSON.parse(r.text).error).toContain(error);
  });

  it("a facilitator that does not answer in time, or stops mid-body, is backend_timeout", async () => {
    const port = new URL(stubUrls[2]!).port;
    const forwarder = createRouter({ logger: pino({ level: "silent" }), metrics: createMetrics("router"), verifyTimeoutMs: 300 });
    forwarder.setTable({ backends: [{ network: "eip155:10", url: `http://127.0.0.1:${port}/base/v2`, kinds: [{ x402Version: 2, scheme: "exact", network: "eip155:10" }], signers: [], extensions: [] }] });
    try {
      for (const answer of [() => undefined, (res: ServerResponse) => res.writeHead(200, { "content-type": "application/json" }).write("{")]) {
        odd = answer;
        const error = await forwarder.verify(JSON.parse(raw), {}).then(() => undefined, (e: unknown) => e);
        expect(error).toBeInstanceOf(RequestError);
        expect((error as RequestError).body().error).toBe("backend_timeout: the facilitator for eip155:10 did not answer within 300 ms");
      }
    } finally {
      await forwarder.close();
    }
  });
});

describe("request logs", () => {
  /** A kit app logging into `lines` at `level`, with a route that succeeds and one that fails. */
  function app(level: string, lines: string[]) {
    const logger = pino({ level }, { write: (line: string) => void lines.push(line) });
    return createServiceApp({ service: "test", logger, bodyLimit: 1024, endpoints: "none" }, (a) => {
      a.get("/ok", async (request) => {
        request.log.child({ step: "inner" }).debug("inner step");
        return { ok: true };
      });
      a.get("/boom", async () => {
        throw new Error("boom");
      });
    });
  }

  it("each line a request logs carries its reqId, whatever the level", async () => {
    const lines: string[] = [];
    const a = app("debug", lines);
    await a.inject({ method: "GET", url: "/ok" });
    await a.inject({ method: "GET", url: "/boom" });
    await a.close();
    const parsed = lines.map((l) => JSON.parse(l) as { reqId?: string; msg: string; step?: string });
    const ok = parsed.filter((l) => l.reqId === parsed[0]!.reqId);
    expect(ok.map((l) => l.msg)).toEqual(["inner step", "request completed"]); // one access line per request
    expect(parsed[1]).toMatchObject({ req: { method: "GET", url: "/ok", remoteAddress: "127.0.0.1" }, res: { statusCode: 200 } });
    expect(ok[0]!.step).toBe("inner");
    const boom = parsed.filter((l) => l.reqId !== parsed[0]!.reqId);
    expect(new Set(boom.map((l) => l.reqId)).size).toBe(1);
    expect(boom[0]!.reqId).toMatch(/^req-/);
    expect(boom.map((l) => l.msg)).toEqual(["test request failed", "request completed"]);
  });

  it("at warn, a successful request logs nothing and a failure its error line with its reqId", async () => {
    const lines: string[] = [];
    const a = app("warn", lines);
    await a.inject({ method: "GET", url: "/ok" });
    expect(lines).toEqual([]);
    await a.inject({ method: "GET", url: "/boom" });
    await a.close();
    expect(lines.map((l) => JSON.parse(l) as { reqId?: string; msg: string })).toEqual([expect.objectContaining({ msg: "test request failed", reqId: expect.stringMatching(/^req-/) })]);
  });
});
