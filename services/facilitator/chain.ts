// The chain client of one facilitator: viem over one or more RPC endpoints with fallback,
// short timeouts, a metric and a span for every RPC round trip, and a chain-id check before
// anything is served; `rpc` calls the same endpoints without viem's layers, for the hot path.
// Endpoints are named by host only: provider URLs often embed API keys.
import { AsyncLocalStorage } from "node:async_hooks";
import { SpanKind, type SpanContext } from "@opentelemetry/api";
import { Pool } from "undici";
import { ExecutionRevertedError, HttpRequestError, RpcRequestError, TimeoutError, createPublicClient, custom, defineChain, type Chain, type PublicClient, type Transport } from "viem";
import { endpointName } from "../platform/logger.ts";
import type { Metrics } from "../platform/metrics.ts";
import { activeSpanContext, withSpan } from "../platform/tracing.ts";
import { describeRevertData, revertDataOf } from "./settlement/reverts.ts";

export interface ChainClientOptions {
  chainId: number;
  rpcUrls: string[];
  metrics?: Metrics;
  /** How often receipts and blocks are polled, in ms. */
  pollingIntervalMs?: number;
  rpcTimeoutMs?: number;
  /** Calls sent together as one JSON-RPC batch at most (1: never batch). */
  rpcMaxBatch?: number;
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

/**
 * One RPC endpoint over an undici keep-alive pool: every JSON-RPC round trip, viem's or a direct
 * one (ChainClient.rpc), is posted here and recorded as a metric and a client span. Node's WHATWG
 * fetch costs about 0.7 ms of CPU per call here, a pool request about 0.2 ms.
 */
function createEndpoint(url: string, network: string, metrics?: Metrics) {
  const target = new URL(url);
  const pool = new Pool(target.origin, { connections: POOL_CONNECTIONS, keepAliveTimeout: 30_000 });
  // Calls the node holds until a block (synchronous sends) go over connections of their own: held
  // for seconds, they would leave a burst's quick calls half the pool.
  const heldPool = new Pool(target.origin, { connections: HELD_CONNECTIONS, keepAliveTimeout: 30_000 });
  // Quick round trips on their way, and who wants to hear when one ends (the batcher: see createBatcher).
  let inFlight = 0;
  const onSettled = new Set<() => void>();
  const path = `${target.pathname}${target.search}`;
  const name = endpointName(url);
  const labels = { network, endpoint: name };
  /** `calls`: the methods of a batch's calls (each counted in x402_rpc_calls_total); `method` alone otherwise. */
  async function post(body: string, method: string, init: { headers?: Record<string, string>; signal?: AbortSignal; timeoutMs?: number; links?: readonly SpanContext[]; calls?: readonly string[] }) {
    if (metrics) {
      if (init.calls) for (const call of init.calls) metrics.rpcCalls.inc({ ...labels, method: call });
      else metrics.rpcCalls.inc({ ...labels, method });
    }
    return withSpan(`rpc ${method}`, { "rpc.system": "jsonrpc", "rpc.method": method, "x402.network": network, "x402.rpc.endpoint": name }, async () => {
      const end = metrics?.rpcDuration.startTimer(labels);
      let result = "error";
      const held = HELD_METHODS.has(method);
      if (!held) inFlight++;
      try {
        const res = await (held ? heldPool : pool).request({ path, method: "POST", headers: init.headers ?? JSON_HEADERS, body, signal: init.signal, headersTimeout: init.timeoutMs, bodyTimeout: init.timeoutMs });
        const text = await res.body.text();
        // A JSON-RPC error is seen without parsing the body.
        result = res.statusCode < 200 || res.statusCode >= 300 ? `http_${res.statusCode}` : text.includes('"error"') ? "rpc_error" : "ok";
        return { status: res.statusCode, headers: res.headers, text };
      } finally {
        if (!held) inFlight--;
        end?.();
        metrics?.rpcRequests.inc({ ...labels, method, result });
        for (const f of onSettled) f();
      }
    }, SpanKind.CLIENT, init.links);
  }
  return { url, name, post, inFlight: () => inFlight, onSettled };
}

/** Connections to one RPC endpoint for calls answered at once, and for calls the node holds until a block. */
const POOL_CONNECTIONS = 32;
const HELD_CONNECTIONS = 16;
const HELD_METHODS = new Set(["eth_sendRawTransactionSync"]);

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

/** Methods every node serves: "method not found" for one of them is a broken provider, not an answer (eth_simulateV1 and fee helpers are optional). */
const REQUIRED_METHODS = new Set(["eth_call", "eth_estimateGas", "eth_getCode", "eth_getBalance", "eth_getTransactionCount", "eth_blockNumber", "eth_chainId", "eth_getBlockByNumber", "eth_getTransactionReceipt", "eth_getTransactionByHash", "eth_sendRawTransaction", "eth_gasPrice", "eth_getLogs"]);

const NOT_YET_VALID = /not yet valid|AuthorizationNotYetValid|PaymentTooEarly/i;

/**
 * True when a call reverted because the payment's time has not come on the chain (EIP-3009 "authorization
 * is not yet valid", the Permit2 proxies' PaymentTooEarly). Every payment's validAfter is checked
 * against our clock before it is simulated, so this says the provider's head is behind the clock
 * (an automining node left idle, a lagging replica behind a load balancer): a judgment of a past
 * state, not of the payment, whose transaction would be mined in a later block.
 */
export function isHeadBehindPayment(e: unknown): boolean {
  const data = revertDataOf(e);
  if (data && NOT_YET_VALID.test(describeRevertData(data))) return true;
  for (let err = e as { details?: unknown; cause?: unknown } | undefined, depth = 0; err && depth < 10; err = err.cause as typeof err, depth++) {
    if (typeof err.details === "string" && /revert/i.test(err.details) && NOT_YET_VALID.test(err.details)) return true;
  }
  return false;
}

/** A failure that says nothing about the payment: no answer, a node without a method every node serves, or a head behind the payment's time. */
function isNoVerdict(e: unknown, method?: string): boolean {
  if (isRpcUnavailable(e) || isHeadBehindPayment(e)) return true;
  return method !== undefined && REQUIRED_METHODS.has(method) && e instanceof RpcRequestError && e.code === -32601;
}

// A request's RPC watch: mechanisms swallow many RPC errors into payment-level reasons (a failed
// simulation reads as "simulation failed"), so the transport notes, in the context of the request
// that made the call, that the provider failed after the transport's own retry, or judged the
// payment on a head behind our clock.
export interface RpcWatch {
  failed: boolean;
}
const watches = new AsyncLocalStorage<RpcWatch>();

/**
 * Notes a failure in a request's watch (by default the current one): for a shared promise (a cache)
 * whose call another request made. `method`: the JSON-RPC method that failed, when known.
 */
export function noteRpcFailure(e: unknown, watch = watches.getStore(), method?: string): void {
  if (watch && isNoVerdict(e, method)) watch.failed = true;
}

/** Runs fn: its value or its error, and whether any RPC call it made failed for want of an answer. */
export async function watchRpc<T>(fn: () => Promise<T>): Promise<{ failed: boolean; value?: T; error?: unknown }> {
  const watch = { failed: false };
  try {
    const value = await watches.run(watch, fn);
    return { failed: watch.failed, value };
  } catch (error) {
    return { failed: watch.failed || isNoVerdict(error), error };
  }
}

function watched(transport: Transport): Transport {
  return (params) => {
    const t = transport(params);
    const request: typeof t.request = async (args, options) => {
      try {
        return await t.request(args, options);
      } catch (e) {
        noteRpcFailure(e, undefined, args.method);
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
  // viem's actions go through the same path as direct calls (rpc below: its endpoints in order,
  // its one retry, its batches), so a burst's receipts, sends and estimates share round trips too.
  const client = createPublicClient({
    chain,
    transport: watched(custom({ request: ({ method, params }) => rpc(method, (params as unknown[] | undefined) ?? []) }, { retryCount: 0 })),
    pollingInterval: opts.pollingIntervalMs ?? 250,
  }) as PublicClient;

  type Endpoint = (typeof endpoints)[number];
  interface Call {
    request: { id: number; method: string };
    body: string;
    /** Set once a batch it was in failed as a whole: its later attempts go alone, not with the same neighbours again. */
    alone?: boolean;
    /** How many times it was posted (alone or in a batch), retries and other endpoints included. */
    posts?: number;
  }

  /** A failed round trip as viem's transport raises it, for one call (an error names its own call only, never a batch's others). */
  function transportError(e: unknown, endpoint: Endpoint, call: Call): Error {
    const { code, name } = e as { code?: string; name?: string };
    if (code === "UND_ERR_HEADERS_TIMEOUT" || code === "UND_ERR_BODY_TIMEOUT" || name === "TimeoutError") return new TimeoutError({ body: call.request, url: endpoint.url });
    return new HttpRequestError({ body: call.request, cause: e as Error, details: (e as Error).message, url: endpoint.url });
  }

  /** A call's result from its JSON-RPC answer, or the error viem's transport would raise for it. */
  function resultOf(endpoint: Endpoint, call: Call, status: number, reply: unknown, details: string): unknown {
    const answer = reply as { result?: unknown; error?: { code: number; message: string } } | null;
    if (status < 200 || status >= 300 || typeof answer !== "object" || answer === null || !("result" in answer || "error" in answer)) {
      throw new HttpRequestError({ body: call.request, details, status, url: endpoint.url });
    }
    if (answer.error) throw new RpcRequestError({ body: call.request, error: answer.error, url: endpoint.url });
    return answer.result;
  }

  /**
   * One HTTP round trip within the call's timeout as a whole (undici's own bounds are per gap
   * between chunks: a provider trickling its answer would hold the call without end).
   */
  function post(endpoint: Endpoint, body: string, method: string, batch?: { links: readonly SpanContext[]; calls: readonly string[] }) {
    return endpoint.post(body, method, { timeoutMs, signal: AbortSignal.timeout(timeoutMs), links: batch?.links, calls: batch?.calls });
  }

  /** One call in its own round trip. */
  async function once(endpoint: Endpoint, call: Call): Promise<unknown> {
    let res: Awaited<ReturnType<Endpoint["post"]>>;
    call.posts = (call.posts ?? 0) + 1;
    try {
      res = await post(endpoint, call.body, call.request.method);
    } catch (e) {
      throw transportError(e, endpoint, call);
    }
    return resultOf(endpoint, call, res.status, parseJson(res.text), res.text.slice(0, 200));
  }

  // Calls made in the same turn of the event loop (concurrent verifications) share one round trip
  // to an endpoint as a JSON-RPC batch: one request to write and one answer to read instead of one
  // per call, which at a few hundred verifications a second is most of the RPC client's CPU. Only
  // quick reads are batched (a batch's answer waits for its slowest call), at most maxBatch per
  // round trip. What a batch's answer is trusted for: a result or a revert under the id of a call
  // it holds. Anything else sends the calls again one by one, so no call's verdict ever depends on
  // its neighbours: a batch that failed whole (its calls' next attempts go alone), an answer with
  // an id the batch did not send or twice (a gateway renumbering calls), another per-call error (a
  // provider's batch cap or size limit). An endpoint that answers a batch with a JSON-RPC error of
  // its own, or with none of the batch's ids, gets single calls for the next ten minutes.
  const maxBatch = opts.rpcMaxBatch ?? DEFAULT_MAX_BATCH;
  function createBatcher(endpoint: Endpoint) {
    /** A queued call, with the span of the request it is for (the batch's span links to each). */
    type Entry = { call: Call; resolve: (v: unknown) => void; reject: (e: unknown) => void; span?: SpanContext };
    let queue: Entry[] = [];
    let refusedUntil = 0;
    const alone = (b: Entry) => void once(endpoint, b.call).then(b.resolve, b.reject);
    // With every connection busy (a burst), calls wait here rather than one by one in the pool's
    // queue: the ones that come meanwhile join them, and the next round trip to end sends them as
    // one batch. Below that, a call waits for the end of its event-loop turn only.
    endpoint.onSettled.add(() => queue.length > 0 && flush());
    const flush = () => {
      if (queue.length === 0 || (queue.length < maxBatch && endpoint.inFlight() >= POOL_CONNECTIONS)) return;
      const batch = queue;
      queue = [];
      if (batch.length === 1) alone(batch[0]!);
      else if (batch.length > 1) sendBatch(batch).catch(() => batch.forEach(alone)); // (sendBatch settles every entry itself; this is the backstop)
    };
    async function sendBatch(batch: Entry[]) {
      let res: Awaited<ReturnType<Endpoint["post"]>>;
      for (const b of batch) b.call.posts = (b.call.posts ?? 0) + 1;
      try {
        // Its span is a trace of its own, linked to each request's: it belongs to none of them alone.
        res = await post(endpoint, `[${batch.map((b) => b.call.body).join(",")}]`, "batch", { links: batch.flatMap((b) => (b.span ? [b.span] : [])), calls: batch.map((b) => b.call.request.method) });
      } catch (e) {
        for (const b of batch) {
          b.call.alone = true;
          b.reject(transportError(e, endpoint, b.call));
        }
        return;
      }
      const ok = res.status >= 200 && res.status < 300;
      const replies = ok ? parseJson(res.text) : undefined;
      if (!ok || replies === undefined) {
        // Refused whole (429, 5xx) or unreadable: no answer, as a lost round trip.
        for (const b of batch) {
          b.call.alone = true;
          b.reject(new HttpRequestError({ body: b.call.request, details: `a batch of ${batch.length} calls was not answered (HTTP ${res.status})`, status: res.status, url: endpoint.url }));
        }
        return;
      }
      if (!Array.isArray(replies)) {
        // One JSON-RPC error for the whole batch: a rate limit or an outage fails each call as
        // unavailable (the next endpoint takes them); any other error means batches are refused.
        const error = (replies as { error?: { code?: unknown; message?: unknown } } | null)?.error;
        const answer = { code: typeof error?.code === "number" ? error.code : -32603, message: typeof error?.message === "string" ? error.message : "batch refused" };
        const unavailable = isRpcUnavailable({ code: answer.code });
        if (!unavailable) refusedUntil = Date.now() + BATCH_REFUSED_MS;
        for (const b of batch) {
          b.call.alone = true;
          if (unavailable) b.reject(new RpcRequestError({ body: b.call.request, error: answer, url: endpoint.url }));
          else alone(b);
        }
        return;
      }
      const sent = new Map(batch.map((b) => [String(b.call.request.id), b]));
      const answers = new Map<string, unknown>();
      let foreign = false;
      for (const r of replies) {
        const id = (r as { id?: unknown } | null)?.id;
        const key = typeof id === "number" || typeof id === "string" ? String(id) : undefined;
        if (key === undefined || !sent.has(key) || answers.has(key)) foreign = true;
        else answers.set(key, r);
      }
      if (foreign || answers.size === 0) {
        if (answers.size === 0) refusedUntil = Date.now() + BATCH_REFUSED_MS;
        batch.forEach(alone);
        return;
      }
      for (const b of batch) {
        const answer = answers.get(String(b.call.request.id)) as { result?: unknown; error?: { code: number; message: string } } | undefined;
        if (answer === undefined || (answer.error && !isRevert(new RpcRequestError({ body: b.call.request, error: answer.error, url: endpoint.url })))) {
          alone(b); // left out, or an error that may be about the batch rather than the call: asked alone
          continue;
        }
        try {
          b.resolve(resultOf(endpoint, b.call, res.status, answer, ""));
        } catch (e) {
          b.reject(e);
        }
      }
    }
    return (call: Call): Promise<unknown> => {
      if (maxBatch <= 1 || call.alone || !BATCHED_METHODS.has(call.request.method) || refusedUntil > Date.now()) return once(endpoint, call);
      return new Promise((resolve, reject) => {
        queue.push({ call, resolve, reject, span: activeSpanContext() });
        if (queue.length === 1) setImmediate(flush);
        else if (queue.length >= maxBatch) flush();
      });
    };
  }
  const batchers = new Map(endpoints.map((e) => [e, createBatcher(e)]));

  /**
   * A JSON-RPC call without viem's transport stack: on the verify path its retry, dedupe, timeout
   * and batching layers cost more CPU than the call. Same endpoints, metrics and spans, and viem's
   * error classes (isRpcUnavailable and messages read them alike). As viem's fallback does, an
   * endpoint's failure passes the call to the next one, except a revert (an answer about the
   * chain); a round where no endpoint answered is tried once more, as the transport's one retry.
   */
  async function rpc<T>(method: string, params: unknown[], watch?: RpcWatch): Promise<T> {
    const request = { jsonrpc: "2.0", id: ++lastId, method, params };
    const call: Call = { request, body: JSON.stringify(request) };
    let error: unknown;
    for (let round = 0; round < 2; round++) {
      if (round > 0) await sleep(RETRY_DELAY_MS);
      for (const endpoint of endpoints) {
        try {
          return (await batchers.get(endpoint)!(call)) as T;
        } catch (e) {
          error = e;
          if (isRevert(e)) break;
        }
      }
      if (!isRpcUnavailable(error)) break;
    }
    noteRpcFailure(error, watch, method);
    // The answer is to a repeat: an earlier post may have reached a node (a send's "nonce too low" may
    // then be about itself: outbox-signer.ts).
    if ((call.posts ?? 0) > 1 && typeof error === "object" && error !== null) (error as { repeatedCall?: boolean }).repeatedCall = true;
    throw error;
  }
  return { chain, client, rpc, endpoints: endpoints.map((e) => e.name) };
}

// Ids start at a random point: answers are matched to calls by id, and a gateway renumbering a
// batch from 1 must not land on ids of ours.
let lastId = Math.floor(Math.random() * 2 ** 40);
/** Calls per JSON-RPC batch: providers cap batches (some at 10 or 20 calls on small plans). */
const DEFAULT_MAX_BATCH = 10;
const BATCH_REFUSED_MS = 600_000;
/**
 * Calls that answer at once: a batch's answer waits for its slowest call (never a synchronous send).
 * A plain send is among them: a burst's sends share round trips, and a send asked again alone (a
 * batch lost, an error that may be the batch's) is the same transaction, "already known" at worst.
 */
const BATCHED_METHODS = new Set(["eth_call", "eth_estimateGas", "eth_getCode", "eth_getBalance", "eth_getTransactionCount", "eth_blockNumber", "eth_chainId", "eth_getBlockByNumber", "eth_maxPriorityFeePerGas", "eth_gasPrice", "eth_getTransactionReceipt", "eth_sendRawTransaction"]);
const parseJson = (text: string): unknown => {
  try {
    return JSON.parse(text);
  } catch {
    return undefined;
  }
};
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
