// The wallet service's SQL repository on the project's one storage layer (embedded engine or
// PostgreSQL, same SQL): platforms and their hashed API keys, wallets with their sealed keys,
// policies with an audit trail, the signature log (which also feeds the daily caps), and the
// fingerprints of the master keys that wrapped data keys.
import type { Address } from "viem";
import type { Database, Migration, Queryable } from "../platform/storage.ts";
import type { SealedKey } from "./custody.ts";
import { spendKey, type Policy } from "./policy.ts";

export const WALLETS_MIGRATIONS: Migration[] = [
  {
    id: "wallets/001_custody",
    sql: `
CREATE TABLE wallet_platforms (
  id text PRIMARY KEY,
  name text NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE wallet_api_keys (
  id text PRIMARY KEY,
  platform_id text NOT NULL REFERENCES wallet_platforms (id),
  digest text NOT NULL,
  label text,
  created_at timestamptz NOT NULL DEFAULT now(),
  revoked_at timestamptz
);
CREATE INDEX wallet_api_keys_platform ON wallet_api_keys (platform_id);
CREATE TABLE wallet_master_keys (
  id text PRIMARY KEY,
  fingerprint text NOT NULL,
  first_seen_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE wallets (
  id text PRIMARY KEY,
  seq bigint GENERATED ALWAYS AS IDENTITY UNIQUE,
  platform_id text NOT NULL REFERENCES wallet_platforms (id),
  address text NOT NULL UNIQUE,
  label text,
  agent_id text,
  policy jsonb NOT NULL,
  policy_version integer NOT NULL,
  created_at timestamptz NOT NULL,
  updated_at timestamptz NOT NULL
);
CREATE INDEX wallets_platform ON wallets (platform_id, seq);
CREATE TABLE wallet_keys (
  wallet_id text PRIMARY KEY REFERENCES wallets (id),
  master_key_id text NOT NULL,
  wrapped_data_key bytea NOT NULL,
  encrypted_key bytea NOT NULL,
  rewrapped_at timestamptz
);
CREATE INDEX wallet_keys_master ON wallet_keys (master_key_id);
CREATE TABLE wallet_policy_audit (
  seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  wallet_id text NOT NULL REFERENCES wallets (id),
  version integer NOT NULL,
  api_key_id text,
  previous jsonb,
  policy jsonb NOT NULL,
  changed_at timestamptz NOT NULL
);
CREATE INDEX wallet_policy_audit_wallet ON wallet_policy_audit (wallet_id, seq);
CREATE TABLE wallet_signatures (
  id text PRIMARY KEY,
  seq bigint GENERATED ALWAYS AS IDENTITY UNIQUE,
  wallet_id text NOT NULL REFERENCES wallets (id),
  api_key_id text,
  kind text NOT NULL,
  scheme text,
  network text NOT NULL,
  asset text NOT NULL,
  amount numeric(78, 0) NOT NULL,
  pay_to text NOT NULL,
  method text NOT NULL,
  resource_url text,
  nonce text,
  valid_before bigint,
  signature_hash text NOT NULL,
  created_at timestamptz NOT NULL,
  outcome jsonb
);
CREATE INDEX wallet_signatures_wallet ON wallet_signatures (wallet_id, seq);
CREATE INDEX wallet_signatures_spend ON wallet_signatures (wallet_id, network, asset, created_at) WHERE kind = 'payment'`,
  },
  {
    // Two-phase retirement of master keys, coordinated through the database: a key is "retiring"
    // once a replica has a newer primary (phase 1: that replica stops wrapping under it), and
    // "retired" once no data key is under it and no live replica still wraps under it (phase 2:
    // from then on nothing may wrap under it, and it can leave the file). Replicas report the key
    // they wrap new wallets under in wallet_replicas.
    id: "wallets/002_key_retirement",
    sql: `
ALTER TABLE wallet_master_keys ADD COLUMN retiring_at timestamptz;
ALTER TABLE wallet_master_keys ADD COLUMN retired_at timestamptz;
CREATE TABLE wallet_replicas (
  id text PRIMARY KEY,
  primary_key_id text NOT NULL,
  seen_at timestamptz NOT NULL DEFAULT now()
)`,
  },
];

