// Master key rotation without downtime:
//   1. put the new key first in the master key file (the Secret), keep the old ones below it;
//   2. every replica reloads the file (polled), wraps new data keys under the new primary (phase 1
//      of the old key's retirement: this replica stops wrapping under it), still reads the old
//      ones, reports its primary in the database (heartbeat), and re-wraps existing data keys in
//      the background (or on POST /v1/admin/master-keys/rotate); each re-wrap is one conditional
//      UPDATE, so replicas racing on the same wallet are harmless;
//   3. phase 2: an old key is retired, in one transaction, once no data key is under it and no live
//      replica still wraps under it; from then on the database refuses any wrap under it, so a
//      replica that has not seen the new file cannot create a wallet that the next step would
//      strand. A replica that has not finished retiring retries on every heartbeat;
//   4. when GET /v1/admin/master-keys lists the old key under `retired`, remove it from the file.
// Private keys and their ciphertexts never change; only the wrapped data keys do.
import type { Logger } from "../platform/logger.ts";
import type { Metrics } from "../platform/metrics.ts";
import { CustodyError, rewrapSealedKey } from "./custody.ts";
import { KeyringError, type Keyring, type KeyringSource } from "./keyring.ts";
import type { WalletStore } from "./store.ts";

const BATCH = 200;

export interface RotationResult {
  primary: string;
  rewrapped: number;
  failed: number;
  /** Loaded non-primary keys now retired (safe to remove from the file). */
  retired: string[];
  /** Loaded non-primary keys not retired yet, and why. */
  pending: Record<string, { dataKeys: number; replicas: string[] }>;
}

export interface MasterKeyStatus {
  primary: string;
  /** Ids of the keys in the master key file, primary first. */
  loaded: string[];
  /** Data keys per master key id, for every id in the database. */
  dataKeys: Record<string, number>;
  /** Data keys under a master key that is not loaded (those wallets cannot sign). */
  unreadable: number;
  /** Keys no replica wraps under any more and no data key uses: safe to remove from the file. */
  retired: string[];
  /** Keys some replica has replaced by a newer primary, not retired yet. */
  retiring: string[];
}

export interface Rotator {
  /** Re-wraps every data key under a loaded non-primary key with the primary; runs are serialised. */
  rewrapAll(): Promise<RotationResult>;
  status(): Promise<MasterKeyStatus>;
  /** Resolves when no run is under way. */
  idle(): Promise<void>;
}

/** Refuses a keyring whose key differs from the one that wrapped data keys under the same id. */
export async function checkFingerprints(store: WalletStore, keyring: Keyring): Promise<void> {
  for (const key of keyring.keys.values()) {
    const recorded = await store.registerMasterKey(key.id, key.fingerprint);
    if (recorded !== key.fingerprint) {
      throw new KeyringError(`master key ${key.id} is not the key this database knows under that id (fingerprint mismatch): wrong master key file?`);
    }
  }
}

export function createRotator(opts: {
  store: WalletStore;
  keyring: KeyringSource;
  logger: Logger;
  metrics?: Metrics;
  now: () => number;
  /** This replica's id in wallet_replicas. */
  replicaId: string;
  /** A replica whose heartbeat is older than this no longer holds a key back from retirement. */
  replicaLivenessMs: number;
}): Rotator {
  const { store, keyring, logger } = opts;
  let tail: Promise<unknown> = Promise.resolve();
  let gaugeFresh = false;

  const refreshGauge = async () => {
    if (!opts.metrics) return;
    const counts = await store.dataKeyCounts();
    opts.metrics.walletDataKeys.reset();
    for (const [id, n] of Object.entries(counts)) opts.metrics.walletDataKeys.set({ master_key: keyring.current().keys.has(id) ? id : "unloaded" }, n);
  };

  const run = async (): Promise<RotationResult> => {
    const ring = keyring.current();
    const primary = ring.primary;
    const from = [...ring.keys.keys()].filter((id) => id !== primary.id);
    // Report the key this replica wraps under before judging whether an old one can retire.
    await store.heartbeat(opts.replicaId, primary.id);
    let rewrapped = 0;
    let failed = 0;
    const skip = new Set<string>();
    for (;;) {
      const batch = (await store.keysWrappedBy(from, BATCH + skip.size)).filter((k) => !skip.has(k.walletId));
      if (batch.length === 0) break;
      for (const k of batch) {
        const old = ring.keys.get(k.sealed.masterKeyId);
        try {
          if (!old) throw new CustodyError(`master key ${k.sealed.masterKeyId} is not loaded`);
          const sealed = rewrapSealedKey(k.walletId, k.sealed, old, primary);
          if (await store.replaceWrappedKey(k.walletId, old.id, sealed, new Date(opts.now()))) rewrapped++;
        } catch (e) {
          failed++;
          skip.add(k.walletId);
          logger.error({ wallet: k.walletId, masterKey: k.sealed.masterKeyId, reason: (e as Error).message }, "wallets: data key not re-wrapped");
        }
      }
    }
    if (rewrapped || failed) logger.info({ primary: primary.id, rewrapped, failed }, "wallets: data keys re-wrapped under the primary master key");
    await store.markRetiring(from);
    const retired: string[] = [];
    const pending: RotationResult["pending"] = {};
    for (const id of from) {
      const outcome = await store.tryRetire(id, opts.replicaLivenessMs);
      if (outcome.retired) retired.push(id);
      else pending[id] = { dataKeys: outcome.dataKeys, replicas: outcome.replicas };
    }
    if (retired.length) logger.info({ retired }, "wallets: master keys retired (no data key under them, no replica wraps under them): they can leave the file");
    if (!gaugeFresh || rewrapped || failed) await refreshGauge().then(() => (gaugeFresh = true)).catch(() => undefined);
    return { primary: primary.id, rewrapped, failed, retired, pending };
  };

  return {
    rewrapAll() {
      // Runs queue up: a rotation requested during a run still sees the newest keyring.
      const next = tail.then(run, run);
      tail = next.catch(() => undefined);
      return next;
    },
    idle: () => tail.then(() => undefined),
    async status() {
      const ring = keyring.current();
      const dataKeys = await store.dataKeyCounts();
      const unreadable = Object.entries(dataKeys)
        .filter(([id]) => !ring.keys.has(id))
        .reduce((n, [, c]) => n + c, 0);
      const states = await store.masterKeyStates();
      return {
        primary: ring.primary.id,
        loaded: [...ring.keys.keys()],
        dataKeys,
        unreadable,
        retired: states.filter((k) => k.retiredAt).map((k) => k.id),
        retiring: states.filter((k) => k.retiringAt && !k.retiredAt).map((k) => k.id),
      };
    },
  };
}
