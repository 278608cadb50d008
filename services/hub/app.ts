// The hub's HTTP surface: the three endpoints of the original (upload, download, conversation) as
// its clients call them, plus our own history and info endpoints. Writes must be signed; reads are
// public. Every error is a proper status with `{"error": "<code>: <detail>"}`, never a 500 for bad input.
import Fastify, { type FastifyBaseLogger, type FastifyInstance, type FastifyReply, type FastifyRequest } from "fastify";
import formbody from "@fastify/formbody";
import { stringToBytes } from "viem";
import type { Logger } from "../platform/logger.ts";
import type { Metrics } from "../platform/metrics.ts";
import { resolveServerTimeouts, serverTimeoutOptions, type ServerTimeouts } from "../platform/timeouts.ts";
import { withServerSpan } from "../platform/tracing.ts";
import { AUTH_HEADERS, DEFAULT_MAX_EXPIRY_SECONDS, HUB_WRITE_TYPES, authorizeWrite, hubMessageHash, readAuthorization, type HubDomain, type SignatureVerifier } from "./auth.ts";
import { HubError } from "./errors.ts";
import { createRateLimiter, type RateLimit, type RateLimiter } from "./rate-limit.ts";
import { DEFAULT_STORE_LIMITS, NonceReusedError, QuotaExceededError, type HubStore, type StoreLimits } from "./store.ts";
import { collectFields, conversationOf, parseConversation, parseDownload, parseForm, parseHistory, parseUpload } from "./wire.ts";

/** The original's limit on JSON bodies. */
export const DEFAULT_HUB_BODY_LIMIT = 4 * 1024 * 1024;
export const DEFAULT_WRITE_RATE_LIMIT: RateLimit = { burst: 200, perSecond: 50 };
export const DEFAULT_READ_RATE_LIMIT: RateLimit = { burst: 1000, perSecond: 200 };
export const DEFAULT_WRITE_ATTEMPT_RATE_LIMIT: RateLimit = { burst: 200, perSecond: 50 };

export interface HubAppOptions {
  logger: Logger;
  /** Request counts and latencies by route (x402_http_requests_total, x402_http_request_duration_seconds). */
  metrics?: Metrics;
  store: HubStore;
  domain: HubDomain;
  verifier: SignatureVerifier;
  /** Largest request body in bytes (larger → 413). */
  bodyLimit?: number;
  /** Longest validity a write's signature may claim. */
  maxExpirySeconds?: number;
  /** Per owner, counted after the signature is checked (unsigned requests cannot use up an owner's quota). */
  writeRateLimit?: RateLimit;
  /** Per caller (client address): every upload, before any signature work (an ERC-1271 check costs RPC calls). */
  writeAttemptRateLimit?: RateLimit;
  /** Per caller (client address): reads, whichever owners they read. */
  readRateLimit?: RateLimit;
  /** Whose X-Forwarded-For names the caller: true (any peer), a hop count, or proxy addresses/CIDRs; default none (the peer is the caller). */
  trustProxy?: TrustProxy;
  /** The store's quota and version limits, for GET /api/info (the store enforces them). */
  storeLimits?: StoreLimits;
  /** Whether contract-wallet (ERC-1271) signatures can be checked (an RPC is configured). */
  contractWallets?: boolean;
  /** Connection bounds (slow clients); unset ones come from HTTP_*_TIMEOUT_MS or the defaults. */
  timeouts?: Partial<ServerTimeouts>;
  /** Clock in ms (tests pass their own). */
  now?: () => number;
}

export type TrustProxy = boolean | number | string[];

/** Fastify's form of the setting: a hop count trusts that many proxies in front of the hub. */
function fastifyTrustProxy(t: TrustProxy | undefined): boolean | string[] | ((address: string, hop: number) => boolean) {
  if (typeof t === "number") return (_address, hop) => hop < t;
  return t ?? false;
}

const decoder = new TextDecoder();

function sendError(reply: FastifyReply, err: HubError) {
  return reply.code(err.status).headers(err.headers).type("application/json").send(err.body());
}

