// `x402-fleet devnet` and `x402-fleet pay`: their flags, checked by name before anything starts.
// Kept apart from devnet.ts, which loads every service.
import { existsSync } from "node:fs";
import { createRequire } from "node:module";
import { delimiter, dirname, join } from "node:path";
import { defineCommand, flagOrEnv, list, oneOf, port, serviceCommand, stringFlags, type FlagValues } from "../platform/flags.ts";
import { NETWORKS, type Caip2 } from "../x402/networks.ts";
import type { DevnetOptions } from "./devnet.ts";
import type { PayOptions } from "./pay.ts";

const FLAGS = { ...stringFlags("networks", "port", "host", "state-dir"), "block-times": { type: "boolean" }, "api-keys": { type: "boolean" }, "no-discovery": { type: "boolean" } } as const;

const DEVNET_NETWORKS = NETWORKS.map((n) => n.network);

export function devnetOptionsFrom(flags: FlagValues<typeof FLAGS>, env: NodeJS.ProcessEnv): DevnetOptions {
  return {
    networks: list(flags.networks)?.map((n) => oneOf("--networks", n, DEVNET_NETWORKS) as Caip2),
    port: port(...flagOrEnv("--port", flags.port, env, "PORT")),
    host: flags.host,
    stateDir: flags["state-dir"],
    blockTimes: flags["block-times"],
    apiKeys: flags["api-keys"],
    discovery: !flags["no-discovery"],
  };
}

/**
 * What the devnet needs beyond the services, missing from this install: the container image leaves
 * them out (about 134 MB the production commands never load), as `npm ci --omit=optional` leaves anvil.
 */
export function missingDevnetTools(resolve: (id: string) => string = createRequire(import.meta.url).resolve, path = process.env.PATH ?? ""): string[] {
  const has = (id: string) => {
    try {
      return resolve(id) !== "";
    } catch {
      return false;
    }
  };
  const anvilInstalled = has("@foundry-rs/anvil-linux-amd64/package.json") && existsSync(join(dirname(resolve("@foundry-rs/anvil-linux-amd64/package.json")), "bin", "anvil"));
  const anvilOnPath = path.split(delimiter).some((dir) => dir && existsSync(join(dir, "anvil")));
  return [
    ...(anvilInstalled || anvilOnPath ? [] : ["anvil (@foundry-rs/anvil-linux-amd64, or anvil on PATH)"]),
    ...(has("solc/package.json") ? [] : ["solc"]),
    ...(has("@uniswap/v4-periphery/package.json") ? [] : ["@uniswap/v4-periphery"]),
  ];
}

export const devnetCli = serviceCommand({
  name: "devnet",
  summary: "run the whole system on local anvil chains (the embedded default)",
  help: `  --networks eip155:8453,eip155:56   (default: every devnet network)
  --port 4020   (env PORT; the router's: hub +10, wallets +20, admin ports +100; 0 picks free ports)
  --host 127.0.0.1 --state-dir .devnet
  [--block-times]   mine at each chain's block time and settle at its confirmations
  [--api-keys]   the router requires API keys; its key admin API's token in <state-dir>/keys/router-admin-token
  [--no-discovery]   no bazaar catalog at /v2/discovery/* (on by default)
env: LOG_LEVEL (default warn)
`,
  flags: FLAGS,
  optionsFrom: devnetOptionsFrom,
  start: async (options, env) => {
    const missing = missingDevnetTools();
    if (missing.length > 0) {
      throw new Error(`devnet: needs the development install (a checkout with \`npm ci\`); missing: ${missing.join(", ")}. The container image runs the services, not the devnet.`);
    }
    const { startDevnet, devnetGuide } = await import("./devnet.ts");
    const { createLogger } = await import("../platform/logger.ts");
    const devnet = await startDevnet({ ...options, logger: createLogger("devnet", env.LOG_LEVEL ?? "warn") });
    process.stdout.write(devnetGuide(devnet.info, devnet.infoPath));
    return { close: devnet.stop };
  },
});

const PAY_FLAGS = { ...stringFlags("network", "amount", "method", "state-dir", "resource", "api-key"), "body-only": { type: "boolean" }, bazaar: { type: "boolean" } } as const;

export function payOptionsFrom(flags: FlagValues<typeof PAY_FLAGS>): PayOptions {
  return {
    infoPath: `${flags["state-dir"] ?? ".devnet"}/devnet.json`,
    network: oneOf("--network", flags.network, DEVNET_NETWORKS) ?? "eip155:8453",
    amount: flags.amount ?? "10000",
    method: oneOf("--method", flags.method, ["eip3009", "permit2"] as const),
    bodyOnly: flags["body-only"],
    bazaar: flags.bazaar,
    resource: flags.resource,
    apiKey: flags["api-key"],
  };
}

export const payCli = defineCommand({
  name: "pay",
  summary: "sign, verify and settle an example payment on a running devnet",
  help: `  --network eip155:8453 --amount 10000 [--method eip3009|permit2] [--state-dir .devnet]
  [--body-only]   print the signed request body for curl instead of sending it
  [--bazaar] [--resource https://api.example.com/premium]   declare the resource for the router's
      discovery catalog (GET /v2/discovery/resources lists it once the payment settled)
  [--api-key KEY]   for a devnet started with --api-keys (npx x402-fleet api-key-create makes one)
`,
  flags: PAY_FLAGS,
  run: async (flags) => {
    const options = payOptionsFrom(flags);
    const { payOnDevnet } = await import("./pay.ts");
    await payOnDevnet(options);
  },
});