/** The master key was retired (phase 2): nothing may be wrapped under it any more. */
export class MasterKeyRetiredError extends Error {
  constructor(readonly masterKeyId: string) {
    super(`master key ${masterKeyId} is retired`);
  }
}

export type RetireOutcome = { retired: true } | { retired: false; dataKeys: number; replicas: string[] };

export interface MasterKeyState {
  id: string;
  retiringAt: string | null;
  retiredAt: string | null;
}

/** Takes a share lock on the master key's row and refuses a retired key (wraps and retirement serialise on it). */
async function assertWrappable(tx: Queryable, masterKeyId: string): Promise<void> {
  const [row] = await tx.query<{ retired_at: Date | null }>("SELECT retired_at FROM wallet_master_keys WHERE id = $1 FOR SHARE", [masterKeyId]);
  if (!row || row.retired_at !== null) throw new MasterKeyRetiredError(masterKeyId);
}

export interface Platform {
  id: string;
  name: string;
  createdAt: string;
}

export interface ApiKeyInfo {
  id: string;
  platformId: string;
  label: string | null;
  createdAt: string;
  revokedAt: string | null;
}

export interface StoredApiKey extends ApiKeyInfo {
  digest: string;
}

export interface Wallet {
  id: string;
  platformId: string;
  address: Address;
  label: string | null;
  agentId: string | null;
  policy: Policy;
  policyVersion: number;
  createdAt: string;
  updatedAt: string;
}

export interface LockedWallet extends Wallet {
  sealed: SealedKey;
}

export interface PolicyAuditEntry {
  version: number;
  apiKeyId: string | null;
  changedAt: string;
  previous: Policy | null;
  policy: Policy;
}

export type SignatureKind = "payment" | "permit2_approval";

export interface SignatureOutcome {
  /** HTTP status of the paid retry (fetch), or of the approval's receipt. */
  status?: number;
  settled?: boolean;
  transaction?: string;
  errorReason?: string;
}

export interface SignatureRecord {
  id: string;
  walletId: string;
  apiKeyId: string | null;
  kind: SignatureKind;
  scheme: string | null;
  network: string;
  asset: string;
  amount: string;
  payTo: string;
  method: string;
  resource: string | null;
  nonce: string | null;
  validBefore: number | null;
  /** keccak256 of the signature: identifies it without keeping a usable authorisation at rest. */
  signatureHash: string;
  createdAt: string;
  outcome: SignatureOutcome | null;
}

export interface CreateWalletInput {
  id: string;
  platformId: string;
  address: Address;
  label?: string;
  agentId?: string;
  policy: Policy;
  sealed: SealedKey;
  apiKeyId: string;
  now: Date;
}

export interface PageInput {
  limit: number;
  /** Items after (wallets, oldest first) or before (signatures and audit, newest first) this cursor. */
  cursor?: bigint;
  agentId?: string;
}

export interface Paged<T> {
  items: T[];
  next: string | null;
}

interface WalletRow {
  id: string;
  seq: string | number;
  platform_id: string;
  address: string;
  label: string | null;
  agent_id: string | null;
  policy: Policy | string;
  policy_version: number;
  created_at: Date | string;
  updated_at: Date | string;
}

interface KeyRow {
  master_key_id: string;
  wrapped_data_key: Uint8Array;
  encrypted_key: Uint8Array;
}

interface SignatureRow {
  id: string;
  seq: string | number;
  wallet_id: string;
  api_key_id: string | null;
  kind: SignatureKind;
  scheme: string | null;
  network: string;
  asset: string;
  amount: string;
  pay_to: string;
  method: string;
  resource_url: string | null;
  nonce: string | null;
  valid_before: string | number | null;
  signature_hash: string;
  created_at: Date | string;
  outcome: SignatureOutcome | string | null;
}

const iso = (t: Date | string | null): string | null => (t === null ? null : t instanceof Date ? t.toISOString() : new Date(t).toISOString());
const json = <T>(v: T | string): T => (typeof v === "string" ? (JSON.parse(v) as T) : v);

