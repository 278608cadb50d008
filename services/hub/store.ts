// The hub's SQL repository on the project's one storage layer (embedded engine or PostgreSQL, same
// SQL): keys per owner with their recent versions, conversations, the single-use write nonces, and
// each owner's usage (bytes and keys) against its quota.
import type { Database, Migration, Queryable } from "../platform/storage.ts";

export const HUB_MIGRATIONS: Migration[] = [
  {
    id: "hub/001_store",
    sql: `
CREATE TABLE hub_keys (
  owner text NOT NULL,
  id text NOT NULL,
  seq bigint GENERATED ALWAYS AS IDENTITY,
  bucket text NOT NULL,
  kind text NOT NULL,
  latest_version integer NOT NULL,
  conversation_id text,
  created_at timestamptz NOT NULL DEFAULT now(),
  updated_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (owner, id)
);
CREATE INDEX hub_keys_conversation ON hub_keys (owner, conversation_id, seq) WHERE conversation_id IS NOT NULL;
CREATE TABLE hub_versions (
  owner text NOT NULL,
  id text NOT NULL,
  version integer NOT NULL,
  bucket text NOT NULL,
  kind text NOT NULL,
  message bytea NOT NULL,
  message_hash text NOT NULL,
  nonce text NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (owner, id, version)
);
CREATE TABLE hub_conversations (
  owner text NOT NULL,
  conversation_id text NOT NULL,
  seq bigint GENERATED ALWAYS AS IDENTITY,
  bucket text NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (owner, conversation_id)
);
CREATE INDEX hub_conversations_newest ON hub_conversations (owner, seq);
CREATE TABLE hub_nonces (
  owner text NOT NULL,
  nonce text NOT NULL,
  expires_at bigint NOT NULL,
  PRIMARY KEY (owner, nonce)
);
CREATE INDEX hub_nonces_expiry ON hub_nonces (expires_at)`,
  },
  {
    // Usage per owner, kept in the write's transaction; the row is also the lock that serialises
    // one owner's writes, so the quota holds under concurrency and across replicas.
    id: "hub/002_usage",
    sql: `
CREATE TABLE hub_usage (
  owner text PRIMARY KEY,
  bytes bigint NOT NULL DEFAULT 0,
  keys bigint NOT NULL DEFAULT 0
);
INSERT INTO hub_usage (owner, bytes, keys)
SELECT owner, sum(bytes), sum(keys) FROM (
  SELECT owner, octet_length(message)::bigint AS bytes, 0::bigint AS keys FROM hub_versions
  UNION ALL
  SELECT owner, 0::bigint, 1::bigint FROM hub_keys
) u GROUP BY owner`,
  },
];

/** What one owner may keep, and how many versions of a key; 0 means no limit. */
export interface StoreLimits {
  /** Bytes of stored messages (every kept version counts). */
  maxBytesPerOwner: number;
  /** Distinct keys (ids). */
  maxKeysPerOwner: number;
  /** Versions kept per key: older ones are deleted by the write that goes past it; the latest is always kept. */
  maxVersionsPerKey: number;
}

export const DEFAULT_STORE_LIMITS: StoreLimits = { maxBytesPerOwner: 100 * 1024 * 1024, maxKeysPerOwner: 100_000, maxVersionsPerKey: 100 };

export interface WriteInput {
  owner: string;
  bucket: string;
  id: string;
  kind: string;
  message: Uint8Array;
  messageHash: string;
  nonce: string;
  /** Unix seconds: the nonce row may be swept some time after this. */
  expiry: bigint;
  /** Set for conversation records `<conversationId>_<n>`. */
  conversationId?: string;
  /** True for `<conversationId>_0`: the write that makes the conversation exist. */
  startsConversation?: boolean;
}

export interface VersionInfo {
  version: number;
  bucket: string;
  kind: string;
  messageHash: string;
  createdAt: string;
}

export interface StoredValue extends VersionInfo {
  message: Uint8Array;
}

/** The write would take the owner past its quota; nothing was stored and the nonce is not used. */
export class QuotaExceededError extends Error {
  constructor(
    readonly limit: "bytes" | "keys",
    readonly max: number,
    readonly wouldUse: number,
  ) {
    super(`quota exceeded (${limit})`);
  }
}

/** The nonce of a write was already used by this owner. */
export class NonceReusedError extends Error {
  constructor() {
    super("nonce already used");
  }
}

