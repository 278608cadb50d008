// The embedded default: real anvil nodes for the contract's networks, our devnet contracts and
// tokens on them, one facilitator service per network and the router, all on this machine.
import { randomBytes } from "node:crypto";
import { mkdir, rm, writeFile } from "node:fs/promises";
import { dirname, join, resolve } from "node:path";
import { mnemonicToAccount } from "viem/accounts";
import { bytesToHex, type Address, type Hex } from "viem";
import { NETWORKS, networkInfo, type AssetInfo, type Caip2 } from "../x402/networks.ts";
import { createLogger, type Logger } from "../platform/logger.ts";
import { openDatabase, type Database } from "../platform/storage.ts";
import { startFacilitatorService, type RunningFacilitator } from "../facilitator/service.ts";
import { resolveFacilitatorConfig } from "../facilitator/config.ts";
import { startRouterService, type RunningRouter } from "../router/service.ts";
import { startHubService, type RunningHub } from "../hub/service.ts";
import type { RunningWallets } from "../wallets/service.ts";
import { startDevnetWallets } from "./wallets.ts";
import type { RoutingTable } from "../router/routing-table.ts";
import { keepHeadFresh, startAnvil, type AnvilNode } from "./anvil.ts";
import { SMART_WALLET_FACTORY_ADDRESS, setupDevnetChain, smartWalletsOf, type SmartWallets } from "./chain-setup.ts";
import { devnetAssets } from "./devnet-assets.ts";
import { startFeeFloorProxy, type FeeFloorProxy } from "./fee-floor-proxy.ts";
import { resolveNetworkPolicy } from "../facilitator/network-policy.ts";

/** anvil's well-known development mnemonic: these keys guard nothing outside a devnet. */
export const DEVNET_MNEMONIC = "test test test test test test test test test test test junk";

const key = (addressIndex: number): { address: Address; privateKey: Hex } => {
  const account = mnemonicToAccount(DEVNET_MNEMONIC, { addressIndex });
  return { address: account.address, privateKey: bytesToHex(account.getHdKey().privateKey!) };
};

export interface DevnetOptions {
  networks?: Caip2[];
  /** Router port; 0 picks free ports for every service. */
  port?: number;
  host?: string;
  stateDir?: string;
  logger?: Logger;
  /** Start the hub (on the devnet's in-memory engine, port+10); default true. */
  hub?: boolean;
  /** Start the wallet service (on the devnet's in-memory database, port+20); default true. */
  wallets?: boolean;
  /**
   * Mine blocks at each chain's block time and settle at its confirmation count (network-policy.ts).
   * Default false: a block per transaction and one confirmation, so tests never wait for a clock.
   * Base fees and minimum tips are each chain's either way.
   */
  blockTimes?: boolean;
  /** Without blockTimes: mine an empty block when a chain's head is older than 30 s (anvil.ts keepHeadFresh); default true. */
  freshHead?: boolean;
  /** The router's bazaar catalog at /v2/discovery/* (on the devnet's engine); default true. */
  discovery?: boolean;
  /** The router requires API keys, managed through its admin API with the token in keys/router-admin-token; default false. */
  apiKeys?: boolean;
}

/** Starting base fees of the devnet chains where anvil's default (1 gwei) is not the chain's: BSC has none, Arbitrum's floor is 0.01 gwei. */
const DEVNET_BASE_FEE: Partial<Record<Caip2, bigint>> = { "eip155:56": 0n, "eip155:97": 0n, "eip155:42161": 10_000_000n };

export interface DevnetNetwork {
  network: Caip2;
  chainId: number;
  rpcUrl: string;
  facilitatorUrl: string;
  /** /metrics, /healthz, /readyz of that network's facilitator. */
  adminUrl: string;
  signers: Address[];
  assets: AssetInfo[];
  /** What the facilitator talks to: the anvil itself, or the fee-floor proxy in front of it on chains with a minimum tip. */
  facilitatorRpcUrl: string;
  /** Blocks a settlement waits for on this devnet (1 without blockTimes). */
  confirmations: number;
}

