// Wallets of a platform: the row with its policy, the sealed key beside it, and the policy's audit
// trail (every version with the key that set it). Signing holds the wallet's row lock.
import type { Address } from "viem";
import type { Database, Queryable } from "../../platform/storage.ts";
import type { SealedKey } from "../custody.ts";
import type { Policy } from "../policy.ts";
import { assertWrappable, toSealed, type KeyRow } from "./master-keys.ts";
import { iso, json, keysetPage, type Page, type Paged } from "./rows.ts";

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

/** A wallet row as WALLET_COLUMNS selects it: the wallet's names, the engine's types. */
type WalletRow = Omit<Wallet, "policy" | "createdAt" | "updatedAt"> & { seq: string | number; policy: Policy | string; createdAt: Date | string; updatedAt: Date | string };

interface AuditRow {
  seq: string | number;
  version: number;
  api_key_id: string | null;
  previous: Policy | string | null;
  policy: Policy | string;
  changed_at: Date | string;
}

const WALLET_COLUMNS = `w.id, w.seq, w.platform_id AS "platformId", w.address, w.label, w.agent_id AS "agentId", w.policy, w.policy_version AS "policyVersion",
  w.created_at AS "createdAt", w.updated_at AS "updatedAt"`;

// Picks the wallet's fields: a row may carry its sealed key's columns too.
const toWallet = ({ id, platformId, address, label, agentId, policy, policyVersion, createdAt, updatedAt }: WalletRow): Wallet => ({
  id,
  platformId,
  address,
  label,
  agentId,
  policy: json(policy),
  policyVersion: Number(policyVersion),
  createdAt: iso(createdAt)!,
  updatedAt: iso(updatedAt)!,
});

const toAuditEntry = (r: AuditRow): PolicyAuditEntry => ({ version: Number(r.version), apiKeyId: r.api_key_id, changedAt: iso(r.changed_at)!, previous: r.previous === null ? null : json(r.previous), policy: json(r.policy) });

const audit = (q: Queryable, walletId: string, version: number, apiKeyId: string, previous: Policy | null, policy: Policy, at: Date) =>
  q.query("INSERT INTO wallet_policy_audit (wallet_id, version, api_key_id, previous, policy, changed_at) VALUES ($1, $2, $3, $4::jsonb, $5::jsonb, $6)", [
    walletId,
    version,
    apiKeyId,
    previous === null ? null : JSON.stringify(previous),
    JSON.stringify(policy),
    at,
  ]);

export interface WalletRepository {
  createWallet(input: CreateWalletInput): Promise<Wallet>;
  /** Undefined when the wallet does not exist or belongs to another platform (likewise below). */
  wallet(platformId: string, walletId: string): Promise<Wallet | undefined>;
  /** The wallet and its sealed key (for signing outside a payment: approvals). */
  walletWithKey(platformId: string, walletId: string): Promise<LockedWallet | undefined>;
  listWallets(platformId: string, page: Page): Promise<Paged<Wallet>>;
  setPolicy(platformId: string, walletId: string, policy: Policy, apiKeyId: string, now: Date): Promise<Wallet | undefined>;
  policyHistory(platformId: string, walletId: string, page: Page): Promise<Paged<PolicyAuditEntry> | undefined>;
  /** Runs fn in a transaction holding the wallet's row lock (payments of one wallet are serialised). */
  withLockedWallet<T>(platformId: string, walletId: string, fn: (tx: Queryable, wallet: LockedWallet) => Promise<T>): Promise<T | undefined>;
}

export function walletRepository(db: Database): WalletRepository {
  const withKey = async (q: Queryable, platformId: string, walletId: string, lock = false) => {
    const [row] = await q.query<WalletRow & KeyRow>(
      `SELECT ${WALLET_COLUMNS}, k.master_key_id, k.wrapped_data_key, k.encrypted_key
       FROM wallets w JOIN wallet_keys k ON k.wallet_id = w.id
       WHERE w.id = $1 AND w.platform_id = $2${lock ? " FOR UPDATE OF w" : ""}`,
      [walletId, platformId],
    );
    return row ? { ...toWallet(row), sealed: toSealed(row) } : undefined;
  };

  const wallet = async (platformId: string, walletId: string) => {
    const [row] = await db.query<WalletRow>(`SELECT ${WALLET_COLUMNS} FROM wallets w WHERE w.id = $1 AND w.platform_id = $2`, [walletId, platformId]);
    return row ? toWallet(row) : undefined;
  };

  return {
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
        await audit(tx, w.id, 1, w.apiKeyId, null, w.policy, w.now);
        return toWallet(row!);
      });
    },

    wallet,

    walletWithKey: (platformId, walletId) => withKey(db, platformId, walletId),

    listWallets: (platformId, page) =>
      keysetPage(db, { columns: WALLET_COLUMNS, from: "wallets w", where: "w.platform_id = $1 AND ($2::text IS NULL OR w.agent_id = $2)", args: [platformId, page.agentId ?? null], newestFirst: false }, page, toWallet),

    async setPolicy(platformId, walletId, policy, apiKeyId, now) {
      return db.transaction(async (tx) => {
        const current = await withKey(tx, platformId, walletId, true);
        if (!current) return undefined;
        const version = current.policyVersion + 1;
        const [row] = await tx.query<WalletRow>(
          `UPDATE wallets w SET policy = $2::jsonb, policy_version = $3, updated_at = $4 WHERE w.id = $1 RETURNING ${WALLET_COLUMNS}`,
          [walletId, JSON.stringify(policy), version, now],
        );
        await audit(tx, walletId, version, apiKeyId, current.policy, policy, now);
        return toWallet(row!);
      });
    },

    async policyHistory(platformId, walletId, page) {
      if (!(await wallet(platformId, walletId))) return undefined;
      const columns = "seq, version, api_key_id, previous, policy, changed_at";
      return keysetPage(db, { columns, from: "wallet_policy_audit", where: "wallet_id = $1", args: [walletId], newestFirst: true }, page, toAuditEntry);
    },

    async withLockedWallet(platformId, walletId, fn) {
      return db.transaction(async (tx) => {
        const wallet = await withKey(tx, platformId, walletId, true);
        return wallet ? fn(tx, wallet) : undefined;
      });
    },
  };
}
