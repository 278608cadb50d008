// `x402-fleet api-key-*`: manage the routers' API keys in their shared database (DATABASE_URL), or
// through a router's key admin API (--admin-url with its admin token): the only way to a router on
// its embedded engine (a devnet, one replica), whose files no second process may open.
// A new or rotated key is printed once; only its hash is stored.
import { readFileSync } from "node:fs";
import { defineCommand, httpUrl, list, stringFlags, type Command, type FlagSpec } from "../platform/flags.ts";
import { openDatabase } from "../platform/storage.ts";
import { CAIP2_PATTERN } from "../x402/networks.ts";
import { SCHEMES } from "../x402/wire.ts";
import { tenantWebhookKey, webhookOrigin, webhookUrlProblem } from "../x402/webhooks.ts";
import { API_KEY_MIGRATIONS, createApiKeyStore, type ApiKeyInfo, type ApiKeyStore, type KeyLimits } from "./api-keys.ts";

/** The flags of every api-key-* command, each taking its own (their help says which). */
export type ApiKeyFlags = Partial<Record<"name" | "networks" | "schemes" | "id" | "requests-per-minute" | "settlements-per-day" | "gas-budget" | "webhook-url" | "since" | "admin-url" | "admin-token-file", string>>;

/** What the commands do to the keys: the store itself, or a router's admin API standing in for it. */
type KeyAdmin = Pick<ApiKeyStore, "create" | "setLimits" | "usage" | "list" | "rotate" | "revoke"> & {
  /** The key a key's settlement webhooks are signed with (x402/webhooks.ts); undefined: no such key. */
  webhookKey(id: string): Promise<string | undefined>;
  close(): Promise<void>;
};

/** The key admin API of a router (tenants/admin-api.ts) behind the store's interface; its refusals become the command's error. */
function httpKeyAdmin(command: string, adminUrl: string, token: string): KeyAdmin {
  const call = async <T>(method: string, path: string, body?: unknown): Promise<T | undefined> => {
    let res: Response;
    try {
      res = await fetch(new URL(path, adminUrl), {
        method,
        headers: { authorization: `Bearer ${token}`, ...(body === undefined ? {} : { "content-type": "application/json" }) },
        body: body === undefined ? undefined : JSON.stringify(body),
        signal: AbortSignal.timeout(30_000),
      });
    } catch (e) {
      throw new Error(`${command}: the router's admin API at ${new URL(adminUrl).origin} cannot be reached (${(e as { cause?: { code?: string } }).cause?.code ?? (e as Error).name})`);
    }
    const json = (await res.json().catch(() => ({}))) as T & { error?: string };
    if (res.status === 404 && json.error?.startsWith("not_found")) return undefined;
    if (!res.ok) throw new Error(`${command}: the router's admin API answered ${res.status}${json.error ? ` ${json.error}` : ""}`);
    return json;
  };
  const keyPath = (id: string, action = "") => `/admin/v1/api-keys/${encodeURIComponent(id)}${action}`;
  return {
    create: async (name, scope) => {
      const r = (await call<{ key: string; apiKey: ApiKeyInfo }>("POST", "/admin/v1/api-keys", { ...scope, name }))!;
      return { key: r.key, info: r.apiKey };
    },
    setLimits: async (id, limits) => (await call<{ apiKey: ApiKeyInfo }>("PATCH", keyPath(id), limits))?.apiKey,
    usage: async (filter = {}) => (await call<{ usage: Awaited<ReturnType<ApiKeyStore["usage"]>> }>("GET", `/admin/v1/usage?${new URLSearchParams(Object.entries(filter).filter(([, v]) => v !== undefined) as [string, string][])}`))!.usage,
    list: async () => (await call<{ apiKeys: ApiKeyInfo[] }>("GET", "/admin/v1/api-keys"))!.apiKeys,
    rotate: async (id) => {
      const r = await call<{ key: string; apiKey: ApiKeyInfo }>("POST", keyPath(id, "/rotate"));
      return r && { key: r.key, info: r.apiKey };
    },
    revoke: async (id) => (await call<{ apiKey: ApiKeyInfo }>("POST", keyPath(id, "/revoke")))?.apiKey,
    webhookKey: async (id) => (await call<{ webhookKey: string }>("GET", keyPath(id, "/webhook-key")))?.webhookKey,
    close: async () => undefined,
  };
}

