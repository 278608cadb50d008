// The HTTP surface every /v2 service shares (router and facilitator): the contract's 404/405/400
// behaviour, the error body `{"error": "<code>: <detail>"}`, body limits and JSON parsing.
import Fastify, { type FastifyBaseLogger, type FastifyInstance, type FastifyReply } from "fastify";
import { RequestError } from "../x402/errors.ts";
import type { Logger } from "./logger.ts";
import type { Metrics } from "./metrics.ts";
import { resolveServerTimeouts, serverTimeoutOptions, type ServerTimeouts } from "./timeouts.ts";
import { withServerSpan } from "./tracing.ts";

/**
 * Headers between the router and its facilitators (never sent by or to resource servers): the
 * gas a settlement may commit for the calling API key, and what it spent (services/tenants).
 */
export const FLEET_HEADERS = {
  /** Router → facilitator: wei this settle may commit, or "unlimited" (metering only). */
  gasAllowance: "x402-fleet-gas-allowance",
  /** Facilitator → router: wei the transactions of this call cost on chain; absent while one is not mined. */
  gasSpent: "x402-fleet-gas-spent-wei",
  /** Facilitator → router: the worst case of one settlement of this scheme at the current fee cap. */
  gasQuote: "x402-fleet-gas-quote-wei",
} as const;

/** What of a request's headers a handler may use: the caller's credentials (forwarded by the router). */
export interface CallerHeaders {
  authorization?: string;
  /** X-API-Key: the router's API key, when the caller sends it apart from Authorization. */
  apiKey?: string;
  /** FLEET_HEADERS.gasAllowance, as sent by the router. */
  gasAllowance?: string;
}

export interface ContractHandlers {
  verify(body: unknown, caller: CallerHeaders): Promise<HandlerResult>;
  settle(body: unknown, caller: CallerHeaders): Promise<HandlerResult>;
  supported(): Promise<HandlerResult>;
  /** The bazaar discovery catalog (router only, when enabled): GET /v2/discovery/resources and /search. */
  discovery?: {
    resources(query: Record<string, unknown>): Promise<HandlerResult>;
    search(query: Record<string, unknown>): Promise<HandlerResult>;
  };
}

export interface HandlerResult {
  status: number;
  /** An object to serialise, or a string that already is JSON (a proxied answer, sent as is). */
  body: unknown;
  headers?: Record<string, string>;
}

export interface ContractAppOptions {
  logger: Logger;
  /** Largest accepted request body in bytes (larger → 413). */
  bodyLimit?: number;
  handlers: ContractHandlers;
  /** Service name for metrics and spans ("router", "facilitator"). */
  service: string;
  metrics: Metrics;
  /** Connection bounds (slow clients); unset ones come from HTTP_*_TIMEOUT_MS or the defaults. */
  timeouts?: Partial<ServerTimeouts>;
  /** The longest a handler may wait (a settle's receipt bound): the idle bound must exceed it. */
  longestHandlerMs?: number;
}

export const DEFAULT_BODY_LIMIT = 64 * 1024;

// Response schemas: fastify compiles them into serialisers (fast-json-stringify). Known fields are
// listed; anything a mechanism adds (extra, extensions, channel state) is kept.
const anyObject = { type: "object", additionalProperties: true } as const;
const RESPONSE_SCHEMAS = {
  verify: {
    type: "object",
    additionalProperties: true,
    properties: { isValid: { type: "boolean" }, invalidReason: { type: "string" }, invalidMessage: { type: "string" }, payer: { type: "string" }, extensions: anyObject, extra: anyObject },
  },
  settle: {
    type: "object",
    additionalProperties: true,
    properties: {
      success: { type: "boolean" },
      errorReason: { type: "string" },
      errorMessage: { type: "string" },
      payer: { type: "string" },
      transaction: { type: "string" },
      network: { type: "string" },
      amount: { type: "string" },
      extensions: anyObject,
      extra: anyObject,
    },
  },
  supported: {
    type: "object",
    additionalProperties: true,
    properties: {
      kinds: { type: "array", items: { type: "object", additionalProperties: true, properties: { x402Version: { type: "integer" }, scheme: { type: "string" }, network: { type: "string" }, extra: anyObject } } },
      extensions: { type: "array", items: { type: "string" } },
      signers: { type: "object", additionalProperties: { type: "array", items: { type: "string" } } },
    },
  },
} as const;

// The text each parsed body came from: a proxy forwards it as received instead of serialising the
// object again (entries go with their request's body object).
const rawBodies = new WeakMap<object, string>();

/** The JSON text a request body was parsed from, when it came through acceptJsonBodies. */
export function rawBodyOf(body: unknown): string | undefined {
  return typeof body === "object" && body !== null ? rawBodies.get(body) : undefined;
}

/**
 * One JSON parser for any content type: callers differ in what they send, the body is JSON either
 * way. An empty body parses as undefined; anything else that is not JSON fails with `invalid`.
 */
export function acceptJsonBodies(app: FastifyInstance, bodyLimit: number, invalid: (detail: string) => Error): void {
  app.removeAllContentTypeParsers();
  app.addContentTypeParser("*", { parseAs: "string", bodyLimit }, (_req, body, done) => {
    const text = typeof body === "string" ? body : body.toString("utf8");
    if (text.trim() === "") return done(null, undefined);
    try {
      const parsed: unknown = JSON.parse(text);
      if (typeof parsed === "object" && parsed !== null) rawBodies.set(parsed, text);
      done(null, parsed);
    } catch (e) {
      done(invalid(`the body is not valid JSON (${(e as Error).message})`), undefined);
    }
  });
}

