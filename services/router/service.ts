// Starts the router: the routing table file, the /v2 contract surface, the forwarding pools.
import { createContractApp } from "../platform/http.ts";
import { createLogger, type Logger } from "../platform/logger.ts";
import { createRouter } from "./router.ts";
import { watchRoutingTable } from "./routing-table.ts";

export interface RouterConfig {
  routingTablePath: string;
  host: string;
  port: number;
  bodyLimit?: number;
}

export interface RunningRouter {
  url: string;
  close(): Promise<void>;
}

export async function startRouterService(config: RouterConfig, logger: Logger = createLogger("router")): Promise<RunningRouter> {
  const router = createRouter({ logger });
  const source = await watchRoutingTable(config.routingTablePath, logger, (t) => router.setTable(t));
  const app = createContractApp({ logger, bodyLimit: config.bodyLimit, handlers: router });
  const address = await app.listen({ host: config.host, port: config.port });
  logger.info({ url: `${address}/v2`, table: config.routingTablePath }, "router listening");
  return {
    url: `${address}/v2`,
    close: async () => {
      source.close();
      await app.close();
      await router.close();
    },
  };
}
