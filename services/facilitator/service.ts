// Starts one facilitator service: checks the chain, builds the signer and mechanisms, serves /v2
// on the public port and /metrics, /healthz, /readyz on the admin port.
import { privateKeyToAccount } from "viem/accounts";
import { startAdminServer } from "../platform/admin.ts";
import { createContractApp } from "../platform/http.ts";
import { createLogger, type Logger } from "../platform/logger.ts";
import { createMetrics } from "../platform/metrics.ts";
import { chainIdOf } from "../x402/networks.ts";
import { watchBalances } from "./balances.ts";
import { assertChainId, createChainClient, reportedChainId } from "./chain.ts";
import type { FacilitatorConfig } from "./config.ts";
import { createFacilitator, type Facilitator } from "./facilitator.ts";
import { createFleetSigner } from "./signer.ts";

export interface RunningFacilitator {
  url: string;
  adminUrl: string;
  facilitator: Facilitator;
  signers: string[];
  close(): Promise<void>;
}

export async function startFacilitatorService(config: FacilitatorConfig, logger: Logger = createLogger("facilitator")): Promise<RunningFacilitator> {
  const log = logger.child({ network: config.network });
  const metrics = createMetrics("facilitator");
  const chain = createChainClient({ chainId: chainIdOf(config.network), rpcUrls: config.rpcUrls, metrics });
  await assertChainId(chain);
  const signer = createFleetSigner({
    chain,
    accounts: config.signerKeys.map((k) => privateKeyToAccount(k)),
    receiptTimeoutMs: config.receiptTimeoutMs,
    onPendingChange: (address, n) => metrics.signerPending.set({ network: config.network, signer: address }, n),
  });
  const facilitator = createFacilitator({ network: config.network, signer, schemes: config.schemes, assets: config.assets, logger: log, metrics });
  const balances = watchBalances({ chain, network: config.network, signers: signer.getAddresses(), minBalanceWei: config.minSignerBalanceWei, intervalMs: 15_000, metrics });
  for (const address of signer.getAddresses()) metrics.signerPending.set({ network: config.network, signer: address }, 0);

  const ok = (body: unknown) => ({ status: 200, body });
  const app = createContractApp({
    logger: log,
    bodyLimit: config.bodyLimit,
    service: "facilitator",
    metrics,
    handlers: {
      verify: async (body) => ok(await facilitator.verify(body)),
      settle: async (body) => ok(await facilitator.settle(body)),
      supported: async () => ok(facilitator.supported()),
    },
  });
  const admin = await startAdminServer({
    host: config.host,
    port: config.adminPort,
    registry: metrics.registry,
    logger: log,
    checks: [
      { name: "rpc_chain_id", check: async () => (await reportedChainId(chain)) === chain.chain.id },
      { name: "signer_funded", check: () => balances.anyFunded() },
    ],
  });
  const address = await app.listen({ host: config.host, port: config.port });
  log.info({ url: `${address}/v2`, admin: admin.url, pairs: facilitator.pairs(), signers: signer.getAddresses(), rpc: chain.endpoints }, "facilitator listening");
  return {
    url: `${address}/v2`,
    adminUrl: admin.url,
    facilitator,
    signers: [...signer.getAddresses()],
    close: async () => {
      balances.stop();
      await app.close();
      await admin.close();
    },
  };
}
