// `x402-fleet router`: flags and environment → RouterConfig, every value checked before anything
// starts (the service itself trusts its config).
import { FlagError, flagOrEnv, port, serviceCommand, stringFlags, wholeNumber, type FlagValues } from "../platform/flags.ts";
import type { RouterConfig } from "./service.ts";

const FLAGS = stringFlags("routing-table", "host", "port", "admin-port", "data-dir");

export function routerOptionsFrom(flags: FlagValues<typeof FLAGS>, env: NodeJS.ProcessEnv): RouterConfig {
  const listen = {
    port: port(...flagOrEnv("--port", flags.port, env, "PORT")) ?? 4020,
    adminPort: port(...flagOrEnv("--admin-port", flags["admin-port"], env, "ADMIN_PORT")),
  };
  const routingTablePath = flags["routing-table"] ?? env.X402_ROUTING_TABLE;
  if (!routingTablePath) throw new Error("router: --routing-table (or X402_ROUTING_TABLE) is required");
  const apiKeys = env.X402_ROUTER_API_KEYS === "required";
  const discovery = env.X402_ROUTER_DISCOVERY === "on";
  const routerTokenFile = env.X402_ROUTER_TOKEN_FILE || undefined;
  // A facilitator reads a gas allowance only from a router it authenticates: without the token a
  // tenant's budget would not bind there, and its port would settle for anyone.
  if (apiKeys && !routerTokenFile) throw new Error("router: X402_ROUTER_API_KEYS=required needs X402_ROUTER_TOKEN_FILE (the token the facilitators accept from the router: docs/tenants.md)");
  // Requests held at once (load shedding); the router only forwards, and fronts one facilitator per network.
  const cap = (name: string, fallback: number) => {
    const v = wholeNumber(name, env[name]);
    if (v === 0) throw new FlagError(`${name} must be at least 1`);
    return v ?? fallback;
  };
  return {
    maxInFlight: { verify: cap("X402_MAX_VERIFY_IN_FLIGHT", 16_384), settle: cap("X402_MAX_SETTLE_IN_FLIGHT", 16_384) },
    // Several replicas share keys, quotas and the catalog in DATABASE_URL; without it one router keeps them in its own embedded engine.
    databaseUrl: env.DATABASE_URL || undefined,
    dataDir: flags["data-dir"] ?? env.X402_ROUTER_DATA_DIR ?? ".data/router",
    apiKeys,
    discovery,
    adminTokenFile: env.X402_ROUTER_ADMIN_TOKEN_FILE || undefined,
    routerTokenFile,
    webhooks: { secretFile: env.X402_ROUTER_WEBHOOK_SECRET_FILE || undefined, allowPrivateNetworks: env.X402_ROUTER_WEBHOOK_ALLOW_PRIVATE_NETWORKS === "true" },
    routingTablePath,
    host: flags.host ?? env.HOST ?? "127.0.0.1",
    ...listen,
  };
}

export const routerCli = serviceCommand({
  name: "router",
  summary: "the public /v2 edge",
  help: `  --routing-table FILE   (env X402_ROUTING_TABLE; required)
  --port 4020 --admin-port 9420 --host 127.0.0.1   (env PORT, ADMIN_PORT, HOST)
  --data-dir .data/router   (env X402_ROUTER_DATA_DIR) the embedded engine of keys and catalog: one replica only
env: OTEL_EXPORTER_OTLP_ENDPOINT,
  DATABASE_URL: the PostgreSQL database several replicas share (keys, quotas, usage, catalog),
  X402_ROUTER_API_KEYS=required: /verify and /settle need an API key,
  X402_ROUTER_DISCOVERY=on: the bazaar catalog at /v2/discovery/*,
  X402_ROUTER_ADMIN_TOKEN_FILE: the key admin API at /admin/v1/* on the admin port,
  X402_ROUTER_TOKEN_FILE: the token sent to the facilitators (its first line; required with API keys),
  X402_ROUTER_WEBHOOK_SECRET_FILE: the facilitators' webhook secret, to show each key its webhook key,
  X402_ROUTER_WEBHOOK_ALLOW_PRIVATE_NETWORKS=true: keys' webhook URLs may be http and private (in-cluster receivers),
  X402_MAX_VERIFY_IN_FLIGHT, X402_MAX_SETTLE_IN_FLIGHT: requests held at once (16384 each), past it 503 + Retry-After
`,
  flags: FLAGS,
  optionsFrom: routerOptionsFrom,
  start: async (config) => (await import("./service.ts")).startRouterService(config),
});
