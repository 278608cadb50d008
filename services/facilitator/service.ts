// Starts one facilitator service: checks the chain, opens the settlement store, builds the signer
// pool, mechanisms and reconciler, serves /v2 on the public port and /metrics, /healthz, /readyz
// on the admin port.
import { readFileSync } from "node:fs";
import { privateKeyToAccount } from "viem/accounts";
import { settlementAccount } from "./crypto/secp256k1.ts";
import { FLEET_HEADERS, createContractApp } from "../platform/http.ts";
import { watchRouterTokens } from "../platform/router-token.ts";
import { RequestError } from "../x402/errors.ts";
import { serve, serviceDatabase, startService, type RunningService } from "../platform/lifecycle.ts";
import { createLogger, type Logger } from "../platform/logger.ts";
import { createMetrics } from "../platform/metrics.ts";
import { describeDatabase, type Database } from "../platform/storage.ts";
import { chainIdOf, chainKind, networkInfo } from "../x402/networks.ts";
import { watchBalances } from "./balances.ts";
import { assertChainId, createChainClient, reportedChainId, type ChainClient } from "./chain.ts";
import { SIGNER_NETWORK_MIGRATIONS, bindSignersToNetwork, refuseWellKnownKeys } from "./signer-networks.ts";
import { minimumSignerBalance } from "./network-policy.ts";
import { gasPolicyOf, type FacilitatorConfig } from "./config.ts";
import { watchDenyList } from "./screening.ts";
import { createScreeningHook } from "./screening-hook.ts";
import { createFacilitator, type Facilitator } from "./facilitator.ts";
import { readReceiverCredentials } from "./receiver-auth.ts";
import { createSettlementCoordinator } from "./settlement/coordinator.ts";
import { GasMeter } from "./settlement/gas-meter.ts";
import type { TransactionKind } from "./settlement/gas-policy.ts";
import { createOutboxSigner, type OutboxSigner } from "./settlement/outbox-signer.ts";
import { createApprovalSponsor } from "./settlement/approval-sponsor.ts";
import { configureReceiptPolling } from "./settlement/receipts.ts";
import { startReconciler } from "./settlement/reconciler.ts";
import { acceptTenantWebhook, startWebhookDelivery } from "./settlement/webhooks.ts";
import { explainMinedRevert } from "./settlement/reverts.ts";
import { SETTLEMENT_MIGRATIONS, createSettlementStore } from "./settlement/store.ts";

export interface RunningFacilitator extends RunningService {
  facilitator: Facilitator;
  signers: string[];
  /** The settlement engine's signer and reconciler (tests drive them directly). */
  outbox: OutboxSigner;
  reconciler: { pass(): Promise<void> };
  /** The webhook delivery worker, when webhooks are configured (tests drive it directly). */
  webhooks?: { pass(): Promise<void> };
}

export interface FacilitatorDeps {
  /** A database to share (the devnet runs every network's facilitator on one embedded engine); the caller closes it. */
  db?: Database;
}

const CRASH_POINTS = new Set(["after_store", "after_broadcast"]);

