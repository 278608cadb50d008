// Metrics, traces, logs and readiness, on a real chain through the real router and facilitator.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { Writable } from "node:stream";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pino } from "pino";
import { context, propagation, trace } from "@opentelemetry/api";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import { W3CTraceContextPropagator } from "@opentelemetry/core";
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } from "@opentelemetry/sdk-trace-base";
import { startAnvil, type AnvilNode } from "../services/devnet/anvil.ts";
import { setupDevnetChain } from "../services/devnet/chain-setup.ts";
import { DEVNET_MNEMONIC } from "../services/devnet/devnet.ts";
import { networkInfo } from "../services/x402/networks.ts";
import { resolveFacilitatorConfig } from "../services/facilitator/config.ts";
import { startFacilitatorService, type RunningFacilitator } from "../services/facilitator/service.ts";
import { startRouterService, type RunningRouter } from "../services/router/service.ts";
import { mnemonicToAccount } from "viem/accounts";
import { bytesToHex } from "viem";
import { postJson, serviceShape, signEip3009 } from "./helpers/payments.ts";
import { startTcpProxy, type TcpProxy } from "./helpers/tcp-proxy.ts";

const RPC_SECRET = "S3CRET-api-key-0c1d2e3f4a5b";
const exporter = new InMemorySpanExporter();
const logLines: string[] = [];
let anvil: AnvilNode;
let proxy: TcpProxy;
let facilitator: RunningFacilitator;
let router: RunningRouter;
let dir: string;
const net = networkInfo("eip155:8453")!;
const key = (i: number) => {
  const a = mnemonicToAccount(DEVNET_MNEMONIC, { addressIndex: i });
  return { address: a.address, privateKey: bytesToHex(a.getHdKey().privateKey!) };
};
const signer = key(20);
const payer = key(21);
const receiver = key(22).address;

beforeAll(async () => {
  trace.setGlobalTracerProvider(new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] }));
  context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
  propagation.setGlobalPropagator(new W3CTraceContextPropagator());
  const logger = pino(
    { level: "trace" },
    new Writable({
      write(chunk, _enc, cb) {
        logLines.push(chunk.toString());
        cb();
      },
    }),
  );

  anvil = await startAnvil({ chainId: net.chainId });
  await setupDevnetChain({ rpcUrl: anvil.rpcUrl, chainId: net.chainId, assets: net.assets, gasFunded: [signer.address], payers: [{ privateKey: payer.privateKey, permit2Approved: true }] });
  proxy = await startTcpProxy(anvil.port);
  dir = await mkdtemp(join(tmpdir(), "x402-obs-"));
  await writeFile(join(dir, "signer.key"), `${signer.privateKey}\n`);
  const config = resolveFacilitatorConfig({ network: net.network, rpcUrls: [`${proxy.url}/?apikey=${RPC_SECRET}`], signerKeyFile: join(dir, "signer.key"), port: 0, dataDir: join(dir, "db") });
  facilitator = await startFacilitatorService(config, logger.child({ service: "facilitator" }));
  await writeFile(join(dir, "routing.json"), JSON.stringify({ backends: [{ network: net.network, url: facilitator.url, kinds: facilitator.facilitator.supported().kinds, signers: facilitator.signers }] }));
  router = await startRouterService({ routingTablePath: join(dir, "routing.json"), host: "127.0.0.1", port: 0, probeIntervalMs: 100 }, logger.child({ service: "router" }));
});

afterAll(async () => {
  await router?.close();
  await facilitator?.close();
  await proxy?.close();
  await anvil?.stop();
  if (dir) await rm(dir, { recursive: true, force: true });
});

