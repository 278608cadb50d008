// Every row of the service contract's error table, against the real router and facilitators.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { mkdtemp, writeFile } from "node:fs/promises";
import { createServer } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pino } from "pino";
import { startTestDevnet } from "./helpers/devnet.ts";
import { postJson, serviceShape, signEip3009 } from "./helpers/payments.ts";
import { until } from "./helpers/wait.ts";
import { startRouterService } from "../services/router/service.ts";
import type { RunningDevnet } from "../services/devnet/devnet.ts";

let devnet: RunningDevnet;
const PAIRS = ["batch-settlement@eip155:56", "batch-settlement@eip155:8453", "exact@eip155:56", "exact@eip155:8453", "upto@eip155:56", "upto@eip155:8453"];
let base: string; // ends in /v2
let origin: string;

beforeAll(async () => {
  devnet = await startTestDevnet(["eip155:8453", "eip155:56"]);
  base = devnet.info.routerUrl;
  origin = new URL(base).origin;
});
afterAll(() => devnet?.stop());

function expectErrorBody(json: unknown, code: string) {
  expect(json).toBeTypeOf("object");
  expect(Object.keys(json as object)).toEqual(["error"]);
  const error = (json as { error: unknown }).error;
  expect(error).toBeTypeOf("string");
  expect(error).toMatch(new RegExp(`^${code}: \\S.*`));
}

async function validBody() {
  const net = devnet.info.networks.find((n) => n.network === "eip155:8453")!;
  const spec = { network: net.network, chainId: net.chainId, asset: net.assets[0]!, payerKey: devnet.info.payers[0]!.privateKey, payTo: devnet.info.receivers[0]!.address, amount: 1000n };
  return serviceShape(spec, await signEip3009(spec));
}

describe("service contract: paths and methods", () => {
  it.each(["/v2", "/v2/", "/", "/v2/unknown", "/v2/verify/extra", "/health", "/v2/health"])("GET %s is 404 with the error body", async (path) => {
    const r = await postJson(`${origin}${path}`, undefined, { method: "GET" });
    expect(r.status).toBe(404);
    expectErrorBody(r.json, "not_found");
  });

  it.each([
    ["GET", "/v1/supported"],
    ["POST", "/v1/verify"],
    ["POST", "/v1/settle"],
    ["GET", "/v1"],
  ])("%s %s (v1) is 404", async (method, path) => {
    const r = await postJson(`${origin}${path}`, await validBody(), { method });
    expect(r.status).toBe(404);
    expectErrorBody(r.json, "not_found");
  });

  it.each(["verify", "settle"])("GET /v2/%s is 405 with Allow: POST", async (action) => {
    const r = await postJson(`${base}/${action}`, undefined, { method: "GET" });
    expect(r.status).toBe(405);
    expect(r.headers.get("allow")).toBe("POST");
    expectErrorBody(r.json, "method_not_allowed");
  });

  it("GET /v2/supported lists the three schemes of each routed network, upto with its facilitator address", async () => {
    // Once the router has probed its facilitators (at start, then every few seconds), it also publishes their confirmation policies.
    const r = await until(async () => {
      const answer = await postJson(`${base}/supported`, undefined, { method: "GET" });
      return answer.json.confirmationPolicy ? answer : undefined;
    }, "the router's first probe of its facilitators", 30_000);
    expect(r.status).toBe(200);
    expect(Object.keys(r.json.confirmationPolicy as object).sort()).toEqual([...new Set(PAIRS.map((p) => p.split("@")[1]!))].sort());
    const kinds = r.json.kinds as { scheme: string; network: string; x402Version: number; extra?: Record<string, unknown> }[];
    expect(kinds.map((k) => `${k.scheme}@${k.network}@${k.x402Version}`).sort()).toEqual(PAIRS.map((p) => `${p}@2`));
    for (const k of kinds) {
      const signer = devnet.info.networks.find((n) => n.network === k.network)!.signers[0];
      if (k.scheme === "upto") expect(k.extra).toEqual({ facilitatorAddress: signer });
      else expect(k.extra).toBeUndefined(); // extra only for upto (no receiverAuthorizer unless configured)
    }
    expect(r.json.extensions).toEqual(["eip2612GasSponsoring", "erc20ApprovalGasSponsoring", "payment-identifier", "settlement-status", "bazaar"]); // the devnet sponsors approvals; its facilitators serve the status API, its router the discovery catalog
    const signers = (r.json.signers as Record<string, string[]>)["eip155:*"];
    expect(signers).toEqual(expect.arrayContaining(devnet.info.networks.flatMap((n) => n.signers)));
  });
});

