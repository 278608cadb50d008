// How long a client may hold a connection, for every HTTP server of the project (public and admin
// ports alike): a slow-loris client that sends a partial header, or headers and then a trickle of
// body, is answered 408 and disconnected within the bound.
//
// Node's semantics matter here: `requestTimeout` bounds *receiving* the request (headers and body),
// not the handler's work, so a /v2/settle that waits for its receipt is not cut by it. What does
// cut a busy handler is the socket idle timeout (no bytes either way), so that one must exceed the
// longest wait a handler has (`longestHandlerMs`).
import type { ServerOptions } from "node:http";

export interface ServerTimeouts {
  /** Receiving the request line and all headers. */
  headersMs: number;
  /** Receiving the whole request, body included (the handler's own time does not count). */
  requestMs: number;
  /** An idle keep-alive connection between two requests. */
  keepAliveMs: number;
  /** A connection without a byte either way, a request in progress included. */
  idleMs: number;
}

export const DEFAULT_SERVER_TIMEOUTS: ServerTimeouts = { headersMs: 10_000, requestMs: 30_000, keepAliveMs: 5_000, idleMs: 120_000 };

/** The same four settings for every service, from the environment. */
export const SERVER_TIMEOUT_ENV: Record<keyof ServerTimeouts, string> = {
  headersMs: "HTTP_HEADERS_TIMEOUT_MS",
  requestMs: "HTTP_REQUEST_TIMEOUT_MS",
  keepAliveMs: "HTTP_KEEP_ALIVE_TIMEOUT_MS",
  idleMs: "HTTP_IDLE_TIMEOUT_MS",
};

/** Headroom of the idle timeout over the longest handler wait (RPC calls around a receipt wait). */
const HANDLER_MARGIN_MS = 30_000;

export interface ResolveTimeoutsOptions {
  /** Where the HTTP_*_TIMEOUT_MS settings come from; default process.env. */
  env?: NodeJS.ProcessEnv;
  /** The longest a handler legitimately waits (the facilitator's receipt bound, the router's settle bound). */
  longestHandlerMs?: number;
}

function fromEnv(env: NodeJS.ProcessEnv): Partial<ServerTimeouts> {
  const out: Partial<ServerTimeouts> = {};
  for (const [key, name] of Object.entries(SERVER_TIMEOUT_ENV) as [keyof ServerTimeouts, string][]) {
    const v = env[name];
    if (v === undefined || v === "") continue;
    if (!/^\d+$/.test(v) || Number(v) <= 0) throw new Error(`${name} must be a positive number of milliseconds, got ${JSON.stringify(v)}`);
    out[key] = Number(v);
  }
  return out;
}

/** Defaults, then the environment, then `given`; checked for consistency (a misconfiguration fails at start). */
export function resolveServerTimeouts(given: Partial<ServerTimeouts> = {}, opts: ResolveTimeoutsOptions = {}): ServerTimeouts {
  const set = { ...fromEnv(opts.env ?? process.env), ...Object.fromEntries(Object.entries(given).filter(([, v]) => v !== undefined)) } as Partial<ServerTimeouts>;
  const longest = opts.longestHandlerMs ?? 0;
  const t: ServerTimeouts = {
    ...DEFAULT_SERVER_TIMEOUTS,
    // Unless set explicitly, the idle bound grows with the longest handler wait.
    idleMs: Math.max(DEFAULT_SERVER_TIMEOUTS.idleMs, longest + HANDLER_MARGIN_MS),
    ...set,
  };
  for (const [key, v] of Object.entries(t)) {
    if (!Number.isSafeInteger(v) || v <= 0) throw new Error(`server timeout ${key} must be a positive integer (ms), got ${v}`);
  }
  if (t.headersMs > t.requestMs) throw new Error(`the headers timeout (${t.headersMs} ms) cannot exceed the request timeout (${t.requestMs} ms)`);
  if (t.idleMs <= longest) {
    throw new Error(`${SERVER_TIMEOUT_ENV.idleMs} (${t.idleMs} ms) must exceed the longest a request of this service may wait (${longest} ms), or such requests are cut`);
  }
  return t;
}

/** The Fastify (and node http) server options that enforce `t`. */
export function serverTimeoutOptions(t: ServerTimeouts): { connectionTimeout: number; keepAliveTimeout: number; requestTimeout: number; http: ServerOptions } {
  return {
    connectionTimeout: t.idleMs,
    keepAliveTimeout: t.keepAliveMs,
    requestTimeout: t.requestMs,
    http: {
      headersTimeout: t.headersMs,
      requestTimeout: t.requestMs,
      // Node checks header and request deadlines on this interval (default 30 s): keep it a
      // fraction of the shortest bound so the bound holds.
      connectionsCheckingInterval: Math.max(10, Math.min(1000, Math.floor(Math.min(t.headersMs, t.requestMs) / 4))),
    },
  };
}