/** The keys behind DATABASE_URL, or behind a router's admin API. */
async function keyAdminFor(command: string, flags: ApiKeyFlags, env: NodeJS.ProcessEnv): Promise<KeyAdmin> {
  const adminUrl = flags["admin-url"] ?? (env.X402_ROUTER_ADMIN_URL || undefined);
  if (adminUrl !== undefined) {
    const url = httpUrl(flags["admin-url"] !== undefined ? "--admin-url" : "X402_ROUTER_ADMIN_URL", adminUrl);
    const tokenFile = flags["admin-token-file"] ?? (env.X402_ROUTER_ADMIN_TOKEN_FILE || undefined);
    if (!tokenFile) throw new Error(`${command}: --admin-url needs the router's admin token: --admin-token-file FILE (or X402_ROUTER_ADMIN_TOKEN_FILE)`);
    let token: string;
    try {
      token = readFileSync(tokenFile, "utf8").trim();
    } catch (e) {
      throw new Error(`${command}: admin token file ${tokenFile} cannot be read (${(e as NodeJS.ErrnoException).code ?? "error"})`);
    }
    return httpKeyAdmin(command, url, token);
  }
  if (!env.DATABASE_URL) throw new Error(`${command}: DATABASE_URL (the routers' PostgreSQL database) or --admin-url (a router's key admin API, with --admin-token-file) is required`);
  const db = await openDatabase({ url: env.DATABASE_URL, migrations: API_KEY_MIGRATIONS });
  const keys = createApiKeyStore(db, { cacheMs: 0 });
  const webhookKey = async (id: string) => {
    const file = env.X402_ROUTER_WEBHOOK_SECRET_FILE;
    if (!file) throw new Error(`${command}: X402_ROUTER_WEBHOOK_SECRET_FILE (the facilitators' webhook secret) is required to derive a webhook key`);
    let secret: string;
    try {
      secret = readFileSync(file, "utf8").trim();
    } catch (e) {
      throw new Error(`${command}: webhook secret file ${file} cannot be read (${(e as NodeJS.ErrnoException).code ?? "error"})`);
    }
    return (await keys.list()).some((k) => k.id === id) ? tenantWebhookKey(secret, id) : undefined;
  };
  return { ...keys, webhookKey, close: () => db.close() };
}

/** A limit flag: a non-negative integer, or "none" (no limit); absent: not given. */
function limit(flag: string, value: string | undefined): number | null | undefined {
  if (value === undefined) return undefined;
  if (value === "none") return null;
  if (!/^\d{1,9}$/.test(value)) throw new Error(`api-key: ${flag} must be a non-negative integer or "none", got ${JSON.stringify(value)}`);
  return Number(value);
}

/** --gas-budget eip155:8453=1000000000000000,eip155:56=none, merged into the key's current budgets. */
function gasBudgets(value: string, current: Record<string, string>): Record<string, string> {
  const out = { ...current };
  for (const item of list(value) ?? []) {
    const m = /^(eip155:[0-9]+)=([0-9]{1,78}|none)$/.exec(item);
    if (!m || !CAIP2_PATTERN.test(m[1]!)) throw new Error(`api-key: --gas-budget takes NETWORK=WEI or NETWORK=none (e.g. eip155:8453=2000000000000000), got ${JSON.stringify(item)}`);
    if (m[2] === "none") delete out[m[1]!];
    else out[m[1]!] = BigInt(m[2]!).toString();
  }
  return out;
}

