// API keys of the resource servers that call the router (opt-in: X402_ROUTER_API_KEYS=required).
// A key is `x402k_<id>_<secret>`: the id finds the row, the secret is checked against its SHA-256
// (the secret is 256 random bits, so a fast hash is enough and no plaintext is ever stored). Keys
// are scoped to networks and schemes (empty: all), rotated (a new secret, the old one dead at
// once) and revoked. Rows live in the shared database so every router replica sees the same keys;
// each replica caches a lookup for a few seconds, so a revocation reaches all of them within that.
import { createHash, randomBytes, timingSafeEqual } from "node:crypto";
import type { Database, Migration } from "../platform/storage.ts";

export const API_KEY_MIGRATIONS: Migration[] = [
  {
    id: "tenants/001_api_keys",
    sql: `CREATE TABLE IF NOT EXISTS tenant_api_keys (
      id text PRIMARY KEY,
      name text NOT NULL,
      secret_sha256 text NOT NULL,
      networks text[] NOT NULL DEFAULT '{}',
      schemes text[] NOT NULL DEFAULT '{}',
      created_at timestamptz NOT NULL DEFAULT now(),
      rotated_at timestamptz,
      revoked_at timestamptz
    )`,
  },
  {
    // Quotas (null: unlimited) and their counters, per key and window, shared by every replica.
    id: "tenants/002_quotas",
    sql: `ALTER TABLE tenant_api_keys ADD COLUMN IF NOT EXISTS requests_per_minute integer;
      ALTER TABLE tenant_api_keys ADD COLUMN IF NOT EXISTS settlements_per_day integer;
      CREATE TABLE IF NOT EXISTS tenant_quota_usage (
        key_id text NOT NULL,
        counter text NOT NULL,
        window_start timestamptz NOT NULL,
        used bigint NOT NULL,
        PRIMARY KEY (key_id, counter, window_start)
      )`,
  },
  {
    // Usage for billing, per key, UTC day, network and asset.
    id: "tenants/003_usage",
    sql: `CREATE TABLE IF NOT EXISTS tenant_usage (
        key_id text NOT NULL,
        day date NOT NULL,
        network text NOT NULL,
        asset text NOT NULL,
        verifies bigint NOT NULL DEFAULT 0,
        valid bigint NOT NULL DEFAULT 0,
        settles bigint NOT NULL DEFAULT 0,
        settled bigint NOT NULL DEFAULT 0,
        volume numeric(78, 0) NOT NULL DEFAULT 0,
        PRIMARY KEY (key_id, day, network, asset)
      )`,
  },
  {
    // Gas budgets per key and network (wei per UTC day), their reservations and spend, and gas in usage.
    id: "tenants/004_gas_budgets",
    sql: `ALTER TABLE tenant_api_keys ADD COLUMN IF NOT EXISTS gas_budgets jsonb NOT NULL DEFAULT '{}';
      CREATE TABLE IF NOT EXISTS tenant_gas_budget_usage (
        key_id text NOT NULL,
        network text NOT NULL,
        day date NOT NULL,
        reserved numeric(78, 0) NOT NULL DEFAULT 0,
        spent numeric(78, 0) NOT NULL DEFAULT 0,
        PRIMARY KEY (key_id, network, day)
      );
      ALTER TABLE tenant_usage ADD COLUMN IF NOT EXISTS gas_wei numeric(78, 0) NOT NULL DEFAULT 0`,
  },
  {
    // Where the settlement events of a key's payments go (the facilitators POST them, signed with
    // the key's webhook key: x402/webhooks.ts); the router sends it with each settle.
    id: "tenants/005_webhooks",
    sql: `ALTER TABLE tenant_api_keys ADD COLUMN IF NOT EXISTS webhook_url text`,
  },
];

export const API_KEY_PREFIX = "x402k_";
const KEY_FORMAT = /^x402k_([0-9a-f]{16})_([A-Za-z0-9_-]{43})$/;