function toWallet(r: WalletRow): Wallet {
  return {
    id: r.id,
    platformId: r.platform_id,
    address: r.address as Address,
    label: r.label,
    agentId: r.agent_id,
    policy: json(r.policy),
    policyVersion: Number(r.policy_version),
    createdAt: iso(r.created_at)!,
    updatedAt: iso(r.updated_at)!,
  };
}

function toSealed(r: KeyRow): SealedKey {
  return { masterKeyId: r.master_key_id, wrappedDataKey: r.wrapped_data_key, encryptedKey: r.encrypted_key };
}

function toSignature(r: SignatureRow): SignatureRecord {
  return {
    id: r.id,
    walletId: r.wallet_id,
    apiKeyId: r.api_key_id,
    kind: r.kind,
    scheme: r.scheme,
    network: r.network,
    asset: r.asset,
    amount: String(r.amount),
    payTo: r.pay_to,
    method: r.method,
    resource: r.resource_url,
    nonce: r.nonce,
    validBefore: r.valid_before === null ? null : Number(r.valid_before),
    signatureHash: r.signature_hash,
    createdAt: iso(r.created_at)!,
    outcome: r.outcome === null ? null : json(r.outcome),
  };
}

const WALLET_COLUMNS = "w.id, w.seq, w.platform_id, w.address, w.label, w.agent_id, w.policy, w.policy_version, w.created_at, w.updated_at";

export interface WalletStore {
  createPlatform(id: string, name: string, key: { id: string; digest: string; label?: string }): Promise<Platform>;
  listPlatforms(): Promise<Platform[]>;
  /** Undefined when the platform does not exist. */
  addApiKey(platformId: string, key: { id: string; digest: string; label?: string }): Promise<ApiKeyInfo | undefined>;
  listApiKeys(platformId: string): Promise<ApiKeyInfo[] | undefined>;
  revokeApiKey(platformId: string, keyId: string, at: Date): Promise<ApiKeyInfo | undefined>;
  apiKey(keyId: string): Promise<StoredApiKey | undefined>;
  platform(platformId: string): Promise<Platform | undefined>;

  /** Records the fingerprint of a master key id the first time it is seen; returns the one on record. */
  registerMasterKey(id: string, fingerprint: string): Promise<string>;
  dataKeyCounts(): Promise<Record<string, number>>;
  /** Wallets whose data key is wrapped by one of `from`. */
  keysWrappedBy(from: string[], limit: number): Promise<{ walletId: string; address: Address; sealed: SealedKey }[]>;
  /** Replaces a wrapped data key, only if it is still wrapped by `fromMasterKeyId` (replicas may race); MasterKeyRetiredError when the target is retired. */
  replaceWrappedKey(walletId: string, fromMasterKeyId: string, sealed: SealedKey, at: Date): Promise<boolean>;
  /** This replica is alive and wraps new wallets under `primaryKeyId` (database clock). */
  heartbeat(replicaId: string, primaryKeyId: string): Promise<void>;
  /** A replica that stops. */
  leave(replicaId: string): Promise<void>;
  /** Phase 1: keys a replica no longer wraps under (a newer primary is loaded). */
  markRetiring(masterKeyIds: string[]): Promise<void>;
  /** Phase 2, atomically: retired only when no data key is under it and no replica seen within `liveWithinMs` wraps under it. */
  tryRetire(masterKeyId: string, liveWithinMs: number): Promise<RetireOutcome>;
  masterKeyStates(): Promise<MasterKeyState[]>;

  createWallet(input: CreateWalletInput): Promise<Wallet>;
  wallet(platformId: string, walletId: string): Promise<Wallet | undefined>;
  /** The wallet and its sealed key (for signing outside a payment: approvals). */
  walletWithKey(platformId: string, walletId: string): Promise<LockedWallet | undefined>;
  listWallets(platformId: string, page: PageInput): Promise<Paged<Wallet>>;
  setPolicy(platformId: string, walletId: string, policy: Policy, apiKeyId: string, now: Date): Promise<Wallet | undefined>;
  policyHistory(platformId: string, walletId: string, page: PageInput): Promise<Paged<PolicyAuditEntry> | undefined>;

