// The chain client of one facilitator: viem over one or more RPC endpoints with fallback,
// short timeouts, a metric and a span for every RPC round trip, and a chain-id check before
// anything is served; `rpc` calls the same endpoints without viem's layers, for the hot path.
// Endpoints are named by host only: provider URLs often embed API keys.
import { AsyncLocalStorage } from "node:async_hooks";
import { SpanKind } from "@opentelemetry/api";
import { Pool } from "undici";
import { ExecutionRevertedError, HttpRequestError, RpcRequestError, TimeoutError, createPublicClient, defineChain, fallback, http, type Chain, type PublicClient, type Transport } from "viem";
import { endpointName } from "../platform/logger.ts";
import type { Metrics } from "../platform/metrics.ts";
import { withSpan } from "../platform/tracing.ts";

export interface ChainClientOptions {
  chainId: number;
  rpcUrls: string[];
  metrics?: Metrics;
  /** How often receipts and blocks are polled, in ms. */
  pollingIntervalMs?: number;
  rpcTimeoutMs?: number;
}

export interface ChainClient {
  chain: Chain;
  client: PublicClient;
  /**
   * A JSON-RPC call straight to the endpoints (params as the node takes them: hex strings): for
   * the hot path, where viem's formatting and transport layers cost more than the call. A failure
   * for want of an answer is noted in `watch` when given, else in the current watchRpc.
   */
  rpc<T = unknown>(method: string, params: unknown[], watch?: RpcWatch): Promise<T>;
  /** Safe names of the endpoints (host:port), for logs and metrics. */
  endpoints: string[];
}

/** The JSON-RPC method of a request body viem wrote (`{"jsonrpc":"2.0","id":…,"method":"…"`), without parsing it all. */
function rpcMethodOf(body: unknown): string {
  const text = String(body);
  if (text.startsWith("[")) return "batch";
  return /"method":"([a-zA-Z0-9_]{1,64})"/.exec(text)?.[1] ?? "unknown";
}

/**
 * One RPC endpoint over an undici keep-alive pool: every JSON-RPC round trip, viem's or a direct
 * one (ChainClient.rpc), is posted here and recorded as a metric and a client span. Node's WHATWG
 * fetch costs about 0.7 ms of CPU per call here, a pool request about 0.2 ms.
 */
function createEndpoint(url: string, network: string, metrics?: Metrics) {
  const target = new URL(url);
  const pool = new Pool(target.origin, { connections: 32, keepAliveTimeout: 30_000 });
  const path = `${target.pathname}${target.search}`;
  const name = endpointName(url);
  const labels = { network, endpoint: name };
  async function post(body: string, method: string, init: { headers?: Record<string, string>; signal?: AbortSignal; timeoutMs?: number }) {
    return withSpan(`rpc ${method}`, { "rpc.system": "jsonrpc", "rpc.method": method, "x402.network": network, "x402.rpc.endpoint": name }, async () => {
      const end = metrics?.rpcDuration.startTimer(labels);
      let result = "error";
      try {
        const res = await pool.request({ path, method: "POST", headers: init.headers ?? JSON_HEADERS, body, signal: init.signal, headersTimeout: init.timeoutMs, bodyTimeout: init.timeoutMs });
        const text = await res.body.text();
        // A JSON-RPC error is seen without parsing the body.
        result = res.statusCode < 200 || res.statusCode >= 300 ? `http_${res.statusCode}` : text.includes('"error"') ? "rpc_error" : "ok";
        return { status: res.statusCode, headers: res.headers, text };
      } finally {
        end?.();
        metrics?.rpcRequests.inc({ ...labels, method, result });
      }
    }, SpanKind.CLIENT);
  }
  // viem reads only status, headers and text: a minimal response object is all it needs.
  const fetchFn = (async (_input: unknown, init?: RequestInit) => {
    const body = init?.body as string;
    const res = await post(body, rpcMethodOf(body), { headers: (init?.headers ?? {}) as Record<string, string>, signal: init?.signal ?? undefined });
    const header = (h: string) => {
      const v = res.headers[h.toLowerCase()];
      return Array.isArray(v) ? v.join(", ") : (v ?? null);
    };
    return { ok: res.status >= 200 && res.status < 300, status: res.status, statusText: "", headers: { get: header }, body: null, text: async () => res.text, json: async () => JSON.parse(res.text) };
  }) as unknown as typeof fetch;
  return { url, name, post, fetchFn };
}

const JSON_HEADERS = { "content-type": "application/json" };

/**
 * True when an error says "the provider did not give an answer": an HTTP error status, a dropped
 * or refused connection, an unparsable body, a timeout, a rate limit (-32005, 429, -32007) or an
 * internal error of the provider (-32603, -32002). Not an answer about the chain (a revert, a
 * transaction the node rejects with its own code). A transaction sent with this outcome may or may
 * not be on its way: it is sent again, its nonce never filled. Walks the cause chain.
 */
export function isRpcUnavailable(e: unknown): boolean {
  for (let err = e as { name?: string; code?: unknown; cause?: unknown } | undefined, depth = 0; err && depth < 10; err = err.cause as typeof err, depth++) {
    if (err.name === "HttpRequestError" || err.name === "TimeoutError") return true;
    if (typeof err.code === "number" && [-32005, 429, -32007, -32603, -32002].includes(err.code)) return true;
  }
  return false;
}

// A request's RPC watch: mechanisms swallow many RPC errors into payment-level reasons (a failed
// simulation reads as "simulation failed"), so the transport notes, in the context of the request
// that made the call, that the provider failed after the transport's own retry.
export interface RpcWatch {
  failed: boolean;
}
const watches = new AsyncLocalStorage<RpcWatch>();