/** What a key is allowed to do; empty lists allow everything. */
export interface KeyScope {
  networks: string[];
  schemes: string[];
}

/** How much a key may do; null: no limit. */
export interface KeyLimits {
  /** /verify and /settle calls per minute. */
  requestsPerMinute: number | null;
  /** /settle calls per UTC day (each call counts, whatever its outcome). */
  settlementsPerDay: number | null;
  /** Wei of gas per network and UTC day the facilitators may spend settling for the key (decimal strings); a network absent: no limit. */
  gasBudgets: Record<string, string>;
  /** Where the settlement events of the key's payments are POSTed (https); null: none. Not a limit, but set like one. */
  webhookUrl: string | null;
}

/** A key as listed: never its secret. */
export interface ApiKeyInfo extends KeyScope, KeyLimits {
  id: string;
  name: string;
  createdAt: string;
  rotatedAt: string | null;
  revokedAt: string | null;
}

export interface UsageCall {
  network: string;
  asset: string;
  action: "verify" | "settle";
  ok: boolean;
  /** Atomic units that moved (a successful settle). */
  amount?: bigint;
  /** Wei of gas the settlement's transactions cost. */
  gasWei?: bigint;
}

export interface UsageRow {
  keyId: string;
  day: string;
  network: string;
  asset: string;
  verifies: number;
  valid: number;
  settles: number;
  settled: number;
  /** Atomic units of `asset`, as a decimal string (no precision lost). */
  volume: string;
  /** Wei of the network's native coin spent on gas settling these payments, as a decimal string. */
  gasWei: string;
}

/** A reservation against a key's gas budget, held while one settlement is in flight. */
export interface GasReservation {
  keyId: string;
  network: string;
  /** The UTC day it counts against (a settlement crossing midnight is charged to the day it started). */
  day: string;
  wei: bigint;
}

export type Authentication =
  | { ok: true; key: ApiKeyInfo }
  | { ok: false; code: "api_key_invalid" | "api_key_revoked"; detail: string };

export interface ApiKeyStore {
  create(name: string, scope?: Partial<KeyScope & KeyLimits>): Promise<{ key: string; info: ApiKeyInfo }>;
  setLimits(id: string, limits: Partial<KeyLimits>): Promise<ApiKeyInfo | undefined>;
  /**
   * Counts one request, or one settlement, against the key's limit, atomically across replicas; a
   * limit already reached is not counted and comes back as the reason.
   */
  consume(key: ApiKeyInfo, counter: "requests" | "settlements"): Promise<string | undefined>;
  /**
   * Reserves `quote` wei of the key's gas budget on `network` for one settlement (the whole rest
   * when no quote is known yet), atomically across replicas; a reason when it does not fit.
   */
  reserveGas(key: ApiKeyInfo, network: string, quote: bigint | undefined): Promise<{ reservation: GasReservation } | { refused: string }>;
  /** Ends a reservation: its wei are released and `spentWei` is charged to the budget. */
  settleGas(reservation: GasReservation, spentWei: bigint): Promise<void>;
  list(): Promise<ApiKeyInfo[]>;
  /** A new secret for the same id and scope; the old key stops working. */
  rotate(id: string): Promise<{ key: string; info: ApiKeyInfo } | undefined>;
  revoke(id: string): Promise<ApiKeyInfo | undefined>;
  authenticate(presented: string): Promise<Authentication>;
  /**
   * Adds one call to the key's usage of the day (UTC) for this network and asset: a verify (and
   * whether it was valid), or a settle (and, when it succeeded, the amount that moved).
   */
  recordUsage(keyId: string, call: UsageCall): Promise<void>;
  /** Usage rows per key, day, network and asset, from `since` (YYYY-MM-DD, UTC) on. */
  usage(filter?: { keyId?: string; since?: string }): Promise<UsageRow[]>;
  /** Drops quota counters of windows that ended more than two days ago. */
  pruneUsage(): Promise<void>;
}