  /** Runs fn in a transaction holding the wallet's row lock (payments of one wallet are serialised); undefined when not found. */
  withLockedWallet<T>(platformId: string, walletId: string, fn: (tx: Queryable, wallet: LockedWallet) => Promise<T>): Promise<T | undefined>;
  /** Amounts signed for payments since `since`, by network and asset (spendKey). */
  spentSince(tx: Queryable, walletId: string, since: Date): Promise<Map<string, bigint>>;
  recordSignature(tx: Queryable, record: SignatureRecord): Promise<void>;
  setOutcome(walletId: string, signatureId: string, outcome: SignatureOutcome): Promise<void>;
  signatures(platformId: string, walletId: string, page: PageInput): Promise<Paged<SignatureRecord> | undefined>;
  ping(): Promise<void>;
}

async function insertSignature(q: Queryable, s: SignatureRecord): Promise<void> {
  await q.query(
    `INSERT INTO wallet_signatures (id, wallet_id, api_key_id, kind, scheme, network, asset, amount, pay_to, method, resource_url, nonce, valid_before, signature_hash, created_at, outcome)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16::jsonb)`,
    [s.id, s.walletId, s.apiKeyId, s.kind, s.scheme, s.network, s.asset, s.amount, s.payTo, s.method, s.resource, s.nonce, s.validBefore, s.signatureHash, s.createdAt, s.outcome === null ? null : JSON.stringify(s.outcome)],
  );
}

