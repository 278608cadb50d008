// Starts the wallet service: the database (embedded engine under a data directory, or PostgreSQL by
// URL) with its migrations, the master keys (checked against the fingerprints on record, reloaded
// when the file changes, data keys re-wrapped when the primary changes), the chains it reads, the
// HTTP app, and the admin port (/metrics, /healthz, /readyz).
import { randomBytes } from "node:crypto";
import { databaseLabel, serve, serviceDatabase, startService, type DatabaseOptions, type RunningService, type ServiceOptions } from "../platform/lifecycle.ts";
import { createLogger, endpointName, safeMessage } from "../platform/logger.ts";
import { createMetrics } from "../platform/metrics.ts";
import type { Caip2 } from "../x402/networks.ts";
import { createWalletsApp, DEFAULT_MAX_AUTHORIZATION_SECONDS, DEFAULT_WALLETS_BODY_LIMIT } from "./app.ts";
import { createChainAccess } from "./chain.ts";
import { adminTokenFrom, readAdminTokenFile } from "../platform/admin-token.ts";
import { createFetcher } from "./fetcher.ts";
import { openKeyringSource, type Keyring } from "./keyring.ts";
import { checkFingerprints, createRotator, type RotationResult } from "./rotation.ts";
import { createWalletStore, WALLETS_MIGRATIONS } from "./store.ts";

export const DEFAULT_WALLETS_PORT = 4040;
export const DEFAULT_WALLETS_ADMIN_PORT = 9440;

export interface WalletsServiceOptions extends ServiceOptions, DatabaseOptions {
  /** The master key file (a mounted Secret): `<id>:<64 hex>` per line, the primary first. */
  masterKeyFile?: string;
  /** A fixed keyring instead of a file (embedding, tests). */
  masterKeys?: Keyring;
  /** Poll interval of the master key file; default 1000 ms, 0 disables. */
  masterKeyPollMs?: number;
  /**
   * How often this replica reports its primary master key in the database and retries retiring old
   * keys; default 10 s. A replica silent for 3 intervals no longer holds a key back from retirement.
   */
  replicaHeartbeatMs?: number;
  /** The operator's token for /v1/admin, from a file (a mounted Secret) or given directly. */
  adminTokenFile?: string;
  adminToken?: string;
  /** One RPC per network: balances, Permit2 allowances and approvals. */
  rpcUrls?: Partial<Record<Caip2, string>>;
  /** Let /fetch reach loopback and private addresses (the devnet); default false. */
  allowPrivateNetworks?: boolean;
  fetchTimeoutMs?: number;
  fetchMaxResponseBytes?: number;
  maxAuthorizationSeconds?: number;
  bodyLimit?: number;
}

/** Clients call `${url}/v1/wallets` and so on. */
export interface RunningWallets extends RunningService {
  /** Reloads the master key file and re-wraps every data key under the primary. */
  rotate(): Promise<RotationResult>;
}

export async function startWalletsService(opts: WalletsServiceOptions = {}): Promise<RunningWallets> {
  const logger = opts.logger ?? createLogger("wallets");
  const now = opts.now ?? Date.now;
  const adminToken = opts.adminToken !== undefined ? adminTokenFrom(opts.adminToken, "wallets") : opts.adminTokenFile ? readAdminTokenFile(opts.adminTokenFile, "wallets") : undefined;
  return startService(async (life) => {
    const store = createWalletStore(await serviceDatabase(life, opts, WALLETS_MIGRATIONS, { logger }));
    const metrics = createMetrics("wallets");
    let rotate: () => void = () => undefined;
    const keyring = life.own(
      await openKeyringSource({
        path: opts.masterKeys ? undefined : opts.masterKeyFile,
        keyring: opts.masterKeys,
        logger,
        accept: (k) => checkFingerprints(store, k),
        onPrimaryChange: () => rotate(),
        watchIntervalMs: opts.masterKeyPollMs,
      }),
    );
    const replicaId = `wr_${randomBytes(8).toString("hex")}`;
    const heartbeatMs = opts.replicaHeartbeatMs ?? 10_000;
    const rotator = createRotator({ store, keyring, logger, metrics, now, replicaId, replicaLivenessMs: 3 * heartbeatMs });
    life.defer(() => store.leave(replicaId));
    life.defer(() => rotator.idle());
    rotate = () => void rotator.rewrapAll().catch((e: Error) => logger.error({ reason: safeMessage(e) }, "wallets: re-wrapping failed"));
    // Registers this replica's primary before anything is served; then finishes a rotation an
    // earlier run started (data keys still under an older loaded key) in the background.
    await store.heartbeat(replicaId, keyring.current().primary.id);
    rotate();
    // Each beat reports the primary again and retries retiring old keys (another replica may only
    // now have moved to the new primary, or wrapped a wallet under the old one meanwhile).
    const beat = setInterval(rotate, heartbeatMs);
    beat.unref();
    life.defer(() => clearInterval(beat));

    const fetchTimeoutMs = opts.fetchTimeoutMs ?? 20_000;
    const chain = opts.rpcUrls && Object.keys(opts.rpcUrls).length ? createChainAccess({ rpcUrls: opts.rpcUrls }) : undefined;
    const fetcher = life.own(createFetcher({ allowPrivateNetworks: opts.allowPrivateNetworks ?? false, timeoutMs: fetchTimeoutMs, maxResponseBytes: opts.fetchMaxResponseBytes ?? 1024 * 1024 }));

    const app = createWalletsApp({
      logger,
      metrics,
      store,
      keyring,
      rotator,
      chain,
      fetcher,
      adminToken,
      now,
      maxAuthorizationSeconds: opts.maxAuthorizationSeconds ?? DEFAULT_MAX_AUTHORIZATION_SECONDS,
      bodyLimit: opts.bodyLimit ?? DEFAULT_WALLETS_BODY_LIMIT,
      timeouts: opts.httpTimeouts,
      // /fetch waits for the resource twice (the request, then the paid retry) and for the chain around them.
      longestHandlerMs: 2 * fetchTimeoutMs + 30_000,
    });
    const port = opts.port ?? DEFAULT_WALLETS_PORT;
    const { url, adminUrl } = await serve(life, app, { host: opts.host ?? "127.0.0.1", port, adminPort: opts.adminPort ?? (port === 0 ? 0 : DEFAULT_WALLETS_ADMIN_PORT) }, {
      registry: metrics.registry,
      logger,
      checks: [{ name: "database", check: async () => (await store.ping(), true) }],
      timeouts: opts.httpTimeouts,
    });
    logger.info(
      {
        url,
        admin: adminUrl,
        ...databaseLabel(opts),
        masterKeys: { primary: keyring.current().primary.id, loaded: [...keyring.current().keys.keys()] },
        networks: Object.entries(opts.rpcUrls ?? {}).map(([n, u]) => `${n}@${endpointName(u!)}`),
        admin_api: Boolean(adminToken),
      },
      "wallets listening",
    );
    return {
      url,
      adminUrl,
      rotate: async () => {
        await keyring.reload();
        return rotator.rewrapAll();
      },
    };
  });
}
