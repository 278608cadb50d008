// The wallet service's HTTP surface. Agent platforms call /v1/wallets… with their API key; the
// operator calls /v1/admin… with the admin token. A platform sees only its own wallets: another
// platform's wallet id answers 404 exactly like an id that does not exist. Every error is a proper
// status with `{"error": "<code>: <detail>"}`; bad input is never a 500.
import { randomBytes } from "node:crypto";
import type { FastifyInstance, FastifyReply, FastifyRequest } from "fastify";
import { createServiceApp } from "../platform/http-kit.ts";
import type { Logger } from "../platform/logger.ts";
import type { Metrics } from "../platform/metrics.ts";
import type { ServerTimeouts } from "../platform/timeouts.ts";
import { approvePermit2 } from "./approvals.ts";
import { walletBalances } from "./balances.ts";
import type { ChainAccess } from "./chain.ts";
import { apiKeyIdOf, bearerToken, matchesDigest, newApiKey, unauthorized, type AdminToken } from "./credentials.ts";
import { createSealedKey } from "./custody.ts";
import { WalletError } from "./errors.ts";
import type { Fetcher } from "./fetcher.ts";
import type { KeyringSource } from "./keyring.ts";
import { owned, ownedWallet } from "./owned.ts";
import { payFor, type Caller, type PaymentsDeps } from "./payments.ts";
import { EMPTY_POLICY, parsePolicy, WALLET_SCHEMES } from "./policy.ts";
import type { Rotator } from "./rotation.ts";
import { MasterKeyRetiredError, type CreateWalletInput, type Page, type Paged, type Wallet, type WalletStore } from "./store.ts";
import { createApiKeyBody, createPlatformBody, createWalletBody, parseBody, parseFetchRequest, parseNetworkQuery, parsePage, parsePayRequest, permit2ApprovalBody } from "./wire.ts";
import type { Caip2 } from "../x402/networks.ts";

export const DEFAULT_WALLETS_BODY_LIMIT = 2 * 1024 * 1024;
export const DEFAULT_MAX_AUTHORIZATION_SECONDS = 3600;

export interface WalletsAppOptions {
  logger: Logger;
  metrics?: Metrics;
  store: WalletStore;
  keyring: KeyringSource;
  rotator: Rotator;
  chain?: ChainAccess;
  fetcher: Fetcher;
  /** The operator's token for /v1/admin; absent: the admin endpoints answer admin_disabled. */
  adminToken?: AdminToken;
  /** Clock in ms (tests pass their own). */
  now?: () => number;
  maxAuthorizationSeconds?: number;
  bodyLimit?: number;
  /** Connection bounds (slow clients); unset ones come from HTTP_*_TIMEOUT_MS or the defaults. */
  timeouts?: Partial<ServerTimeouts>;
  /** The longest a handler may wait (/fetch: two upstream requests): the idle bound must exceed it. */
  longestHandlerMs?: number;
}

const WALLET_ID = /^wal_[0-9a-f]{24}$/;
const PLATFORM_ID = /^plt_[0-9a-f]{16}$/;
const KEY_ID = /^[0-9a-f]{16}$/;

export function walletView(w: Wallet) {
  return { id: w.id, address: w.address, label: w.label, agentId: w.agentId, policy: w.policy, policyVersion: w.policyVersion, createdAt: w.createdAt, updatedAt: w.updatedAt };
}

export function createWalletsApp(opts: WalletsAppOptions): FastifyInstance {
  const deps: PaymentsDeps = {
    store: opts.store,
    keyring: opts.keyring,
    chain: opts.chain,
    metrics: opts.metrics,
    logger: opts.logger,
    now: opts.now ?? Date.now,
    maxAuthorizationSeconds: opts.maxAuthorizationSeconds ?? DEFAULT_MAX_AUTHORIZATION_SECONDS,
  };
  const endpoints = "see GET /v1/info and docs/wallets.md";
  return createServiceApp({ ...opts, service: "wallets", bodyLimit: opts.bodyLimit ?? DEFAULT_WALLETS_BODY_LIMIT, endpoints }, (app) => walletRoutes(app, opts, deps));
}

