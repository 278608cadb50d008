// `x402-fleet hub` and `x402-fleet hub-upload`: flags and environment → options, every value checked
// before anything starts. Kept apart from the service and the client, which load viem.
import { defineCommand, flagOrEnv, httpUrl, port, serviceCommand, stringFlags, wholeNumber, type FlagValues } from "../platform/flags.ts";
import type { TrustProxy } from "./app.ts";
import type { HubServiceOptions } from "./service.ts";

const FLAGS = { ...stringFlags("host", "port", "admin-port", "data-dir", "chain-id"), "rpc-url": { type: "string", multiple: true } } as const;

/** HUB_TRUST_PROXY: "true", a hop count, or comma-separated proxy addresses/CIDRs; unset or "false": none. */
export function parseTrustProxy(v: string | undefined): TrustProxy | undefined {
  if (v === undefined || v.trim() === "" || v === "false") return undefined;
  if (v === "true") return true;
  if (/^\d+$/.test(v)) return Number(v);
  return v.split(",").map((s) => s.trim()).filter(Boolean);
}

export function hubOptionsFrom(flags: FlagValues<typeof FLAGS>, env: NodeJS.ProcessEnv): HubServiceOptions {
  const envNumber = (name: string) => wholeNumber(name, env[name]);
  const rpcUrl = flags["rpc-url"]?.[0] ?? (env.HUB_RPC_URL || undefined);
  return {
    host: flags.host ?? env.HOST ?? "127.0.0.1",
    port: port(...flagOrEnv("--port", flags.port, env, "PORT")) ?? 4030,
    adminPort: port(...flagOrEnv("--admin-port", flags["admin-port"], env, "ADMIN_PORT")),
    databaseUrl: env.DATABASE_URL || undefined,
    dataDir: flags["data-dir"] ?? env.HUB_DATA_DIR ?? ".data/hub",
    rpcUrl: rpcUrl === undefined ? undefined : httpUrl(flags["rpc-url"] ? "--rpc-url" : "HUB_RPC_URL", rpcUrl),
    chainId: wholeNumber(...flagOrEnv("--chain-id", flags["chain-id"], env, "HUB_CHAIN_ID")),
    domainName: env.HUB_DOMAIN_NAME || undefined,
    domainSalt: (env.HUB_DOMAIN_SALT || undefined) as `0x${string}` | undefined,
    domainVerifyingContract: (env.HUB_DOMAIN_VERIFYING_CONTRACT || undefined) as `0x${string}` | undefined,
    storeLimits: { maxBytesPerOwner: envNumber("HUB_QUOTA_BYTES"), maxKeysPerOwner: envNumber("HUB_QUOTA_KEYS"), maxVersionsPerKey: envNumber("HUB_MAX_VERSIONS") },
    trustProxy: parseTrustProxy(env.HUB_TRUST_PROXY),
    maxExpirySeconds: envNumber("HUB_MAX_EXPIRY_SECONDS"),
    bodyLimit: envNumber("HUB_BODY_LIMIT"),
  };
}

export const hubCli = serviceCommand({
  name: "hub",
  summary: "the wallet-scoped key-value store (writes signed by the owner's wallet; docs/hub.md)",
  help: `  --port 4030 --admin-port 9430 --host 127.0.0.1   (env PORT, ADMIN_PORT, HOST)
  --data-dir .data/hub   (env HUB_DATA_DIR)
  [--rpc-url URL] [--chain-id 8453]   (env HUB_RPC_URL, HUB_CHAIN_ID)
env: DATABASE_URL (PostgreSQL instead of the embedded engine), HUB_DOMAIN_NAME, HUB_DOMAIN_SALT,
  HUB_DOMAIN_VERIFYING_CONTRACT, HUB_MAX_EXPIRY_SECONDS, HUB_BODY_LIMIT, HUB_QUOTA_BYTES, HUB_QUOTA_KEYS,
  HUB_MAX_VERSIONS, HUB_TRUST_PROXY
`,
  flags: FLAGS,
  optionsFrom: hubOptionsFrom,
  start: async (options) => (await import("./service.ts")).startHubService(options),
});

export const hubUploadCli = defineCommand({
  name: "hub-upload",
  summary: "sign a hub write with a wallet key, send it and print the hub's answer (docs/hub.md)",
  help: `  --key-file FILE   (0x private key; or HUB_SIGNER_KEY_FILE)
  --id chat7_0 --message TEXT [--bucket B] [--kind memory|knowledgebase] [--owner 0xContractWallet]
  [--hub-url URL]   (or HUB_URL; default: hubUrl of the running devnet's --state-dir .devnet)
`,
  flags: stringFlags("hub-url", "state-dir", "key-file", "id", "message", "bucket", "kind", "owner"),
  run: async (flags, env) => {
    const [source, hubUrl] = flagOrEnv("--hub-url", flags["hub-url"], env, "HUB_URL");
    if (hubUrl !== undefined) httpUrl(source, hubUrl);
    const { hubUploadCommand } = await import("./upload-command.ts");
    const answer = await hubUploadCommand({
      hubUrl,
      stateDir: flags["state-dir"] ?? ".devnet",
      keyFile: flags["key-file"] ?? env.HUB_SIGNER_KEY_FILE,
      id: flags.id,
      message: flags.message,
      bucket: flags.bucket,
      kind: flags.kind,
      owner: flags.owner,
    });
    process.stdout.write(`${JSON.stringify(answer)}\n`);
  },
});
