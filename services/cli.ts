// x402-fleet: one command, one subcommand per service.
import { readFileSync } from "node:fs";
import { parseArgs } from "node:util";
import { createLogger } from "./platform/logger.ts";
import type { Caip2 } from "./x402/networks.ts";
import type { Scheme } from "./x402/wire.ts";

const USAGE = `x402-fleet <command> [options]

commands:
  devnet        run the whole system on local anvil chains (the embedded default)
                --networks eip155:8453,eip155:56   --port 4020   --state-dir .devnet
                [--block-times: mine at each chain's block time and settle at its confirmations]
  facilitator   serve one network
                --network eip155:8453 --rpc-url URL [--rpc-url URL2] --signer-key-file FILE
                --schemes exact --port 4021 --admin-port 9421 --host 127.0.0.1 --config FILE.json
                (env: X402_NETWORK, X402_RPC_URLS, X402_SIGNER_KEY_FILE, X402_SCHEMES, PORT, ADMIN_PORT, HOST,
                 X402_RECEIPT_TIMEOUT_MS, X402_MIN_SIGNER_BALANCE_WEI, X402_GAS_CEILINGS, X402_MAX_FEE_PER_GAS_WEI,
                 X402_FEE_CAP_BASE_FEE_MULTIPLIER, X402_MAX_FEE_BUMPS, OTEL_EXPORTER_OTLP_ENDPOINT; README lists all)
  router        the public /v2 edge
                --routing-table FILE --port 4020 --admin-port 9420 --host 127.0.0.1
                (env: X402_ROUTING_TABLE, PORT, ADMIN_PORT, HOST, OTEL_EXPORTER_OTLP_ENDPOINT,
                 X402_ROUTER_API_KEYS=required with DATABASE_URL: /verify and /settle need an API key,
                 X402_ROUTER_DISCOVERY=on with DATABASE_URL: the bazaar catalog at /v2/discovery/*,
                 X402_ROUTER_ADMIN_TOKEN_FILE: the key admin API at /admin/v1/* on the admin port)
  api-key-create   a key for a resource server (printed once; stored hashed). DATABASE_URL is the routers'.
                --name NAME [--networks eip155:8453,eip155:56] [--schemes exact,upto]
                [--requests-per-minute N] [--settlements-per-day N]   (enforced across router replicas)
                [--gas-budget eip155:8453=WEI,eip155:56=WEI]   (gas per network per UTC day, checked before signing)
  api-key-limits   change --id ID's --requests-per-minute / --settlements-per-day (a number, or none)
                and --gas-budget NETWORK=WEI|none,... (the networks named change, the others stay)
  api-key-usage    usage for billing as CSV: per UTC day, key, network and asset: verifies, valid, settles,
                settled, volume (atomic units), gas_wei [--id ID] [--since YYYY-MM-DD]
  api-key-list     the keys: id, name, scope, created/rotated/revoked (never a secret)
  api-key-rotate   a new secret for --id ID (the old key stops working; printed once)
  api-key-revoke   revoke --id ID
  hub           the wallet-scoped key-value store (writes signed by the owner's wallet; docs/hub.md)
                --port 4030 --admin-port 9430 --host 127.0.0.1 --data-dir .data/hub [--rpc-url URL] [--chain-id 8453]
                (env: DATABASE_URL (PostgreSQL instead of the embedded engine), HUB_DATA_DIR, HUB_RPC_URL,
                 HUB_CHAIN_ID, HUB_DOMAIN_NAME, HUB_DOMAIN_SALT, HUB_DOMAIN_VERIFYING_CONTRACT, HUB_MAX_EXPIRY_SECONDS,
                 HUB_BODY_LIMIT, HUB_QUOTA_BYTES, HUB_QUOTA_KEYS, HUB_MAX_VERSIONS, HUB_TRUST_PROXY, PORT, ADMIN_PORT, HOST)
  wallets       custodial agent wallets: platforms pay x402 resources with an API key (docs/wallets.md)
                --master-key-file FILE [--admin-token-file FILE] --port 4040 --admin-port 9440 --host 127.0.0.1
                --data-dir .data/wallets [--rpc-url eip155:8453=URL ...]
                (env: DATABASE_URL, WALLETS_MASTER_KEY_FILE, WALLETS_ADMIN_TOKEN_FILE, WALLETS_DATA_DIR,
                 WALLETS_RPC_URLS (comma-separated network=URL), WALLETS_ALLOW_PRIVATE_NETWORKS=true,
                 WALLETS_MAX_AUTHORIZATION_SECONDS, WALLETS_FETCH_TIMEOUT_MS, WALLETS_BODY_LIMIT, PORT, ADMIN_PORT, HOST)
  operator      reconcile FacilitatorNetwork resources into facilitator pod sets and the routing table
                --facilitator-image IMAGE [--namespace x402-system] [--watch-namespace NS] --admin-port 9422
                (env: X402_FACILITATOR_IMAGE, POD_NAMESPACE, X402_WATCH_NAMESPACE, X402_ROUTING_CONFIGMAP,
                 X402_CLUSTER_DOMAIN, X402_LEADER_ELECTION=false, X402_LEASE_NAME, POD_NAME, KUBECONFIG;
                 docs/operator.md)
  doctor        check a facilitator configuration against its chain before it takes money: RPC chain id and
                head lag, contract code, asset decimals and EIP-712 domains, signer balances and nonces, the
                router's table. Plain-words report; exit 1 on problems. Same flags and env as facilitator, plus
                [--routing-table FILE] [--router-url URL] (docs/networks.md)
  hub-upload    sign a hub write with a wallet key and send it (docs/hub.md); prints the hub's answer
                --key-file FILE (0x private key; or HUB_SIGNER_KEY_FILE) --id chat7_0 --message TEXT
                [--bucket B] [--kind memory|knowledgebase] [--owner 0xContractWallet]
                [--hub-url URL (or HUB_URL; default: hubUrl of the running devnet's --state-dir .devnet)]
  pay           sign, verify and settle an example payment on a running devnet
                --network eip155:8453 --amount 10000 [--method eip3009|permit2] [--state-dir .devnet]
                [--body-only: print the signed request body for curl instead of sending it]
`;

