// The hub's HTTP surface: the three endpoints of the original (upload, download, conversation) as
// its clients call them, plus our own history and info endpoints. Writes must be signed; reads are
// public. Every error is a proper status with `{"error": "<code>: <detail>"}`, never a 500 for bad input.
import type { FastifyInstance, FastifyReply, FastifyRequest } from "fastify";
import { stringToBytes } from "viem";
import { createServiceApp, type ServiceAppOptions } from "../platform/http-kit.ts";
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

export interface HubAppOptions extends Pick<ServiceAppOptions, "logger" | "metrics" | "timeouts"> {
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

// JSON, form fields, and anything else that is one of the two (fetch sends text/plain by default).
function parseHubBody(text: string, contentType: string): unknown {
  if (/^multipart\//i.test(contentType)) throw new HubError("unsupported_media_type", "multipart bodies are not accepted; send JSON or form fields");
  if (/^application\/x-www-form-urlencoded\s*(;|$)/i.test(contentType)) return parseForm(text);
  if (/^application\/json\s*(;|$)/i.test(contentType) || /^\s*[[{]/.test(text)) return JSON.parse(text);
  return parseForm(text.trim());
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

  /** Uses a token of `key` (or, with peek, only checks there is one); 429 with Retry-After when none is left. */
  function limit(limiter: RateLimiter, key: string, what: string, peek = false) {
    const decision = peek ? limiter.check(key) : limiter.take(key);
    if (!decision.ok) throw new HubError("rate_limited", `too many ${what}; retry in ${decision.retryAfterSeconds} s`, { "retry-after": String(decision.retryAfterSeconds) });
  }
  /** The caller's address: the peer, or what a trusted proxy says (trustProxy). */
  const callerOf = (request: FastifyRequest) => request.ip;

  const fieldsOf = (request: FastifyRequest) => collectFields(request.query, request.body);

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
      stored = await store.write({
        ...req,
        message: bytes,
        messageHash,
        nonce: write.nonce,
        expiry: write.expiry,
        conversationId: conversation?.conversationId,
        startsConversation: conversation?.index === "0",
      });
    } catch (e) {
      if (e instanceof NonceReusedError) throw new HubError("replayed_nonce", `nonce ${write.nonce} was already used by owner ${req.owner}; sign every write with a fresh nonce`);
      if (e instanceof QuotaExceededError) {
        const wouldUse = e.limit === "bytes" ? `store ${e.wouldUse} bytes` : `have ${e.wouldUse} keys`;
        throw new HubError("quota_exceeded", `owner ${req.owner} would ${wouldUse}, over its quota of ${e.max}; nothing was stored and the nonce is unused`);
      }
      throw e;
    }
    return reply.send({ owner: req.owner, bucket: req.bucket, id: req.id, kind: req.kind, version: stored.version, messageHash, size: bytes.length, createdAt: stored.createdAt });
  };

  const download = async (request: FastifyRequest, reply: FastifyReply) => {
    const req = parseDownload(fieldsOf(request));
    limit(reads, callerOf(request), "reads from this client");
    const value = await store.read(req.owner, req.id, req.version);
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
    if (req.id === undefined) return reply.send(await store.listConversations(req.owner, req.bucket, req.offset, req.length));
    const messages = await store.getConversation(req.owner, req.id, req.bucket, req.offset, req.length);
    return reply.send(messages.map((m) => decoder.decode(m)));
  };

  const history = async (request: FastifyRequest, reply: FastifyReply) => {
    const req = parseHistory(fieldsOf(request));
    limit(reads, callerOf(request), "reads from this client");
    const found = await store.history(req.owner, req.id, req.offset, req.length);
    if (!found) throw new HubError("not_found", `owner ${req.owner} has no value ${req.id}`);
    return reply.send({
      owner: req.owner,
      id: req.id,
      latest: found.latest,
      versions: found.versions.map((v) => ({ ...v, message: decoder.decode(v.message) })),
    });
  };

  return createServiceApp(
    {
      ...opts,
      service: "hub",
      bodyLimit,
      endpoints: "endpoints are POST /api/upload, GET|POST /api/download, GET|POST /api/conversation, GET|POST /api/history, GET /api/info",
      parseBody: parseHubBody,
      mediaTypes: "send JSON (application/json) or form fields (application/x-www-form-urlencoded)",
      // Query strings decode exactly like form bodies (one decoder, one rule for repeated names).
      fastify: { trustProxy: fastifyTrustProxy(opts.trustProxy), routerOptions: { querystringParser: (s: string) => parseForm(s) } },
    },
    (app) => {
      app.post("/api/upload", upload);
      for (const [url, handler] of [["/api/download", download], ["/api/conversation", conversation], ["/api/history", history]] as const) app.route({ method: ["GET", "POST"], url, handler });
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
    },
  );
}
