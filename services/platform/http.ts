// The /v2 contract surface the router and the facilitator serve (on the HTTP kit): its routes,
// response schemas, and the headers between the router and its facilitators.
import type { FastifyInstance, FastifyReply, FastifyRequest } from "fastify";
import { COMMON_STATUS, CodedError } from "./errors.ts";
import { createServiceApp } from "./http-kit.ts";
import type { Logger } from "./logger.ts";
import type { Metrics } from "./metrics.ts";
import type { RouterTokens } from "./router-token.ts";
import type { ServerTimeouts } from "./timeouts.ts";

/**
 * Headers between the router and its facilitators (never sent by or to resource servers): the
 * gas a settlement may commit for the calling API key, and what it spent (services/tenants).
 */
export const FLEET_HEADERS = {
  /** Router → facilitator: the router's credential (router-token.ts); router-only headers count only beside it. */
  routerToken: "x402-fleet-router-token",
  /** Router → facilitator: wei this settle may commit, or "unlimited" (metering only). */
  gasAllowance: "x402-fleet-gas-allowance",
  /** Facilitator → router: wei the transactions of this call cost on chain; absent while one is not mined. */
  gasSpent: "x402-fleet-gas-spent-wei",
  /** Facilitator → router: the worst case of one settlement of this scheme at the current fee cap. */
  gasQuote: "x402-fleet-gas-quote-wei",
  /** Router → facilitator: the API key id of the caller (its settlements are its own: status.ts). */
  tenant: "x402-fleet-tenant",
  /** Router → facilitator: the calling API key's webhook URL (tenants/api-keys.ts), where its settlement events go. */
  tenantWebhook: "x402-fleet-tenant-webhook",
} as const;

/** What of a request's headers a handler may use: the caller's credentials (forwarded by the router). */
export interface CallerHeaders {
  authorization?: string;
  /** X-API-Key: the router's API key, when the caller sends it apart from Authorization. */
  apiKey?: string;
  /** The call came from a router presenting a token the facilitator accepts (ContractAppOptions.routerTokens). */
  fromRouter?: boolean;
  /** FLEET_HEADERS.gasAllowance, as sent by an authenticated router; never read from anyone else. */
  gasAllowance?: string;
  /** FLEET_HEADERS.tenant, as sent by an authenticated router: the API key a settlement is made under, or whose status is asked. */
  tenant?: string;
  /** FLEET_HEADERS.tenantWebhook, as sent by an authenticated router; never read from anyone else. */
  tenantWebhook?: string;
}

export interface ContractHandlers {
  verify(body: unknown, caller: CallerHeaders): Promise<HandlerResult>;
  settle(body: unknown, caller: CallerHeaders): Promise<HandlerResult>;
  supported(): Promise<HandlerResult>;
  /** What became of a payment (docs/facilitator-interface.md): GET by what names it, POST with the payment itself. */
  status?: {
    lookup(query: Record<string, unknown>, caller: CallerHeaders): Promise<HandlerResult>;
    ofPayment(body: unknown, caller: CallerHeaders): Promise<HandlerResult>;
  };
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
  /** Requests of each action this process holds at once (X402_MAX_*_IN_FLIGHT); past it a 503 with Retry-After. */
  maxInFlight?: InFlightCaps;
  /** Extra headers of a request shed by that cap (the facilitator tells the router that nothing was spent). */
  shedHeaders?: Record<string, string>;
  /**
   * A facilitator's router credential. Set: /settle is refused (401, before any work) without an
   * accepted FLEET_HEADERS.routerToken, and router-only headers are read only beside one. Unset
   * (the router's own app, a lone facilitator): anyone may settle and router-only headers are ignored.
   */
  routerTokens?: RouterTokens;
}

export interface InFlightCaps {
  verify: number;
  settle: number;
}

/** How long a shed caller is asked to wait before retrying (Retry-After, seconds). */
const SHED_RETRY_AFTER_S = 1;

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