function toHubError(error: unknown): HubError | undefined {
  if (error instanceof HubError) return error;
  const e = error as { code?: string; statusCode?: number; message?: string };
  switch (e?.code) {
    case "FST_ERR_CTP_BODY_TOO_LARGE":
      return new HubError("payload_too_large", e.message ?? "request body is too large");
    case "FST_ERR_CTP_INVALID_MEDIA_TYPE":
      return new HubError("unsupported_media_type", "send JSON (application/json) or form fields (application/x-www-form-urlencoded)");
    case "FST_ERR_CTP_INVALID_CONTENT_LENGTH":
      return new HubError("invalid_request", "content-length does not match the body");
  }
  if (e?.statusCode === 413) return new HubError("payload_too_large", e.message ?? "request body is too large");
  if (e?.statusCode && e.statusCode >= 400 && e.statusCode < 500) return new HubError("invalid_request", e.message ?? "bad request");
  return undefined;
}

function parseJson(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch (e) {
    throw new HubError("invalid_json", `the body is not valid JSON (${(e as Error).message})`);
  }
}

export function createHubApp(opts: HubAppOptions): FastifyInstance {
  const bodyLimit = opts.bodyLimit ?? DEFAULT_HUB_BODY_LIMIT;
  const maxExpirySeconds = opts.maxExpirySeconds ?? DEFAULT_MAX_EXPIRY_SECONDS;
  const now = opts.now ?? Date.now;
  const writes = createRateLimiter(opts.writeRateLimit ?? DEFAULT_WRITE_RATE_LIMIT, now);
  const writeAttempts = createRateLimiter(opts.writeAttemptRateLimit ?? DEFAULT_WRITE_ATTEMPT_RATE_LIMIT, now);
  const reads = createRateLimiter(opts.readRateLimit ?? DEFAULT_READ_RATE_LIMIT, now);
  const storeLimits = opts.storeLimits ?? DEFAULT_STORE_LIMITS;
  const { store, domain } = opts;

  const app = Fastify({
    loggerInstance: opts.logger as FastifyBaseLogger,
    bodyLimit,
    return503OnClosing: true,
    trustProxy: fastifyTrustProxy(opts.trustProxy),
    ...serverTimeoutOptions(resolveServerTimeouts(opts.timeouts)),
    // Query strings decode exactly like form bodies (one decoder, one rule for repeated names).
    routerOptions: { querystringParser: (s: string) => parseForm(s) },
  });

  // JSON, form fields, and anything else that is one of the two (fetch sends text/plain by default).
  app.removeAllContentTypeParsers();
  void app.register(formbody, { parser: (s: string) => parseForm(s), bodyLimit });
  app.addContentTypeParser("application/json", { parseAs: "string", bodyLimit }, (_req, body, done) => {
    const text = body as string;
    if (text.trim() === "") return done(null, undefined);
    try {
      done(null, parseJson(text));
    } catch (e) {
      done(e as Error, undefined);
    }
  });
  app.addContentTypeParser("*", { parseAs: "string", bodyLimit }, (req, body, done) => {
    if (/^multipart\//i.test(req.headers["content-type"] ?? "")) {
      return done(new HubError("unsupported_media_type", "multipart bodies are not accepted; send JSON or form fields"), undefined);
    }
    const text = (body as string).trim();
    if (text === "") return done(null, undefined);
    try {
      done(null, text.startsWith("{") || text.startsWith("[") ? parseJson(text) : parseForm(text));
    } catch (e) {
      done(e as Error, undefined);
    }
  });

  app.setErrorHandler((error, request, reply) => {
    const known = toHubError(error);
    if (known) return sendError(reply, known);
    // Log the kind of failure, never its parameters (they can hold stored messages).
    const e = error as { message?: string; code?: string };
    request.log.error({ err: { message: e?.message?.split("\n")[0], code: e?.code }, url: request.url.split("?")[0] }, "hub request failed");
    return sendError(reply, new HubError("internal_error", "the request could not be processed; see the service logs"));
  });

  // Route labels are the registered patterns (bounded), never the raw URL.
  const metrics = opts.metrics;
  if (metrics) {
    app.addHook("onResponse", async (request, reply) => {
      const route = request.routeOptions.url ?? "unmatched";
      metrics.httpRequests.inc({ service: "hub", route, status: String(reply.statusCode) });
      metrics.httpDuration.observe({ service: "hub", route }, reply.elapsedTime / 1000);
    });
  }

  app.setNotFoundHandler((request, reply) =>
    sendError(
      reply,
      new HubError(
        "not_found",
        `no endpoint ${request.method} ${request.url.split("?")[0]}; endpoints are POST /api/upload, GET|POST /api/download, GET|POST /api/conversation, GET|POST /api/history, GET /api/info`,
      ),
    ),
  );

  /** Store calls: a database failure is the service being unavailable, not the caller's fault. */
  async function storage<T>(request: FastifyRequest, what: string, fn: () => Promise<T>): Promise<T> {
    try {
      return await fn();
    } catch (e) {
      if (e instanceof HubError || e instanceof NonceReusedError || e instanceof QuotaExceededError) throw e;
      const err = e as { message?: string; code?: string };
      request.log.error({ err: { message: err?.message?.split("\n")[0], code: err?.code }, op: what }, "hub storage failed");
      throw new HubError("backend_unavailable", `the store could not ${what}; try again`);
    }
  }

  /** Uses a token of `key` (or, with peek, only checks there is one); 429 with Retry-After when none is left. */
  function limit(limiter: RateLimiter, key: string, what: string, peek = false) {
    const decision = peek ? limiter.check(key) : limiter.take(key);
    if (!decision.ok) {
      throw new HubError("rate_limited", `too many ${what}; retry in ${decision.retryAfterSeconds} s`, { "retry-after": String(decision.retryAfterSeconds) });
    }
  }
  /** The caller's address: the peer, or what a trusted proxy says (trustProxy). */
  const callerOf = (request: FastifyRequest) => request.ip;

  const fieldsOf = (request: FastifyRequest) => collectFields(request.query, request.body);

  /** One server span per request, continuing the caller's trace; attributes stay bounded (no owners, ids or values). */
  const traced =
    (name: string, handler: (request: FastifyRequest, reply: FastifyReply) => Promise<FastifyReply>) => (request: FastifyRequest, reply: FastifyReply) =>
      withServerSpan(`hub ${request.method} ${name}`, request.headers, { "x402.service": "hub" }, async (span) => {
        try {
          const sent = await handler(request, reply);
          span.setAttribute("http.response.status_code", reply.statusCode);
          return sent;
        } catch (e) {
          span.setAttribute("http.response.status_code", e instanceof HubError ? e.status : 500);
          throw e;
        }
      });

  const upload = async (request: FastifyRequest, reply: FastifyReply) => {
    // Limits come before any signature work: an ERC-1271 check costs the hub RPC calls.
    limit(writeAttempts, callerOf(request), "writes from this client");
    const fields = fieldsOf(request);
    const req = parseUpload(fields);
    // The authorisation comes from headers or the body, never the query string (URLs end up in logs).
    const auth = readAuthorization(request.headers, collectFields(undefined, request.body));
    const bytes = stringToBytes(req.message);
    const messageHash = hubMessageHash(req.message);
    // An owner at its limit is refused before the check; its token is used only once the signature holds.
    limit(writes, req.owner, `writes for owner ${req.owner}`, true);
    const write = await authorizeWrite({ operation: "upload", owner: req.owner, bucket: req.bucket, id: req.id, kind: req.kind, messageHash }, auth, {
      domain,
      verifier: opts.verifier,
      nowSeconds: now() / 1000,
      maxExpirySeconds,
    });
    limit(writes, req.owner, `writes for owner ${req.owner}`);
    const conversation = conversationOf(req.id);
    let stored;
    try {
      stored = await storage(request, "store the value", () =>
        store.write({
          owner: req.owner,
          bucket: req.bucket,
          id: req.id,
          kind: req.kind,
          message: bytes,
          messageHash,
          nonce: write.nonce,
          expiry: write.expiry,
          conversationId: conversation?.conversationId,
          startsConversation: conversation?.index === "0",
        }),
      );
    } catch (e) {
      if (e instanceof NonceReusedError) throw new HubError("replayed_nonce", `nonce ${write.nonce} was already used by owner ${req.owner}; sign every write with a fresh nonce`);
      if (e instanceof QuotaExceededError) {
        throw new HubError(
          "quota_exceeded",
          e.limit === "bytes"
            ? `owner ${req.owner} would store ${e.wouldUse} bytes, over its quota of ${e.max}; nothing was stored and the nonce is unused`
            : `owner ${req.owner} would have ${e.wouldUse} keys, over its quota of ${e.max}; nothing was stored and the nonce is unused`,
        );
      }
      throw e;
    }
    return reply.send({ owner: req.owner, bucket: req.bucket, id: req.id, kind: req.kind, version: stored.version, messageHash, size: bytes.length, createdAt: stored.createdAt });
  };

  const download = async (request: FastifyRequest, reply: FastifyReply) => {
    const req = parseDownload(fieldsOf(request));
    limit(reads, callerOf(request), "reads from this client");
    const value = await storage(request, "read the value", () => store.read(req.owner, req.id, req.version));
    if (!value) {
      throw new HubError("not_found", req.version === undefined ? `owner ${req.owner} has no value ${req.id}` : `owner ${req.owner} has no version ${req.version} of ${req.id}`);
    }
    return reply
      .code(200)
      .header("content-type", "text/plain; charset=utf-8")
      .header("x-hub-version", String(value.version))
      .header("x-hub-bucket", encodeURIComponent(value.bucket))
      .send(Buffer.from(value.message.buffer, value.message.byteOffset, value.message.byteLength));
  };

  const conversation = async (request: FastifyRequest, reply: FastifyReply) => {
    const req = parseConversation(fieldsOf(request));
    limit(reads, callerOf(request), "reads from this client");
    if (req.id === undefined) {
      const ids = await storage(request, "list conversations", () => store.listConversations(req.owner, req.bucket, req.offset, req.length));
      return reply.send(ids);
    }
    const id = req.id;
    const messages = await storage(request, "read the conversation", () => store.getConversation(req.owner, id, req.bucket, req.offset, req.length));
    return reply.send(messages.map((m) => decoder.decode(m)));
  };

  const history = async (request: FastifyRequest, reply: FastifyReply) => {
    const req = parseHistory(fieldsOf(request));
    limit(reads, callerOf(request), "reads from this client");
    const found = await storage(request, "read the history", () => store.history(req.owner, req.id, req.offset, req.length));
    if (!found) throw new HubError("not_found", `owner ${req.owner} has no value ${req.id}`);
    return reply.send({
      owner: req.owner,
      id: req.id,
      latest: found.latest,
      versions: found.versions.map((v) => ({ version: v.version, bucket: v.bucket, kind: v.kind, messageHash: v.messageHash, createdAt: v.createdAt, message: decoder.decode(v.message) })),
    });
  };

  app.post("/api/upload", traced("/api/upload", upload));
  app.route({ method: ["GET", "POST"], url: "/api/download", handler: traced("/api/download", download) });
  app.route({ method: ["GET", "POST"], url: "/api/conversation", handler: traced("/api/conversation", conversation) });
  app.route({ method: ["GET", "POST"], url: "/api/history", handler: traced("/api/history", history) });

  app.get("/api/info", async (_request, reply) =>
    reply.send({
      service: "x402-fleet hub",
      domain,
      primaryType: "HubWrite",
      types: HUB_WRITE_TYPES,
      authHeaders: AUTH_HEADERS,
      maxExpirySeconds,
      bodyLimit,
      contractWallets: Boolean(opts.contractWallets),
      quota: { bytesPerOwner: storeLimits.maxBytesPerOwner, keysPerOwner: storeLimits.maxKeysPerOwner, versionsPerKey: storeLimits.maxVersionsPerKey },
    }),
  );

  const methodNotAllowed = (allow: string) => async (request: FastifyRequest, reply: FastifyReply) =>
    sendError(reply, new HubError("method_not_allowed", `${request.method} is not allowed on ${request.url.split("?")[0]}; use ${allow}`, { allow }));
  app.route({ method: ["GET", "HEAD", "PUT", "PATCH", "DELETE", "OPTIONS"], url: "/api/upload", handler: methodNotAllowed("POST") });
  for (const url of ["/api/download", "/api/conversation", "/api/history"]) {
    app.route({ method: ["PUT", "PATCH", "DELETE", "OPTIONS"], url, handler: methodNotAllowed("GET, POST") });
  }
  app.route({ method: ["POST", "PUT", "PATCH", "DELETE", "OPTIONS"], url: "/api/info", handler: methodNotAllowed("GET") });

  return app;
}