export interface DevnetInfo {
  routerUrl: string;
  routerAdminUrl: string;
  hubUrl: string | null;
  /** /metrics, /healthz, /readyz of the hub. */
  hubAdminUrl: string | null;
  /** The custodial wallet service (docs/wallets.md) and an API key of the devnet's agent platform. */
  walletsUrl: string | null;
  walletsApiKey: string | null;
  /** /metrics, /healthz, /readyz of the wallet service. */
  walletsAdminUrl: string | null;
  /** With API keys (--api-keys): the bearer token of the router's key admin API (routerAdminUrl/admin/v1/*), also in keys/router-admin-token. */
  routerAdminToken: string | null;
  networks: DevnetNetwork[];
  payers: { address: Address; privateKey: Hex; permit2Approved: boolean }[];
  receivers: { address: Address; privateKey: Hex }[];
  /**
   * Smart-wallet payers owned by the first payer's key (docs/payers/): one deployed (ERC-1271,
   * funded, Permit2-approved), one counterfactual (ERC-6492, funded, deployed by its first settlement).
   */
  smartWallets: SmartWallets & { ownerPrivateKey: Hex };
}

/** The token the devnet's router presents to its facilitators (platform/router-token.ts); another router on the devnet's table needs it to settle. */
export function devnetRouterTokenFile(stateDir: string): string {
  return join(resolve(stateDir), "keys", "router-token");
}

/** The router's key admin token on a devnet started with API keys. */
export function devnetRouterAdminTokenFile(stateDir: string): string {
  return join(resolve(stateDir), "keys", "router-admin-token");
}

export interface RunningDevnet {
  info: DevnetInfo;
  infoPath: string;
  /** The fee-floor proxies by network (chains with a minimum tip): what they forwarded and refused. */
  feeFloorProxies: Partial<Record<Caip2, FeeFloorProxy>>;
  stop(): Promise<void>;
}

