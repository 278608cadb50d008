// A chain with tokens and funded payers, plus a facilitator on it with fresh random signer keys
// (so rows other runs left in a shared PostgreSQL never collide), for settlement-engine tests.
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pino } from "pino";
import { createTestClient, http, type Address, type Hex } from "viem";
import { generatePrivateKey, privateKeyToAccount } from "viem/accounts";
import { startAnvil, type AnvilNode } from "../../services/devnet/anvil.ts";
import { setupDevnetChain } from "../../services/devnet/chain-setup.ts";
import { networkInfo, type AssetInfo } from "../../services/x402/networks.ts";
import { resolveFacilitatorConfig, type FacilitatorConfigInput } from "../../services/facilitator/config.ts";
import { startFacilitatorService, type RunningFacilitator } from "../../services/facilitator/service.ts";
import { serviceShape, signEip3009, type PaymentSpec } from "./payments.ts";

export const DATABASE_URL = process.env.DATABASE_URL;
export const ENGINES: ("embedded" | "postgres")[] = DATABASE_URL ? ["embedded", "postgres"] : ["embedded"];

export interface Rig {
  anvil: AnvilNode;
  network: string;
  chainId: number;
  usdc: AssetInfo;
  payerKey: Hex;
  receiver: Address;
  signerKeys: Hex[];
  keyFile: string;
  dir: string;
  test: ReturnType<typeof createTestClient>;
  /** Starts (another) facilitator on this chain. */
  facilitator(overrides?: FacilitatorConfigInput): Promise<RunningFacilitator>;
  payment(amount?: bigint, overrides?: Partial<PaymentSpec>): Promise<ReturnType<typeof serviceShape>>;
  stop(): Promise<void>;
}

export async function startRig(opts: { keys?: number; engine?: "embedded" | "postgres"; blockTime?: number } = {}): Promise<Rig> {
  const net = networkInfo("eip155:8453")!;
  const anvil = await startAnvil({ chainId: net.chainId, blockTime: opts.blockTime });
  const signerKeys = Array.from({ length: opts.keys ?? 1 }, () => generatePrivateKey());
  const payerKey = generatePrivateKey();
  const receiver = privateKeyToAccount(generatePrivateKey()).address;
  await setupDevnetChain({
    rpcUrl: anvil.rpcUrl,
    chainId: net.chainId,
    assets: net.assets,
    gasFunded: signerKeys.map((k) => privateKeyToAccount(k).address),
    payers: [{ privateKey: payerKey, permit2Approved: true }],
  });
  const dir = await mkdtemp(join(tmpdir(), "x402-settle-"));
  const keyFile = join(dir, "signers.key");
  await writeFile(keyFile, signerKeys.join("\n") + "\n");
  const running: RunningFacilitator[] = [];
  const usdc = net.assets[0]!;
  return {
    anvil,
    network: net.network,
    chainId: net.chainId,
    usdc,
    payerKey,
    receiver,
    signerKeys,
    keyFile,
    dir,
    test: createTestClient({ mode: "anvil", transport: http(anvil.rpcUrl) }),
    async facilitator(overrides = {}) {
      const config = resolveFacilitatorConfig({
        network: net.network,
        rpcUrls: [anvil.rpcUrl],
        signerKeyFile: keyFile,
        port: 0,
        ...(opts.engine === "postgres" ? { databaseUrl: DATABASE_URL } : { dataDir: join(dir, `db-${running.length}`) }),
        ...overrides,
        // anvil mines on demand here: no block is provably still the head (unless a test says otherwise).
        policy: { minBlockIntervalMs: 0, ...overrides.policy },
      });
      const f = await startFacilitatorService(config, pino({ level: process.env.TEST_LOG_LEVEL ?? "silent" }));
      running.push(f);
      return f;
    },
    async payment(amount = 1000n, overrides = {}) {
      const spec: PaymentSpec = { network: net.network, chainId: net.chainId, asset: usdc, payerKey, payTo: receiver, amount, ...overrides };
      return serviceShape(spec, await signEip3009(spec));
    },
    async stop() {
      await Promise.all(running.map((f) => f.close().catch(() => undefined)));
      await anvil.stop();
      await rm(dir, { recursive: true, force: true });
    },
  };
}

/** Stops what a test started: the fault proxy in front of the rig's node first, then the rig. */
export async function stopRig(rig: Rig | undefined, proxy?: { close(): Promise<void> }): Promise<void> {
  await proxy?.close();
  await rig?.stop();
}
