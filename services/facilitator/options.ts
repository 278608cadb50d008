// `x402-fleet facilitator` and `x402-fleet doctor`: their flags, checked by name before anything
// starts, then layered over the environment and the --config file (config.ts merges and validates
// the whole; it loads viem, so it is imported only once the flags hold).
import { readFileSync } from "node:fs";
import { caip2, defineCommand, flagOrEnv, httpUrl, list, oneOf, port, serviceCommand, stringFlags, type FlagValues } from "../platform/flags.ts";
import { SCHEMES } from "../x402/wire.ts";
import type { FacilitatorConfig, FacilitatorConfigInput } from "./config.ts";

const FLAGS = { ...stringFlags("network", "signer-key-file", "schemes", "host", "port", "admin-port", "config"), "rpc-url": { type: "string", multiple: true } } as const;

function readConfigFile(path: string | undefined): FacilitatorConfigInput {
  try {
    return path === undefined ? {} : (JSON.parse(readFileSync(path, "utf8")) as FacilitatorConfigInput);
  } catch (e) {
    throw new Error(`facilitator: --config ${path}: ${(e as NodeJS.ErrnoException).code ?? "not JSON"}`);
  }
}

/** Flags over environment over the --config file; the result is validated whole by config.ts. */
export async function facilitatorOptionsFrom(flags: FlagValues<typeof FLAGS>, env: NodeJS.ProcessEnv): Promise<FacilitatorConfig> {
  const layer: FacilitatorConfigInput = {
    network: flags.network === undefined ? undefined : caip2("--network", flags.network),
    rpcUrls: flags["rpc-url"]?.map((url) => httpUrl("--rpc-url", url)),
    signerKeyFile: flags["signer-key-file"],
    schemes: list(flags.schemes)?.map((s) => oneOf("--schemes", s, SCHEMES)!),
    host: flags.host,
    port: port("--port", flags.port),
    adminPort: port("--admin-port", flags["admin-port"]),
  };
  const file = readConfigFile(flags.config);
  const { facilitatorConfigFromEnv, resolveFacilitatorConfig } = await import("./config.ts");
  return resolveFacilitatorConfig(file, facilitatorConfigFromEnv(env), layer);
}

const CONFIG_HELP = `  --network eip155:8453   (env X402_NETWORK; required)
  --rpc-url URL [--rpc-url URL2]   (env X402_RPC_URLS, comma-separated; required)
  --signer-key-file FILE   (env X402_SIGNER_KEY_FILE)
  --schemes exact,upto,batch-settlement   (env X402_SCHEMES)
  --port 4021 --admin-port 9421 --host 127.0.0.1   (env PORT, ADMIN_PORT, HOST)
  --config FILE.json   (the same fields; flags win over environment over file)
env: X402_RECEIPT_TIMEOUT_MS, X402_MIN_SIGNER_BALANCE_WEI, X402_GAS_CEILINGS, X402_MAX_FEE_PER_GAS_WEI,
  X402_FEE_CAP_BASE_FEE_MULTIPLIER, X402_MAX_FEE_BUMPS, DATABASE_URL, OTEL_EXPORTER_OTLP_ENDPOINT;
  README lists all
`;

export const facilitatorCli = serviceCommand({
  name: "facilitator",
  summary: "serve one network",
  help: CONFIG_HELP,
  flags: FLAGS,
  optionsFrom: facilitatorOptionsFrom,
  start: async (config) => (await import("./service.ts")).startFacilitatorService(config),
});

export const doctorCli = defineCommand({
  name: "doctor",
  summary: "check a facilitator configuration against its chain before it takes money",
  help: `RPC chain id and head lag, contract code, asset decimals and EIP-712 domains, signer balances and nonces,
the router's table. Plain-words report; exit 1 on problems (docs/networks.md). The facilitator's flags and env, plus
  [--routing-table FILE]   (env X402_ROUTING_TABLE)
  [--router-url URL]   (env X402_ROUTER_URL)
${CONFIG_HELP}`,
  flags: { ...FLAGS, ...stringFlags("routing-table", "router-url") },
  run: async (flags, env) => {
    const [source, routerUrl] = flagOrEnv("--router-url", flags["router-url"], env, "X402_ROUTER_URL");
    if (routerUrl !== undefined) httpUrl(source, routerUrl);
    const config = await facilitatorOptionsFrom(flags, env);
    const { runDoctor, formatDoctorReport } = await import("./doctor.ts");
    const { parseRoutingTable } = await import("../router/routing-table.ts");
    const tablePath = flags["routing-table"] ?? env.X402_ROUTING_TABLE;
    const report = await runDoctor({ config, routingTable: tablePath ? parseRoutingTable(readFileSync(tablePath, "utf8")) : undefined, routerUrl });
    process.stdout.write(formatDoctorReport(report));
    if (!report.ok) process.exitCode = 1;
  },
});
