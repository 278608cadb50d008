// The HTTP kit every service is built on (router, facilitator, hub, wallets): one fastify app with
// the error body `{"error": "<code>: <detail>"}`, fastify's and the database's failures mapped to
// it, request metrics, a server span per request, body parsing, and 405 answers derived from the
// routes the service registers. A service's own file keeps only its routes.
import Fastify, { LogController, type FastifyBaseLogger, type FastifyInstance, type FastifyReply, type FastifyRequest, type FastifyServerOptions } from "fastify";
import type { Bindings, ChildLoggerOptions, LogFn } from "pino";
import { COMMON_STATUS, CodedError } from "./errors.ts";
import { safeMessage, type Logger } from "./logger.ts";
import type { Metrics } from "./metrics.ts";
import { resolveServerTimeouts, serverTimeoutOptions, type ServerTimeouts } from "./timeouts.ts";
import { withServerSpan } from "./tracing.ts";

// The kit's own answers: every service's catalogue has these codes, with these statuses.
const kitError = (code: keyof typeof COMMON_STATUS, detail: string, headers?: Record<string, string>) => new CodedError(code, detail, COMMON_STATUS[code], headers);

// In the order an Allow header lists them; HEAD comes with GET (fastify adds it).
const METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"];

export interface ServiceAppOptions {
  /** Names the metrics' service label, the spans and the log lines ("router", "hub"). */
  service: string;
  logger: Logger;
  /** Request counts and latencies by route (x402_http_requests_total, x402_http_request_duration_seconds). */
  metrics?: Metrics;
  /** Largest accepted request body in bytes (larger → 413). */
  bodyLimit: number;
  /** What a 404 says after the path: where the endpoints are listed. */
  endpoints: string;
  /** A non-empty body's value (default: JSON, whatever the content type); a throw that is not a CodedError is invalid_json. */
  parseBody?: (text: string, contentType: string) => unknown;
  /** What a 415 asks for. */
  mediaTypes?: string;
  /** Connection bounds (slow clients); unset ones come from HTTP_*_TIMEOUT_MS or the defaults. */
  timeouts?: Partial<ServerTimeouts>;
  /** The longest a handler may wait (a settle's receipt bound): the idle bound must exceed it. */
  longestHandlerMs?: number;
  fastify?: Pick<FastifyServerOptions, "trustProxy" | "routerOptions">;
}

// The text each parsed body came from: a proxy forwards it as received instead of serialising the
// object again (entries go with their request's body object).
const rawBodies = new WeakMap<object, string>();

/** The JSON text a request body was parsed from. */
export function rawBodyOf(body: unknown): string | undefined {
  return typeof body === "object" && body !== null ? rawBodies.get(body) : undefined;
}

/** Database failures (connection lost, server errors) are the service being unavailable, not a bug. */
export function isDatabaseError(e: { code?: unknown; severity?: unknown; message?: unknown }): boolean {
  if (typeof e.severity === "string") return true;
  if (typeof e.code === "string") return /^[0-9A-Z]{5}$/.test(e.code) || ["ECONNREFUSED", "ECONNRESET", "ETIMEDOUT", "EPIPE"].includes(e.code);
  // node-postgres's own failures carry no code: a server that went away, a pool that could not connect in time.
  return typeof e.message === "string" && /^(Connection terminated|timeout exceeded when trying to connect|Client has encountered a connection error)/.test(e.message);
}

const LEVELS = ["fatal", "error", "warn", "info", "debug", "trace"] as const;

/**
 * request.log: a pino child made when the request first logs at an enabled level, not for every
 * request (its reqId binding goes through every redaction path: microseconds of each request).
 */
function lazyRequestLogger(logger: FastifyBaseLogger, bindings: Bindings, opts: ChildLoggerOptions): FastifyBaseLogger {
  const parent = logger as Logger;
  let child: Logger | undefined;
  const log = () => (child ??= parent.child(bindings, opts));
  const lazy = Object.create(parent) as Logger;
  for (const level of LEVELS) {
    if (parent.isLevelEnabled(level)) lazy[level] = ((...args: Parameters<LogFn>) => log()[level](...args)) as LogFn;
  }
  lazy.child = (b, o) => log().child(b, o);
  return lazy;
}

/**
 * One access line per request, when it is answered, with what fastify's "incoming request" line
 * said of it (method, URL, host, client address): fastify writes two, each a JSON line to serialise
 * and write, a tenth of a millisecond of a request. Its other lines (stream errors, 404s) stay.
 */
class AccessLog extends LogController {
  override incomingRequest(): void {}
  override requestCompleted(error: Error | null, request: FastifyRequest, reply: FastifyReply): void {
    if (error) reply.log.error({ req: request, res: reply, err: error, responseTime: reply.elapsedTime }, "request errored");
    else reply.log.info({ req: request, res: reply, responseTime: reply.elapsedTime }, "request completed");
  }
}

function sendError(reply: FastifyReply, err: CodedError) {
  return reply.code(err.status).headers(err.headers).type("application/json").send(err.body());
}