function limitsOf(flags: ApiKeyFlags, current: Record<string, string> = {}, env: NodeJS.ProcessEnv = {}): Partial<KeyLimits> {
  const out: Partial<KeyLimits> = {};
  const webhook = flags["webhook-url"];
  if (webhook !== undefined) {
    // The facilitators' rules (x402/webhooks.ts); never echoed: the URL may carry a token.
    const problem = webhook === "none" ? undefined : webhookUrlProblem(webhook, { allowPrivateNetworks: env.X402_ROUTER_WEBHOOK_ALLOW_PRIVATE_NETWORKS === "true" });
    if (problem) throw new Error(`api-key: --webhook-url: ${problem}`);
    out.webhookUrl = webhook === "none" ? null : webhook;
  }
  if (flags["gas-budget"] !== undefined) out.gasBudgets = gasBudgets(flags["gas-budget"], current);
  const rpm = limit("--requests-per-minute", flags["requests-per-minute"]);
  const spd = limit("--settlements-per-day", flags["settlements-per-day"]);
  if (rpm !== undefined) out.requestsPerMinute = rpm;
  if (spd !== undefined) out.settlementsPerDay = spd;
  return out;
}

function validList(value: string | undefined, what: string, valid: (s: string) => boolean): string[] {
  const items = list(value) ?? [];
  const bad = items.find((s) => !valid(s));
  if (bad !== undefined) throw new Error(`api-key: ${JSON.stringify(bad)} is not a valid ${what}`);
  return items;
}

const describe = (k: ApiKeyInfo) =>
  `${k.id}  ${k.name}  networks=${k.networks.join(",") || "*"}  schemes=${k.schemes.join(",") || "*"}  requests/min=${k.requestsPerMinute ?? "*"}  settlements/day=${k.settlementsPerDay ?? "*"}${k.webhookUrl ? `  webhook=${webhookOrigin(k.webhookUrl)}` : ""}${Object.keys(k.gasBudgets).length ? `  gas/day=${Object.entries(k.gasBudgets).sort(([x], [y]) => x.localeCompare(y)).map(([n, w]) => `${n}=${w}`).join(",")}` : ""}  created=${k.createdAt}${k.rotatedAt ? `  rotated=${k.rotatedAt}` : ""}${k.revokedAt ? `  REVOKED=${k.revokedAt}` : ""}`;

export async function runApiKeyCommand(command: string, flags: ApiKeyFlags, env: NodeJS.ProcessEnv): Promise<string> {
  const needId = () => {
    if (!flags.id || !/^[0-9a-f]{16}$/.test(flags.id)) throw new Error(`${command}: --id <16 hex characters> is required (api-key-list shows the ids)`);
    return flags.id;
  };
  // Values first: a typo is refused before the database is opened.
  if (flags.id !== undefined || ["api-key-limits", "api-key-rotate", "api-key-revoke", "api-key-webhook-key"].includes(command)) needId();
  limitsOf(flags, {}, env);
  if (flags.since !== undefined && !/^\d{4}-\d{2}-\d{2}$/.test(flags.since)) throw new Error("api-key-usage: --since is a UTC day, YYYY-MM-DD");
  const networks = validList(flags.networks, "network (eip155:<chain id>)", (s) => CAIP2_PATTERN.test(s));
  const schemes = validList(flags.schemes, `scheme (${SCHEMES.join(", ")})`, (s) => (SCHEMES as readonly string[]).includes(s));
  const store = await keyAdminFor(command, flags, env);
  try {
    switch (command) {
      case "api-key-create": {
        if (!flags.name?.trim()) throw new Error("api-key-create: --name is required (who the key is for)");
        const { key, info } = await store.create(flags.name.trim(), { networks, schemes, ...limitsOf(flags, {}, env) });
        return `${describe(info)}\nkey (shown once, store it now): ${key}\n`;
      }
      case "api-key-limits": {
        const id = needId();
        const limits = limitsOf(flags, (await store.list()).find((k) => k.id === id)?.gasBudgets, env);
        if (!Object.keys(limits).length) throw new Error("api-key-limits: give --requests-per-minute, --settlements-per-day (a number, or none), --gas-budget NETWORK=WEI|none and/or --webhook-url URL|none");
        const updated = await store.setLimits(id, limits);
        if (!updated) throw new Error(`api-key-limits: no key ${flags.id}`);
        return `${describe(updated)}\n`;
      }
      case "api-key-usage": {
        const rows = await store.usage({ keyId: flags.id, since: flags.since });
        const header = "day,key,network,asset,verifies,valid,settles,settled,volume,gas_wei\n";
        return header + rows.map((r) => `${r.day},${r.keyId},${r.network},${r.asset},${r.verifies},${r.valid},${r.settles},${r.settled},${r.volume},${r.gasWei}\n`).join("");
      }
      case "api-key-list":
        return (await store.list()).map((k) => `${describe(k)}\n`).join("") || "no API keys\n";
      case "api-key-rotate": {
        const rotated = await store.rotate(needId());
        if (!rotated) throw new Error(`api-key-rotate: no active key ${flags.id}`);
        return `${describe(rotated.info)}\nnew key (shown once; the old one no longer works): ${rotated.key}\n`;
      }
      case "api-key-webhook-key": {
        const key = await store.webhookKey(needId());
        if (!key) throw new Error(`api-key-webhook-key: no key ${flags.id}`);
        return `webhook key of ${flags.id} (its settlement webhooks' signatures: docs/facilitator-interface.md#webhooks): ${key}\n`;
      }
      default: {
        const revoked = await store.revoke(needId());
        if (!revoked) throw new Error(`api-key-revoke: no key ${flags.id}`);
        return `${describe(revoked)}\n`;
      }
    }
  } finally {
    await store.close();
  }
}