function walletRoutes(app: FastifyInstance, opts: WalletsAppOptions, deps: PaymentsDeps): void {
  const { store, keyring, now } = deps;

  // ---- authentication

  async function platformCaller(request: FastifyRequest): Promise<Caller> {
    const token = bearerToken(request.headers);
    if (!token) throw unauthorized("send the platform's API key as Authorization: Bearer <key>");
    const keyId = apiKeyIdOf(token);
    if (!keyId) throw unauthorized("the credential is not a wallet service API key");
    const key = await store.apiKey(keyId);
    if (!key || !matchesDigest(token, key.digest)) throw unauthorized("unknown API key");
    if (key.revokedAt) throw unauthorized(`API key ${key.id} was revoked`);
    return { platformId: key.platformId, apiKeyId: key.id };
  }

  function requireAdmin(request: FastifyRequest): void {
    if (!opts.adminToken) throw new WalletError("admin_disabled", "the admin API is off: start the service with an admin token file (--admin-token-file)");
    const token = bearerToken(request.headers);
    if (!token) throw unauthorized("send the admin token as Authorization: Bearer <token>");
    if (!opts.adminToken.matches(token)) throw unauthorized("wrong admin token");
  }

  const walletIdOf = (request: FastifyRequest): string => {
    const id = (request.params as { walletId?: string }).walletId ?? "";
    if (!WALLET_ID.test(id)) throw new WalletError("not_found", `no wallet ${JSON.stringify(id.slice(0, 40))}`);
    return id;
  };
  const platformIdOf = (request: FastifyRequest): string => {
    const id = (request.params as { platformId?: string }).platformId ?? "";
    if (!PLATFORM_ID.test(id)) throw new WalletError("not_found", `no platform ${JSON.stringify(id.slice(0, 40))}`);
    return id;
  };

  const platformRoute = (method: "GET" | "POST" | "PUT" | "DELETE", url: string, handler: (caller: Caller, request: FastifyRequest, reply: FastifyReply) => Promise<unknown>) =>
    app.route({ method, url, handler: async (request, reply) => handler(await platformCaller(request), request, reply) });
  const adminRoute = (method: "GET" | "POST" | "DELETE", url: string, handler: (request: FastifyRequest, reply: FastifyReply) => Promise<unknown>) =>
    app.route({ method, url, handler: async (request, reply) => (requireAdmin(request), handler(request, reply)) });

  // ---- public

  app.get("/v1/info", async () => ({
    service: "x402-fleet wallets",
    x402Version: 2,
    schemes: WALLET_SCHEMES,
    transferMethods: { exact: ["eip3009", "permit2"], upto: ["permit2"] },
    networks: opts.chain?.networks() ?? [],
    auth: "Authorization: Bearer <API key>",
    maxAuthorizationSeconds: deps.maxAuthorizationSeconds,
  }));

  // ---- agent platforms

  platformRoute("GET", "/v1/platform", async (caller) => {
    const platform = await store.platform(caller.platformId);
    return { platform, apiKeyId: caller.apiKeyId };
  });

  platformRoute("POST", "/v1/wallets", async (caller, request, reply) => {
    const body = parseBody(createWalletBody, request.body);
    const policy = body.policy === undefined ? EMPTY_POLICY : parsePolicy(body.policy);
    const id = `wal_${randomBytes(12).toString("hex")}`;
    const create = (master = keyring.current().primary) => {
      const { address, sealed } = createSealedKey(id, master);
      const input: CreateWalletInput = { id, platformId: caller.platformId, address, label: body.label, agentId: body.agentId, policy, sealed, apiKeyId: caller.apiKeyId, now: new Date(now()) };
      return store.createWallet(input).then((wallet) => ({ wallet, masterKeyId: sealed.masterKeyId }));
    };
    let created;
    try {
      created = await create();
    } catch (e) {
      if (!(e instanceof MasterKeyRetiredError)) throw e;
      // Another replica retired our primary: the file must hold a newer one; re-read it once.
      await keyring.reload().catch(() => undefined);
      const primary = keyring.current().primary;
      if (primary.id === e.masterKeyId) {
        throw new WalletError("master_key_unavailable", `master key ${e.masterKeyId} is retired and this replica has not loaded a newer primary yet; retry shortly`);
      }
      created = await create(primary).catch((again: unknown) => {
        if (again instanceof MasterKeyRetiredError) throw new WalletError("master_key_unavailable", `master key ${again.masterKeyId} is retired; retry shortly`);
        throw again;
      });
    }
    opts.metrics?.walletDataKeys.inc({ master_key: created.masterKeyId });
    return reply.code(201).send(walletView(created.wallet));
  });

  platformRoute("GET", "/v1/wallets", async (caller, request) => {
    const page = await store.listWallets(caller.platformId, parsePage(request.query));
    return { wallets: page.items.map(walletView), next: page.next };
  });

  platformRoute("GET", "/v1/wallets/:walletId", async (caller, request) => {
    return walletView(await ownedWallet(store, caller, walletIdOf(request)));
  });

  platformRoute("GET", "/v1/wallets/:walletId/balances", async (caller, request) => {
    const id = walletIdOf(request);
    const network = parseNetworkQuery(request.query);
    const wallet = await ownedWallet(store, caller, id);
    if (!opts.chain) throw new WalletError("network_not_configured", "the wallet service has no RPC configured (--rpc-url eip155:<chain id>=<url>)");
    return { walletId: id, address: wallet.address, networks: await walletBalances(opts.chain, wallet.address, wallet.policy, network) };
  });

  platformRoute("GET", "/v1/wallets/:walletId/policy", async (caller, request) => {
    const id = walletIdOf(request);
    const wallet = await ownedWallet(store, caller, id);
    return { walletId: id, version: wallet.policyVersion, policy: wallet.policy };
  });

  platformRoute("PUT", "/v1/wallets/:walletId/policy", async (caller, request) => {
    const id = walletIdOf(request);
    const policy = parsePolicy(request.body);
    const wallet = await owned(store.setPolicy(caller.platformId, id, policy, caller.apiKeyId, new Date(now())), id);
    request.log.info({ wallet: id, version: wallet.policyVersion, apiKey: caller.apiKeyId }, "wallets policy changed");
    return { walletId: id, version: wallet.policyVersion, policy: wallet.policy };
  });

  // A wallet's records a page at a time: its policy changes and its signatures.
  type Lister = (platformId: string, walletId: string, page: Page) => Promise<Paged<unknown> | undefined>;
  const pageRoute = (path: string, field: string, list: Lister) =>
    platformRoute("GET", `/v1/wallets/:walletId/${path}`, async (caller, request) => {
      const id = walletIdOf(request);
      const page = await owned(list(caller.platformId, id, parsePage(request.query)), id);
      return { walletId: id, [field]: page.items, next: page.next };
    });
  pageRoute("policy/history", "changes", (p, w, page) => store.policyHistory(p, w, page));
  pageRoute("signatures", "signatures", (p, w, page) => store.signatures(p, w, page));

  platformRoute("POST", "/v1/wallets/:walletId/pay", async (caller, request) => {
    const id = walletIdOf(request);
    return payFor(deps, caller, id, parsePayRequest(request.body));
  });

  platformRoute("POST", "/v1/wallets/:walletId/fetch", async (caller, request) => {
    const id = walletIdOf(request);
    return opts.fetcher.fetchAndPay(deps, caller, id, parseFetchRequest(request.body));
  });

  platformRoute("POST", "/v1/wallets/:walletId/permit2-approval", async (caller, request) => {
    const id = walletIdOf(request);
    const body = parseBody(permit2ApprovalBody, request.body);
    return approvePermit2(deps, caller, id, { network: body.network as Caip2, asset: body.asset, amount: body.amount });
  });

  // ---- the operator

  adminRoute("POST", "/v1/admin/platforms", async (request, reply) => {
    const body = parseBody(createPlatformBody, request.body);
    const key = newApiKey();
    const platform = await store.createPlatform(`plt_${randomBytes(8).toString("hex")}`, body.name, { id: key.id, digest: key.digest });
    request.log.info({ platform: platform.id, apiKey: key.id }, "wallets platform created");
    return reply.code(201).send({ platform, apiKey: { id: key.id, key: key.token } });
  });

  adminRoute("GET", "/v1/admin/platforms", async () => ({ platforms: await store.listPlatforms() }));

  adminRoute("GET", "/v1/admin/platforms/:platformId/api-keys", async (request) => {
    const id = platformIdOf(request);
    const keys = await store.listApiKeys(id);
    if (!keys) throw new WalletError("not_found", `no platform ${id}`);
    return { platformId: id, apiKeys: keys };
  });

  adminRoute("POST", "/v1/admin/platforms/:platformId/api-keys", async (request, reply) => {
    const id = platformIdOf(request);
    const body = parseBody(createApiKeyBody, request.body);
    const key = newApiKey();
    const info = await store.addApiKey(id, { id: key.id, digest: key.digest, label: body.label });
    if (!info) throw new WalletError("not_found", `no platform ${id}`);
    request.log.info({ platform: id, apiKey: key.id }, "wallets API key created");
    return reply.code(201).send({ ...info, key: key.token });
  });

  adminRoute("DELETE", "/v1/admin/platforms/:platformId/api-keys/:keyId", async (request) => {
    const id = platformIdOf(request);
    const keyId = (request.params as { keyId: string }).keyId;
    const info = KEY_ID.test(keyId) ? await store.revokeApiKey(id, keyId, new Date(now())) : undefined;
    if (!info) throw new WalletError("not_found", `platform ${id} has no API key ${JSON.stringify(keyId.slice(0, 40))}`);
    request.log.info({ platform: id, apiKey: keyId }, "wallets API key revoked");
    return info;
  });

  adminRoute("GET", "/v1/admin/master-keys", async () => opts.rotator.status());

  adminRoute("POST", "/v1/admin/master-keys/rotate", async () => {
    const reload = await keyring.reload().catch((e: Error) => {
      throw new WalletError("conflict", `the master key file was not loaded: ${e.message}`);
    });
    const result = await opts.rotator.rewrapAll();
    return { reloaded: reload.changed, ...result, ...(await opts.rotator.status()) };
  });
}