type Row = {
  id: string;
  name: string;
  secret_sha256: string;
  networks: string[];
  schemes: string[];
  requests_per_minute: number | null;
  settlements_per_day: number | null;
  gas_budgets: Record<string, string>;
  webhook_url: string | null;
  created_at: Date | string;
  rotated_at: Date | string | null;
  revoked_at: Date | string | null;
};

const iso = (v: Date | string | null) => (v === null ? null : new Date(v).toISOString());
const info = (r: Row): ApiKeyInfo => ({
  id: r.id,
  name: r.name,
  networks: r.networks,
  schemes: r.schemes,
  requestsPerMinute: r.requests_per_minute,
  settlementsPerDay: r.settlements_per_day,
  gasBudgets: r.gas_budgets ?? {},
  webhookUrl: r.webhook_url ?? null,
  createdAt: iso(r.created_at)!,
  rotatedAt: iso(r.rotated_at),
  revokedAt: iso(r.revoked_at),
});
const sha256 = (secret: string) => createHash("sha256").update(secret).digest("hex");
const newSecret = () => randomBytes(32).toString("base64url");

/** `x402k_0123…` with the secret cut: safe in logs and answers. */
export function keyLabel(id: string): string {
  return `${API_KEY_PREFIX}${id}_…`;
}