describe("service contract: request-level errors are 400 with one error field", () => {
  it("a forwarded answer says in Server-Timing how long the facilitator took (within the caller's time), byte for byte the facilitator's body", async () => {
    const body = await validBody();
    const t0 = performance.now();
    const r = await postJson(`${base}/verify`, body);
    const total = performance.now() - t0;
    expect(r.json).toMatchObject({ isValid: true });
    const upstream = /^upstream;dur=(\d+\.\d\d)$/.exec(r.headers.get("server-timing") ?? "");
    expect(upstream, String(r.headers.get("server-timing"))).not.toBeNull();
    expect(Number(upstream![1])).toBeGreaterThan(0);
    expect(Number(upstream![1])).toBeLessThanOrEqual(total);
    const net = devnet.info.networks.find((n) => n.network === "eip155:8453")!;
    const direct = await postJson(`${net.facilitatorUrl}/verify`, body);
    expect(r.json).toEqual(direct.json);
  });

  it("an unroutable pair lists every registered pair as scheme@network", async () => {
    const body = await validBody();
    for (const [scheme, network] of [
      ["streaming", "eip155:8453"],
      ["exact", "eip155:1"],
      ["batch-settlement", "eip155:42161"],
    ]) {
      const r = await postJson(`${base}/verify`, { ...body, paymentRequirements: { ...body.paymentRequirements, scheme, network } });
      expect(r.status).toBe(400);
      expectErrorBody(r.json, "unsupported_scheme_network");
      const detail = (r.json.error as string).split("registered pairs: ")[1]!;
      expect(detail.split(", ").sort()).toEqual(PAIRS);
      expect(r.json.error).toContain(`${scheme}@${network}`);
    }
  });

  it("a top-level x402Version without one inside paymentPayload fails version detection", async () => {
    const body = await validBody();
    const { x402Version: _drop, ...payload } = body.paymentPayload;
    for (const action of ["verify", "settle"]) {
      const r = await postJson(`${base}/${action}`, { x402Version: 2, paymentPayload: payload, paymentRequirements: body.paymentRequirements });
      expect(r.status).toBe(400);
      expectErrorBody(r.json, "unsupported_version");
    }
  });

  it("malformed JSON is 400 invalid_json", async () => {
    for (const raw of ["{", "not json", '{"paymentPayload": }', "\u0000"]) {
      const r = await postJson(`${base}/verify`, undefined, { raw });
      expect(r.status).toBe(400);
      expectErrorBody(r.json, "invalid_json");
    }
  });

  it.each([
    ["empty body", ""],
    ["null", "null"],
    ["a number", "12"],
    ["an array", "[]"],
  ])("%s is a 400", async (_name, raw) => {
    const r = await postJson(`${base}/settle`, undefined, { raw });
    expect(r.status).toBe(400);
    expectErrorBody(r.json, "(invalid_json|invalid_request)");
  });

  it("wrong types, missing fields, huge numbers and non-hex addresses are 400 naming the field", async () => {
    const body = await validBody();
    const cases: [string, unknown, string][] = [
      ["paymentRequirements.payTo", { ...body, paymentRequirements: { ...body.paymentRequirements, payTo: "alice" } }, "invalid_request"],
      ["paymentRequirements.asset", { ...body, paymentRequirements: { ...body.paymentRequirements, asset: 5 } }, "invalid_request"],
      ["paymentRequirements.maxAmountRequired", { ...body, paymentRequirements: { ...body.paymentRequirements, maxAmountRequired: "1e400" } }, "invalid_request"],
      ["paymentRequirements.maxAmountRequired", { ...body, paymentRequirements: { ...body.paymentRequirements, maxAmountRequired: "9".repeat(90) } }, "invalid_request"],
      ["paymentRequirements.maxTimeoutSeconds", { ...body, paymentRequirements: { ...body.paymentRequirements, maxTimeoutSeconds: "60" } }, "invalid_request"],
      ["paymentRequirements.network", { ...body, paymentRequirements: { ...body.paymentRequirements, network: null } }, "invalid_request"],
      ["paymentRequirements", { paymentPayload: body.paymentPayload }, "invalid_request"],
      ["paymentPayload", { paymentRequirements: body.paymentRequirements }, "invalid_request"],
      ["paymentPayload.payload.authorization.from", { ...body, paymentPayload: { ...body.paymentPayload, payload: { ...body.paymentPayload.payload, authorization: { ...(body.paymentPayload.payload as { authorization: object }).authorization, from: "0xZZ" } } } }, "invalid_payload"],
      ["paymentPayload.payload.authorization.value", { ...body, paymentPayload: { ...body.paymentPayload, payload: { ...body.paymentPayload.payload, authorization: { ...(body.paymentPayload.payload as { authorization: object }).authorization, value: "1".repeat(100) } } } }, "invalid_payload"],
      ["paymentPayload.payload.signature", { ...body, paymentPayload: { ...body.paymentPayload, payload: { ...body.paymentPayload.payload, signature: 42 } } }, "invalid_payload"],
      ["paymentPayload.payload.signature", { ...body, paymentPayload: { ...body.paymentPayload, payload: {} } }, "invalid_payload"],
    ];
    for (const [field, bad, code] of cases) {
      for (const action of ["verify", "settle"]) {
        const r = await postJson(`${base}/${action}`, bad);
        expect(r.status, `${action} ${field}`).toBe(400);
        expectErrorBody(r.json, code);
        expect(r.json.error).toContain(field);
      }
    }
  });

  it("amount and maxAmountRequired that differ are refused", async () => {
    const body = await validBody();
    const r = await postJson(`${base}/verify`, { ...body, paymentRequirements: { ...body.paymentRequirements, amount: "1" } });
    expect(r.status).toBe(400);
    expectErrorBody(r.json, "amount_mismatch");
  });

  it("a body over the size limit is 413", async () => {
    const body = await validBody();
    const r = await postJson(`${base}/verify`, { ...body, padding: "x".repeat(200 * 1024) });
    expect(r.status).toBe(413);
    expectErrorBody(r.json, "payload_too_large");
  });

  it("a facilitator that cannot be reached is 503 with the error body", async () => {
    const dir = await mkdtemp(join(tmpdir(), "x402-router-"));
    const table = join(dir, "routing.json");
    await writeFile(table, JSON.stringify({ backends: [{ network: "eip155:8453", url: "http://127.0.0.1:9/v2", kinds: [{ x402Version: 2, scheme: "exact", network: "eip155:8453" }] }] }));
    const router = await startRouterService({ routingTablePath: table, host: "127.0.0.1", port: 0 }, pino({ level: "silent" }));
    try {
      const r = await postJson(`${router.url}/verify`, await validBody());
      expect(r.status).toBe(503);
      expectErrorBody(r.json, "backend_unavailable");
    } finally {
      await router.close();
    }
  });

  it("a facilitator whose answer breaks off mid-body is 503, not 500", async () => {
    // A facilitator that dies while answering: JSON headers, half a body, then the connection is gone.
    const dying = createServer((_req, res) => {
      res.writeHead(200, { "content-type": "application/json", "content-length": "64" });
      res.write('{"isValid":tr');
      setImmediate(() => res.socket?.destroy());
    });
    await new Promise<void>((resolve) => dying.listen(0, "127.0.0.1", resolve));
    const dir = await mkdtemp(join(tmpdir(), "x402-router-"));
    const table = join(dir, "routing.json");
    const url = `http://127.0.0.1:${(dying.address() as { port: number }).port}/v2`;
    await writeFile(table, JSON.stringify({ backends: [{ network: "eip155:8453", url, kinds: [{ x402Version: 2, scheme: "exact", network: "eip155:8453" }] }] }));
    const router = await startRouterService({ routingTablePath: table, host: "127.0.0.1", port: 0 }, pino({ level: "silent" }));
    try {
      const r = await postJson(`${router.url}/verify`, await validBody());
      expect(r.status).toBe(503);
      expectErrorBody(r.json, "backend_unavailable");
    } finally {
      await router.close();
      dying.close();
    }
  });
});