const spec = (overrides: object = {}) => ({ network: net.network, chainId: net.chainId, asset: net.assets[0]!, payerKey: payer.privateKey, payTo: receiver, amount: 4242n, ...overrides });
const metricsOf = async (adminUrl: string) => (await fetch(`${adminUrl}/metrics`)).text();
/** The value of `name{labels}` in a Prometheus text exposition, label order ignored. */
const value = (text: string, series: string) => {
  const parse = (s: string) => {
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?$/.exec(s)!;
    const labels = [...(m[2] ?? "").matchAll(/([a-zA-Z_]+)="([^"]*)"/g)].map((x) => `${x[1]}=${x[2]}`).sort();
    return `${m[1]}|${labels.join(",")}`;
  };
  const want = parse(series);
  for (const line of text.split("\n")) {
    if (line.startsWith("#") || !line) continue;
    const cut = line.lastIndexOf(" ");
    if (parse(line.slice(0, cut)) === want) return Number(line.slice(cut + 1));
  }
  return undefined;
};

describe("metrics", () => {
  it("count one verify and one settle of a payment, and a failure with its reason, on router and facilitator", async () => {
    const s = spec();
    const body = serviceShape(s, await signEip3009(s));
    expect((await postJson(`${router.url}/verify`, body)).json.isValid).toBe(true);
    expect((await postJson(`${router.url}/settle`, body)).json.success).toBe(true);
    const expired = spec();
    const bad = serviceShape(expired, await signEip3009({ ...expired, auth: { validBefore: 1n } }));
    expect((await postJson(`${router.url}/verify`, bad)).json.invalidReason).toBe("invalid_exact_evm_payload_authorization_valid_before");

    const f = await metricsOf(facilitator.adminUrl);
    const l = `network="eip155:8453",scheme="exact"`;
    expect(value(f, `x402_verify_total{${l},result="valid",reason="none",service="facilitator"}`)).toBe(1);
    expect(value(f, `x402_verify_total{${l},result="invalid",reason="invalid_exact_evm_payload_authorization_valid_before",service="facilitator"}`)).toBe(1);
    expect(value(f, `x402_settle_total{${l},result="success",reason="none",service="facilitator"}`)).toBe(1);
    expect(value(f, `x402_verify_duration_seconds_count{${l},service="facilitator"}`)).toBe(2);
    expect(value(f, `x402_settle_duration_seconds_count{${l},service="facilitator"}`)).toBe(1);
    expect(value(f, `x402_http_requests_total{service="facilitator",route="/v2/settle",status="200"}`)).toBe(1);
    // A send may share its round trip with a background read (method="batch"): counted as a call by its own method.
    expect(value(f, `x402_rpc_calls_total{network="eip155:8453",endpoint="127.0.0.1:${proxy.port}",method="eth_sendRawTransaction",service="facilitator"}`)).toBe(1);
    expect(value(f, `x402_signer_balance_wei{network="eip155:8453",signer="${signer.address}",service="facilitator"}`)).toBeGreaterThan(0);
    expect(value(f, `x402_signer_pending_transactions{network="eip155:8453",signer="${signer.address}",service="facilitator"}`)).toBe(0);
    expect(f).toContain("process_cpu_user_seconds_total");
    expect(f).not.toContain(payer.address); // payers are never labels

    const r = await metricsOf(router.adminUrl);
    expect(value(r, `x402_http_requests_total{service="router",route="/v2/verify",status="200"}`)).toBe(2);
    expect(value(r, `x402_http_requests_total{service="router",route="/v2/settle",status="200"}`)).toBe(1);
    expect(value(r, `x402_router_backend_up{network="eip155:8453",service="router"}`)).toBe(1);
    await postJson(`${router.url.replace("/v2", "")}/v1/verify`, {});
    expect(value(await metricsOf(router.adminUrl), `x402_http_requests_total{service="router",route="unmatched",status="404"}`)).toBe(1);
  });
});

