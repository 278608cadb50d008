// The wallet service's store on the project's one storage layer (embedded engine or PostgreSQL, same
// SQL): the schema, and one WalletStore made of four repositories under store/: platforms and their
// hashed API keys, master keys and their retirement, wallets with their policies' audit trail, and
// the signature log (which also feeds the daily caps).
import type { Database, Migration } from "../platform/storage.ts";
import { masterKeyRepository, type MasterKeyRepository } from "./store/master-keys.ts";
import { platformRepository, type PlatformRepository } from "./store/platforms.ts";
import { signatureRepository, type SignatureRepository } from "./store/signatures.ts";
import { walletRepository, type WalletRepository } from "./store/wallets.ts";

export { MasterKeyRetiredError, type MasterKeyState, type RetireOutcome } from "./store/master-keys.ts";
export type { ApiKeyInfo, Platform, StoredApiKey } from "./store/platforms.ts";
export type { Page, Paged } from "./store/rows.ts";
export type { SignatureKind, SignatureOutcome, SignatureRecord } from "./store/signatures.ts";
export type { CreateWalletInput, LockedWallet, PolicyAuditEntry, Wallet } from "./store/wallets.ts";

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

export interface WalletStore extends PlatformRepository, MasterKeyRepository, WalletRepository, SignatureRepository {
  ping(): Promise<void>;
}

export function createWalletStore(db: Database): WalletStore {
  const wallets = walletRepository(db);
  return {
    ...platformRepository(db),
    ...masterKeyRepository(db),
    ...wallets,
    ...signatureRepository(db, wallets.wallet),
    async ping() {
      await db.query("SELECT 1");
    },
  };
}