function toCodedError(error: unknown, mediaTypes: string): CodedError | undefined {
  if (error instanceof CodedError) return error;
  const e = error as { code?: string; statusCode?: number; message?: string } | undefined;
  if (e?.code === "FST_ERR_CTP_INVALID_MEDIA_TYPE") return kitError("unsupported_media_type", mediaTypes);
  if (e?.code === "FST_ERR_CTP_INVALID_CONTENT_LENGTH") return kitError("invalid_request", "content-length does not match the body");
  if (e?.statusCode === 413) return kitError("payload_too_large", e.message ?? "request body is too large");
  if (e?.statusCode && e.statusCode >= 400 && e.statusCode < 500) return kitError("invalid_request", e.message ?? "bad request");
  return undefined;
}

/**
 * A service's app: `routes` registers its endpoints in a scope of their own, where each handler runs
 * in a server span; every other method on their paths then answers 405 with Allow.
 */
export function createServiceApp(opts: ServiceAppOptions, routes: (app: FastifyInstance) => void | Promise<void>): FastifyInstance {
  const { service, bodyLimit } = opts;
  const timeouts = resolveServerTimeouts(opts.timeouts, { longestHandlerMs: opts.longestHandlerMs });
  const app = Fastify({ loggerInstance: opts.logger as FastifyBaseLogger, childLoggerFactory: lazyRequestLogger, logController: new AccessLog(), bodyLimit, return503OnClosing: true, ...opts.fastify, ...serverTimeoutOptions(timeouts) });

  // One parser for any content type: callers differ in what they send, the body is one format either way.
  const parse = opts.parseBody ?? ((text: string) => JSON.parse(text) as unknown);
  app.removeAllContentTypeParsers();
  app.addContentTypeParser("*", { parseAs: "string", bodyLimit }, (req, body, done) => {
    const text = typeof body === "string" ? body : body.toString("utf8");
    if (text.trim() === "") return done(null, undefined);
    try {
      const parsed = parse(text, req.headers["content-type"] ?? "");
      if (typeof parsed === "object" && parsed !== null) rawBodies.set(parsed, text);
      done(null, parsed);
    } catch (e) {
      done(e instanceof CodedError ? e : kitError("invalid_json", `the body is not valid JSON (${(e as Error).message})`), undefined);
    }
  });

  app.setErrorHandler((error, request, reply) => {
    const known = toCodedError(error, opts.mediaTypes ?? "send the body as application/json");
    if (known) return sendError(reply, known);
    // The kind of failure only: never parameters (they can hold payment data or stored messages).
    const e = (error ?? {}) as { name?: string; message?: string; code?: string };
    const err = { name: e.name, message: safeMessage(e), code: e.code };
    if (isDatabaseError(e)) {
      request.log.error({ err }, `${service} storage failed`);
      return sendError(reply, kitError("backend_unavailable", "the store is unavailable; try again"));
    }
    request.log.error({ err, url: request.routeOptions.url ?? "unmatched" }, `${service} request failed`);
    return sendError(reply, kitError("internal_error", "the request could not be processed; see the service logs"));
  });

  // Route labels are the registered patterns (bounded), never the raw URL.
  const metrics = opts.metrics;
  if (metrics) {
    // A callback hook, not async: no promise per request.
    app.addHook("onResponse", (request, reply, done) => {
      const route = request.routeOptions.url ?? "unmatched";
      metrics.httpRequests.inc({ service, route, status: String(reply.statusCode) });
      metrics.httpDuration.observe({ service, route }, reply.elapsedTime / 1000);
      done();
    });
  }

  app.setNotFoundHandler((request, reply) => sendError(reply, kitError("not_found", `no endpoint ${request.method} ${request.url.split("?")[0]}; ${opts.endpoints}`)));

  const used = new Map<string, Set<string>>();
  void app.register(async (scope) => {
    scope.addHook("onRoute", (route) => {
      const methods = used.get(route.url) ?? new Set<string>();
      for (const m of [route.method].flat()) methods.add(m);
      used.set(route.url, methods);
      // One server span per request, continuing the caller's trace; attributes stay bounded (no ids, no amounts).
      const handler = route.handler;
      route.handler = function (this: FastifyInstance, request: FastifyRequest, reply: FastifyReply) {
        return withServerSpan(`${service} ${request.method} ${route.url}`, request.headers, { "x402.service": service }, async (span) => {
          try {
            const sent: unknown = await handler.call(this, request, reply);
            span.setAttribute("http.response.status_code", reply.statusCode);
            return sent;
          } catch (e) {
            span.setAttribute("http.response.status_code", e instanceof CodedError ? e.status : 500);
            throw e;
          }
        });
      };
    });
    await routes(scope);
  });
  // Loaded after the routes' scope, so every path and method is known by now.
  void app.register(async (scope) => {
    for (const [url, methods] of used) {
      if (methods.has("GET")) methods.add("HEAD");
      const allow = METHODS.filter((m) => methods.has(m) && m !== "HEAD").join(", ");
      const others = METHODS.filter((m) => !methods.has(m));
      if (others.length === 0) continue;
      scope.route({
        method: others,
        url,
        handler: async (request, reply) =>
          sendError(reply, kitError("method_not_allowed", `${request.method} is not allowed on ${request.url.split("?")[0]}; use ${allow}`, { allow })),
      });
    }
  });
  return app;
}