/** Notes a failure in a request's watch (by default the current one): for a shared promise (a cache) whose call another request made. */
export function noteRpcFailure(e: unknown, watch = watches.getStore()): void {
  if (watch && isRpcUnavailable(e)) watch.failed = true;
}

/** Runs fn: its value or its error, and whether any RPC call it made failed for want of an answer. */
export async function watchRpc<T>(fn: () => Promise<T>): Promise<{ failed: boolean; value?: T; error?: unknown }> {
  const watch = { failed: false };
  try {
    const value = await watches.run(watch, fn);
    return { failed: watch.failed, value };
  } catch (error) {
    return { failed: watch.failed || isRpcUnavailable(error), error };
  }
}

function watched(transport: Transport): Transport {
  return (params) => {
    const t = transport(params);
    const request: typeof t.request = async (args, options) => {
      try {
        return await t.request(args, options);
      } catch (e) {
        noteRpcFailure(e);
        throw e;
      }
    };
    return { ...t, request };
  };
}

export function createChainClient(opts: ChainClientOptions): ChainClient {
  if (opts.rpcUrls.length === 0) throw new Error("at least one RPC URL is required");
  const network = `eip155:${opts.chainId}`;
  const chain = defineChain({
    id: opts.chainId,
    name: network,
    nativeCurrency: { name: "Ether", symbol: "ETH", decimals: 18 },
    rpcUrls: { default: { http: [] } },
  });
  const timeoutMs = opts.rpcTimeoutMs ?? 10_000;
  const endpoints = opts.rpcUrls.map((url) => createEndpoint(url, network, opts.metrics));
  const transports = endpoints.map((e) => http(e.url, { timeout: timeoutMs, retryCount: 1, fetchFn: e.fetchFn }));
  const client = createPublicClient({
    chain,
    transport: watched(transports.length === 1 ? transports[0]! : fallback(transports, { rank: false })),
    pollingInterval: opts.pollingIntervalMs ?? 250,
  }) as PublicClient;

  /** One round trip to one endpoint: its result, or the error viem's transport would raise. */
  async function once(endpoint: (typeof endpoints)[number], request: { method: string }, body: string): Promise<unknown> {
    let res: Awaited<ReturnType<typeof endpoint.post>>;
    try {
      res = await endpoint.post(body, request.method, { timeoutMs });
    } catch (e) {
      const code = (e as { code?: string }).code;
      if (code === "UND_ERR_HEADERS_TIMEOUT" || code === "UND_ERR_BODY_TIMEOUT") throw new TimeoutError({ body: request, url: endpoint.url });
      throw new HttpRequestError({ body: request, cause: e as Error, details: (e as Error).message, url: endpoint.url });
    }
    let reply: { result?: unknown; error?: { code: number; message: string } };
    try {
      reply = JSON.parse(res.text) as typeof reply;
    } catch {
      reply = {};
    }
    if (res.status < 200 || res.status >= 300 || typeof reply !== "object" || reply === null || !("result" in reply || "error" in reply)) {
      throw new HttpRequestError({ body: request, details: res.text.slice(0, 200), status: res.status, url: endpoint.url });
    }
    if (reply.error) throw new RpcRequestError({ body: request, error: reply.error, url: endpoint.url });
    return reply.result;
  }

  /**
   * A JSON-RPC call without viem's transport stack: on the verify path its retry, dedupe, timeout
   * and batching layers cost more CPU than the call. Same endpoints, metrics and spans, and viem's
   * error classes (isRpcUnavailable and messages read them alike). As viem's fallback does, an
   * endpoint's failure passes the call to the next one, except a revert (an answer about the
   * chain); a round where no endpoint answered is tried once more, as the transport's one retry.
   */
  async function rpc<T>(method: string, params: unknown[], watch?: RpcWatch): Promise<T> {
    const request = { jsonrpc: "2.0", id: ++lastId, method, params };
    const body = JSON.stringify(request);
    let error: unknown;
    for (let round = 0; round < 2; round++) {
      if (round > 0) await sleep(RETRY_DELAY_MS);
      for (const endpoint of endpoints) {
        try {
          return (await once(endpoint, request, body)) as T;
        } catch (e) {
          error = e;
          if (isRevert(e)) break;
        }
      }
      if (!isRpcUnavailable(error)) break;
    }
    noteRpcFailure(error, watch);
    throw error;
  }
  return { chain, client, rpc, endpoints: endpoints.map((e) => e.name) };
}

let lastId = 0;
const RETRY_DELAY_MS = 150;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
/** A call the node executed and reverted: the same answer from any endpoint (viem's fallback throws it too). */
const isRevert = (e: unknown) => e instanceof RpcRequestError && (e.code === 3 || ExecutionRevertedError.nodeMessage.test(e.details));

/** The chain id the RPC reports, or an error that names endpoints by host only. */
export async function reportedChainId(chain: ChainClient): Promise<number> {
  try {
    return await chain.client.getChainId();
  } catch (e) {
    throw new Error(`RPC ${chain.endpoints.join(", ")} did not answer eth_chainId: ${(e as Error).name}`);
  }
}

/** Refuses to serve a network whose RPC reports another chain. */
export async function assertChainId(chain: ChainClient): Promise<void> {
  const reported = await reportedChainId(chain);
  if (reported !== chain.chain.id) {
    throw new Error(`RPC ${chain.endpoints.join(", ")} reports chain id ${reported}, but this facilitator serves eip155:${chain.chain.id}`);
  }
}