/** HUB_TRUST_PROXY: "true", a hop count, or comma-separated proxy addresses/CIDRs; unset or "false": none. */
function parseTrustProxy(v: string | undefined): boolean | number | string[] | undefined {
  if (v === undefined || v.trim() === "" || v === "false") return undefined;
  if (v === "true") return true;
  if (/^\d+$/.test(v)) return Number(v);
  return v.split(",").map((s) => s.trim()).filter(Boolean);
}

function onShutdown(stop: () => Promise<void>) {
  let stopping = false;
  const handler = (signal: string) => {
    if (stopping) return;
    stopping = true;
    void stop().finally(() => process.exit(signal === "SIGINT" ? 130 : 0));
  };
  process.once("SIGINT", () => handler("SIGINT"));
  process.once("SIGTERM", () => handler("SIGTERM"));
}

export async function main(argv: string[]): Promise<void> {
  const [command, ...rest] = argv;
  const { values } = parseArgs({
    args: rest,
    allowPositionals: false,
    options: {
      networks: { type: "string" },
      network: { type: "string" },
      port: { type: "string" },
      host: { type: "string" },
      "state-dir": { type: "string" },
      "rpc-url": { type: "string", multiple: true },
      "signer-key-file": { type: "string" },
      schemes: { type: "string" },
      config: { type: "string" },
      "routing-table": { type: "string" },
      "admin-port": { type: "string" },
      amount: { type: "string" },
      method: { type: "string" },
      "body-only": { type: "boolean" },
      "block-times": { type: "boolean" },
      "data-dir": { type: "string" },
      "chain-id": { type: "string" },
      namespace: { type: "string" },
      "watch-namespace": { type: "string" },
      "facilitator-image": { type: "string" },
      "master-key-file": { type: "string" },
      "admin-token-file": { type: "string" },
      "router-url": { type: "string" },
      "hub-url": { type: "string" },
      "key-file": { type: "string" },
      id: { type: "string" },
      message: { type: "string" },
      bucket: { type: "string" },
      kind: { type: "string" },
      owner: { type: "string" },
      name: { type: "string" },
      "requests-per-minute": { type: "string" },
      "settlements-per-day": { type: "string" },
      "gas-budget": { type: "string" },
      since: { type: "string" },
    },
  });
  const port = values.port ?? process.env.PORT;
  if (command && ["devnet", "facilitator", "router", "hub", "operator", "wallets"].includes(command)) {
    // Before anything starts: a stray rejection must be counted and logged, never exit the process.
    const { installProcessGuard } = await import("./platform/process-guard.ts");
    installProcessGuard(createLogger(command));
    const { startTracing } = await import("./platform/tracing.ts");
    await startTracing(`x402-fleet-${command}`);
  }

  switch (command) {
    case "devnet": {
      const { startDevnet, devnetGuide } = await import("./devnet/devnet.ts");
      const devnet = await startDevnet({
        networks: values.networks?.split(",").map((s) => s.trim()) as Caip2[] | undefined,
        port: port !== undefined ? Number(port) : undefined,
        host: values.host,
        stateDir: values["state-dir"],
        blockTimes: values["block-times"],
        logger: createLogger("devnet", process.env.LOG_LEVEL ?? "warn"),
      });
      onShutdown(devnet.stop);
      process.stdout.write(devnetGuide(devnet.info, devnet.infoPath));
      return;
    }
    case "facilitator": {
      const { resolveFacilitatorConfig, facilitatorConfigFromEnv } = await import("./facilitator/config.ts");
      const { startFacilitatorService } = await import("./facilitator/service.ts");
      const file = values.config ? JSON.parse(readFileSync(values.config, "utf8")) : {};
      const config = resolveFacilitatorConfig(file, facilitatorConfigFromEnv(process.env), {
        network: values.network,
        rpcUrls: values["rpc-url"],
        signerKeyFile: values["signer-key-file"],
        schemes: values.schemes?.split(",") as Scheme[] | undefined,
        host: values.host,
        port: values.port !== undefined ? Number(values.port) : undefined,
        adminPort: values["admin-port"] !== undefined ? Number(values["admin-port"]) : undefined,
      });
      const running = await startFacilitatorService(config);
      onShutdown(running.close);
      return;
    }
    case "doctor": {
      const { resolveFacilitatorConfig, facilitatorConfigFromEnv } = await import("./facilitator/config.ts");
      const { runDoctor, formatDoctorReport } = await import("./facilitator/doctor.ts");
      const { parseRoutingTable } = await import("./router/routing-table.ts");
      const file = values.config ? JSON.parse(readFileSync(values.config, "utf8")) : {};
      const config = resolveFacilitatorConfig(file, facilitatorConfigFromEnv(process.env), {
        network: values.network,
        rpcUrls: values["rpc-url"],
        signerKeyFile: values["signer-key-file"],
        schemes: values.schemes?.split(",") as Scheme[] | undefined,
      });
      const tablePath = values["routing-table"] ?? process.env.X402_ROUTING_TABLE;
      const report = await runDoctor({
        config,
        routingTable: tablePath ? parseRoutingTable(readFileSync(tablePath, "utf8")) : undefined,
        routerUrl: values["router-url"] ?? process.env.X402_ROUTER_URL,
      });
      process.stdout.write(formatDoctorReport(report));
      if (!report.ok) process.exitCode = 1;
      return;
    }
    case "router": {
      const { startRouterService } = await import("./router/service.ts");
      const routingTablePath = values["routing-table"] ?? process.env.X402_ROUTING_TABLE;
      if (!routingTablePath) throw new Error("router: --routing-table (or X402_ROUTING_TABLE) is required");
      const adminPort = values["admin-port"] ?? process.env.ADMIN_PORT;
      const requireKeys = process.env.X402_ROUTER_API_KEYS === "required";
      const discovery = process.env.X402_ROUTER_DISCOVERY === "on";
      if (requireKeys && !process.env.DATABASE_URL) throw new Error("router: X402_ROUTER_API_KEYS=required needs DATABASE_URL (the PostgreSQL database the replicas share)");
      if (discovery && !process.env.DATABASE_URL) throw new Error("router: X402_ROUTER_DISCOVERY=on needs DATABASE_URL (the PostgreSQL database the replicas share)");
      const running = await startRouterService({
        databaseUrl: process.env.DATABASE_URL,
        apiKeys: requireKeys,
        discovery,
        adminTokenFile: process.env.X402_ROUTER_ADMIN_TOKEN_FILE || undefined,
        routingTablePath,
        host: values.host ?? process.env.HOST ?? "127.0.0.1",
        port: Number(port ?? 4020),
        adminPort: adminPort !== undefined ? Number(adminPort) : undefined,
      });
      onShutdown(running.close);
      return;
    }
    case "hub": {
      const { startHubService } = await import("./hub/service.ts");
      const env = process.env;
      const num = (name: string, v: string | undefined) => {
        if (v === undefined || v === "") return undefined;
        if (!/^\d+$/.test(v)) throw new Error(`hub: ${name} must be a non-negative integer, got ${JSON.stringify(v)}`);
        return Number(v);
      };
      const running = await startHubService({
        host: values.host ?? env.HOST ?? "127.0.0.1",
        port: num("--port", port) ?? 4030,
        adminPort: num("--admin-port", values["admin-port"] ?? env.ADMIN_PORT),
        databaseUrl: env.DATABASE_URL || undefined,
        dataDir: values["data-dir"] ?? env.HUB_DATA_DIR ?? ".data/hub",
        rpcUrl: values["rpc-url"]?.[0] ?? (env.HUB_RPC_URL || undefined),
        chainId: num("--chain-id", values["chain-id"] ?? env.HUB_CHAIN_ID),
        domainName: env.HUB_DOMAIN_NAME || undefined,
        domainSalt: (env.HUB_DOMAIN_SALT || undefined) as `0x${string}` | undefined,
        domainVerifyingContract: (env.HUB_DOMAIN_VERIFYING_CONTRACT || undefined) as `0x${string}` | undefined,
        storeLimits: { maxBytesPerOwner: num("HUB_QUOTA_BYTES", env.HUB_QUOTA_BYTES), maxKeysPerOwner: num("HUB_QUOTA_KEYS", env.HUB_QUOTA_KEYS), maxVersionsPerKey: num("HUB_MAX_VERSIONS", env.HUB_MAX_VERSIONS) },
        trustProxy: parseTrustProxy(env.HUB_TRUST_PROXY),
        maxExpirySeconds: num("HUB_MAX_EXPIRY_SECONDS", env.HUB_MAX_EXPIRY_SECONDS),
        bodyLimit: num("HUB_BODY_LIMIT", env.HUB_BODY_LIMIT),
        logger: createLogger("hub"),
      });
      onShutdown(running.close);
      return;
    }
    case "wallets": {
      const { startWalletsService } = await import("./wallets/service.ts");
      const { walletsOptionsFrom } = await import("./wallets/config.ts");
      const running = await startWalletsService({
        ...walletsOptionsFrom(
          {
            host: values.host,
            port,
            adminPort: values["admin-port"],
            dataDir: values["data-dir"],
            masterKeyFile: values["master-key-file"],
            adminTokenFile: values["admin-token-file"],
            rpcUrls: values["rpc-url"],
          },
          process.env,
        ),
        logger: createLogger("wallets"),
      });
      onShutdown(running.close);
      return;
    }
    case "operator": {
      const { runOperatorCommand } = await import("../operator/main.ts");
      const running = await runOperatorCommand({
        namespace: values.namespace,
        watchNamespace: values["watch-namespace"],
        facilitatorImage: values["facilitator-image"],
        host: values.host,
        adminPort: values["admin-port"],
      });
      onShutdown(running.close);
      return;
    }
    case "hub-upload": {
      const { hubUploadCommand } = await import("./hub/upload-command.ts");
      const answer = await hubUploadCommand({
        hubUrl: values["hub-url"] ?? process.env.HUB_URL,
        stateDir: values["state-dir"] ?? ".devnet",
        keyFile: values["key-file"] ?? process.env.HUB_SIGNER_KEY_FILE,
        id: values.id,
        message: values.message,
        bucket: values.bucket,
        kind: values.kind,
        owner: values.owner,
      });
      process.stdout.write(`${JSON.stringify(answer)}\n`);
      return;
    }
    case "pay": {
      const { payOnDevnet } = await import("./devnet/pay.ts");
      await payOnDevnet({
        infoPath: `${values["state-dir"] ?? ".devnet"}/devnet.json`,
        network: values.network ?? "eip155:8453",
        amount: values.amount ?? "10000",
        method: values.method as "eip3009" | "permit2" | undefined,
        bodyOnly: values["body-only"],
      });
      return;
    }
    case undefined:
    case "api-key-create":
    case "api-key-list":
    case "api-key-rotate":
    case "api-key-revoke":
    case "api-key-limits":
    case "api-key-usage": {
      const { runApiKeyCommand } = await import("./tenants/api-key-command.ts");
      process.stdout.write(await runApiKeyCommand(command!, {
          name: values.name,
          networks: values.networks,
          schemes: values.schemes,
          id: values.id,
          requestsPerMinute: values["requests-per-minute"],
          settlementsPerDay: values["settlements-per-day"],
          gasBudget: values["gas-budget"],
          since: values.since,
        }, process.env));
      return;
    }
    case "help":
    case "--help":
      process.stdout.write(USAGE);
      return;
    default:
      process.stderr.write(`unknown command: ${command}\n\n${USAGE}`);
      process.exitCode = 2;
  }
}