export function createWalletStore(db: Database): WalletStore {
  const apiKeyInfo = (r: { id: string; platform_id: string; label: string | null; created_at: Date | string; revoked_at: Date | string | null }): ApiKeyInfo => ({
    id: r.id,
    platformId: r.platform_id,
    label: r.label,
    createdAt: iso(r.created_at)!,
    revokedAt: iso(r.revoked_at),
  });
  const platformOf = (r: { id: string; name: string; created_at: Date | string }): Platform => ({ id: r.id, name: r.name, createdAt: iso(r.created_at)! });

  const ownedWallet = async (q: Queryable, platformId: string, walletId: string, lock = false) => {
    const [row] = await q.query<WalletRow & KeyRow>(
      `SELECT ${WALLET_COLUMNS}, k.master_key_id, k.wrapped_data_key, k.encrypted_key
       FROM wallets w JOIN wallet_keys k ON k.wallet_id = w.id
       WHERE w.id = $1 AND w.platform_id = $2${lock ? " FOR UPDATE OF w" : ""}`,
      [walletId, platformId],
    );
    return row ? { ...toWallet(row), sealed: toSealed(row) } : undefined;
  };

  const platform = async (platformId: string) => {
    const [row] = await db.query<{ id: string; name: string; created_at: Date }>("SELECT id, name, created_at FROM wallet_platforms WHERE id = $1", [platformId]);
    return row ? platformOf(row) : undefined;
  };
  const wallet = async (platformId: string, walletId: string) => {
    const [row] = await db.query<WalletRow>(`SELECT ${WALLET_COLUMNS} FROM wallets w WHERE w.id = $1 AND w.platform_id = $2`, [walletId, platformId]);
    return row ? toWallet(row) : undefined;
  };

  return {
    async createPlatform(id, name, key) {
      return db.transaction(async (tx) => {
        const [row] = await tx.query<{ id: string; name: string; created_at: Date }>("INSERT INTO wallet_platforms (id, name) VALUES ($1, $2) RETURNING id, name, created_at", [id, name]);
        await tx.query("INSERT INTO wallet_api_keys (id, platform_id, digest, label) VALUES ($1, $2, $3, $4)", [key.id, id, key.digest, key.label ?? null]);
        return platformOf(row!);
      });
    },

    async listPlatforms() {
      return (await db.query<{ id: string; name: string; created_at: Date }>("SELECT id, name, created_at FROM wallet_platforms ORDER BY created_at, id")).map(platformOf);
    },

    platform,

    async addApiKey(platformId, key) {
      const [row] = await db.query<{ id: string; platform_id: string; label: string | null; created_at: Date; revoked_at: null }>(
        `INSERT INTO wallet_api_keys (id, platform_id, digest, label) SELECT $1, p.id, $3, $4 FROM wallet_platforms p WHERE p.id = $2
         RETURNING id, platform_id, label, created_at, revoked_at`,
        [key.id, platformId, key.digest, key.label ?? null],
      );
      return row ? apiKeyInfo(row) : undefined;
    },

    async listApiKeys(platformId) {
      if (!(await platform(platformId))) return undefined;
      const rows = await db.query<{ id: string; platform_id: string; label: string | null; created_at: Date; revoked_at: Date | null }>(
        "SELECT id, platform_id, label, created_at, revoked_at FROM wallet_api_keys WHERE platform_id = $1 ORDER BY created_at, id",
        [platformId],
      );
      return rows.map(apiKeyInfo);
    },

    async revokeApiKey(platformId, keyId, at) {
      const [row] = await db.query<{ id: string; platform_id: string; label: string | null; created_at: Date; revoked_at: Date | null }>(
        `UPDATE wallet_api_keys SET revoked_at = COALESCE(revoked_at, $3) WHERE id = $1 AND platform_id = $2
         RETURNING id, platform_id, label, created_at, revoked_at`,
        [keyId, platformId, at],
      );
      return row ? apiKeyInfo(row) : undefined;
    },

    async apiKey(keyId) {
      const [row] = await db.query<{ id: string; platform_id: string; digest: string; label: string | null; created_at: Date; revoked_at: Date | null }>(
        "SELECT id, platform_id, digest, label, created_at, revoked_at FROM wallet_api_keys WHERE id = $1",
        [keyId],
      );
      return row ? { ...apiKeyInfo(row), digest: row.digest } : undefined;
    },

    async registerMasterKey(id, fingerprint) {
      await db.query("INSERT INTO wallet_master_keys (id, fingerprint) VALUES ($1, $2) ON CONFLICT (id) DO NOTHING", [id, fingerprint]);
      const [row] = await db.query<{ fingerprint: string }>("SELECT fingerprint FROM wallet_master_keys WHERE id = $1", [id]);
      return row!.fingerprint;
    },

    async dataKeyCounts() {
      const rows = await db.query<{ master_key_id: string; n: string | number }>("SELECT master_key_id, count(*) AS n FROM wallet_keys GROUP BY master_key_id ORDER BY master_key_id");
      return Object.fromEntries(rows.map((r) => [r.master_key_id, Number(r.n)]));
    },

    async keysWrappedBy(from, limit) {
      if (from.length === 0) return [];
      const rows = await db.query<KeyRow & { wallet_id: string; address: string }>(
        `SELECT k.wallet_id, w.address, k.master_key_id, k.wrapped_data_key, k.encrypted_key
         FROM wallet_keys k JOIN wallets w ON w.id = k.wallet_id
         WHERE k.master_key_id = ANY($1::text[]) ORDER BY k.wallet_id LIMIT $2`,
        [from, limit],
      );
      return rows.map((r) => ({ walletId: r.wallet_id, address: r.address as Address, sealed: toSealed(r) }));
    },

    async replaceWrappedKey(walletId, fromMasterKeyId, sealed, at) {
      return db.transaction(async (tx) => {
        await assertWrappable(tx, sealed.masterKeyId);
        const rows = await tx.query(
          `UPDATE wallet_keys SET master_key_id = $3, wrapped_data_key = $4, rewrapped_at = $5
           WHERE wallet_id = $1 AND master_key_id = $2 RETURNING 1`,
          [walletId, fromMasterKeyId, sealed.masterKeyId, sealed.wrappedDataKey, at],
        );
        return rows.length > 0;
      });
    },

    async heartbeat(replicaId, primaryKeyId) {
      await db.query(
        `INSERT INTO wallet_replicas (id, primary_key_id, seen_at) VALUES ($1, $2, now())
         ON CONFLICT (id) DO UPDATE SET primary_key_id = EXCLUDED.primary_key_id, seen_at = now()`,
        [replicaId, primaryKeyId],
      );
    },

    async leave(replicaId) {
      await db.query("DELETE FROM wallet_replicas WHERE id = $1", [replicaId]);
    },

    async markRetiring(ids) {
      if (ids.length === 0) return;
      await db.query("UPDATE wallet_master_keys SET retiring_at = now() WHERE id = ANY($1::text[]) AND retiring_at IS NULL", [ids]);
    },

    async tryRetire(masterKeyId, liveWithinMs) {
      return db.transaction(async (tx): Promise<RetireOutcome> => {
        // The row lock waits for every wrap under this key in flight (they hold a share lock) to
        // commit; the counts below are new statements, so they see those wraps.
        const [key] = await tx.query<{ retired_at: Date | null }>("SELECT retired_at FROM wallet_master_keys WHERE id = $1 FOR UPDATE", [masterKeyId]);
        if (!key) return { retired: false, dataKeys: 0, replicas: [] };
        if (key.retired_at !== null) return { retired: true };
        const replicas = await tx.query<{ id: string }>(
          "SELECT id FROM wallet_replicas WHERE primary_key_id = $1 AND seen_at > now() - make_interval(secs => $2::double precision / 1000) ORDER BY id",
          [masterKeyId, liveWithinMs],
        );
        const [count] = await tx.query<{ n: string | number }>("SELECT count(*) AS n FROM wallet_keys WHERE master_key_id = $1", [masterKeyId]);
        const dataKeys = Number(count!.n);
        if (dataKeys > 0 || replicas.length > 0) return { retired: false, dataKeys, replicas: replicas.map((r) => r.id) };
        await tx.query("UPDATE wallet_master_keys SET retired_at = now(), retiring_at = COALESCE(retiring_at, now()) WHERE id = $1", [masterKeyId]);
        return { retired: true };
      });
    },

    async masterKeyStates() {
      const rows = await db.query<{ id: string; retiring_at: Date | string | null; retired_at: Date | string | null }>("SELECT id, retiring_at, retired_at FROM wallet_master_keys ORDER BY id");
      return rows.map((r) => ({ id: r.id, retiringAt: iso(r.retiring_at), retiredAt: iso(r.retired_at) }));
    },

    async createWallet(w) {
      return db.transaction(async (tx) => {
        await assertWrappable(tx, w.sealed.masterKeyId);
        const [row] = await tx.query<WalletRow>(
          `INSERT INTO wallets (id, platform_id, address, label, agent_id, policy, policy_version, created_at, updated_at)
           VALUES ($1, $2, $3, $4, $5, $6::jsonb, 1, $7, $7)
           RETURNING ${WALLET_COLUMNS.replaceAll("w.", "")}`,
          [w.id, w.platformId, w.address, w.label ?? null, w.agentId ?? null, JSON.stringify(w.policy), w.now],
        );
        await tx.query("INSERT INTO wallet_keys (wallet_id, master_key_id, wrapped_data_key, encrypted_key) VALUES ($1, $2, $3, $4)", [
          w.id,
          w.sealed.masterKeyId,
          w.sealed.wrappedDataKey,
          w.sealed.encryptedKey,
        ]);
        await tx.query("INSERT INTO wallet_policy_audit (wallet_id, version, api_key_id, previous, policy, changed_at) VALUES ($1, 1, $2, NULL, $3::jsonb, $4)", [
          w.id,
          w.apiKeyId,
          JSON.stringify(w.policy),
          w.now,
        ]);
        return toWallet(row!);
      });
    },

    wallet,

    walletWithKey: (platformId, walletId) => ownedWallet(db, platformId, walletId),

    async listWallets(platformId, page) {
      const rows = await db.query<WalletRow>(
        `SELECT ${WALLET_COLUMNS} FROM wallets w
         WHERE w.platform_id = $1 AND ($2::bigint IS NULL OR w.seq > $2) AND ($3::text IS NULL OR w.agent_id = $3)
         ORDER BY w.seq LIMIT $4`,
        [platformId, page.cursor?.toString() ?? null, page.agentId ?? null, page.limit + 1],
      );
      const items = rows.slice(0, page.limit);
      return { items: items.map(toWallet), next: rows.length > page.limit ? String(items[items.length - 1]!.seq) : null };
    },

    async setPolicy(platformId, walletId, policy, apiKeyId, now) {
      return db.transaction(async (tx) => {
        const current = await ownedWallet(tx, platformId, walletId, true);
        if (!current) return undefined;
        const version = current.policyVersion + 1;
        const [row] = await tx.query<WalletRow>(
          `UPDATE wallets w SET policy = $2::jsonb, policy_version = $3, updated_at = $4 WHERE w.id = $1 RETURNING ${WALLET_COLUMNS}`,
          [walletId, JSON.stringify(policy), version, now],
        );
        await tx.query("INSERT INTO wallet_policy_audit (wallet_id, version, api_key_id, previous, policy, changed_at) VALUES ($1, $2, $3, $4::jsonb, $5::jsonb, $6)", [
          walletId,
          version,
          apiKeyId,
          JSON.stringify(current.policy),
          JSON.stringify(policy),
          now,
        ]);
        return toWallet(row!);
      });
    },

    async policyHistory(platformId, walletId, page) {
      if (!(await wallet(platformId, walletId))) return undefined;
      const rows = await db.query<{ seq: string | number; version: number; api_key_id: string | null; previous: Policy | string | null; policy: Policy | string; changed_at: Date | string }>(
        `SELECT seq, version, api_key_id, previous, policy, changed_at FROM wallet_policy_audit
         WHERE wallet_id = $1 AND ($2::bigint IS NULL OR seq < $2) ORDER BY seq DESC LIMIT $3`,
        [walletId, page.cursor?.toString() ?? null, page.limit + 1],
      );
      const items = rows.slice(0, page.limit);
      return {
        items: items.map((r) => ({ version: Number(r.version), apiKeyId: r.api_key_id, changedAt: iso(r.changed_at)!, previous: r.previous === null ? null : json(r.previous), policy: json(r.policy) })),
        next: rows.length > page.limit ? String(items[items.length - 1]!.seq) : null,
      };
    },

    async withLockedWallet(platformId, walletId, fn) {
      return db.transaction(async (tx) => {
        const wallet = await ownedWallet(tx, platformId, walletId, true);
        return wallet ? fn(tx, wallet) : undefined;
      });
    },

    async spentSince(tx, walletId, since) {
      const rows = await tx.query<{ network: string; asset: string; total: string }>(
        `SELECT network, asset, SUM(amount)::text AS total FROM wallet_signatures
         WHERE wallet_id = $1 AND kind = 'payment' AND created_at > $2 GROUP BY network, asset`,
        [walletId, since],
      );
      return new Map(rows.map((r) => [spendKey(r.network, r.asset), BigInt(r.total)]));
    },

    recordSignature: (tx, record) => insertSignature(tx, record),

    async setOutcome(walletId, signatureId, outcome) {
      await db.query("UPDATE wallet_signatures SET outcome = $3::jsonb WHERE id = $1 AND wallet_id = $2", [signatureId, walletId, JSON.stringify(outcome)]);
    },

    async signatures(platformId, walletId, page) {
      if (!(await wallet(platformId, walletId))) return undefined;
      const rows = await db.query<SignatureRow>(
        `SELECT id, seq, wallet_id, api_key_id, kind, scheme, network, asset, amount::text AS amount, pay_to, method, resource_url, nonce, valid_before, signature_hash, created_at, outcome
         FROM wallet_signatures WHERE wallet_id = $1 AND ($2::bigint IS NULL OR seq < $2) ORDER BY seq DESC LIMIT $3`,
        [walletId, page.cursor?.toString() ?? null, page.limit + 1],
      );
      const items = rows.slice(0, page.limit);
      return { items: items.map(toSignature), next: rows.length > page.limit ? String(items[items.length - 1]!.seq) : null };
    },

    async ping() {
      await db.query("SELECT 1");
    },
  };
}
