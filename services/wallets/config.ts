// `x402-fleet wallets` configuration: flags win over the environment, which wins over defaults.
// Secrets come from files only (mounted Secrets): the master keys and the admin token.
import { CAIP2_PATTERN, type Caip2 } from "../x402/networks.ts";
import type { WalletsServiceOptions } from "./service.ts";

export interface WalletsFlags {
  host?: string;
  port?: string;
  adminPort?: string;
  dataDir?: string;
  masterKeyFile?: string;
  adminTokenFile?: string;
  /** `eip155:8453=https://…`, repeatable. */
  rpcUrls?: string[];
}

function num(name: string, v: string | undefined): number | undefined {
  if (v === undefined || v === "") return undefined;
  if (!/^\d+$/.test(v)) throw new Error(`wallets: ${name} must be a non-negative integer, got ${JSON.stringify(v)}`);
  return Number(v);
}

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

export function walletsOptionsFrom(flags: WalletsFlags, env: NodeJS.ProcessEnv): WalletsServiceOptions {
  const masterKeyFile = flags.masterKeyFile ?? (env.WALLETS_MASTER_KEY_FILE || undefined);
  if (!masterKeyFile) throw new Error("wallets: --master-key-file (or WALLETS_MASTER_KEY_FILE) is required: a file with one master key a line, <id>:<64 hex characters>, the primary first");
  const rpc = [...(flags.rpcUrls ?? []), ...(env.WALLETS_RPC_URLS ?? "").split(",").map((s) => s.trim()).filter(Boolean)];
  return {
    host: flags.host ?? env.HOST ?? "127.0.0.1",
    port: num("--port", flags.port) ?? 4040,
    adminPort: num("--admin-port", flags.adminPort ?? env.ADMIN_PORT),
    databaseUrl: env.DATABASE_URL || undefined,
    dataDir: flags.dataDir ?? env.WALLETS_DATA_DIR ?? ".data/wallets",
    masterKeyFile,
    adminTokenFile: flags.adminTokenFile ?? (env.WALLETS_ADMIN_TOKEN_FILE || undefined),
    rpcUrls: parseRpcUrls(rpc),
    allowPrivateNetworks: env.WALLETS_ALLOW_PRIVATE_NETWORKS === "true",
    maxAuthorizationSeconds: num("WALLETS_MAX_AUTHORIZATION_SECONDS", env.WALLETS_MAX_AUTHORIZATION_SECONDS),
    fetchTimeoutMs: num("WALLETS_FETCH_TIMEOUT_MS", env.WALLETS_FETCH_TIMEOUT_MS),
    bodyLimit: num("WALLETS_BODY_LIMIT", env.WALLETS_BODY_LIMIT),
  };
}
