// Starts the router: the routing table file, the /v2 contract surface, the forwarding pools.
import { readFileSync } from "node:fs";
import { createContractApp, type InFlightCaps } from "../platform/http.ts";
import { databaseLabel, serve, serviceDatabase, startService, type DatabaseOptions, type RunningService } from "../platform/lifecycle.ts";
import { createLogger, type Logger } from "../platform/logger.ts";
import { createMetrics } from "../platform/metrics.ts";
import { API_KEY_MIGRATIONS, createApiKeyStore } from "../tenants/api-keys.ts";
import { createRouter } from "./router.ts";
import { createRouterDiscovery } from "./discovery.ts";
import { readAdminTokenFile } from "../platform/admin-token.ts";
import { watchRouterToken } from "../platform/router-token.ts";
import { registerKeyAdmin } from "../tenants/admin-api.ts";
import { DEFAULT_CATALOG_MAX_AGE_MS, DISCOVERY_MIGRATIONS, createCatalog } from "../discovery/catalog.ts";
import { createResourceVerifier, type VerificationOptions } from "../discovery/verification.ts";
import { watchRoutingTable } from "./routing-table.ts";

export interface RouterConfig extends DatabaseOptions {
  routingTablePath: string;
  host: string;
  port: number;
  adminPort?: number;
  bodyLimit?: number;
  /** How often backends are probed for x402_router_backend_up. */
  probeIntervalMs?: number;
  // Where keys, quotas, usage and the catalog live (DatabaseOptions): `databaseUrl`, the PostgreSQL
  // database several replicas share; else the embedded engine in `dataDir` (in memory without it),
  // which serves one replica only: two routers on their own engines would each count their own quotas.
  /**
   * Require API keys on /verify and /settle, kept in the router's database (`x402-fleet api-key-*`
   * or the admin API manages them). Off: the endpoints are open, as the contract says.
   */
  apiKeys?: boolean;
  /** Catalogue paid requests' bazaar declarations in the router's database and serve GET /v2/discovery/*. */
  discovery?: boolean;
  /**
   * How declarations are proven against the resource's own 402 answer (discovery/verification.ts):
   * the fetch bound, and hosts fetched at another origin past the SSRF guard (tests, devnets; none
   * by default, so loopback and private addresses stay unreachable).
   */
  discoveryVerification?: VerificationOptions;
  /** With API keys: the bootstrap admin token (a file, from a Secret) opening /admin/v1/* on the admin port. */
  adminTokenFile?: string;
  /** Requests held at once, per action: past it a 503 with Retry-After (unset: no cap). */
  maxInFlight?: InFlightCaps;
  /** Our credential at the facilitators: a file whose first line is the token (platform/router-token.ts), re-read on change. */
  routerTokenFile?: string;
  /**
   * Settlement webhooks of keys: the fleet's webhook secret (the facilitators' X402_WEBHOOK_SECRET_FILE,
   * from which the admin API derives each key's webhook key), and whether keys' URLs may be http or private.
   */
  webhooks?: { secretFile?: string; allowPrivateNetworks?: boolean };
}

export type RunningRouter = RunningService;

export async function startRouterService(config: RouterConfig, logger: Logger = createLogger("router")): Promise<RunningRouter> {
  const metrics = createMetrics("router");
  const migrations = [...(config.apiKeys ? API_KEY_MIGRATIONS : []), ...(config.discovery ? DISCOVERY_MIGRATIONS : [])];
  if (config.adminTokenFile && !config.apiKeys) throw new Error("router: an admin token (X402_ROUTER_ADMIN_TOKEN_FILE) manages API keys: it needs X402_ROUTER_API_KEYS=required");
  const adminToken = config.adminTokenFile ? readAdminTokenFile(config.adminTokenFile, "router") : undefined;
  const webhooks = { secret: config.webhooks?.secretFile ? readWebhookSecret(config.webhooks.secretFile) : undefined, allowPrivateNetworks: config.webhooks?.allowPrivateNetworks ?? false };
  return startService(async (life) => {
    const keysDb = migrations.length ? await serviceDatabase(life, config, migrations, { logger }) : undefined;
    const apiKeys = keysDb && config.apiKeys ? createApiKeyStore(keysDb) : undefined;
    const catalog = keysDb && config.discovery ? createCatalog(keysDb) : undefined;
    // Owned after the database: closed first, so no proof is written to a closed database.
    const discovery = catalog ? life.own(createRouterDiscovery(catalog, logger, { verifier: createResourceVerifier(config.discoveryVerification), metrics })) : undefined;
    const routerToken = config.routerTokenFile ? life.own(watchRouterToken(config.routerTokenFile, logger)) : undefined;
    const router = life.own(createRouter({ logger, metrics, apiKeys, discovery, routerToken }));
    // Hourly housekeeping of the shared database: old quota windows, resources nobody paid for in 30 days.
    if (keysDb) {
      const prune = setInterval(() => {
        void apiKeys?.pruneUsage().catch(() => undefined);
        void catalog?.prune(DEFAULT_CATALOG_MAX_AGE_MS).catch(() => undefined);
      }, 3_600_000);
      prune.unref();
      life.defer(() => clearInterval(prune));
    }
    const source = life.own(
      await watchRoutingTable(config.routingTablePath, logger, (t) => {
        router.setTable(t);
        void router.probeBackends();
      }),
    );
    const probe = setInterval(() => void router.probeBackends(), config.probeIntervalMs ?? 5000);
    probe.unref();
    life.defer(() => clearInterval(probe));
    // A settle is forwarded with a 60 s bound (router.ts): the connection must outlive it.
    const app = createContractApp({ logger, bodyLimit: config.bodyLimit, handlers: router, service: "router", metrics, longestHandlerMs: 60_000, maxInFlight: config.maxInFlight });
    const { url, adminUrl } = await serve(life, app, { host: config.host, port: config.port, adminPort: config.adminPort ?? (config.port === 0 ? 0 : 9420) }, {
      registry: metrics.registry,
      logger,
      checks: [{ name: "routing_table_loaded", check: async () => source.current() !== undefined }],
      routes: apiKeys && adminToken ? (scope) => registerKeyAdmin(scope, { keys: apiKeys, token: adminToken, webhooks }) : undefined,
    });
    logger.info({ url: `${url}/v2`, admin: adminUrl, table: config.routingTablePath, apiKeys: apiKeys ? "required" : "off", discovery: discovery ? "on" : "off", ...(keysDb ? databaseLabel(config) : {}) }, "router listening");
    return { url: `${url}/v2`, adminUrl };
  });
}

/** The fleet's webhook secret, as the facilitators read it (never echoed). */
function readWebhookSecret(path: string): string {
  let secret: string;
  try {
    secret = readFileSync(path, "utf8").trim();
  } catch (e) {
    throw new Error(`router: webhook secret file ${path} cannot be read (${(e as NodeJS.ErrnoException).code ?? "error"})`);
  }
  if (secret.length < 32) throw new Error(`router: the webhook secret file ${path} holds fewer than 32 characters`);
  return secret;
}