export interface HubStore {
  /**
   * Stores a new version of (owner, id), consuming the nonce, pruning versions past the limit and
   * accounting the owner's usage in the same transaction; QuotaExceededError rolls it all back.
   */
  write(input: WriteInput): Promise<VersionInfo>;
  /** What the owner stores: message bytes of every kept version, and distinct keys. */
  usage(owner: string): Promise<{ bytes: number; keys: number }>;
  /** The latest version, or the given one. */
  read(owner: string, id: string, version?: number): Promise<StoredValue | undefined>;
  /** Versions in order (oldest first), paged; undefined when the key does not exist. */
  history(owner: string, id: string, offset: number, length: number): Promise<{ latest: number; versions: StoredValue[] } | undefined>;
  /** Conversation ids of an owner, newest first. */
  listConversations(owner: string, bucket: string | undefined, offset: number, length: number): Promise<string[]>;
  /** Latest messages of `<conversationId>_<n>` records in write order; empty when the conversation does not exist. */
  getConversation(owner: string, conversationId: string, bucket: string | undefined, offset: number, length: number): Promise<Uint8Array[]>;
  /** Deletes nonces whose expiry is before `beforeSeconds` (they can no longer be replayed: expired writes are refused). */
  sweepNonces(beforeSeconds: number): Promise<void>;
  ping(): Promise<void>;
}

interface VersionRow {
  version: number;
  bucket: string;
  kind: string;
  message_hash: string;
  created_at: Date | string;
  message?: Uint8Array;
}

const iso = (t: Date | string) => (t instanceof Date ? t.toISOString() : new Date(t).toISOString());

function toVersion(row: VersionRow): VersionInfo {
  return { version: Number(row.version), bucket: row.bucket, kind: row.kind, messageHash: row.message_hash, createdAt: iso(row.created_at) };
}

function toStored(row: VersionRow): StoredValue {
  return { ...toVersion(row), message: row.message ?? new Uint8Array() };
}

async function writeIn(tx: Queryable, w: WriteInput, limits: StoreLimits): Promise<VersionInfo> {
  const fresh = await tx.query("INSERT INTO hub_nonces (owner, nonce, expires_at) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING RETURNING 1", [w.owner, w.nonce, w.expiry.toString()]);
  if (fresh.length === 0) throw new NonceReusedError();
  // Locks the owner's usage row first (every writer of the owner in the same order: no deadlock).
  const [usage] = await tx.query<{ bytes: string | number; keys: string | number }>(
    "INSERT INTO hub_usage (owner) VALUES ($1) ON CONFLICT (owner) DO UPDATE SET owner = EXCLUDED.owner RETURNING bytes, keys",
    [w.owner],
  );
  // The upsert takes the key's row lock: concurrent writers of one key get consecutive versions.
  const [key] = await tx.query<{ latest_version: number }>(
    `INSERT INTO hub_keys (owner, id, bucket, kind, latest_version, conversation_id) VALUES ($1, $2, $3, $4, 1, $5)
     ON CONFLICT (owner, id) DO UPDATE SET latest_version = hub_keys.latest_version + 1, bucket = EXCLUDED.bucket, kind = EXCLUDED.kind, updated_at = now()
     RETURNING latest_version`,
    [w.owner, w.id, w.bucket, w.kind, w.conversationId ?? null],
  );
  const [row] = await tx.query<VersionRow>(
    `INSERT INTO hub_versions (owner, id, version, bucket, kind, message, message_hash, nonce) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
     RETURNING version, bucket, kind, message_hash, created_at`,
    [w.owner, w.id, key!.latest_version, w.bucket, w.kind, w.message, w.messageHash, w.nonce],
  );
  const latest = Number(key!.latest_version);
  let pruned = 0;
  if (limits.maxVersionsPerKey > 0 && latest > limits.maxVersionsPerKey) {
    // Only versions at or below latest - N: the one just written is never among them.
    const gone = await tx.query<{ size: string | number }>("DELETE FROM hub_versions WHERE owner = $1 AND id = $2 AND version <= $3 RETURNING octet_length(message) AS size", [
      w.owner,
      w.id,
      latest - limits.maxVersionsPerKey,
    ]);
    pruned = gone.reduce((n, r) => n + Number(r.size), 0);
  }
  const bytes = Number(usage!.bytes) + w.message.byteLength - pruned;
  const keys = Number(usage!.keys) + (latest === 1 ? 1 : 0);
  if (limits.maxBytesPerOwner > 0 && bytes > limits.maxBytesPerOwner) throw new QuotaExceededError("bytes", limits.maxBytesPerOwner, bytes);
  if (limits.maxKeysPerOwner > 0 && keys > limits.maxKeysPerOwner) throw new QuotaExceededError("keys", limits.maxKeysPerOwner, keys);
  await tx.query("UPDATE hub_usage SET bytes = $2, keys = $3 WHERE owner = $1", [w.owner, bytes, keys]);
  if (w.startsConversation && w.conversationId !== undefined) {
    await tx.query(
      `INSERT INTO hub_conversations (owner, conversation_id, bucket) VALUES ($1, $2, $3)
       ON CONFLICT (owner, conversation_id) DO UPDATE SET bucket = EXCLUDED.bucket`,
      [w.owner, w.conversationId, w.bucket],
    );
  }
  return toVersion(row!);
}