export async function startDevnet(opts: DevnetOptions = {}): Promise<RunningDevnet> {
  const logger = opts.logger ?? createLogger("devnet");
  const host = opts.host ?? "127.0.0.1";
  const routerPort = opts.port ?? 4020;
  const stateDir = resolve(opts.stateDir ?? ".devnet");
  const selected = (opts.networks ?? NETWORKS.map((n) => n.network)).map((n) => {
    const info = networkInfo(n);
    if (!info) throw new Error(`unknown network ${n}; the devnet serves ${NETWORKS.map((x) => x.network).join(", ")}`);
    // The devnet's own token list (real assets and devnet-only stand-ins), never the production table alone.
    return { ...info, assets: devnetAssets(info.network) };
  });

  const payers = [
    { ...key(1), permit2Approved: true },
    { ...key(2), permit2Approved: false },
  ];
  const receivers = [key(3)];

  const anvils: AnvilNode[] = [];
  const keepers: (() => void)[] = [];
  const proxies: Partial<Record<Caip2, FeeFloorProxy>> = {};
  let db: Database | undefined;
  const facilitators: RunningFacilitator[] = [];
  let router: RunningRouter | undefined;
  let hub: RunningHub | undefined;
  let wallets: { running: RunningWallets; apiKey: string } | undefined;
  const stop = async () => {
    await wallets?.running.close().catch(() => undefined);
    await hub?.close().catch(() => undefined);
    await router?.close().catch(() => undefined);
    await Promise.all(facilitators.map((f) => f.close().catch(() => undefined)));
    await Promise.all(Object.values(proxies).map((p) => p?.close()));
    for (const stopKeeping of keepers) stopKeeping();
    await Promise.all(anvils.map((a) => a.stop()));
    await db?.close().catch(() => undefined);
  };

  try {
    await mkdir(join(stateDir, "keys"), { recursive: true, mode: 0o700 });
    // The facilitators settle only for the router, as in a cluster: a new token on every start.
    const routerTokenFile = devnetRouterTokenFile(stateDir);
    await writeFile(routerTokenFile, `${randomBytes(32).toString("hex")}\n`, { mode: 0o600 });
    // The chains are new on every start, so is their settlement state: one in-memory engine shared by every network.
    const database = await openDatabase();
    db = database;
    const networks = await Promise.all(
      selected.map(async (net, i) => {
        // Each chain's rules as far as anvil allows: its base fee, its block time (opt-in), and its minimum tip (the proxy).
        const policy = resolveNetworkPolicy(net.network);
        const anvil = await startAnvil({ chainId: net.chainId, baseFeePerGas: DEVNET_BASE_FEE[net.network], blockTime: opts.blockTimes ? policy.blockTimeMs / 1000 : undefined });
        anvils.push(anvil);
        if (!opts.blockTimes && opts.freshHead !== false) keepers.push(keepHeadFresh(anvil.rpcUrl));
        const proxy = policy.minPriorityFeePerGasWei > 0n ? await startFeeFloorProxy({ upstream: anvil.rpcUrl, minPriorityFeePerGasWei: policy.minPriorityFeePerGasWei, host }) : undefined;
        if (proxy) proxies[net.network] = proxy;
        const confirmations = opts.blockTimes ? policy.confirmations : 1;
        const signer = key(10 + i);
        await setupDevnetChain({
          rpcUrl: anvil.rpcUrl,
          chainId: net.chainId,
          assets: net.assets,
          gasFunded: [signer.address],
          payers: payers.map((p) => ({ privateKey: p.privateKey, permit2Approved: p.permit2Approved })),
          smartWalletOwner: payers[0]!.privateKey,
        });
        const keyFile = join(stateDir, "keys", `${net.chainId}.key`);
        await writeFile(keyFile, `${signer.privateKey}\n`, { mode: 0o600 });
        const config = resolveFacilitatorConfig({
          network: net.network,
          rpcUrls: [proxy?.url ?? anvil.rpcUrl],
          signerKeyFile: keyFile,
          schemes: ["exact", "upto", "batch-settlement"],
          // The facilitator accepts the devnet's tokens: the production table lacks the stand-ins.
          assets: net.assets,
          // Without block times anvil mines a block per transaction: deeper confirmations would wait for blocks that never come.
          confirmations,
          // anvil serves eth_sendRawTransactionSync (EIP-7966): a settlement and its receipt in one round trip.
          // Without block times anvil mines at any moment: no block is provably still the head.
          policy: { sendRawTransactionSync: true, minBlockIntervalMs: opts.blockTimes ? policy.blockTimeMs : 0 },
          // Counterfactual smart wallets are deployed only through the devnet's own factory.
          eip6492Factories: [SMART_WALLET_FACTORY_ADDRESS],
          // Payers of tokens without EIP-2612 (USDT on 56) pay without gas: their approval is funded
          // (at most its gas limit x fee) and relayed; 0.05 of the native coin per day at most.
          erc20ApprovalSponsoring: "on",
          erc20ApprovalDailyFundingWei: (5n * 10n ** 16n).toString(),
          routerTokenFile,
          host,
          port: routerPort === 0 ? 0 : routerPort + 101 + i,
          adminPort: routerPort === 0 ? 0 : routerPort + 301 + i, // 4321…: clear of common local services (NATS listens on 4222)
        });
        const facilitator = await startFacilitatorService(config, logger.child({ service: "facilitator" }), { db: database });
        facilitators.push(facilitator);
        return { net, anvil, facilitator, facilitatorRpcUrl: proxy?.url ?? anvil.rpcUrl, confirmations };
      }),
    );

    const table: RoutingTable = {
      backends: networks.map(({ net, facilitator }) => ({
        network: net.network,
        url: facilitator.url,
        kinds: facilitator.facilitator.supported().kinds,
        signers: facilitator.signers,
        extensions: facilitator.facilitator.supported().extensions,
      })),
    };
    const routingTablePath = join(stateDir, "routing.json");
    await writeFile(routingTablePath, JSON.stringify(table, null, 2));
    // Keys and the catalog on the devnet's one engine, as the router's own embedded engine would keep them for one replica.
    // Loopback resources cannot prove a declaration (discovery/verification.ts): their entries stay unproven, and listed.
    const routerAdminToken = opts.apiKeys ? randomBytes(24).toString("hex") : null;
    const adminTokenFile = devnetRouterAdminTokenFile(stateDir);
    if (routerAdminToken) await writeFile(adminTokenFile, `${routerAdminToken}\n`, { mode: 0o600 });
    else await rm(adminTokenFile, { force: true }); // a previous run's token opens nothing now
    router = await startRouterService(
      {
        routingTablePath,
        host,
        port: routerPort,
        adminPort: routerPort === 0 ? 0 : routerPort + 100,
        routerTokenFile,
        db: database,
        discovery: opts.discovery ?? true,
        apiKeys: opts.apiKeys ?? false,
        adminTokenFile: routerAdminToken ? adminTokenFile : undefined,
      },
      logger.child({ service: "router" }),
    );

    if (opts.hub ?? true) {
      // ERC-1271 contract wallets are checked on the Base chain of the devnet (else the first one).
      const hubChain = networks.find(({ net }) => net.network === "eip155:8453") ?? networks[0];
      hub = await startHubService({
        host,
        port: routerPort === 0 ? 0 : routerPort + 10,
        adminPort: routerPort === 0 ? 0 : routerPort + 110,
        db: database, // the devnet runs every service on its one in-memory engine: the chains are new each time, so is the state
        rpcUrl: hubChain?.anvil.rpcUrl,
        logger: logger.child({ service: "hub" }),
      });
    }

    if (opts.wallets ?? true) {
      wallets = await startDevnetWallets({
        stateDir,
        host,
        port: routerPort === 0 ? 0 : routerPort + 20,
        adminPort: routerPort === 0 ? 0 : routerPort + 120,
        rpcUrls: Object.fromEntries(networks.map(({ net, anvil }) => [net.network, anvil.rpcUrl])),
        db: database,
        logger: logger.child({ service: "wallets" }),
      });
    }

    const info: DevnetInfo = {
      routerUrl: router.url,
      routerAdminUrl: router.adminUrl,
      hubUrl: hub?.url ?? null,
      hubAdminUrl: hub?.adminUrl ?? null,
      walletsUrl: wallets?.running.url ?? null,
      walletsApiKey: wallets?.apiKey ?? null,
      walletsAdminUrl: wallets?.running.adminUrl ?? null,
      routerAdminToken,
      networks: networks.map(({ net, anvil, facilitator, facilitatorRpcUrl, confirmations }) => ({
        network: net.network,
        chainId: net.chainId,
        rpcUrl: anvil.rpcUrl,
        facilitatorUrl: facilitator.url,
        adminUrl: facilitator.adminUrl,
        signers: facilitator.signers as Address[],
        assets: net.assets,
        facilitatorRpcUrl,
        confirmations,
      })),
      payers,
      receivers,
      smartWallets: { ...(await smartWalletsOf(payers[0]!.address)), ownerPrivateKey: payers[0]!.privateKey },
    };
    const infoPath = join(stateDir, "devnet.json");
    await writeFile(infoPath, JSON.stringify(info, null, 2));
    return { info, infoPath, feeFloorProxies: proxies, stop };
  } catch (e) {
    await stop();
    throw e;
  }
}

