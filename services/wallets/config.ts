// `x402-fleet wallets` configuration: flags win over the environment, which wins over defaults.
// Secrets come from files only (mounted Secrets): the master keys and the admin token.
import { flagOrEnv, port, serviceCommand, stringFlags, wholeNumber, type FlagValues } from "../platform/flags.ts";
import { CAIP2_PATTERN, type Caip2 } from "../x402/networks.ts";
import type { WalletsServiceOptions } from "./service.ts";

const FLAGS = {
  ...stringFlags("host", "port", "admin-port", "data-dir", "master-key-file", "admin-token-file"),
  /** `eip155:8453=https://…`, repeatable. */
  "rpc-url": { type: "string", multiple: true },
} as const;

/** `eip155:<id>=<url>` pairs; the URL itself is never echoed (it can embed an API key). */
export function parseRpcUrls(entries: string[]): Partial<Record<Caip2, string>> {
  const out: Partial<Record<Caip2, string>> = {};
  for (const entry of entries) {
    const at = entry.indexOf("=");
    const network = at > 0 ? entry.slice(0, at).trim() : "";
    const url = at > 0 ? entry.slice(at + 1).trim() : "";
    if (!CAIP2_PATTERN.test(network) || !/^https?:\/\//.test(url)) {
      throw new Error(`wallets: an RPC is given as eip155:<chain id>=<http(s) URL>, got ${CAIP2_PATTERN.test(network) ? `${network}=<not an http(s) URL>` : "a value without a network"}`);
    }
    if (out[network as Caip2]) throw new Error(`wallets: two RPCs for ${network}`);
    out[network as Caip2] = url;
  }
  return out;
}

export function walletsOptionsFrom(flags: FlagValues<typeof FLAGS>, env: NodeJS.ProcessEnv): WalletsServiceOptions {
  const envNumber = (name: string) => wholeNumber(name, env[name]);
  const listen = {
    port: port(...flagOrEnv("--port", flags.port, env, "PORT")) ?? 4040,
    adminPort: port(...flagOrEnv("--admin-port", flags["admin-port"], env, "ADMIN_PORT")),
  };
  const masterKeyFile = flags["master-key-file"] ?? (env.WALLETS_MASTER_KEY_FILE || undefined);
  if (!masterKeyFile) throw new Error("wallets: --master-key-file (or WALLETS_MASTER_KEY_FILE) is required: a file with one master key a line, <id>:<64 hex characters>, the primary first");
  const rpc = [...(flags["rpc-url"] ?? []), ...(env.WALLETS_RPC_URLS ?? "").split(",").map((s) => s.trim()).filter(Boolean)];
  return {
    host: flags.host ?? env.HOST ?? "127.0.0.1",
    ...listen,
    databaseUrl: env.DATABASE_URL || undefined,
    dataDir: flags["data-dir"] ?? env.WALLETS_DATA_DIR ?? ".data/wallets",
    masterKeyFile,
    adminTokenFile: flags["admin-token-file"] ?? (env.WALLETS_ADMIN_TOKEN_FILE || undefined),
    rpcUrls: parseRpcUrls(rpc),
    allowPrivateNetworks: env.WALLETS_ALLOW_PRIVATE_NETWORKS === "true",
    maxAuthorizationSeconds: envNumber("WALLETS_MAX_AUTHORIZATION_SECONDS"),
    fetchTimeoutMs: envNumber("WALLETS_FETCH_TIMEOUT_MS"),
    bodyLimit: envNumber("WALLETS_BODY_LIMIT"),
  };
}

export const walletsCli = serviceCommand({
  name: "wallets",
  summary: "custodial agent wallets: platforms pay x402 resources with an API key (docs/wallets.md)",
  help: `  --master-key-file FILE   (env WALLETS_MASTER_KEY_FILE; required)
  [--admin-token-file FILE]   (env WALLETS_ADMIN_TOKEN_FILE)
  --port 4040 --admin-port 9440 --host 127.0.0.1   (env PORT, ADMIN_PORT, HOST)
  --data-dir .data/wallets   (env WALLETS_DATA_DIR)
  [--rpc-url eip155:8453=URL ...]   (env WALLETS_RPC_URLS, comma-separated network=URL)
env: DATABASE_URL, WALLETS_ALLOW_PRIVATE_NETWORKS=true, WALLETS_MAX_AUTHORIZATION_SECONDS,
  WALLETS_FETCH_TIMEOUT_MS, WALLETS_BODY_LIMIT
`,
  flags: FLAGS,
  optionsFrom: walletsOptionsFrom,
  start: async (options) => (await import("./service.ts")).startWalletsService(options),
});
