// The signature log: every payment and approval a wallet signed, by hash (never a usable
// authorisation at rest), with its outcome once known. Payments in it are the daily caps' spend.
import type { Database, Queryable } from "../../platform/storage.ts";
import { spendKey } from "../policy.ts";
import { iso, json, keysetPage, type Page, type Paged } from "./rows.ts";

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

/** A row as signatures() selects it: the record's names, the engine's types. */
type SignatureRow = Omit<SignatureRecord, "validBefore" | "createdAt" | "outcome"> & {
  seq: string | number;
  validBefore: string | number | null;
  createdAt: Date | string;
  outcome: SignatureOutcome | string | null;
};

const SIGNATURE_COLUMNS = `id, seq, wallet_id AS "walletId", api_key_id AS "apiKeyId", kind, scheme, network, asset, amount::text AS amount, pay_to AS "payTo", method,
  resource_url AS resource, nonce, valid_before AS "validBefore", signature_hash AS "signatureHash", created_at AS "createdAt", outcome`;

const toSignature = ({ seq: _seq, ...r }: SignatureRow): SignatureRecord => ({
  ...r,
  amount: String(r.amount),
  validBefore: r.validBefore === null ? null : Number(r.validBefore),
  createdAt: iso(r.createdAt)!,
  outcome: r.outcome === null ? null : json(r.outcome),
});

export interface SignatureRepository {
  /** Amounts signed for payments since `since`, by network and asset (spendKey). */
  spentSince(tx: Queryable, walletId: string, since: Date): Promise<Map<string, bigint>>;
  recordSignature(tx: Queryable, record: SignatureRecord): Promise<void>;
  setOutcome(walletId: string, signatureId: string, outcome: SignatureOutcome): Promise<void>;
  /** Undefined when the platform has no such wallet. */
  signatures(platformId: string, walletId: string, page: Page): Promise<Paged<SignatureRecord> | undefined>;
}

/** `owns` says whether the platform has the wallet (the wallet repository answers it). */
export function signatureRepository(db: Database, owns: (platformId: string, walletId: string) => Promise<unknown>): SignatureRepository {
  return {
    async spentSince(tx, walletId, since) {
      const rows = await tx.query<{ network: string; asset: string; total: string }>(
        `SELECT network, asset, SUM(amount)::text AS total FROM wallet_signatures
         WHERE wallet_id = $1 AND kind = 'payment' AND created_at > $2 GROUP BY network, asset`,
        [walletId, since],
      );
      return new Map(rows.map((r) => [spendKey(r.network, r.asset), BigInt(r.total)]));
    },

    async recordSignature(tx, s) {
      await tx.query(
        `INSERT INTO wallet_signatures (id, wallet_id, api_key_id, kind, scheme, network, asset, amount, pay_to, method, resource_url, nonce, valid_before, signature_hash, created_at, outcome)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16::jsonb)`,
        [s.id, s.walletId, s.apiKeyId, s.kind, s.scheme, s.network, s.asset, s.amount, s.payTo, s.method, s.resource, s.nonce, s.validBefore, s.signatureHash, s.createdAt, s.outcome === null ? null : JSON.stringify(s.outcome)],
      );
    },

    async setOutcome(walletId, signatureId, outcome) {
      await db.query("UPDATE wallet_signatures SET outcome = $3::jsonb WHERE id = $1 AND wallet_id = $2", [signatureId, walletId, JSON.stringify(outcome)]);
    },

    async signatures(platformId, walletId, page) {
      if (!(await owns(platformId, walletId))) return undefined;
      return keysetPage(db, { columns: SIGNATURE_COLUMNS, from: "wallet_signatures", where: "wallet_id = $1", args: [walletId], newestFirst: true }, page, toSignature);
    },
  };
}