export function devnetGuide(info: DevnetInfo, infoPath: string): string {
  const base = info.networks.find((n) => n.network === "eip155:8453") ?? info.networks[0]!;
  const row = (label: string, text: string) => `  ${label.padEnd(14)}${text}`;
  const lines = [
    "",
    "x402-fleet devnet is running",
    "",
    row("router", `${info.routerUrl}   (POST /verify, POST /settle, GET /supported, GET /discovery/resources)`),
    ...(info.routerAdminToken ? [row("API keys", `required; create one: npx x402-fleet api-key-create --name shop --admin-url ${info.routerAdminUrl} --admin-token-file ${devnetRouterAdminTokenFile(dirname(infoPath))}`)] : []),
    ...info.networks.map((n) => row(n.network, `rpc ${n.rpcUrl}   facilitator ${n.facilitatorUrl}`)),
    ...(info.hubUrl ? [row("hub", `${info.hubUrl}   (POST /api/upload signed by the owner's wallet, /api/download, /api/conversation; docs/hub.md)`)] : []),
    ...(info.walletsUrl ? [row("wallets", `${info.walletsUrl}   (custodial agent wallets; API key: walletsApiKey in the details; docs/wallets.md)`)] : []),
    "",
    "Metrics (and /healthz, /readyz beside each /metrics):",
    row("router", `${info.routerAdminUrl}/metrics`),
    ...info.networks.map((n) => row(n.network, `${n.adminUrl}/metrics`)),
    ...(info.hubAdminUrl ? [row("hub", `${info.hubAdminUrl}/metrics`)] : []),
    ...(info.walletsAdminUrl ? [row("wallets", `${info.walletsAdminUrl}/metrics`)] : []),
    "",
    `Details (keys, assets, every URL): ${infoPath}`,
    "",
    "Try it:",
    `  curl -s ${info.routerUrl}/supported`,
    `  npx x402-fleet pay --network ${base.network} --amount 10000            # sign, verify and settle a payment`,
    `  npx x402-fleet pay --network ${base.network} --amount 10000 --body-only > /tmp/pay.json`,
    `  curl -s -H 'content-type: application/json' -d @/tmp/pay.json ${info.routerUrl}/verify`,
    `  curl -s -H 'content-type: application/json' -d @/tmp/pay.json ${info.routerUrl}/settle`,
    "",
    "Ctrl-C stops everything.",
    "",
  ];
  return lines.join("\n");
}