export async function startFacilitatorService(config: FacilitatorConfig, logger: Logger = createLogger("facilitator"), deps: FacilitatorDeps = {}): Promise<RunningFacilitator> {
  const log = logger.child({ network: config.network });
  const metrics = createMetrics("facilitator");
  const chain = createChainClient({ chainId: chainIdOf(config.network), rpcUrls: config.rpcUrls, metrics, rpcTimeoutMs: config.rpcTimeoutMs, rpcMaxBatch: config.rpcMaxBatch });
  await assertNetworkKind(chain, config.network);
  await assertChainId(chain);
  const served = networkInfo(config.network);
  if (served && !served.testnet) {
    const clientVersion = await chain.client.request({ method: "web3_clientVersion" }).catch(() => "");
    refuseWellKnownKeys(served, config.signerKeys, String(clientVersion));
  }

  return startService(async (life) => {
    const db = await serviceDatabase(life, { db: deps.db, databaseUrl: config.databaseUrl, dataDir: config.dataDir }, [...SETTLEMENT_MIGRATIONS, ...SIGNER_NETWORK_MIGRATIONS], {
      logger: log,
      admin: { host: config.host, port: config.adminPort, registry: metrics.registry },
    });
    const store = createSettlementStore(db, config.network, {
      onMined: (signer, gasWei) => metrics.gasSpent.inc({ network: config.network, signer }, Number(gasWei)),
      onReversed: (paymentId) => {
        metrics.reversed.inc({ network: config.network });
        log.error({ paymentId }, "a settlement answered as successful reverted after a reorg; its record now says failed");
      },
      explainRevert: (row, _hash, minedAt) =>
        explainMinedRevert(chain, { from: row.signer, to: row.to_address, data: row.data, gas: BigInt(row.gas), blockNumber: minedAt?.blockNumber, kind: (row.kind ?? "other") as TransactionKind }),
    });
    const accounts = config.signerKeys.map((k) => settlementAccount(k));
    // A key serves one network: refused when the store knows it from another one.
    await bindSignersToNetwork(db, config.network, accounts.map((a) => a.address));
    const policy = config.policy;
    const gasPolicy = gasPolicyOf(config);
    configureReceiptPolling(chain, { intervalMs: config.receiptPollMs, maxIntervalMs: config.receiptPollMaxMs, maxCallsPerWait: config.receiptPollBudget });
    const crashAt = process.env.X402_FAULT_CRASH_AT;
    const signer = createOutboxSigner({
      chain,
      accounts,
      store,
      receiptTimeoutMs: config.receiptTimeoutMs,
      confirmations: config.confirmations,
      gasPolicy,
      isFunded: (address) => balances.isFunded(address),
      onInsufficientFunds: (address) => balances.markUnfunded(address),
      logger: log,
      metrics,
      network: config.network,
      crashAt: crashAt && CRASH_POINTS.has(crashAt) ? (crashAt as "after_store" | "after_broadcast") : undefined,
      dataFee: policy.dataFee,
      syncSend: policy.sendRawTransactionSync,
      minBlockIntervalMs: policy.minBlockIntervalMs,
      eip6492Factories: config.eip6492Factories,
    });
    life.defer(() => signer.stop());
    const balances = watchBalances({
      chain,
      network: config.network,
      signers: accounts.map((a) => a.address),
      // Unset: what the costliest transaction a key may sign costs at the current fee cap.
      minBalanceWei: config.minSignerBalanceWei ?? (async () => minimumSignerBalance(gasPolicy.largestCeiling(), (await signer.marketFees()).cap, policy)),
      intervalMs: config.balanceRefreshMs,
      metrics,
    });
    life.defer(() => balances.stop());
    for (const a of accounts) metrics.signerPending.set({ network: config.network, signer: a.address }, 0);
    const hooks = config.webhooks;
    const coordinator = createSettlementCoordinator({
      store,
      chain,
      network: config.network,
      waitBoundMs: config.receiptTimeoutMs,
      confirmations: config.confirmations,
      webhooks: hooks && { facilitator: !!hooks.url, tenantUrl: (url) => acceptTenantWebhook(hooks, url) },
    });
    const reconciler = startReconciler({
      store,
      signer,
      chain,
      network: config.network,
      confirmations: config.confirmations,
      logger: log,
      metrics,
      replaceAfterMs: config.replaceAfterMs,
      maxFeeBumps: config.maxFeeBumps,
      onInsufficientFunds: (address) => balances.markUnfunded(address),
    });
    life.defer(() => reconciler.stop());
    // Never on the settle path: events are written by the store's trigger, this only sends them.
    const webhooks = hooks && startWebhookDelivery({ db, network: config.network, config: hooks, logger: log, metrics });
    if (webhooks) life.defer(() => webhooks.stop());
    const screening = config.denyListFile ? life.own(watchDenyList(config.denyListFile, log)) : undefined;
    const hook = config.screening;
    const token = hook?.tokenFile ? `Bearer ${readFileSync(hook.tokenFile, "utf8").trim()}` : undefined;
    const screeningHook = hook ? createScreeningHook({ ...hook, authorization: token, network: config.network, logger: log, metrics }) : undefined;
    const sponsoring = config.approvalSponsoring;
    const approvalSponsor = sponsoring
      ? createApprovalSponsor({ signer, chain, store, network: config.network, logger: log, metrics, ...sponsoring, simulateFrom: config.uptoFacilitatorAddress, receiptTimeoutMs: config.receiptTimeoutMs })
      : undefined;
    const facilitator = createFacilitator({
      settlements: { store, confirmations: config.confirmations },
      approvalSponsor,
      screening,
      screeningHook,
      network: config.network,
      signer,
      chain,
      coordinator,
      schemes: config.schemes,
      assets: config.assets,
      logger: log,
      metrics,
      uptoFacilitatorAddress: config.uptoFacilitatorAddress,
      receiverAuthorizer: config.receiverAuthorizerKey ? privateKeyToAccount(config.receiverAuthorizerKey) : undefined,
      allowedAssets: config.allowedAssets,
      eip6492Factories: config.eip6492Factories,
      receiverCredentials: config.receiverCredentialsFile ? readReceiverCredentials(config.receiverCredentialsFile) : undefined,
    });

    const routerTokens = config.routerTokenFile ? life.own(watchRouterTokens(config.routerTokenFile, log)) : undefined;
    const ok = (body: unknown) => ({ status: 200, body });
    const app = createContractApp({
      logger: log,
      bodyLimit: config.bodyLimit,
      service: "facilitator",
      metrics,
      longestHandlerMs: config.receiptTimeoutMs, // a settle waits for its receipt up to this bound
      maxInFlight: config.maxInFlight,
      shedHeaders: { [FLEET_HEADERS.gasSpent]: "0" }, // shed before anything ran: nothing to charge
      routerTokens,
      handlers: {
        verify: async (body) => ok(await facilitator.verify(body)),
        settle: async (body, caller) => {
          const gas = GasMeter.fromHeader(caller.gasAllowance);
          // An authenticated router always says what a settle may spend ("unlimited" for a key
          // without a budget): a missing or malformed allowance never means no limit.
          if (caller.fromRouter && !gas) throw new RequestError("gas_allowance_required", `the router sent no valid ${FLEET_HEADERS.gasAllowance}: wei or "unlimited"`);
          try {
            return { ...ok(await facilitator.settle(body, caller, gas)), headers: gas?.headers() };
          } catch (e) {
            throw gas ? gas.withHeaders(e) : e;
          }
        },
        supported: async () => ok(facilitator.supported()),
        status: {
          lookup: (query, caller) => facilitator.status(query, caller),
          ofPayment: (body, caller) => facilitator.statusOf(body, caller),
        },
      },
    });
    const { url, adminUrl } = await serve(life, app, config, {
      registry: metrics.registry,
      logger: log,
      checks: [
        { name: "rpc_chain_id", check: async () => (await reportedChainId(chain)) === chain.chain.id },
        // A key counts when its balance covers its next transaction (X402_MIN_SIGNER_BALANCE_WEI, or derived).
        { name: "signer_funded", check: () => balances.anyFunded() },
        { name: "store", check: async () => (await db.query("SELECT 1 AS ok")).length === 1 },
      ],
    });
    log.info({ url: `${url}/v2`, admin: adminUrl, pairs: facilitator.pairs(), signers: signer.getAddresses(), rpc: chain.endpoints, store: describeDatabase(config.databaseUrl) }, "facilitator listening");
    return { url: `${url}/v2`, adminUrl, facilitator, signers: [...signer.getAddresses()], outbox: signer, reconciler, webhooks };
  });
}

/** Testnets and mainnets never mix: a mainnet facilitator refuses an RPC on a testnet, and the reverse, in those words. */
async function assertNetworkKind(chain: ChainClient, network: string): Promise<void> {
  const served = networkInfo(network);
  if (!served) return;
  const reported = await reportedChainId(chain);
  const kind = chainKind(reported);
  const servedKind = served.testnet ? "testnet" : "mainnet";
  if (reported !== served.chainId && kind !== "unknown" && kind !== servedKind) {
    throw new Error(`RPC ${chain.endpoints.join(", ")} is on ${kind} eip155:${reported}, but this facilitator serves the ${servedKind} ${network}: testnets and mainnets never mix`);
  }
}