export function createContractApp(opts: ContractAppOptions): FastifyInstance {
  const discovery = opts.handlers.discovery;
  const status = opts.handlers.status;
  const endpoints = `endpoints are POST /v2/verify, POST /v2/settle, GET /v2/supported${status ? ", GET and POST /v2/settlements/status" : ""}${discovery ? ", GET /v2/discovery/resources, GET /v2/discovery/search" : ""}`;
  // The charset fastify would add to a JSON string body, given here so it is not worked out per reply.
  const reply = (r: FastifyReply, result: HandlerResult) => r.code(result.status).headers(result.headers ?? {}).type("application/json; charset=utf-8").send(result.body);
  return createServiceApp({ ...opts, bodyLimit: opts.bodyLimit ?? DEFAULT_BODY_LIMIT, endpoints }, (app) => {
    for (const action of ["verify", "settle"] as const) {
      // Load shedding: past its cap a request is refused before any work (nothing verified, claimed
      // or sent), so a burst larger than the process can carry goes back to the caller, or through
      // the router to a retry, instead of growing memory and every request's latency without bound.
      const cap = opts.maxInFlight?.[action] ?? Infinity;
      let inFlight = 0;
      const labels = { service: opts.service, route: `/v2/${action}` };
      app.post(`/v2/${action}`, { schema: { response: { 200: RESPONSE_SCHEMAS[action] } } }, async (request, r) => {
        const fromRouter = opts.routerTokens?.accepts(headerValue(request.headers[FLEET_HEADERS.routerToken])) ?? false;
        // verify spends no gas and stays open; a settle signs, so only the router's are taken.
        if (action === "settle" && opts.routerTokens && !fromRouter) {
          throw new CodedError("router_token_required", `this ${opts.service} settles only for its router: ${FLEET_HEADERS.routerToken} missing or not accepted`, 401);
        }
        if (inFlight >= cap) {
          opts.metrics.httpShed.inc(labels);
          throw new CodedError("backend_unavailable", `this ${opts.service} is already handling ${cap} ${action} requests, the most it takes at once; retry in ${SHED_RETRY_AFTER_S} s`, COMMON_STATUS.backend_unavailable, {
            "retry-after": String(SHED_RETRY_AFTER_S),
            ...opts.shedHeaders,
          });
        }
        inFlight++;
        opts.metrics.httpInFlight.inc(labels);
        try {
          const caller: CallerHeaders = { authorization: request.headers.authorization, apiKey: headerValue(request.headers["x-api-key"]) };
          if (fromRouter) {
            caller.fromRouter = true;
            caller.gasAllowance = headerValue(request.headers[FLEET_HEADERS.gasAllowance]);
            caller.tenantWebhook = headerValue(request.headers[FLEET_HEADERS.tenantWebhook]);
            caller.tenant = headerValue(request.headers[FLEET_HEADERS.tenant]);
          }
          return reply(r, await opts.handlers[action](request.body, caller));
        } finally {
          inFlight--;
          opts.metrics.httpInFlight.dec(labels);
        }
      });
    }
    app.get("/v2/supported", { schema: { response: { 200: RESPONSE_SCHEMAS.supported } } }, async (_request, r) => reply(r, await opts.handlers.supported()));
    if (status) {
      // A facilitator with a router token answers only its router (which checks API keys and says whose call it is).
      const callerOf = (request: FastifyRequest): CallerHeaders => {
        const fromRouter = opts.routerTokens?.accepts(headerValue(request.headers[FLEET_HEADERS.routerToken])) ?? false;
        if (opts.routerTokens && !fromRouter) throw new CodedError("router_token_required", `this ${opts.service} answers status only for its router: ${FLEET_HEADERS.routerToken} missing or not accepted`, 401);
        const caller: CallerHeaders = { authorization: request.headers.authorization, apiKey: headerValue(request.headers["x-api-key"]) };
        if (fromRouter) Object.assign(caller, { fromRouter: true, tenant: headerValue(request.headers[FLEET_HEADERS.tenant]) });
        return caller;
      };
      // An anonymous endpoint that may read the chain: held to the verify cap (past it, 503 and nothing read).
      const cap = opts.maxInFlight?.verify ?? Infinity;
      let inFlight = 0;
      const bounded = async (r: FastifyReply, ask: () => Promise<HandlerResult>) => {
        if (inFlight >= cap) throw new CodedError("backend_unavailable", `this ${opts.service} is already answering ${cap} status requests; retry in ${SHED_RETRY_AFTER_S} s`, COMMON_STATUS.backend_unavailable, { "retry-after": String(SHED_RETRY_AFTER_S) });
        inFlight++;
        try {
          return reply(r, await ask());
        } finally {
          inFlight--;
        }
      };
      app.get("/v2/settlements/status", (request, r) => bounded(r, () => status.lookup(request.query as Record<string, unknown>, callerOf(request))));
      app.post("/v2/settlements/status", (request, r) => bounded(r, () => status.ofPayment(request.body, callerOf(request))));
    }
    if (discovery) {
      for (const action of ["resources", "search"] as const) {
        app.get(`/v2/discovery/${action}`, async (request, r) => reply(r, await discovery[action](request.query as Record<string, unknown>)));
      }
    }
  });
}

function headerValue(v: string | string[] | undefined): string | undefined {
  return Array.isArray(v) ? v[0] : v;
}
