// Starts the hub: the database (embedded engine under a data directory, PostgreSQL by URL, or one the
// caller shares and closes itself) with the hub's migrations, the signature verifier (ERC-1271
// through an RPC when one is configured), the HTTP app, the admin port (/metrics, /healthz,
// /readyz), and a periodic sweep of expired nonces.
import { createPublicClient, getAddress, http, isAddress, type Address, type Hex, type PublicClient } from "viem";
import { databaseLabel, serve, serviceDatabase, startService, type DatabaseOptions, type RunningService, type ServiceOptions } from "../platform/lifecycle.ts";
import { createLogger, endpointName, safeMessage } from "../platform/logger.ts";
import { createMetrics } from "../platform/metrics.ts";
import { createHubApp, type HubAppOptions } from "./app.ts";
import { createSignatureVerifier, DEFAULT_HUB_DOMAIN_NAME, hubDomain, type HubDomain } from "./auth.ts";
import { createHubStore, DEFAULT_STORE_LIMITS, HUB_MIGRATIONS, type StoreLimits } from "./store.ts";

/** The EIP-712 chain id when no RPC is configured and none is given (Base). */
export const DEFAULT_HUB_CHAIN_ID = 8453;
const SWEEP_INTERVAL_MS = 60_000;
/** Nonces are kept this long past their expiry, to cover clock skew between replicas. */
const SWEEP_GRACE_SECONDS = 600;

export interface HubServiceOptions
  extends ServiceOptions, DatabaseOptions, Pick<HubAppOptions, "bodyLimit" | "maxExpirySeconds" | "writeRateLimit" | "writeAttemptRateLimit" | "readRateLimit" | "trustProxy"> {
  /** A chain RPC: enables ERC-1271 contract-wallet signatures and fixes the domain's chain id. */
  rpcUrl?: string;
  /** The EIP-712 domain's chain id (must match the RPC's when both are given). */
  chainId?: number;
  /** The EIP-712 domain's name: give each deployment its own so signatures cannot cross between them. */
  domainName?: string;
  /** The EIP-712 domain's salt (32 bytes hex): set per deployment (the chart derives one per release). */
  domainSalt?: Hex;
  /** The EIP-712 domain's verifyingContract: an address that names this deployment. */
  domainVerifyingContract?: Address;
  /** Quota per owner and versions kept per key; unset fields keep their defaults, 0 is no limit. */
  storeLimits?: Partial<StoreLimits>;
}

/** Clients call `${url}/api/upload` and so on. */
export interface RunningHub extends RunningService {
  domain: HubDomain;
}

async function rpcClient(rpcUrl: string): Promise<{ client: PublicClient; chainId: number }> {
  const client = createPublicClient({ transport: http(rpcUrl, { timeout: 10_000, retryCount: 1 }) }) as PublicClient;
  try {
    return { client, chainId: await client.getChainId() };
  } catch (e) {
    throw new Error(`hub: RPC ${endpointName(rpcUrl)} did not answer eth_chainId: ${safeMessage(e)}`);
  }
}

export async function startHubService(opts: HubServiceOptions = {}): Promise<RunningHub> {
  const logger = opts.logger ?? createLogger("hub");
  let publicClient: PublicClient | undefined;
  let chainId = opts.chainId ?? DEFAULT_HUB_CHAIN_ID;
  if (opts.rpcUrl) {
    const rpc = await rpcClient(opts.rpcUrl);
    if (opts.chainId !== undefined && opts.chainId !== rpc.chainId) {
      throw new Error(`hub: RPC ${endpointName(opts.rpcUrl)} reports chain id ${rpc.chainId}, but the hub is configured for chain id ${opts.chainId}`);
    }
    publicClient = rpc.client;
    chainId = rpc.chainId;
  }
  if (opts.domainSalt !== undefined && !/^0x[0-9a-fA-F]{64}$/.test(opts.domainSalt)) throw new Error("hub: the domain salt must be 32 bytes as 0x-prefixed hex");
  if (opts.domainVerifyingContract !== undefined && !isAddress(opts.domainVerifyingContract, { strict: false })) throw new Error("hub: the domain's verifyingContract must be a 0x address");
  const domain: HubDomain = hubDomain({
    name: opts.domainName ?? DEFAULT_HUB_DOMAIN_NAME,
    chainId,
    verifyingContract: opts.domainVerifyingContract ? getAddress(opts.domainVerifyingContract) : undefined,
    salt: opts.domainSalt,
  });
  const storeLimits: StoreLimits = { ...DEFAULT_STORE_LIMITS, ...Object.fromEntries(Object.entries(opts.storeLimits ?? {}).filter(([, v]) => v !== undefined)) };
  for (const [k, v] of Object.entries(storeLimits)) if (!Number.isSafeInteger(v) || v < 0) throw new Error(`hub: ${k} must be a non-negative integer (0: no limit)`);

  const now = opts.now ?? Date.now;
  return startService(async (life) => {
    const store = createHubStore(await serviceDatabase(life, opts, HUB_MIGRATIONS, { logger }), storeLimits);
    const metrics = createMetrics("hub");
    const app = createHubApp({
      ...opts,
      logger,
      metrics,
      store,
      domain,
      verifier: createSignatureVerifier({ publicClient }),
      storeLimits,
      contractWallets: Boolean(publicClient),
      timeouts: opts.httpTimeouts,
      now,
    });
    const sweep = setInterval(() => {
      store.sweepNonces(now() / 1000 - SWEEP_GRACE_SECONDS).catch((e: Error) => logger.warn({ err: { message: safeMessage(e) } }, "hub nonce sweep failed"));
    }, SWEEP_INTERVAL_MS);
    sweep.unref();
    life.defer(() => clearInterval(sweep));
    const port = opts.port ?? 4030;
    const { url, adminUrl } = await serve(life, app, { host: opts.host ?? "127.0.0.1", port, adminPort: opts.adminPort ?? (port === 0 ? 0 : 9430) }, {
      registry: metrics.registry,
      logger,
      checks: [{ name: "database", check: async () => (await store.ping(), true) }],
      timeouts: opts.httpTimeouts,
    });
    logger.info({ url, admin: adminUrl, ...databaseLabel(opts), rpc: opts.rpcUrl ? endpointName(opts.rpcUrl) : undefined, domain }, "hub listening");
    return { url, adminUrl, domain };
  });
}