describe("traces", () => {
  it("one trace for a verify spans the router, the facilitator and its RPC calls", async () => {
    exporter.reset();
    const s = spec();
    expect((await postJson(`${router.url}/verify`, serviceShape(s, await signEip3009(s)))).json.isValid).toBe(true);
    const spans = exporter.getFinishedSpans();
    const routerSpan = spans.find((x) => x.name === "router POST /v2/verify")!;
    expect(routerSpan).toBeDefined();
    const traceId = routerSpan.spanContext().traceId;
    const inTrace = spans.filter((x) => x.spanContext().traceId === traceId).map((x) => x.name);
    expect(inTrace).toContain("facilitator POST /v2/verify");
    expect(inTrace).toContain("facilitator.verify");
    expect(inTrace.filter((n) => n.startsWith("rpc ")).length).toBeGreaterThan(0);
    const facSpan = spans.find((x) => x.name === "facilitator POST /v2/verify" && x.spanContext().traceId === traceId)!;
    expect(facSpan.parentSpanContext?.spanId).toBe(routerSpan.spanContext().spanId);
  });
});

describe("traces of shared work", () => {
  it("a JSON-RPC batch serving several verifications is a trace of its own, linked to each of theirs", async () => {
    exporter.reset();
    const bodies = await Promise.all(
      Array.from({ length: 8 }, async () => {
        const s = spec();
        return serviceShape(s, await signEip3009(s));
      }),
    );
    // Verified at once in this process (as concurrent requests are): their simulations go out together.
    const answers = await Promise.all(bodies.map((b) => facilitator.facilitator.verify(b)));
    for (const a of answers) expect(a.isValid).toBe(true);
    const spans = exporter.getFinishedSpans();
    const requestTraces = new Set(spans.filter((x) => x.name === "facilitator.verify").map((x) => x.spanContext().traceId));
    expect(requestTraces.size).toBe(8);
    const batches = spans.filter((x) => x.name === "rpc batch");
    expect(batches.length).toBeGreaterThan(0);
    for (const batch of batches) {
      expect(batch.parentSpanContext).toBeUndefined();
      expect(requestTraces.has(batch.spanContext().traceId)).toBe(false);
      expect(batch.links.length).toBeGreaterThanOrEqual(2);
      for (const link of batch.links) expect(requestTraces.has(link.context.traceId)).toBe(true);
    }
  });
});

describe("secrets", () => {
  it("no private key and no RPC secret in any log line, metric or span attribute after full flows", async () => {
    const s = spec();
    const body = serviceShape(s, await signEip3009(s));
    await postJson(`${router.url}/verify`, body);
    await postJson(`${router.url}/settle`, body);
    await postJson(`${router.url}/settle`, body); // replay: a failure path
    await postJson(`${router.url}/settle`, { ...body, paymentRequirements: { ...body.paymentRequirements, asset: "0x00000000000000000000000000000000000b0b0b" } });
    await postJson(`${router.url}/verify`, "{oops");
    const haystacks = [
      logLines.join("\n"),
      await metricsOf(facilitator.adminUrl),
      await metricsOf(router.adminUrl),
      JSON.stringify(exporter.getFinishedSpans().map((x) => ({ name: x.name, attributes: x.attributes, status: x.status, events: x.events }))),
    ];
    expect(logLines.length).toBeGreaterThan(5);
    for (const text of haystacks) {
      for (const k of [signer.privateKey, payer.privateKey]) {
        expect(text.toLowerCase()).not.toContain(k.slice(2).toLowerCase());
      }
      expect(text).not.toContain(RPC_SECRET);
    }
  });
});

describe("readiness", () => {
  it("/readyz turns not-ready when the RPC is stopped and ready again when it returns; /healthz stays up", async () => {
    const ready = async () => {
      const r = await fetch(`${facilitator.adminUrl}/readyz`);
      return { status: r.status, body: (await r.json()) as { checks: Record<string, boolean> } };
    };
    expect((await ready()).status).toBe(200);
    await proxy.down();
    const down = await ready();
    expect(down.status).toBe(503);
    expect(down.body.checks.rpc_chain_id).toBe(false);
    expect((await fetch(`${facilitator.adminUrl}/healthz`)).status).toBe(200);
    await proxy.up();
    expect((await ready()).status).toBe(200);
    const r = await fetch(`${router.adminUrl}/readyz`);
    expect(await r.json()).toEqual({ status: "ready", checks: { routing_table_loaded: true } });
  });
});