export function createHubStore(db: Database, limits: StoreLimits = DEFAULT_STORE_LIMITS): HubStore {
  return {
    write: (input) => db.transaction((tx) => writeIn(tx, input, limits)),

    async usage(owner) {
      const [row] = await db.query<{ bytes: string | number; keys: string | number }>("SELECT bytes, keys FROM hub_usage WHERE owner = $1", [owner]);
      return { bytes: Number(row?.bytes ?? 0), keys: Number(row?.keys ?? 0) };
    },

    async read(owner, id, version) {
      const rows =
        version === undefined
          ? await db.query<VersionRow>(
              `SELECT v.version, v.bucket, v.kind, v.message_hash, v.created_at, v.message
               FROM hub_keys k JOIN hub_versions v ON v.owner = k.owner AND v.id = k.id AND v.version = k.latest_version
               WHERE k.owner = $1 AND k.id = $2`,
              [owner, id],
            )
          : await db.query<VersionRow>(
              "SELECT version, bucket, kind, message_hash, created_at, message FROM hub_versions WHERE owner = $1 AND id = $2 AND version = $3",
              [owner, id, version],
            );
      return rows[0] ? toStored(rows[0]) : undefined;
    },

    async history(owner, id, offset, length) {
      const [key] = await db.query<{ latest_version: number }>("SELECT latest_version FROM hub_keys WHERE owner = $1 AND id = $2", [owner, id]);
      if (!key) return undefined;
      const rows = await db.query<VersionRow>(
        `SELECT version, bucket, kind, message_hash, created_at, message FROM hub_versions
         WHERE owner = $1 AND id = $2 ORDER BY version OFFSET $3 LIMIT $4`,
        [owner, id, offset, length],
      );
      return { latest: Number(key.latest_version), versions: rows.map(toStored) };
    },

    async listConversations(owner, bucket, offset, length) {
      const rows = await db.query<{ conversation_id: string }>(
        `SELECT conversation_id FROM hub_conversations
         WHERE owner = $1 AND ($2::text IS NULL OR bucket = $2)
         ORDER BY seq DESC OFFSET $3 LIMIT $4`,
        [owner, bucket ?? null, offset, length],
      );
      return rows.map((r) => r.conversation_id);
    },

    async getConversation(owner, conversationId, bucket, offset, length) {
      // Exact equality on the parsed conversation id: no LIKE, so `_` and `%` are plain characters.
      const rows = await db.query<{ message: Uint8Array }>(
        `SELECT v.message
         FROM hub_keys k JOIN hub_versions v ON v.owner = k.owner AND v.id = k.id AND v.version = k.latest_version
         WHERE k.owner = $1 AND k.conversation_id = $2 AND ($3::text IS NULL OR k.bucket = $3)
           AND EXISTS (SELECT 1 FROM hub_conversations c WHERE c.owner = $1 AND c.conversation_id = $2)
         ORDER BY k.seq OFFSET $4 LIMIT $5`,
        [owner, conversationId, bucket ?? null, offset, length],
      );
      return rows.map((r) => r.message);
    },

    async sweepNonces(beforeSeconds) {
      await db.query("DELETE FROM hub_nonces WHERE expires_at < $1", [Math.floor(beforeSeconds)]);
    },

    async ping() {
      await db.query("SELECT 1");
    },
  };
}
