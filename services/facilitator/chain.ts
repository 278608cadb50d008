// The chain client of one facilitator: viem over one or more RPC endpoints with fallback,
// short timeouts, a metric and a span for every RPC round trip, and a chain-id check before
// anything is served. Endpoints are named by host only: provider URLs often embed API keys.
import { AsyncLocalStorage } from "node:async_hooks";
import { SpanKind } from "@opentelemetry/api";
import { Pool } from "undici";
import { createPublicClient, defineChain, fallback, http, type Chain, type PublicClient, type Transport } from "viem";
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
 * A fetch for one RPC endpoint over an undici keep-alive pool. Node's WHATWG fetch costs about
 * 0.7 ms of CPU per JSON-RPC call here, a pool request about 0.2 ms; viem reads only status,
 * headers and text, so a minimal response object is all it needs.
 */
function pooledFetch(url: string): typeof fetch {
  const target = new URL(url);
  const pool = new Pool(target.origin, { connections: 32, keepAliveTimeout: 30_000 });
  const path = `${target.pathname}${target.search}`;
  return (async (_input: unknown, init?: RequestInit) => {
    const res = await pool.request({
      path,
      method: "POST",
      headers: (init?.headers ?? {}) as Record<string, string>,
      body: init?.body as string,
      signal: init?.signal ?? undefined,
    });
    const text = await res.body.text();
    const header = (name: string) => {
      const v = res.headers[name.toLowerCase()];
      return Array.isArray(v) ? v.join(", ") : (v ?? null);
    };
    return { ok: res.statusCode >= 200 && res.statusCode < 300, status: res.statusCode, statusText: "", headers: { get: header }, body: null, text: async () => text, json: async () => JSON.parse(text) };
  }) as unknown as typeof fetch;
}

/** Records each JSON-RPC round trip as a metric and a client span. */
function instrumentedFetch(network: string, endpoint: string, fetch: typeof globalThis.fetch, metrics?: Metrics): typeof globalThis.fetch {
  return (input, init) => {
    const method = rpcMethodOf(init?.body);
    return withSpan(`rpc ${method}`, { "rpc.system": "jsonrpc", "rpc.method": method, "x402.network": network, "x402.rpc.endpoint": endpoint }, async () => {
      const end = metrics?.rpcDuration.startTimer({ network, endpoint });
      let result = "error";
      try {
        const res = await fetch(input, init);
        if (!res.ok) {
          result = `http_${res.status}`;
          return res;
        }
        // The pooled response holds its text already: look for a JSON-RPC error without parsing.
        const text = await res.text();
        result = text.includes('"error"') ? "rpc_error" : "ok";
        return res;
      } finally {
        end?.();
        metrics?.rpcRequests.inc({ network, endpoint, method, result });
      }
    }, SpanKind.CLIENT);
  };
}

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
const watches = new AsyncLocalStorage<{ failed: boolean }>();

/** Notes a failure in the current request's watch: for a shared promise (a cache) whose call another request made. */
export function noteRpcFailure(e: unknown): void {
  const watch = watches.getStore();
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
  const transports = opts.rpcUrls.map((url) =>
    http(url, { timeout: opts.rpcTimeoutMs ?? 10_000, retryCount: 1, fetchFn: instrumentedFetch(network, endpointName(url), pooledFetch(url), opts.metrics) }),
  );
  const client = createPublicClient({
    chain,
    transport: watched(transports.length === 1 ? transports[0]! : fallback(transports, { rank: false })),
    pollingInterval: opts.pollingIntervalMs ?? 250,
  }) as PublicClient;
  return { chain, client, endpoints: opts.rpcUrls.map(endpointName) };
}

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
