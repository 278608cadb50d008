// Starts one facilitator service: checks the chain, builds the signer and mechanisms, serves /v2.
import { privateKeyToAccount } from "viem/accounts";
import { createContractApp } from "../platform/http.ts";
import { createLogger, type Logger } from "../platform/logger.ts";
import { chainIdOf } from "../x402/networks.ts";
import { assertChainId, createChainClient } from "./chain.ts";
import type { FacilitatorConfig } from "./config.ts";
import { createFacilitator, type Facilitator } from "./facilitator.ts";
import { createFleetSigner } from "./signer.ts";

export interface RunningFacilitator {
  url: string;
  facilitator: Facilitator;
  signers: string[];
  close(): Promise<void>;
}

export async function startFacilitatorService(config: FacilitatorConfig, logger: Logger = createLogger(`facilitator`)): Promise<RunningFacilitator> {
  const log = logger.child({ network: config.network });
  const chain = createChainClient({ chainId: chainIdOf(config.network), rpcUrls: config.rpcUrls });
  await assertChainId(chain);
  const signer = createFleetSigner({ chain, accounts: config.signerKeys.map((k) => privateKeyToAccount(k)), receiptTimeoutMs: config.receiptTimeoutMs });
  const facilitator = createFacilitator({ network: config.network, signer, schemes: config.schemes, assets: config.assets, logger: log });

  const ok = (body: unknown) => ({ status: 200, body });
  const app = createContractApp({
    logger: log,
    bodyLimit: config.bodyLimit,
    handlers: {
      verify: async (body) => ok(await facilitator.verify(body)),
      settle: async (body) => ok(await facilitator.settle(body)),
      supported: async () => ok(facilitator.supported()),
    },
  });
  const address = await app.listen({ host: config.host, port: config.port });
  log.info({ url: `${address}/v2`, pairs: facilitator.pairs(), signers: signer.getAddresses(), rpc: chain.endpoints }, "facilitator listening");
  return { url: `${address}/v2`, facilitator, signers: [...signer.getAddresses()], close: () => app.close() };
}
