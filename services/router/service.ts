// Starts the router: the routing table file, the /v2 contract surface, the forwarding pools.
import { startAdminServer } from "../platform/admin.ts";
import { createContractApp } from "../platform/http.ts";
import { createLogger, type Logger } from "../platform/logger.ts";
import { createMetrics } from "../platform/metrics.ts";
import { openDatabase } from "../platform/storage.ts";
import { API_KEY_MIGRATIONS, createApiKeyStore } from "../tenants/api-keys.ts";
import { createRouter } from "./router.ts";
import { watchRoutingTable } from "./routing-table.ts";

export interface RouterConfig {
  routingTablePath: string;
  host: string;
  port: number;
  adminPort?: number;
  bodyLimit?: number;
  /** How often backends are probed for x402_router_backend_up. */
  probeIntervalMs?: number;
  /**
   * Require API keys on /verify and /settle, kept in this PostgreSQL database (shared by the
   * replicas; `x402-fleet api-key-*` manages them). Unset: the endpoints are open, as the contract says.
   */
  apiKeysDatabaseUrl?: string;
}

export interface RunningRouter {
  url: string;
  adminUrl: string;
  close(): Promise<void>;
}

export async function startRouterService(config: RouterConfig, logger: Logger = createLogger("router")): Promise<RunningRouter> {
  const metrics = createMetrics("router");
  const keysDb = config.apiKeysDatabaseUrl ? await openDatabase({ url: config.apiKeysDatabaseUrl, migrations: API_KEY_MIGRATIONS }) : undefined;
  const apiKeys = keysDb ? createApiKeyStore(keysDb) : undefined;
  const router = createRouter({ logger, metrics, apiKeys });
  const prune = apiKeys ? setInterval(() => void apiKeys.pruneUsage().catch(() => undefined), 3_600_000) : undefined;
  prune?.unref();
  const source = await watchRoutingTable(config.routingTablePath, logger, (t) => {
    router.setTable(t);
    void router.probeBackends();
  });
  const probe = setInterval(() => void router.probeBackends(), config.probeIntervalMs ?? 5000);
  probe.unref();
  // A settle is forwarded with a 60 s bound (router.ts): the connection must outlive it.
  const app = createContractApp({ logger, bodyLimit: config.bodyLimit, handlers: router, service: "router", metrics, longestHandlerMs: 60_000 });
  const admin = await startAdminServer({
    host: config.host,
    port: config.adminPort ?? (config.port === 0 ? 0 : 9420), // an ephemeral public port implies an ephemeral admin port
    registry: metrics.registry,
    logger,
    checks: [{ name: "routing_table_loaded", check: async () => source.current() !== undefined }],
  });
  const address = await app.listen({ host: config.host, port: config.port });
  logger.info({ url: `${address}/v2`, admin: admin.url, table: config.routingTablePath, apiKeys: keysDb ? "required" : "off" }, "router listening");
  return {
    url: `${address}/v2`,
    adminUrl: admin.url,
    close: async () => {
      clearInterval(probe);
      if (prune) clearInterval(prune);
      source.close();
      await app.close();
      await admin.close();
      await router.close();
      await keysDb?.close();
    },
  };
}
