// A JSON-RPC HTTP proxy in front of a real node that injects the faults providers produce: 429
// (with and without Retry-After), 500/502/503, timeouts, malformed and truncated bodies, JSON-RPC
// error objects and connections dropped mid-response. Faults are drawn from a seeded PRNG (the
// seed is printed; RPC_FAULT_SEED replays the same draws for the same order of requests) or
// follow a per-method schedule. JSON-RPC batches are faulted as one HTTP request, except error
// objects, which replace the answers of the batch's eligible calls.
//
// Where the fault sits matters for transactions: 429, 5xx and error objects refuse the request
// before the node sees it (a rate limiter, a gateway); timeouts, bad bodies and dropped
// connections lose the answer of a request the node has already executed.
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { Socket } from "node:net";
import { prng } from "./seeded.ts";

export const FAULT_KINDS = ["http_429", "http_429_retry_after", "http_500", "http_502", "http_503", "timeout", "malformed_json", "truncated", "rpc_error", "drop"] as const;
/**
 * Drawn at random: FAULT_KINDS; by schedule only: also a node that does not know the method, and a
 * provider that refuses it in its own words (not -32601).
 */
export type FaultKind = (typeof FAULT_KINDS)[number] | "method_not_found" | "method_disallowed" | "null_result";

export interface FaultPlan {
  /** Probability (0..1) that an eligible request is faulted. */
  rate?: number;
  /** Kinds drawn from, uniformly (default: every kind). */
  kinds?: readonly FaultKind[];
  /** Only requests calling one of these methods are eligible (default: every method). */
  methods?: readonly string[];
  /** Per method: the fault of its n-th call (cycled); "ok" leaves that call to the rate. */
  schedule?: Record<string, readonly (FaultKind | "ok")[]>;
  /**
   * What a provider does with JSON-RPC batches: "refuse" answers any batch with one error object
   * (providers that serve single calls only), "omit_last" leaves the last call's answer out,
   * "string_ids" answers with each id turned into a string (as some gateways do), "renumber"
   * answers under ids 1..n instead of the calls' own, "rate_limited" answers any batch with one
   * rate-limit error (-32005), "too_large_last" answers the last call with -32003 (a size limit).
   */
  batches?: "refuse" | "omit_last" | "string_ids" | "renumber" | "rate_limited" | "too_large_last";
  /** A provider whose pending nonce counts only mined transactions: eth_getTransactionCount "pending" is asked as "latest". */
  pendingAsLatest?: boolean;
}

export interface RpcFaultProxy {
  url: string;
  seed: number;
  /** Replaces the plan; `configure({})` heals the endpoint. */
  configure(plan: FaultPlan): void;
  /** Faults injected, by kind and by kind per method. */
  injected: Record<FaultKind, number>;
  injectedByMethod: Record<string, Partial<Record<FaultKind, number>>>;
  /** Calls seen per JSON-RPC method (batch elements counted one by one). */
  calls: Record<string, number>;
  /** Per method: how far its schedule went (steps applied: a fault, or "ok"). */
  scheduled: Record<string, number>;
  /** HTTP requests seen (a batch is one), and how many of them were batches. */
  requests: { total: number; batches: number };
  /** Resolves once no request has been in flight for `quietMs` (faults that lag a request settle by then). */
  idle(quietMs: number): Promise<void>;
  close(): Promise<void>;
}

/** The body with every pending-nonce read asked of the latest block, or undefined where none is. */
function pendingAsLatest(list: RpcCall[], batch: boolean): string | undefined {
  const asked = (c: RpcCall) => c.method === "eth_getTransactionCount" && Array.isArray(c.params) && c.params[1] === "pending";
  if (!list.some(asked)) return undefined;
  const rewritten = list.map((c) => (asked(c) ? { ...c, params: [(c.params as unknown[])[0], "latest"] } : c));
  return JSON.stringify(batch ? rewritten : rewritten[0]);
}


interface RpcCall {
  jsonrpc?: string;
  id?: unknown;
  method?: string;
  params?: unknown;
}