export function createApiKeyStore(db: Database, opts: { cacheMs?: number; clock?: () => number } = {}): ApiKeyStore {
  const cacheMs = opts.cacheMs ?? 5000;
  const clock = opts.clock ?? Date.now;
  const cache = new Map<string, { at: number; row: Row | undefined }>();

  async function row(id: string): Promise<Row | undefined> {
    const hit = cache.get(id);
    if (hit && clock() - hit.at < cacheMs) return hit.row;
    const [r] = await db.query<Row>("SELECT * FROM tenant_api_keys WHERE id = $1", [id]);
    if (cache.size > 10_000) cache.clear(); // unknown ids from hostile callers must not grow it without bound
    cache.set(id, { at: clock(), row: r });
    return r;
  }

  return {
    async create(name, scope = {}) {
      const id = randomBytes(8).toString("hex");
      const secret = newSecret();
      const [r] = await db.query<Row>(
        "INSERT INTO tenant_api_keys (id, name, secret_sha256, networks, schemes, requests_per_minute, settlements_per_day, gas_budgets, webhook_url) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) RETURNING *",
        [id, name, sha256(secret), scope.networks ?? [], scope.schemes ?? [], scope.requestsPerMinute ?? null, scope.settlementsPerDay ?? null, JSON.stringify(scope.gasBudgets ?? {}), scope.webhookUrl ?? null],
      );
      return { key: `${API_KEY_PREFIX}${id}_${secret}`, info: info(r!) };
    },
    async setLimits(id, limits) {
      const [r] = await db.query<Row>(
        `UPDATE tenant_api_keys SET
           requests_per_minute = CASE WHEN $2 THEN $3::integer ELSE requests_per_minute END,
           settlements_per_day = CASE WHEN $4 THEN $5::integer ELSE settlements_per_day END,
           gas_budgets = CASE WHEN $6 THEN $7::jsonb ELSE gas_budgets END,
           webhook_url = CASE WHEN $8 THEN $9::text ELSE webhook_url END
         WHERE id = $1 RETURNING *`,
        [id, "requestsPerMinute" in limits, limits.requestsPerMinute ?? null, "settlementsPerDay" in limits, limits.settlementsPerDay ?? null, "gasBudgets" in limits, JSON.stringify(limits.gasBudgets ?? {}), "webhookUrl" in limits, limits.webhookUrl ?? null],
      );
      cache.delete(id);
      return r ? info(r) : undefined;
    },
    async consume(key, counter) {
      const [limit, window, what] =
        counter === "requests"
          ? [key.requestsPerMinute, "minute", `${key.requestsPerMinute} requests per minute`]
          : [key.settlementsPerDay, "day", `${key.settlementsPerDay} settlements per day (UTC)`];
      if (limit === null) return undefined;
      const exhausted = `${keyLabel(key.id)} has used its ${what}`;
      if (limit === 0) return exhausted;
      // One statement: insert the window's counter or add one, but only below the limit. No row
      // back means the limit was already reached (and nothing was counted).
      const rows = await db.query(
        `INSERT INTO tenant_quota_usage (key_id, counter, window_start, used) VALUES ($1, $2, date_trunc($3, now()), 1)
         ON CONFLICT (key_id, counter, window_start) DO UPDATE SET used = tenant_quota_usage.used + 1 WHERE tenant_quota_usage.used < $4
         RETURNING used`,
        [key.id, counter, window, limit],
      );
      return rows.length === 0 ? exhausted : undefined;
    },
    async reserveGas(key, network, quote) {
      const budget = key.gasBudgets[network];
      if (budget === undefined) return { reservation: { keyId: key.id, network, day: "", wei: 0n } };
      const today = "(now() AT TIME ZONE 'UTC')::date";
      await db.query(`INSERT INTO tenant_gas_budget_usage (key_id, network, day) VALUES ($1, $2, ${today}) ON CONFLICT DO NOTHING`, [key.id, network]);
      /** What is left of today's budget, and how much of it settlements in flight hold. */
      const used = async () => {
        const [u] = await db.query<{ spent: string; reserved: string }>(`SELECT spent::text, reserved::text FROM tenant_gas_budget_usage WHERE key_id = $1 AND network = $2 AND day = ${today}`, [key.id, network]);
        const reserved = BigInt(u?.reserved ?? 0);
        return { left: BigInt(budget) - BigInt(u?.spent ?? 0) - reserved, reserved };
      };
      // Without a quote (the first settlement a replica forwards on this network) the whole rest is held.
      const wei = quote ?? (await used()).left;
      // One statement under the row's lock: only if it fits. Replicas racing for the last wei are
      // serialised by the lock and re-check the condition on the row as the other left it.
      const [r] =
        wei > 0n
          ? await db.query<{ day: string }>(
              `UPDATE tenant_gas_budget_usage SET reserved = reserved + $4::numeric
               WHERE key_id = $1 AND network = $2 AND day = ${today} AND spent + reserved + $4::numeric <= $3::numeric
               RETURNING to_char(day, 'YYYY-MM-DD') AS day`,
              [key.id, network, budget, wei.toString()],
            )
          : [];
      if (r) return { reservation: { keyId: key.id, network, day: r.day, wei } };
      const { left, reserved } = await used();
      return {
        refused:
          `${keyLabel(key.id)} has ${left > 0n ? left : 0n} wei left of its gas budget of ${budget} wei on ${network} today (UTC)` +
          (reserved > 0n ? `, besides ${reserved} wei held by settlements in flight` : "") +
          (quote !== undefined ? `; one settlement may cost up to ${quote} wei` : ""),
      };
    },
    async settleGas(reservation, spentWei) {
      if (reservation.day === "") return; // no budget on this network: nothing was reserved
      await db.query(
        "UPDATE tenant_gas_budget_usage SET reserved = greatest(reserved - $4::numeric, 0), spent = spent + $5::numeric WHERE key_id = $1 AND network = $2 AND day = $3::date",
        [reservation.keyId, reservation.network, reservation.day, reservation.wei.toString(), spentWei.toString()],
      );
    },
    async list() {
      return (await db.query<Row>("SELECT * FROM tenant_api_keys ORDER BY created_at, id")).map(info);
    },
    async rotate(id) {
      const secret = newSecret();
      const [r] = await db.query<Row>("UPDATE tenant_api_keys SET secret_sha256 = $2, rotated_at = now() WHERE id = $1 AND revoked_at IS NULL RETURNING *", [id, sha256(secret)]);
      cache.delete(id);
      return r ? { key: `${API_KEY_PREFIX}${id}_${secret}`, info: info(r) } : undefined;
    },
    async revoke(id) {
      const [r] = await db.query<Row>("UPDATE tenant_api_keys SET revoked_at = coalesce(revoked_at, now()) WHERE id = $1 RETURNING *", [id]);
      cache.delete(id);
      return r ? info(r) : undefined;
    },
    async recordUsage(keyId, call) {
      const verify = call.action === "verify";
      await db.query(
        `INSERT INTO tenant_usage (key_id, day, network, asset, verifies, valid, settles, settled, volume, gas_wei)
         VALUES ($1, (now() AT TIME ZONE 'UTC')::date, $2, $3, $4, $5, $6, $7, $8, $9)
         ON CONFLICT (key_id, day, network, asset) DO UPDATE SET
           verifies = tenant_usage.verifies + EXCLUDED.verifies, valid = tenant_usage.valid + EXCLUDED.valid,
           settles = tenant_usage.settles + EXCLUDED.settles, settled = tenant_usage.settled + EXCLUDED.settled,
           volume = tenant_usage.volume + EXCLUDED.volume, gas_wei = tenant_usage.gas_wei + EXCLUDED.gas_wei`,
        [keyId, call.network, call.asset.toLowerCase(), verify ? 1 : 0, verify && call.ok ? 1 : 0, verify ? 0 : 1, !verify && call.ok ? 1 : 0, (!verify && call.ok ? (call.amount ?? 0n) : 0n).toString(), (call.gasWei ?? 0n).toString()],
      );
    },
    async usage(filter = {}) {
      const rows = await db.query<{ key_id: string; day: string; network: string; asset: string; verifies: string; valid: string; settles: string; settled: string; volume: string; gas_wei: string }>(
        `SELECT key_id, to_char(day, 'YYYY-MM-DD') AS day, network, asset, verifies::text, valid::text, settles::text, settled::text, volume::text, gas_wei::text FROM tenant_usage WHERE ($1::text IS NULL OR key_id = $1) AND ($2::date IS NULL OR day >= $2::date) ORDER BY day, key_id, network, asset`,
        [filter.keyId ?? null, filter.since ?? null],
      );
      return rows.map((r) => ({
        keyId: r.key_id,
        day: r.day,
        network: r.network,
        asset: r.asset,
        verifies: Number(r.verifies),
        valid: Number(r.valid),
        settles: Number(r.settles),
        settled: Number(r.settled),
        volume: String(r.volume),
        gasWei: String(r.gas_wei),
      }));
    },
    async pruneUsage() {
      await db.query("DELETE FROM tenant_quota_usage WHERE window_start < now() - interval '2 days'");
    },
    async authenticate(presented) {
      const m = KEY_FORMAT.exec(presented);
      if (!m) return { ok: false, code: "api_key_invalid", detail: `not an x402-fleet API key (${API_KEY_PREFIX}<id>_<secret>)` };
      const r = await row(m[1]!);
      const presentedHash = Buffer.from(sha256(m[2]!), "hex");
      if (!r || !timingSafeEqual(presentedHash, Buffer.from(r.secret_sha256, "hex"))) return { ok: false, code: "api_key_invalid", detail: `${keyLabel(m[1]!)} is not a valid key` };
      if (r.revoked_at !== null) return { ok: false, code: "api_key_revoked", detail: `${keyLabel(r.id)} was revoked at ${iso(r.revoked_at)}` };
      return { ok: true, key: info(r) };
    },
  };
}

/** Whether a key may act on (scheme, network), and if not, why. */
export function outOfScope(key: ApiKeyInfo, scheme: string, network: string): string | undefined {
  if (key.networks.length && !key.networks.includes(network)) return `${keyLabel(key.id)} is not allowed on ${network} (allowed: ${key.networks.join(", ")})`;
  if (key.schemes.length && !key.schemes.includes(scheme)) return `${keyLabel(key.id)} is not allowed for scheme ${scheme} (allowed: ${key.schemes.join(", ")})`;
  return undefined;
}