const ID = stringFlags("id");
const LIMITS = stringFlags("requests-per-minute", "settlements-per-day", "gas-budget", "webhook-url");
const ADMIN = stringFlags("admin-url", "admin-token-file");
const ENV = `  [--admin-url http://127.0.0.1:9420 --admin-token-file FILE]   (env X402_ROUTER_ADMIN_URL,
      X402_ROUTER_ADMIN_TOKEN_FILE) through a router's key admin API instead of the database
env: DATABASE_URL (the routers' PostgreSQL database; required without --admin-url)
`;

function apiKeyCli(name: string, summary: string, usage: string, flags: FlagSpec): Command {
  return defineCommand({
    name,
    summary,
    help: `${usage}${ENV}`,
    flags: { ...flags, ...ADMIN },
    run: async (f, env) => {
      process.stdout.write(await runApiKeyCommand(name, f, env));
    },
  });
}

export const apiKeyClis: Command[] = [
  apiKeyCli(
    "api-key-create",
    "a key for a resource server (printed once; stored hashed)",
    `  --name NAME [--networks eip155:8453,eip155:56] [--schemes exact,upto]
  [--requests-per-minute N] [--settlements-per-day N]   (enforced across router replicas)
  [--gas-budget eip155:8453=WEI,eip155:56=WEI]   (gas per network per UTC day, checked before signing)
  [--webhook-url https://…]   (where the facilitators POST its settlement events, signed with its webhook key)
`,
    { ...stringFlags("name", "networks", "schemes"), ...LIMITS },
  ),
  apiKeyCli(
    "api-key-limits",
    "change a key's limits",
    `  --id ID [--requests-per-minute N|none] [--settlements-per-day N|none]
  [--gas-budget NETWORK=WEI|none,...]   (the networks named change, the others stay)
  [--webhook-url URL|none]
`,
    { ...ID, ...LIMITS },
  ),
  apiKeyCli(
    "api-key-usage",
    "usage for billing as CSV",
    `  [--id ID] [--since YYYY-MM-DD]   per UTC day, key, network and asset: verifies, valid, settles, settled,
  volume (atomic units), gas_wei
`,
    stringFlags("id", "since"),
  ),
  apiKeyCli("api-key-list", "the keys: id, name, scope, created/rotated/revoked (never a secret)", "", {}),
  apiKeyCli("api-key-rotate", "a new secret for a key (the old one stops working; printed once)", "  --id ID\n", ID),
  apiKeyCli("api-key-revoke", "revoke a key", "  --id ID\n", ID),
  apiKeyCli(
    "api-key-webhook-key",
    "the key a key's settlement webhooks are signed with",
    "  --id ID   (with DATABASE_URL: env X402_ROUTER_WEBHOOK_SECRET_FILE, the facilitators' webhook secret)\n",
    ID,
  ),
];
