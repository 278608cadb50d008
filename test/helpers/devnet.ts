// Starts a real devnet (anvil nodes, contracts, facilitators, router) on free ports for a test file.
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pino } from "pino";
import { startDevnet, type DevnetOptions, type RunningDevnet } from "../../services/devnet/devnet.ts";
import type { Caip2 } from "../../services/x402/networks.ts";

export async function startTestDevnet(networks?: Caip2[], opts: Pick<DevnetOptions, "blockTimes" | "hub" | "wallets" | "freshHead" | "apiKeys" | "discovery"> = {}): Promise<RunningDevnet & { dir: string }> {
  const dir = await mkdtemp(join(tmpdir(), "x402-devnet-"));
  const devnet = await startDevnet({ networks, port: 0, stateDir: dir, logger: pino({ level: process.env.TEST_LOG_LEVEL ?? "silent" }), freshHead: false, ...opts }); // tests count blocks: none mined unasked
  return {
    ...devnet,
    dir,
    stop: async () => {
      await devnet.stop();
      await rm(dir, { recursive: true, force: true });
    },
  };
}
