// The devnet's wallet service: a master key and an admin token of its own under the state dir's
// keys/ (created on first start), the devnet's in-memory database (like the chains, wallets start
// fresh on every start: a wallet's funds would not survive a restart anyway), the devnet's chains as
// RPCs, private addresses allowed for /fetch (everything is on 127.0.0.1), and a ready agent-platform
// credential: the platform "devnet" and its API key.
import { randomBytes } from "node:crypto";
import { existsSync } from "node:fs";
import { readFile, writeFile } from "node:fs/promises";
import { join } from "node:path";
import type { Logger } from "../platform/logger.ts";
import type { Database } from "../platform/storage.ts";
import type { Caip2 } from "../x402/networks.ts";
import { startWalletsService, type RunningWallets } from "../wallets/service.ts";

export const DEVNET_WALLETS_PLATFORM = "devnet";

export interface DevnetWalletsOptions {
  stateDir: string;
  host: string;
  port: number;
  adminPort: number;
  rpcUrls: Partial<Record<Caip2, string>>;
  /** The devnet's database (shared with the facilitators). */
  db: Database;
  logger: Logger;
}

export interface DevnetWallets {
  running: RunningWallets;
  /** An API key of the devnet's agent platform. */
  apiKey: string;
}

async function ensureSecretFile(path: string, content: () => string): Promise<void> {
  if (!existsSync(path)) await writeFile(path, content(), { mode: 0o600, flag: "wx" }).catch((e: NodeJS.ErrnoException) => {
    if (e.code !== "EEXIST") throw e;
  });
}

export async function startDevnetWallets(opts: DevnetWalletsOptions): Promise<DevnetWallets> {
  const masterKeyFile = join(opts.stateDir, "keys", "wallets-master.key");
  const adminTokenFile = join(opts.stateDir, "keys", "wallets-admin.token");
  await ensureSecretFile(masterKeyFile, () => `# the devnet wallet service's master key (devnet only)\ndevnet-1:${randomBytes(32).toString("hex")}\n`);
  await ensureSecretFile(adminTokenFile, () => `${randomBytes(24).toString("base64url")}\n`);
  const running = await startWalletsService({
    host: opts.host,
    port: opts.port,
    adminPort: opts.adminPort,
    db: opts.db,
    masterKeyFile,
    adminTokenFile,
    rpcUrls: opts.rpcUrls,
    allowPrivateNetworks: true,
    logger: opts.logger,
  });
  try {
    const admin = (await readFile(adminTokenFile, "utf8")).trim();
    const call = async (method: string, path: string, body?: unknown) => {
      const res = await fetch(`${running.url}${path}`, {
        method,
        headers: { authorization: `Bearer ${admin}`, "content-type": "application/json" },
        body: body === undefined ? undefined : JSON.stringify(body),
      });
      const json = (await res.json()) as Record<string, unknown>;
      if (!res.ok) throw new Error(`devnet wallets: ${method} ${path} answered ${res.status} ${JSON.stringify(json)}`);
      return json;
    };
    const { platforms } = (await call("GET", "/v1/admin/platforms")) as { platforms: { id: string; name: string }[] };
    const existing = platforms.find((p) => p.name === DEVNET_WALLETS_PLATFORM);
    const apiKey = existing
      ? ((await call("POST", `/v1/admin/platforms/${existing.id}/api-keys`, { label: "devnet start" })) as { key: string }).key
      : ((await call("POST", "/v1/admin/platforms", { name: DEVNET_WALLETS_PLATFORM })) as { apiKey: { key: string } }).apiKey.key;
    return { running, apiKey };
  } catch (e) {
    await running.close();
    throw e;
  }
}
