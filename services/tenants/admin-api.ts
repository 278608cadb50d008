// The routers' key administration over HTTP, on the admin port (never the public one), for the
// platform team's tooling: the same operations as `x402-fleet api-key-*`, behind the bootstrap admin
// token (a Secret mounted as a file, X402_ROUTER_ADMIN_TOKEN_FILE). Errors are the contract's
// body, `{"error": "<code>: <detail>"}`; a new or rotated key is in the answer once, never again.
import type { FastifyInstance, FastifyReply, FastifyRequest } from "fastify";
import { z } from "zod";
import { bearerOf, type AdminToken } from "../platform/admin-token.ts";
import { CodedError } from "../platform/errors.ts";
import { CAIP2_PATTERN } from "../x402/networks.ts";
import { SCHEMES } from "../x402/wire.ts";
import { tenantWebhookKey, webhookOrigin, webhookUrlProblem } from "../x402/webhooks.ts";
import type { ApiKeyStore, KeyLimits } from "./api-keys.ts";

const network = z.string().regex(CAIP2_PATTERN, "a CAIP-2 network (eip155:<chain id>)");
const limit = z.number().int().min(0).max(1_000_000_000).nullable();
const limitsSchema = z
  .object({
    requestsPerMinute: limit,
    settlementsPerDay: limit,
    gasBudgets: z.record(network, z.string().regex(/^[0-9]{1,78}$/, "wei as a decimal string")),
    webhookUrl: z.string().nullable(),
  })
  .partial()
  .strict();
const createSchema = limitsSchema.extend({
  name: z.string().trim().min(1).max(200),
  networks: z.array(network).max(64).optional(),
  schemes: z.array(z.enum(SCHEMES)).max(3).optional(),
});
const idSchema = z.string().regex(/^[0-9a-f]{16}$/, "a key id is 16 hex characters");
const usageQuery = z.object({ keyId: idSchema.optional(), since: z.string().regex(/^\d{4}-\d{2}-\d{2}$/, "a UTC day, YYYY-MM-DD").optional() }).strict();

function parse<T>(schema: z.ZodType<T>, value: unknown, what: string): T {
  const r = schema.safeParse(value ?? {});
  if (r.success) return r.data;
  const issue = r.error.issues[0]!;
  throw new CodedError("invalid_request", `${what}${issue.path.length ? `.${issue.path.join(".")}` : ""}: ${issue.message}`, 400);
}

/** Settlement webhooks at the router: the fleet's webhook secret (a tenant's key derives from it) and the URL rules. */
export interface KeyAdminWebhooks {
  secret?: string;
  allowPrivateNetworks: boolean;
}

export function registerKeyAdmin(app: FastifyInstance, opts: { keys: ApiKeyStore; token: AdminToken; webhooks?: KeyAdminWebhooks }) {
  const { keys } = opts;
  const allowPrivateNetworks = opts.webhooks?.allowPrivateNetworks ?? false;
  /** A key's webhook URL passes the facilitators' rules (never echoed: it may carry a token). */
  const checkWebhook = (url: string | null | undefined) => {
    const problem = url ? webhookUrlProblem(url, { allowPrivateNetworks }) : undefined;
    if (problem) throw new CodedError("invalid_request", `body.webhookUrl: ${problem}`, 400);
  };
  /** What an audit line may say of a webhook URL: its origin. */
  const audited = <T extends { webhookUrl?: string | null }>(v: T) => (v.webhookUrl ? { ...v, webhookUrl: webhookOrigin(v.webhookUrl) } : v);
  app.setErrorHandler((error, _request, reply) => {
    if (error instanceof CodedError) return reply.code(error.status).send(error.body());
    const e = error as { statusCode?: number; message?: string; name?: string };
    if (e.statusCode && e.statusCode < 500) return reply.code(e.statusCode).send({ error: `invalid_request: ${e.message}` }); // bad JSON, too large…
    reply.log.error({ err: { name: e.name } }, "admin API error");
    return reply.code(503).send({ error: "backend_unavailable: the key store cannot be reached right now; try again" });
  });

  const authorized = (request: FastifyRequest) => {
    const token = bearerOf(request.headers.authorization);
    if (!token) throw new CodedError("unauthorized", "send the admin token as Authorization: Bearer <token>", 401);
    if (!opts.token.matches(token)) throw new CodedError("unauthorized", "wrong admin token", 401);
  };
  const route = (method: "GET" | "POST" | "PATCH", url: string, handler: (request: FastifyRequest, reply: FastifyReply) => Promise<unknown>) =>
    app.route({ method, url, preHandler: async (request) => authorized(request), handler });
  const idOf = (request: FastifyRequest) => parse(idSchema, (request.params as { id: string }).id, "id");
  const found = <T>(value: T | undefined, id: string): T => {
    if (value === undefined) throw new CodedError("not_found", `no API key ${id}`, 404);
    return value;
  };

  route("GET", "/admin/v1/api-keys", async () => ({ apiKeys: await keys.list() }));
  route("POST", "/admin/v1/api-keys", async (request, reply) => {
    const body = parse(createSchema, request.body, "body");
    checkWebhook(body.webhookUrl);
    const { key, info } = await keys.create(body.name, body);
    request.log.info({ apiKey: info.id, name: info.name }, "API key created"); // an audit line; never the key
    return reply.code(201).send({ key, apiKey: info });
  });
  route("PATCH", "/admin/v1/api-keys/:id", async (request) => {
    const id = idOf(request);
    const limits: Partial<KeyLimits> = parse(limitsSchema, request.body, "body");
    checkWebhook(limits.webhookUrl);
    const updated = found(await keys.setLimits(id, limits), id);
    request.log.info({ apiKey: id, limits: audited(limits) }, "API key limits changed");
    return { apiKey: updated };
  });
  route("POST", "/admin/v1/api-keys/:id/rotate", async (request) => {
    const id = idOf(request);
    const rotated = found(await keys.rotate(id), id);
    request.log.info({ apiKey: id }, "API key rotated");
    return { key: rotated.key, apiKey: rotated.info };
  });
  route("POST", "/admin/v1/api-keys/:id/revoke", async (request) => {
    const id = idOf(request);
    const revoked = found(await keys.revoke(id), id);
    request.log.info({ apiKey: id }, "API key revoked");
    return { apiKey: revoked };
  });
  // The key a tenant verifies its webhooks with (x402/webhooks.ts), derived from the fleet's webhook secret.
  route("GET", "/admin/v1/api-keys/:id/webhook-key", async (request) => {
    const id = idOf(request);
    found((await keys.list()).find((k) => k.id === id), id);
    if (!opts.webhooks?.secret) throw new CodedError("webhook_secret_missing", "this router has no webhook secret (X402_ROUTER_WEBHOOK_SECRET_FILE): it cannot show webhook keys", 409);
    request.log.info({ apiKey: id }, "API key webhook key shown");
    return { apiKey: id, webhookKey: tenantWebhookKey(opts.webhooks.secret, id) };
  });
  route("GET", "/admin/v1/usage", async (request) => ({ usage: await keys.usage(parse(usageQuery, request.query, "query")) }));
}
