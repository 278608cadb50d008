// Master keys as the database knows them: their fingerprints, the data keys wrapped under each, the
// replicas and the key each wraps under, and two-phase retirement (see the 002 migration in store.ts).
import type { Address } from "viem";
import type { Database, Queryable } from "../../platform/storage.ts";
import type { SealedKey } from "../custody.ts";
import { iso } from "./rows.ts";

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

export interface KeyRow {
  master_key_id: string;
  wrapped_data_key: Uint8Array;
  encrypted_key: Uint8Array;
}

type MasterKeyRow = { id: string; retiring_at: Date | string | null; retired_at: Date | string | null };

export const toSealed = (r: KeyRow): SealedKey => ({ masterKeyId: r.master_key_id, wrappedDataKey: r.wrapped_data_key, encryptedKey: r.encrypted_key });

/** Takes a share lock on the master key's row and refuses a retired key (wraps and retirement serialise on it). */
export async function assertWrappable(tx: Queryable, masterKeyId: string): Promise<void> {
  const [row] = await tx.query<Pick<MasterKeyRow, "retired_at">>("SELECT retired_at FROM wallet_master_keys WHERE id = $1 FOR SHARE", [masterKeyId]);
  if (!row || row.retired_at !== null) throw new MasterKeyRetiredError(masterKeyId);
}

export interface MasterKeyRepository {
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
}

export function masterKeyRepository(db: Database): MasterKeyRepository {
  return {
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
        const [key] = await tx.query<Pick<MasterKeyRow, "retired_at">>("SELECT retired_at FROM wallet_master_keys WHERE id = $1 FOR UPDATE", [masterKeyId]);
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
      const rows = await db.query<MasterKeyRow>("SELECT id, retiring_at, retired_at FROM wallet_master_keys ORDER BY id");
      return rows.map((r) => ({ id: r.id, retiringAt: iso(r.retiring_at), retiredAt: iso(r.retired_at) }));
    },
  };
}