function sendError(reply: FastifyReply, err: RequestError, headers: Record<string, string> = {}) {
  return reply.code(err.status).headers({ ...err.headers, ...headers }).type("application/json").send(err.body());
}

function toRequestError(error: unknown): RequestError | undefined {
  if (error instanceof RequestError) return error;
  const e = error as { code?: string; statusCode?: number; message?: string };
  switch (e?.code) {
    case "FST_ERR_CTP_BODY_TOO_LARGE":
      return new RequestError("payload_too_large", e.message ?? "request body is too large");
    case "FST_ERR_CTP_INVALID_MEDIA_TYPE":
      return new RequestError("unsupported_media_type", "send the body as application/json");
    case "FST_ERR_CTP_EMPTY_JSON_BODY":
      return new RequestError("invalid_json", "the request body is empty");
    case "FST_ERR_CTP_INVALID_CONTENT_LENGTH":
      return new RequestError("invalid_request", "content-length does not match the body");
  }
  if (e?.statusCode && e.statusCode >= 400 && e.statusCode < 500) {
    return new RequestError("invalid_request", e.message ?? "bad request");
  }
  return undefined;
}

export function createContractApp(opts: ContractAppOptions): FastifyInstance {
  const bodyLimit = opts.bodyLimit ?? DEFAULT_BODY_LIMIT;
  const timeouts = resolveServerTimeouts(opts.timeouts, { longestHandlerMs: opts.longestHandlerMs });
  const app = Fastify({ loggerInstance: opts.logger as FastifyBaseLogger, bodyLimit, return503OnClosing: true, ...serverTimeoutOptions(timeouts) });

  acceptJsonBodies(app, bodyLimit, (detail) => new RequestError("invalid_json", detail));

  app.setErrorHandler((error, request, reply) => {
    const known = toRequestError(error);
    if (known) return sendError(reply, known);
    request.log.error({ err: error, url: request.url }, "unhandled error");
    return sendError(reply, new RequestError("internal_error", "the request could not be processed; see the service logs"));
  });

  // Route labels are the registered patterns (bounded), never the raw URL.
  app.addHook("onResponse", async (request, r) => {
    const route = request.routeOptions.url ?? "unmatched";
    opts.metrics.httpRequests.inc({ service: opts.service, route, status: String(r.statusCode) });
    opts.metrics.httpDuration.observe({ service: opts.service, route }, r.elapsedTime / 1000);
  });

  app.setNotFoundHandler((request, reply) =>
    sendError(reply, new RequestError("not_found", `no endpoint ${request.method} ${request.url.split("?")[0]}; endpoints are POST /v2/verify, POST /v2/settle, GET /v2/supported${opts.handlers.discovery ? ", GET /v2/discovery/resources, GET /v2/discovery/search" : ""}`)),
  );

  const reply = (r: FastifyReply, result: HandlerResult) => r.code(result.status).headers(result.headers ?? {}).type("application/json").send(result.body);
  const traced = (name: string, headers: Record<string, unknown>, fn: () => Promise<HandlerResult>) =>
    withServerSpan(`${opts.service} ${name}`, headers, { "x402.service": opts.service }, async (span) => {
      const result = await fn();
      span.setAttribute("http.response.status_code", result.status);
      return result;
    });
  const methodNotAllowed = (allow: string) => async (request: { method: string; url: string }, r: FastifyReply) =>
    sendError(r, new RequestError("method_not_allowed", `${request.method} is not allowed on ${request.url.split("?")[0]}; use ${allow}`), { allow });

  for (const action of ["verify", "settle"] as const) {
    app.post(`/v2/${action}`, { schema: { response: { 200: RESPONSE_SCHEMAS[action] } } }, async (request, r) =>
      reply(r, await traced(`POST /v2/${action}`, request.headers, () => opts.handlers[action](request.body, { authorization: request.headers.authorization, apiKey: headerValue(request.headers["x-api-key"]), gasAllowance: headerValue(request.headers[FLEET_HEADERS.gasAllowance]) }))),
    );
    app.route({ method: ["GET", "HEAD", "PUT", "PATCH", "DELETE", "OPTIONS"], url: `/v2/${action}`, handler: methodNotAllowed("POST") });
  }
  app.get("/v2/supported", { schema: { response: { 200: RESPONSE_SCHEMAS.supported } } }, async (request, r) =>
    reply(r, await traced("GET /v2/supported", request.headers, () => opts.handlers.supported())),
  );
  app.route({ method: ["POST", "PUT", "PATCH", "DELETE", "OPTIONS"], url: "/v2/supported", handler: methodNotAllowed("GET") });
  const discovery = opts.handlers.discovery;
  if (discovery) {
    for (const action of ["resources", "search"] as const) {
      app.get(`/v2/discovery/${action}`, async (request, r) => reply(r, await traced(`GET /v2/discovery/${action}`, request.headers, () => discovery[action](request.query as Record<string, unknown>))));
      app.route({ method: ["POST", "PUT", "PATCH", "DELETE", "OPTIONS"], url: `/v2/discovery/${action}`, handler: methodNotAllowed("GET") });
    }
  }
  return app;
}

function headerValue(v: string | string[] | undefined): string | undefined {
  return Array.isArray(v) ? v[0] : v;
}