export async function startRpcFaultProxy(opts: { upstream: string; seed?: number; plan?: FaultPlan; /** How long a `timeout` holds a request: longer than the client's timeout. */ holdMs?: number }): Promise<RpcFaultProxy> {
  const seed = opts.seed ?? (process.env.RPC_FAULT_SEED ? Number(process.env.RPC_FAULT_SEED) : Math.floor(Math.random() * 2 ** 31));
  const random = prng(seed);
  let plan: FaultPlan = opts.plan ?? {};
  const holdMs = opts.holdMs ?? 5000;
  const injected = Object.fromEntries([...FAULT_KINDS, "method_not_found", "method_disallowed", "null_result"].map((k) => [k, 0])) as Record<FaultKind, number>;
  const injectedByMethod: Record<string, Partial<Record<FaultKind, number>>> = {};
  const calls: Record<string, number> = {};
  const requests = { total: 0, batches: 0 };
  const scheduled: Record<string, number> = {};
  const sockets = new Set<Socket>();
  const timers = new Set<NodeJS.Timeout>();
  let inFlight = 0;
  let lastActivity = Date.now();

  const count = (kind: FaultKind, methods: string[]) => {
    injected[kind]++;
    for (const m of methods) (injectedByMethod[m] ??= {})[kind] = (injectedByMethod[m]![kind] ?? 0) + 1;
  };

  /** The fault for this request, if any, and which of its calls it hits (one call, or a batch's). */
  function decide(methods: string[]): { kind: FaultKind; hits: (method: string) => boolean } | undefined {
    // Every call of the request moves its method's schedule on, also behind the first fault (a
    // method that mostly rides in batches behind another would otherwise never see its faults); a
    // second fault in one request is not used up, and comes with the method's next request.
    let chosen: { kind: FaultKind; method: string } | undefined;
    for (const m of methods) {
      const schedule = plan.schedule?.[m];
      if (!schedule?.length) continue;
      const n = scheduled[m] ?? 0;
      const step = schedule[n % schedule.length]!;
      if (step !== "ok" && chosen) continue;
      scheduled[m] = n + 1;
      if (step !== "ok") chosen = { kind: step, method: m };
    }
    if (chosen) {
      const { kind, method: m } = chosen;
      return { kind, hits: (method) => method === m };
    }
    if (!plan.rate) return undefined;
    const eligible = (method: string) => !plan.methods || plan.methods.includes(method);
    if (!methods.some(eligible)) return undefined;
    // Two draws per eligible request whatever the outcome, so one seed gives one sequence.
    const hit = random() < plan.rate;
    const kinds = plan.kinds ?? FAULT_KINDS;
    const kind = kinds[Math.floor(random() * kinds.length)]!;
    return hit ? { kind, hits: eligible } : undefined;
  }

  async function forward(body: string): Promise<{ status: number; text: string }> {
    const res = await fetch(opts.upstream, { method: "POST", headers: { "content-type": "application/json" }, body });
    return { status: res.status, text: await res.text() };
  }

  const send = (res: ServerResponse, status: number, body: string, headers: Record<string, string> = {}) => {
    res.writeHead(status, { "content-type": "application/json", "content-length": Buffer.byteLength(body), ...headers });
    res.end(body);
  };

  function rpcErrors(calls: RpcCall[], batch: boolean, eligible: (c: RpcCall) => boolean, upstream?: string): string {
    const codes = [
      { code: -32005, message: "limit exceeded" },
      { code: -32603, message: "internal error" },
    ];
    const answers = upstream ? (JSON.parse(upstream) as unknown[] | Record<string, unknown>) : undefined;
    const out = calls.map((c) => {
      if (!eligible(c)) return (Array.isArray(answers) ? answers.find((a) => (a as RpcCall).id === c.id) : answers) ?? { jsonrpc: "2.0", id: c.id ?? null, result: null };
      return { jsonrpc: "2.0", id: c.id ?? null, error: codes[Math.floor(random() * codes.length)]! };
    });
    return JSON.stringify(batch ? out : out[0]);
  }

  async function handle(req: IncomingMessage, res: ServerResponse, body: string) {
    let parsed: RpcCall | RpcCall[] | undefined;
    try {
      parsed = JSON.parse(body) as RpcCall | RpcCall[];
    } catch {
      parsed = undefined;
    }
    const batch = Array.isArray(parsed);
    const list: RpcCall[] = parsed === undefined ? [] : Array.isArray(parsed) ? parsed : [parsed];
    const methods = list.map((c) => String(c.method ?? "unknown"));
    for (const m of methods) calls[m] = (calls[m] ?? 0) + 1;
    requests.total++;
    if (batch) requests.batches++;
    if (batch && plan.batches === "refuse") return send(res, 200, JSON.stringify({ jsonrpc: "2.0", id: null, error: { code: -32600, message: "batch requests are not supported" } }));
    if (batch && plan.batches === "rate_limited") return send(res, 200, JSON.stringify({ jsonrpc: "2.0", id: null, error: { code: -32005, message: "rate limited" } }));
    const decision = decide(methods);
    const fault = decision?.kind;
    const faulted = (c: RpcCall) => decision?.hits(String(c.method ?? "unknown")) ?? false;
    if (fault) count(fault, batch && fault === "rpc_error" ? methods.filter((m) => decision!.hits(m)) : methods);
    switch (fault) {
      case "http_429":
        return send(res, 429, JSON.stringify({ error: "too many requests" }));
      case "http_429_retry_after":
        return send(res, 429, JSON.stringify({ error: "too many requests" }), { "retry-after": "1" });
      case "http_500":
      case "http_502":
      case "http_503":
        return send(res, Number(fault.slice(5)), "<html><body>upstream error</body></html>", { "content-type": "text/html" });
      case "null_result":
        // A node that does not have it (a lagging replica behind a balancer): `null` for the call, as for an unknown hash.
        return send(res, 200, JSON.stringify(batch ? list.map((c) => ({ jsonrpc: "2.0", id: c.id ?? null, result: null })) : { jsonrpc: "2.0", id: list[0]?.id ?? null, result: null }));
      case "method_not_found":
        // A node that does not know the method (JSON-RPC -32601), e.g. an optional extension.
        return send(res, 200, JSON.stringify(batch ? list.map((c) => ({ jsonrpc: "2.0", id: c.id ?? null, error: { code: -32601, message: "Method not found" } })) : { jsonrpc: "2.0", id: list[0]?.id ?? null, error: { code: -32601, message: "Method not found" } }));
      case "method_disallowed": {
        // A hosted provider's refusal of a method its plan does not serve, worded its own way.
        const error = (c: RpcCall) => ({ jsonrpc: "2.0", id: c.id ?? null, error: { code: -32600, message: `Unsupported method: ${c.method} on this network. See the provider's docs for the methods served.` } });
        return send(res, 200, JSON.stringify(batch ? list.map(error) : error(list[0]!)));
      }
      case "rpc_error":
        // A batch with only some eligible calls: the others are answered by the node.
        return send(res, 200, rpcErrors(list, batch, batch ? faulted : () => true, batch && list.some((c) => !faulted(c)) ? (await forward(body)).text : undefined));
    }
    const upstream = await forward(plan.pendingAsLatest ? pendingAsLatest(list, batch) ?? body : body);
    switch (fault) {
      case undefined: {
        const answers = batch && plan.batches ? (JSON.parse(upstream.text) as RpcCall[]) : undefined;
        if (!answers) return send(res, upstream.status, upstream.text);
        const last = list.at(-1)?.id;
        const rewritten = {
          omit_last: () => answers.filter((a) => a.id !== last),
          string_ids: () => answers.map((a) => ({ ...a, id: String(a.id) })),
          renumber: () => answers.map((a, i) => ({ ...a, id: i + 1 })),
          too_large_last: () => answers.map((a) => (a.id === last ? { jsonrpc: "2.0", id: a.id, error: { code: -32003, message: "response too large" } } : a)),
        }[plan.batches as "omit_last"];
        return send(res, upstream.status, JSON.stringify(rewritten ? rewritten() : answers));
      }
      case "malformed_json":
        return send(res, 200, `<!doctype html>${upstream.text.slice(0, 20)}`);
      case "truncated": {
        const cut = upstream.text.slice(0, Math.max(1, Math.floor(upstream.text.length / 2)));
        return send(res, 200, cut);
      }
      case "drop": {
        // Headers promise the whole body; half of it goes out, then the connection dies.
        res.writeHead(200, { "content-type": "application/json", "content-length": Buffer.byteLength(upstream.text) });
        res.write(upstream.text.slice(0, Math.floor(upstream.text.length / 2)));
        return void setImmediate(() => req.socket.destroy());
      }
      case "timeout": {
        // The node executed it; the answer never comes (the client gives up first).
        await new Promise<void>((resolve) => {
          const timer = setTimeout(resolve, holdMs);
          timers.add(timer);
          req.socket.once("close", () => {
            clearTimeout(timer);
            resolve();
          });
        });
        return void req.socket.destroy();
      }
    }
  }

  const server: Server = createServer((req, res) => {
    inFlight++;
    lastActivity = Date.now();
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      handle(req, res, Buffer.concat(chunks).toString("utf8"))
        .catch(() => req.socket.destroy())
        .finally(() => {
          inFlight--;
          lastActivity = Date.now();
        });
    });
  });
  server.on("connection", (s) => {
    sockets.add(s);
    s.on("close", () => sockets.delete(s));
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const port = (server.address() as { port: number }).port;

  return {
    url: `http://127.0.0.1:${port}`,
    seed,
    configure: (next) => {
      plan = next;
      for (const k of Object.keys(scheduled)) delete scheduled[k];
    },
    injected,
    injectedByMethod,
    requests,
    calls,
    scheduled,
    async idle(quietMs) {
      while (inFlight > 0 || Date.now() - lastActivity < quietMs) await new Promise((r) => setTimeout(r, 25));
    },
    close: () =>
      new Promise<void>((resolve) => {
        for (const t of timers) clearTimeout(t);
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
}

/** Calls per method made while `fn` ran, as the proxy saw them; `quietMs`: wait for straggling calls first. */
export async function callsDuring(p: RpcFaultProxy, fn: () => Promise<unknown>, quietMs = 0): Promise<Record<string, number>> {
  const before = { ...p.calls };
  await fn();
  if (quietMs > 0) await p.idle(quietMs);
  return Object.fromEntries(Object.entries(p.calls).flatMap(([m, n]) => (n - (before[m] ?? 0) > 0 ? [[m, n - (before[m] ?? 0)]] : [])));
}
