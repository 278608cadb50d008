// The settlement store: payments (one row per payment id, the exactly-once anchor), per-key nonce
// counters, and the outbox of signed transactions. Every query is plain PostgreSQL and runs the
// same on the embedded engine and on a server shared by several facilitator processes.
//
// A payment row is `claimed → sent → succeeded | failed`:
// - claimed: one request holds it (owner, lease) and may run the mechanism; nothing decisive is stored.
// - sent: set by the database when its first decisive transaction is inserted (a trigger, so in the
//   very SQL transaction of allocateAndStore, whatever version wrote it); from then on it is never
//   executed again, only its transactions are driven to a receipt.
// - succeeded | failed: final, with the answer every caller gets (a CHECK: a final state always has
//   its answer, and only a final state has one). A pending answer is built on read, never stored.
//   Only a reorg that takes its transaction off the chain puts it back to sent (reorged).
import type { SettleResponse } from "@x402/core/types";
import { coalesce } from "../../platform/coalesce.ts";
import type { Database, Migration } from "../../platform/storage.ts";
import { minedAnswer, rejectedAnswer } from "./answers.ts";
import { AUXILIARY_KINDS } from "./gas-policy.ts";

/** SQL: an outbox row (alias o) that can decide its payment's outcome (not a funding or a deployment). */
const DECISIVE = `COALESCE(o.kind, '') NOT IN (${AUXILIARY_KINDS.map((k) => `'${k}'`).join(", ")})`;

/**
 * SQL: the trigger function of migration 013, one event per state change of a payment with a
 * webhook target (submitted, confirmed, failed, reorged), with its deliveries. Written on one line
 * per statement group: migrations are split at a semicolon that ends a line.
 */
const EVENT_FUNCTION = `CREATE FUNCTION settlement_payment_event() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  kind text;
  seq integer;
  tx text;
  ev bigint;
  eid text := gen_random_uuid()::text;
BEGIN
  IF NEW.webhook_url IS NULL AND NOT NEW.webhook_facilitator THEN RETURN NULL; END IF;
  kind := CASE NEW.state WHEN 'succeeded' THEN 'confirmed' WHEN 'failed' THEN 'failed'
    WHEN 'sent' THEN CASE WHEN OLD.state = 'claimed' THEN 'submitted' ELSE 'reorged' END END;
  IF kind IS NULL THEN RETURN NULL; END IF;
  SELECT COALESCE(max(sequence), 0) + 1 INTO seq FROM settlement_events WHERE network = NEW.network AND payment_id = NEW.payment_id;
  SELECT o.hash INTO tx FROM settlement_outbox o WHERE o.network = NEW.network AND o.payment_id = NEW.payment_id AND ${DECISIVE} ORDER BY o.id DESC LIMIT 1;
  IF kind IN ('confirmed', 'failed') THEN tx := COALESCE(NULLIF(NEW.response->>'transaction', ''), tx); END IF;
  INSERT INTO settlement_events (event_id, network, payment_id, sequence, type, tenant, body)
    VALUES (eid, NEW.network, NEW.payment_id, seq, kind, NEW.tenant, jsonb_strip_nulls(jsonb_build_object(
      'id', eid, 'type', kind, 'sequence', seq,
      'status', CASE kind WHEN 'confirmed' THEN 'settled' WHEN 'failed' THEN 'failed' ELSE 'pending' END,
      'network', NEW.network, 'paymentId', NEW.payment_id, 'scheme', NEW.scheme, 'payer', NEW.payer, 'payTo', NEW.pay_to, 'token', NEW.token,
      'amount', COALESCE(CASE WHEN kind = 'confirmed' THEN NEW.response->>'amount' END, NEW.amount::text), 'transaction', tx,
      'errorReason', CASE WHEN kind = 'failed' THEN NEW.response->>'errorReason' END,
      'errorMessage', CASE WHEN kind = 'failed' THEN NEW.response->>'errorMessage' END,
      'tenant', NEW.tenant, 'occurredAt', to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'))))
    RETURNING id INTO ev;
  INSERT INTO settlement_webhook_deliveries (event, target, network, payment_id, sequence)
    SELECT ev, t, NEW.network, NEW.payment_id, seq FROM unnest(ARRAY[CASE WHEN NEW.webhook_facilitator THEN 'facilitator' END, CASE WHEN NEW.webhook_url IS NOT NULL THEN 'tenant' END]) AS t WHERE t IS NOT NULL;
  RETURN NULL;
END $$`.replace(/;\s*\n\s*/g, "; ");

/**
 * SQL: migration 016's trigger function, 013's with two changes. A payment's sequence is kept on its
 * row (`webhook_sequence`), so pruning its old events never restarts it at 1. A delivery behind an
 * earlier pending one of its payment and receiver is written blocked (`next_attempt_at` infinity)
 * and released by the worker when that one ends (webhooks.ts): blocked rows are never "due", and a
 * claim reads only the due index's front, however many are blocked.
 */
const EVENT_FUNCTION_016 = EVENT_FUNCTION.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION")
  .replace(
    "SELECT COALESCE(max(sequence), 0) + 1 INTO seq FROM settlement_events WHERE network = NEW.network AND payment_id = NEW.payment_id; ",
    "SELECT GREATEST(COALESCE(max(sequence), 0), NEW.webhook_sequence) + 1 INTO seq FROM settlement_events WHERE network = NEW.network AND payment_id = NEW.payment_id; " +
      "UPDATE settlement_payments SET webhook_sequence = seq WHERE network = NEW.network AND payment_id = NEW.payment_id AND digest = NEW.digest; ",
  )
  .replace(
    /INSERT INTO settlement_webhook_deliveries \(event, target, network, payment_id, sequence\)\s+SELECT ev, t, NEW\.network, NEW\.payment_id, seq FROM unnest\(/,
    "INSERT INTO settlement_webhook_deliveries (event, target, network, payment_id, sequence, next_attempt_at) SELECT ev, r.t, NEW.network, NEW.payment_id, seq, " +
      "CASE WHEN EXISTS (SELECT 1 FROM settlement_webhook_deliveries b WHERE b.network = NEW.network AND b.payment_id = NEW.payment_id AND b.target = r.t AND b.state = 'pending') THEN 'infinity'::timestamptz ELSE now() END FROM unnest(",
  )
  .replace("AS t WHERE t IS NOT NULL; ", "AS r(t) WHERE r.t IS NOT NULL; ");
if (EVENT_FUNCTION_016 === EVENT_FUNCTION || !EVENT_FUNCTION_016.includes("webhook_sequence = seq") || !EVENT_FUNCTION_016.includes("'infinity'") || !EVENT_FUNCTION_016.includes("AS r(t)")) {
  throw new Error("settlement/016: the trigger function of 013 changed; update its rewrite");
}

export const SETTLEMENT_MIGRATIONS: Migration[] = [
  {
    id: "settlement/001_outbox",
    sql: `
CREATE TABLE settlement_payments (
  network text NOT NULL,
  payment_id text NOT NULL,
  scheme text NOT NULL,
  payer text,
  state text NOT NULL CHECK (state IN ('claimed', 'pending', 'succeeded', 'failed')),
  owner text,
  lease_until timestamptz,
  response jsonb,
  success_extra jsonb NOT NULL DEFAULT '{}',
  created_at timestamptz NOT NULL DEFAULT now(),
  updated_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (network, payment_id)
);
CREATE TABLE settlement_nonces (
  network text NOT NULL,
  signer text NOT NULL,
  next_nonce bigint NOT NULL,
  PRIMARY KEY (network, signer)
);
CREATE TABLE settlement_outbox (
  id bigserial PRIMARY KEY,
  network text NOT NULL,
  payment_id text NOT NULL,
  signer text NOT NULL,
  nonce bigint NOT NULL,
  to_address text NOT NULL,
  data text NOT NULL,
  gas numeric(78,0) NOT NULL,
  max_fee_per_gas numeric(78,0) NOT NULL,
  max_priority_fee_per_gas numeric(78,0) NOT NULL,
  raw_tx text NOT NULL,
  hash text NOT NULL,
  hashes text[] NOT NULL,
  state text NOT NULL CHECK (state IN ('signed', 'broadcast', 'confirmed', 'reverted', 'dropped')),
  attempts integer NOT NULL DEFAULT 0,
  mined_hash text,
  last_error text,
  created_at timestamptz NOT NULL DEFAULT now(),
  updated_at timestamptz NOT NULL DEFAULT now(),
  UNIQUE (network, signer, nonce)
);
CREATE INDEX settlement_outbox_payment ON settlement_outbox (network, payment_id);
CREATE INDEX settlement_outbox_open ON settlement_outbox (network, state) WHERE state IN ('signed', 'broadcast')`,
  },
  {
    // The digest binds a payment id to the one payment that claimed it; asset and reserved hold what
    // an in-flight payment takes from its payer (rows from before have no digest: never matched).
    id: "settlement/002_payment_digest",
    sql: `
ALTER TABLE settlement_payments ADD COLUMN digest text;
ALTER TABLE settlement_payments ADD COLUMN asset text;
ALTER TABLE settlement_payments ADD COLUMN reserved numeric(78,0);
CREATE INDEX settlement_payments_in_flight ON settlement_payments (network, asset, payer) WHERE reserved IS NOT NULL AND state IN ('claimed', 'pending')`,
  },
  {
    // Signer trust: the raw bytes of every attempt (a reorg re-sends the one that was mined), the
    // kind of transaction, why a broadcast was rejected, where a receipt was mined (watched until
    // deep enough), the decoded revert; and a nonce may be held again once its row is dropped.
    id: "settlement/003_signer_trust",
    sql: `
ALTER TABLE settlement_outbox ADD COLUMN raw_txs text[];
UPDATE settlement_outbox SET raw_txs = ARRAY[raw_tx];
ALTER TABLE settlement_outbox ADD COLUMN kind text;
ALTER TABLE settlement_outbox ADD COLUMN reject_reason text;
ALTER TABLE settlement_outbox ADD COLUMN mined_block_number bigint;
ALTER TABLE settlement_outbox ADD COLUMN mined_block_hash text;
ALTER TABLE settlement_outbox ADD COLUMN watched boolean NOT NULL DEFAULT false;
ALTER TABLE settlement_outbox ADD COLUMN revert_reason text;
ALTER TABLE settlement_outbox ADD COLUMN revert_message text;
ALTER TABLE settlement_outbox ADD COLUMN reorged_at timestamptz;
ALTER TABLE settlement_outbox DROP CONSTRAINT settlement_outbox_network_signer_nonce_key;
CREATE UNIQUE INDEX settlement_outbox_live_nonce ON settlement_outbox (network, signer, nonce) WHERE state <> 'dropped';
CREATE INDEX settlement_outbox_watched ON settlement_outbox (network) WHERE watched`,
  },
  {
    // Whose balance a reservation draws on: the payer of the identity is not always it (a
    // batch-settlement deposit has no identity payer but takes the channel payer's tokens).
    id: "settlement/004_reserved_payer",
    sql: `
ALTER TABLE settlement_payments ADD COLUMN reserved_payer text;
DROP INDEX settlement_payments_in_flight;
CREATE INDEX settlement_payments_in_flight ON settlement_payments (network, asset, reserved_payer) WHERE reserved IS NOT NULL AND state IN ('claimed', 'pending')`,
  },
  {
    // The payment-identifier extension: a client's idempotency id, bound at /settle to the payment
    // (its identity and digest) it first came with; the same id on another payment is a conflict.
    id: "settlement/005_payment_identifiers",
    sql: `
CREATE TABLE settlement_payment_identifiers (
  network text NOT NULL,
  identifier text NOT NULL,
  payment_id text NOT NULL,
  digest text NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (network, identifier)
)`,
  },
  {
    // The erc20ApprovalGasSponsoring extension: a transaction may carry native value (the gas a
    // payer is funded with for its approval), and every funding is recorded with the approval it
    // paid for, so a payer who spent it on something else is never funded again and a network's
    // fundings per day stay under their bound.
    id: "settlement/006_gas_fundings",
    sql: `
ALTER TABLE settlement_outbox ADD COLUMN value numeric(78,0) NOT NULL DEFAULT 0;
CREATE TABLE settlement_gas_fundings (
  network text NOT NULL,
  approval_hash text NOT NULL,
  payer text NOT NULL,
  payment_id text NOT NULL,
  funded_wei numeric(78,0) NOT NULL,
  day date NOT NULL DEFAULT (now() AT TIME ZONE 'UTC')::date,
  state text NOT NULL CHECK (state IN ('funded', 'approved', 'abused')),
  created_at timestamptz NOT NULL DEFAULT now(),
  updated_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (network, approval_hash)
);
CREATE INDEX settlement_gas_fundings_payer ON settlement_gas_fundings (network, payer);
CREATE INDEX settlement_gas_fundings_day ON settlement_gas_fundings (network, day)`,
  },
  {
    // The record says what the code does: `sent` once a decisive transaction is stored (read from
    // the outbox before), no stored pending answers, and a final state always has its answer.
    // The database makes a payment `sent` when its first decisive transaction is inserted, for any
    // writer: a process of an older version, still running during a rolling upgrade, too (whose
    // stored pending answer becomes `sent` with none). The
    // trigger exists before the rows are converted, and the first statement locks the payments, so
    // no transaction stored meanwhile is missed.
    id: "settlement/007_sent_state",
    sql: `
ALTER TABLE settlement_payments DROP CONSTRAINT settlement_payments_state_check;
CREATE FUNCTION settlement_payment_sent() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
  UPDATE settlement_payments SET state = 'sent', lease_until = NULL, updated_at = now() WHERE network = NEW.network AND payment_id = NEW.payment_id AND state = 'claimed'; RETURN NULL; END $$;
CREATE FUNCTION settlement_payment_unstored_pending() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN IF NEW.state = 'pending' THEN NEW.state := 'sent'; NEW.response := NULL; END IF; RETURN NEW; END $$;
CREATE TRIGGER settlement_payments_pending BEFORE UPDATE ON settlement_payments FOR EACH ROW WHEN (NEW.state = 'pending') EXECUTE FUNCTION settlement_payment_unstored_pending();
CREATE TRIGGER settlement_outbox_sent AFTER INSERT ON settlement_outbox FOR EACH ROW
  WHEN (COALESCE(NEW.kind, '') NOT IN (${AUXILIARY_KINDS.map((k) => `'${k}'`).join(", ")})) EXECUTE FUNCTION settlement_payment_sent();
UPDATE settlement_payments p SET state = 'sent'
  WHERE state = 'pending' OR (state = 'claimed' AND EXISTS (SELECT 1 FROM settlement_outbox o WHERE o.network = p.network AND o.payment_id = p.payment_id AND ${DECISIVE}));
UPDATE settlement_payments SET response = NULL, lease_until = NULL WHERE state = 'sent';
UPDATE settlement_payments SET response = NULL WHERE state = 'claimed';
ALTER TABLE settlement_payments ADD CONSTRAINT settlement_payments_state_check CHECK (state IN ('claimed', 'sent', 'succeeded', 'failed'));
ALTER TABLE settlement_payments ADD CONSTRAINT settlement_payments_answered CHECK ((state IN ('succeeded', 'failed')) = (response IS NOT NULL));
DROP INDEX settlement_payments_in_flight;
CREATE INDEX settlement_payments_in_flight ON settlement_payments (network, asset, reserved_payer) WHERE reserved IS NOT NULL AND state IN ('claimed', 'sent')`,
  },
  {
    // A final answer a reorg took back: the payment is `sent` again until the chain decides anew,
    // and this keeps what it had been answered (a success that becomes a failure is counted).
    id: "settlement/008_reorged_answer",
    sql: `ALTER TABLE settlement_payments ADD COLUMN reorged_from text`,
  },
  {
    // A client's payment identifier is its payer's: bound per (network, payer, identifier), so
    // another payer using the same id never blocks this one. Rows from before take their payment's
    // payer where it has one ('' otherwise: payments without a payer share one scope).
    id: "settlement/009_identifier_per_payer",
    sql: `
ALTER TABLE settlement_payment_identifiers ADD COLUMN payer text NOT NULL DEFAULT '';
UPDATE settlement_payment_identifiers i SET payer = lower(p.payer) FROM settlement_payments p
  WHERE p.network = i.network AND p.payment_id = i.payment_id AND p.payer IS NOT NULL;
ALTER TABLE settlement_payment_identifiers DROP CONSTRAINT settlement_payment_identifiers_pkey;
ALTER TABLE settlement_payment_identifiers ADD PRIMARY KEY (network, payer, identifier)`,
  },
  {
    // One funding per (payer, approval nonce): the chain runs one transaction per nonce, so payments
    // that carry the same approval (or rival approvals of one nonce) share its funding. A unique key,
    // so replicas of any version never record two (rows from before have no nonce: not held to it).
    id: "settlement/010_gas_funding_per_nonce",
    sql: `
ALTER TABLE settlement_gas_fundings ADD COLUMN approval_nonce bigint;
CREATE UNIQUE INDEX settlement_gas_fundings_one_per_nonce ON settlement_gas_fundings (network, payer, approval_nonce)`,
  },
  {
    // An identifier is bound in the scope of the one signer that alone makes its payment
    // (payment-id.ts identifierScope: `payer:<from>`, `refund:<receiver>:<authorizer>`), never under
    // an address a payload merely names (a sweep's receiver, a refund's payer: anyone could bind
    // those). Bindings of exact and upto payments and of deposits (the only batch payments that
    // reserve a payer's balance) are a payer's own; the rest (sweeps, claims, refunds) are dropped.
    id: "settlement/011_identifier_scope",
    sql: `
ALTER TABLE settlement_payment_identifiers RENAME COLUMN payer TO scope;
UPDATE settlement_payment_identifiers i SET scope = 'payer:' || i.scope FROM settlement_payments p
  WHERE p.network = i.network AND p.payment_id = i.payment_id AND i.scope <> ''
    AND (p.scheme <> 'batch-settlement' OR p.reserved_payer IS NOT NULL);
DELETE FROM settlement_payment_identifiers WHERE scope NOT LIKE 'payer:%'`,
  },
  {
    // The status API (status.ts): what a resource server can find a payment by (its payer and
    // nonce, a transaction hash), what it paid (token, payee, amount) and for which tenant; and the
    // last refusal of a payment nothing was sent for, readable only by whoever holds that very payment.
    id: "settlement/012_status",
    sql: `
ALTER TABLE settlement_payments ADD COLUMN token text;
ALTER TABLE settlement_payments ADD COLUMN pay_to text;
ALTER TABLE settlement_payments ADD COLUMN amount numeric(78,0);
ALTER TABLE settlement_payments ADD COLUMN nonce text;
ALTER TABLE settlement_payments ADD COLUMN tenant text;
CREATE INDEX settlement_payments_by_nonce ON settlement_payments (network, lower(payer), nonce) WHERE nonce IS NOT NULL;
CREATE INDEX settlement_outbox_by_hash ON settlement_outbox USING gin (hashes);
CREATE TABLE settlement_refusals (
  network text NOT NULL,
  payment_id text NOT NULL,
  digest text NOT NULL,
  payer text,
  tenant text,
  reason text NOT NULL,
  message text,
  created_at timestamptz NOT NULL DEFAULT now(),
  updated_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (network, payment_id, digest)
);
CREATE INDEX settlement_refusals_age ON settlement_refusals (updated_at)`,
  },
  {
    // Settlement webhooks (webhooks.ts): where a payment's events go (its tenant's URL, which the
    // router sent; the facilitator's own receiver), its events, and their deliveries. The events
    // are written by the database, in the very transaction that changes a payment's state, by
    // whatever writer of whatever version: none is lost, none is doubled. Numbered per payment
    // under the row lock the UPDATE holds.
    id: "settlement/013_webhooks",
    sql: `
ALTER TABLE settlement_payments ADD COLUMN webhook_url text;
ALTER TABLE settlement_payments ADD COLUMN webhook_facilitator boolean NOT NULL DEFAULT false;
CREATE TABLE settlement_events (
  id bigserial PRIMARY KEY,
  event_id text NOT NULL UNIQUE,
  network text NOT NULL,
  payment_id text NOT NULL,
  sequence integer NOT NULL,
  type text NOT NULL CHECK (type IN ('submitted', 'confirmed', 'failed', 'reorged')),
  tenant text,
  body jsonb NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now(),
  UNIQUE (network, payment_id, sequence)
);
CREATE TABLE settlement_webhook_deliveries (
  event bigint NOT NULL REFERENCES settlement_events (id) ON DELETE CASCADE,
  target text NOT NULL CHECK (target IN ('facilitator', 'tenant')),
  network text NOT NULL,
  payment_id text NOT NULL,
  sequence integer NOT NULL,
  state text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'delivered', 'dead')),
  attempts integer NOT NULL DEFAULT 0,
  next_attempt_at timestamptz NOT NULL DEFAULT now(),
  lease_until timestamptz,
  last_status integer,
  last_error text,
  created_at timestamptz NOT NULL DEFAULT now(),
  updated_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (event, target)
);
CREATE INDEX settlement_webhook_deliveries_due ON settlement_webhook_deliveries (network, next_attempt_at) WHERE state = 'pending';
CREATE INDEX settlement_webhook_deliveries_order ON settlement_webhook_deliveries (network, payment_id, target, sequence) WHERE state = 'pending';
${EVENT_FUNCTION};
CREATE TRIGGER settlement_payments_event AFTER UPDATE OF state ON settlement_payments FOR EACH ROW
  WHEN (OLD.state IS DISTINCT FROM NEW.state) EXECUTE FUNCTION settlement_payment_event()`,
  },
  {
    // Delivered or given-up events are dropped after a while (webhooks.ts): found by age.
    id: "settlement/014_webhook_retention",
    sql: `CREATE INDEX settlement_events_age ON settlement_events (network, created_at)`,
  },
  {
    // Status API review: every tenant that settled a payment (or was answered for it) reads its
    // status, not only the first; a refusal is kept per whole request (the requirements' extra is
    // part of what a signature is checked against) and per tenant, so nobody else's request
    // overwrites or hides it. Refusals are ephemeral: the old table is dropped.
    id: "settlement/015_status_tenants",
    sql: `
CREATE TABLE settlement_payment_tenants (
  network text NOT NULL,
  payment_id text NOT NULL,
  tenant text NOT NULL,
  created_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (network, payment_id, tenant)
);
INSERT INTO settlement_payment_tenants (network, payment_id, tenant) SELECT network, payment_id, tenant FROM settlement_payments WHERE tenant IS NOT NULL;
DROP TABLE settlement_refusals;
CREATE TABLE settlement_refusals (
  network text NOT NULL,
  payment_id text NOT NULL,
  request text NOT NULL,
  tenant text NOT NULL DEFAULT '',
  payer text,
  reason text NOT NULL,
  message text,
  created_at timestamptz NOT NULL DEFAULT now(),
  updated_at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (network, payment_id, request, tenant)
);
CREATE INDEX settlement_refusals_age ON settlement_refusals (network, updated_at)`,
  },
  {
    // Webhook review: deliveries blocked behind an earlier pending one are never due (the worker
    // releases the next when one ends), so a claim's cost does not grow with a failing receiver's
    // backlog; a payment's event sequence survives the pruning of its events.
    id: "settlement/016_webhook_blocked_sequence",
    sql: `
ALTER TABLE settlement_payments ADD COLUMN webhook_sequence integer NOT NULL DEFAULT 0;
UPDATE settlement_payments p SET webhook_sequence = s.n FROM (SELECT network, payment_id, max(sequence) AS n FROM settlement_events GROUP BY network, payment_id) s WHERE p.network = s.network AND p.payment_id = s.payment_id;
UPDATE settlement_webhook_deliveries d SET next_attempt_at = 'infinity' WHERE d.state = 'pending'
  AND EXISTS (SELECT 1 FROM settlement_webhook_deliveries y WHERE y.network = d.network AND y.payment_id = d.payment_id AND y.target = d.target AND y.state = 'pending' AND y.sequence < d.sequence);
${EVENT_FUNCTION_016}`,
  },
];

/** Whether a transaction can decide its payment's outcome: the mechanism's own, not one that prepared it. */
export const isDecisive = (row: Pick<OutboxRow, "kind">) => !AUXILIARY_KINDS.includes((row.kind ?? "") as never);

export type GasFundingState = "funded" | "approved" | "abused";

/** A recorded gas funding and its transaction, once stored (the latest attempt's hash; none: not stored yet, or dropped). */
export interface GasFunding {
  approvalHash: string;
  paymentId: string;
  fundedWei: bigint;
  state: GasFundingState;
  hash?: `0x${string}`;
  /** Its transaction has a receipt recorded (the payer's balance holds it). */
  mined: boolean;
}

/** SQL: a funding (alias f) with its live transaction (the one outbox row of its payment that funds). */
const FUNDING_WITH_TX = `SELECT f.approval_hash, f.payment_id, f.funded_wei::text AS funded_wei, f.state, o.hash, o.state AS tx_state
  FROM settlement_gas_fundings f
  LEFT JOIN LATERAL (SELECT hash, state FROM settlement_outbox o WHERE o.network = f.network AND o.payment_id = f.payment_id AND o.kind = 'gas_funding' AND o.state <> 'dropped' ORDER BY id DESC LIMIT 1) o ON true`;

type FundingRow = { approval_hash: string; payment_id: string; funded_wei: string; state: GasFundingState; hash: `0x${string}` | null; tx_state: OutboxState | null };
const gasFundingOf = (r: FundingRow): GasFunding => ({
  approvalHash: r.approval_hash,
  paymentId: r.payment_id,
  fundedWei: BigInt(r.funded_wei),
  state: r.state,
  hash: r.hash ?? undefined,
  mined: r.tx_state === "confirmed" || r.tx_state === "reverted",
});

export type GasFundingRecord = { recorded: true } | { recorded: false; why: "funded"; funding: GasFunding } | { recorded: false; why: "abused" | "daily_bound" | "payer_daily_bound" };

export type PaymentState = PaymentRow["state"];

/** What a payment pays and for whom, kept for the status API (status.ts). */
export interface PaymentTerms {
  token?: string;
  payTo?: string;
  /** The amount the requirements ask (upto: the most; its success answer carries what was settled). */
  amount?: string;
  /** The authorization's nonce, normalised (payment-id.ts paymentNonce): with the payer, how a resource server names it. */
  nonce?: string;
  /** The API key it was settled under (the router's tenant), if any. */
  tenant?: string;
  /** Where the tenant's webhook events of this payment go (webhooks.ts); a URL its router sent. */
  webhookUrl?: string;
  /** Its events go to this facilitator's own receiver too (X402_WEBHOOK_URL was set when it was claimed). */
  webhookFacilitator?: boolean;
}
const termValues = (t: PaymentTerms) => [t.token ?? null, t.payTo ?? null, t.amount ?? null, t.nonce ?? null, t.tenant ?? null, t.webhookUrl ?? null, t.webhookFacilitator ?? false];

/** A payment as the status API reads it. */
export interface PaymentRecord {
  payment_id: string;
  digest: string | null;
  scheme: string;
  payer: string | null;
  state: PaymentState;
  response: SettleResponse | null;
  success_extra: Record<string, unknown>;
  reorged_from: string | null;
  token: string | null;
  pay_to: string | null;
  amount: string | null;
  nonce: string | null;
  tenant: string | null;
  created_at: string;
  updated_at: string;
}

/** A payment refused before anything was sent, as last answered (kept two days, at most REFUSALS_KEPT per network). */
export interface RefusalRecord {
  payer: string | null;
  reason: string;
  message: string | null;
  created_at: string;
  updated_at: string;
}

/** SQL: a timestamp column as ISO 8601 in UTC, under its own name. */
const iso = (column: string) => `to_char(${column} AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"') AS ${column}`;
const RECORD_COLUMNS = `payment_id, digest, scheme, payer, state, response, success_extra, reorged_from, token, pay_to, amount::text AS amount, nonce, tenant, ${iso("created_at")}, ${iso("updated_at")}`;
export type OutboxState = "signed" | "broadcast" | "confirmed" | "reverted" | "dropped";

interface PaymentFacts {
  payment_id: string;
  scheme: string;
  payer: string | null;
  /** The digest of the payment that holds this id (payment-id.ts); null on rows from before digests. */
  digest: string | null;
  owner: string | null;
  lease_expired: boolean;
  /** Fields a success answer carries besides the transaction (upto: the settled amount). */
  success_extra: Record<string, unknown>;
}

/** A payment in flight (claimed: may run; sent: has a decisive transaction) or final, with its answer. */
export type PaymentRow =
  | (PaymentFacts & { state: "claimed" | "sent"; response: null })
  | (PaymentFacts & { state: "succeeded" | "failed"; response: SettleResponse });

export const isFinal = (row: PaymentRow): row is Extract<PaymentRow, { state: "succeeded" | "failed" }> => row.state === "succeeded" || row.state === "failed";

export interface OutboxRow {
  id: string;
  payment_id: string;
  signer: `0x${string}`;
  nonce: string;
  to_address: `0x${string}`;
  data: `0x${string}`;
  gas: string;
  max_fee_per_gas: string;
  max_priority_fee_per_gas: string;
  raw_tx: `0x${string}`;
  hash: `0x${string}`;
  hashes: `0x${string}`[];
  state: OutboxState;
  /** Native value sent with the transaction (wei; a gas funding's amount). */
  value: string;
  attempts: number;
  mined_hash: `0x${string}` | null;
  /** Since creation, or since the last reorg put it back on its way. */
  age_seconds: number;
  /** Raw bytes of every attempt, in the order of `hashes`. */
  raw_txs: `0x${string}`[] | null;
  kind: string | null;
  reject_reason: string | null;
  mined_block_number: string | null;
  mined_block_hash: `0x${string}` | null;
  revert_reason: string | null;
  revert_message: string | null;
  /** Put back on its way by a reorg once (its outcome may correct a recorded one). */
  reorged: boolean;
  /** When a reorg last did so: a receipt seen before then is of a block that left the chain. */
  reorged_at: string | null;
  /** ISO 8601, UTC. */
  created_at: string;
}

export interface SignedTransaction {
  raw: `0x${string}`;
  hash: `0x${string}`;
}

/** A run's claim was taken over (its lease ran out): it must not sign anything for the payment. */
export class ClaimLostError extends Error {
  override name = "ClaimLostError";
}

export interface NewOutboxEntry {
  paymentId: string;
  /** The claim owner of the run sending it; unset for transactions of no payment (fillers). */
  claimOwner?: string;
  signer: `0x${string}`;
  to: `0x${string}`;
  data: `0x${string}`;
  gas: bigint;
  maxFeePerGas: bigint;
  maxPriorityFeePerGas: bigint;
  /** Native value sent with it (a gas funding); none by default. */
  value?: bigint;
  /** The transaction kind (gas-policy.ts), for ceilings and revert decoding. */
  kind?: string;
}

/** An outbox row without its bytes (calldata and signed transactions): what the reconciler's pass lists. */
export type ListedOutboxRow = Omit<OutboxRow, "data" | "raw_tx" | "raw_txs">;
const LISTED_COLUMNS = `id::text AS id, payment_id, signer, nonce::text AS nonce, to_address, gas::text AS gas,
  max_fee_per_gas::text AS max_fee_per_gas, max_priority_fee_per_gas::text AS max_priority_fee_per_gas,
  hash, hashes, state, attempts, mined_hash, EXTRACT(EPOCH FROM (now() - COALESCE(reorged_at, created_at)))::float8 AS age_seconds,
  kind, reject_reason, mined_block_number::text AS mined_block_number, mined_block_hash, revert_reason, revert_message, value::text AS value, reorged_at IS NOT NULL AS reorged, reorged_at::text AS reorged_at, ${iso("created_at")}`;
const OUTBOX_COLUMNS = `${LISTED_COLUMNS}, data, raw_tx, raw_txs`;

/** What recording a mined transaction needs of its outbox row. */
interface MinedFacts {
  decisive: boolean;
  /** Mined again after a reorg: its outcome corrects whatever was recorded. */
  reorged: boolean;
  revert_reason: string | null;
  revert_message: string | null;
}
/** Statements of one kind (claims, reads, records) a process runs at once; the calls that come meanwhile go in the next. */
const STATEMENT_LANES = 2;
const MINED_FACTS = `(${DECISIVE}) AS decisive, o.reorged_at IS NOT NULL AS reorged, o.revert_reason, o.revert_message`;

/** Where a receipt was mined, so a reorg that removes it can be noticed. */
export interface MinedAt {
  blockNumber: bigint;
  blockHash: string;
}

/** What a transaction whose nonce is given up leaves behind. */
export type RetiredNonce = { reused: true } | { reused: false; filler: OutboxRow };

export const NONCE_FILLER_PAYMENT = "nonce-filler";

/** Refusals kept per network for the status API (settlement_refusals); an anonymous caller can make them. */
export const REFUSALS_KEPT = 50_000;

export interface SettlementStoreHooks {
  /** Called once per transaction, by whichever process records it mined first (gas accounting); a reorged transaction mined again is not counted twice. */
  onMined?(signer: string, gasWei: bigint): void;
  /** A recorded success that the canonical chain no longer holds (reorged, then reverted): the record is corrected. */
  onReversed?(paymentId: string): void;
  /** Decodes why a mined transaction reverted (before it is recorded, so every answer carries it). */
  explainRevert?(row: OutboxRow, minedHash: string, minedAt?: MinedAt): Promise<{ code: string; message: string } | undefined>;
}

export type Reservation = { reserved: true } | { reserved: false; inFlight: bigint };

interface QueuedAllocation {
  entry: NewOutboxEntry;
  /** The key's chain nonce, when this caller found no counter for it. */
  seed?: number;
  sign: (nonce: bigint) => Promise<SignedTransaction>;
  resolve: (row: OutboxRow) => void;
  reject: (e: unknown) => void;
}

/** Transactions stored in one SQL transaction at most (its signing holds the keys' counters). */
const MAX_STORED_TOGETHER = 200;

interface QueuedReservation {
  paymentId: string;
  owner: string;
  amount: bigint;
  balance?: bigint;
  resolve: (outcome: Reservation) => void;
  reject: (e: unknown) => void;
}

/**
 * Runs fn after every earlier run of the same key in this process. Transactions that wait on one
 * database lock (a payer's reservations, a key's nonce counter) each hold a pooled connection while
 * they wait: queued here first, one waits per key, and a burst leaves the pool to everything else.
 */
export function createKeyedQueue() {
  const tails = new Map<string, Promise<void>>();
  return <T>(key: string, fn: () => Promise<T>): Promise<T> => {
    const run = (tails.get(key) ?? Promise.resolve()).then(fn);
    const tail = run.then(
      () => undefined,
      () => undefined,
    );
    tails.set(key, tail);
    void tail.then(() => tails.get(key) === tail && tails.delete(key));
    return run;
  };
}

/** How long past its lease a claim with no transaction is kept before a reservation of its payer drops it. */
export const ABANDONED_CLAIM_GRACE_MS = 60_000;

export function createSettlementStore(db: Database, network: string, hooks: SettlementStoreHooks = {}) {
  const countedKeys = new Set<string>();
  const nonceReads = new Map<string, Promise<boolean>>();
  const inTurn = createKeyedQueue();
  // Keys whose chain nonce is being read to seed their counter.
  const seeding = new Map<string, Promise<number>>();
  const reservationBatches = new Map<string, QueuedReservation[]>();

  async function reserveTogether(asset: string, payer: string, queued: QueuedReservation[]): Promise<void> {
    try {
      const outcomes = await db.transaction(async (tx) => {
        await tx.query(`SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, [`${network}|${asset}|${payer}`]);
        // Abandoned claims (their process died before anything of theirs was stored, and nobody
        // retried them) would hold the payer's balance for ever: a claim whose lease ran out a
        // while ago with no transaction at all is dropped. Its run, if it still lives, has lost it:
        // the fence in allocateAndStore finds no row of its owner and signs nothing.
        await tx.query(
          `DELETE FROM settlement_payments p
           WHERE network = $1 AND asset = $2 AND reserved_payer = $3 AND reserved IS NOT NULL AND state = 'claimed'
             AND lease_until < now() - ($4 || ' milliseconds')::interval
             AND NOT EXISTS (SELECT 1 FROM settlement_outbox o WHERE o.network = $1 AND o.payment_id = p.payment_id)`,
          [network, asset, payer, String(ABANDONED_CLAIM_GRACE_MS)],
        );
        const [row] = await tx.query<{ total: string }>(
          `SELECT COALESCE(sum(reserved), 0)::text AS total FROM settlement_payments p
           WHERE network = $1 AND asset = $2 AND reserved_payer = $3 AND reserved IS NOT NULL AND state IN ('claimed', 'sent')
             AND NOT EXISTS (SELECT 1 FROM unnest($4::text[], $5::text[]) AS b(payment_id, owner) WHERE b.payment_id = p.payment_id AND b.owner = p.owner)
             AND NOT EXISTS (SELECT 1 FROM settlement_outbox o WHERE o.network = $1 AND o.payment_id = p.payment_id AND o.state IN ('confirmed', 'reverted') AND ${DECISIVE})`,
          [network, asset, payer, queued.map((q) => q.paymentId), queued.map((q) => q.owner)],
        );
        // In arrival order, each against what is in flight besides it, the ones reserved before it included.
        // (A batch member's row is left out of the sum only while it still holds its claim: a row another
        // request took over counts like any other.)
        let inFlight = BigInt(row!.total);
        const reserved: QueuedReservation[] = [];
        const outcomes = queued.map((q): Reservation => {
          if (inFlight > 0n && (q.balance === undefined || inFlight + q.amount > q.balance)) return { reserved: false, inFlight };
          inFlight += q.amount;
          reserved.push(q);
          return { reserved: true };
        });
        if (reserved.length > 0) {
          await tx.query(
            `UPDATE settlement_payments p SET asset = $2, reserved_payer = $3, reserved = r.amount
             FROM unnest($4::text[], $5::text[], $6::numeric[]) AS r(payment_id, owner, amount)
             WHERE p.network = $1 AND p.payment_id = ANY($4::text[]) AND p.payment_id = r.payment_id AND p.owner = r.owner`,
            [network, asset, payer, reserved.map((q) => q.paymentId), reserved.map((q) => q.owner), reserved.map((q) => q.amount.toString())],
          );
        }
        return outcomes;
      });
      queued.forEach((q, i) => q.resolve(outcomes[i]!));
    } catch (e) {
      for (const q of queued) q.reject(e);
    }
  }
  // A batch's rows are named twice where it is joined (`= ANY($n)` beside the join on unnest): the
  // key's index then finds them whatever the planner knows of the table. The embedded engine has no
  // autovacuum to keep statistics, and without them the join hashed the whole table each time
  // (12.6 ms against 0.6 for 15 rows among 3,000), a cost that grew with every payment stored.
  // The statements of every settlement, each made once per turn of the event loop for all the
  // settlements that need it then, or, while STATEMENT_LANES of a kind are running, for all that
  // come meanwhile (platform/coalesce.ts).
  const claimTogether = coalesce(
    async (items: { paymentId: string; values: unknown[] }[]) => {
      const column = (i: number) => items.map((c) => c.values[i]);
      // One claim alone (most, in a burst that keeps the process busy) as plain values: a third of
      // the statement's cost on the embedded engine, which plans the unnest form for every call.
      const won = await db.query<{ payment_id: string }>(
        items.length === 1
          ? `INSERT INTO settlement_payments (network, payment_id, digest, scheme, payer, success_extra, state, owner, lease_until, token, pay_to, amount, nonce, tenant, webhook_url, webhook_facilitator)
             VALUES ($1, $2, $3, $4, $5, $6::jsonb, 'claimed', $7, now() + ($8 || ' milliseconds')::interval, $9, $10, $11::numeric, $12, $13, $14, $15::boolean)
             ON CONFLICT (network, payment_id) DO NOTHING RETURNING payment_id`
          : `INSERT INTO settlement_payments (network, payment_id, digest, scheme, payer, success_extra, state, owner, lease_until, token, pay_to, amount, nonce, tenant, webhook_url, webhook_facilitator)
         SELECT $1, u.payment_id, u.digest, u.scheme, u.payer, u.success_extra::jsonb, 'claimed', u.owner, now() + (u.lease_ms || ' milliseconds')::interval,
           u.token, u.pay_to, u.amount::numeric, u.nonce, u.tenant, u.webhook_url, u.webhook_facilitator
         FROM unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[], $9::text[], $10::text[], $11::text[], $12::text[], $13::text[], $14::text[], $15::boolean[])
           AS u(payment_id, digest, scheme, payer, success_extra, owner, lease_ms, token, pay_to, amount, nonce, tenant, webhook_url, webhook_facilitator)
         ON CONFLICT (network, payment_id) DO NOTHING RETURNING payment_id`,
        items.length === 1 ? [network, ...items[0]!.values] : [network, ...Array.from({ length: 14 }, (_, i) => column(i))],
      );
      const claimed = new Set(won.map((r) => r.payment_id));
      return items.map((c) => claimed.has(c.paymentId));
    },
    { key: (c) => c.paymentId, lanes: STATEMENT_LANES },
  );
  const paymentsTogether = coalesce(async (ids: string[]) => {
    const rows = await db.query<PaymentRow>(
      `SELECT payment_id, scheme, payer, digest, state, owner, (lease_until IS NOT NULL AND lease_until < now()) AS lease_expired, response, success_extra
       FROM settlement_payments WHERE network = $1 AND payment_id = ANY($2::text[])`,
      [network, ids],
    );
    const byId = new Map(rows.map((r) => [r.payment_id, r]));
    return ids.map((id) => byId.get(id));
  }, { lanes: STATEMENT_LANES });
  const outboxTogether = coalesce(async (paymentIds: string[]) => {
    const rows = await db.query<OutboxRow>(`SELECT ${OUTBOX_COLUMNS} FROM settlement_outbox WHERE network = $1 AND payment_id = ANY($2::text[]) ORDER BY id`, [network, paymentIds]);
    const byPayment = new Map<string, OutboxRow[]>();
    for (const r of rows) byPayment.set(r.payment_id, [...(byPayment.get(r.payment_id) ?? []), r]);
    return paymentIds.map((id) => byPayment.get(id) ?? []);
  }, { lanes: STATEMENT_LANES });
  const recordTogether = coalesce(
    async (items: { paymentId: string; response: SettleResponse; owner?: string }[]) => {
      const rows = await db.query<{ payment_id: string; response: SettleResponse }>(
        `UPDATE settlement_payments p SET state = u.state, response = u.response::jsonb, lease_until = NULL, updated_at = now()
         FROM unnest($2::text[], $3::text[], $4::text[], $5::text[]) AS u(payment_id, state, response, owner)
         WHERE p.network = $1 AND p.payment_id = ANY($2::text[]) AND p.payment_id = u.payment_id AND p.state IN ('claimed', 'sent') AND (u.owner IS NULL OR p.owner = u.owner)
         RETURNING p.payment_id, p.response`,
        [network, items.map((i) => i.paymentId), items.map((i) => (i.response.success ? "succeeded" : "failed")), items.map((i) => JSON.stringify(i.response)), items.map((i) => i.owner ?? null)],
      );
      const byId = new Map(rows.map((r) => [r.payment_id, r.response]));
      return items.map((i) => byId.get(i.paymentId));
    },
    { key: (i) => i.paymentId, lanes: STATEMENT_LANES },
  );
  const broadcastTogether = coalesce(
    async (items: { id: string; error?: string }[]) => {
      await db.query(
        `UPDATE settlement_outbox o SET state = CASE WHEN o.state = 'signed' THEN 'broadcast' ELSE o.state END, attempts = o.attempts + 1, last_error = u.error, updated_at = now()
         FROM unnest($1::bigint[], $2::text[]) AS u(id, error) WHERE o.id = ANY($1::bigint[]) AND o.id = u.id`,
        [items.map((i) => i.id), items.map((i) => i.error ?? null)],
      );
      return items.map(() => undefined);
    },
    { key: (i) => i.id, lanes: STATEMENT_LANES },
  );
  const minedTogether = coalesce(
    async (items: { id: string; values: unknown[] }[]) => {
      const column = (i: number) => items.map((m) => m.values[i]);
      const rows = await db.query<MinedFacts & { id: string; signer: string }>(
        `UPDATE settlement_outbox o SET state = u.state, mined_hash = u.mined_hash, mined_block_number = u.block_number, mined_block_hash = u.block_hash, watched = u.block_number IS NOT NULL,
           revert_reason = u.revert_reason, revert_message = u.revert_message, updated_at = now()
         FROM unnest($1::bigint[], $2::text[], $3::text[], $4::bigint[], $5::text[], $6::text[], $7::text[]) AS u(id, state, mined_hash, block_number, block_hash, revert_reason, revert_message)
         WHERE o.id = ANY($1::bigint[]) AND o.id = u.id AND o.state IN ('signed', 'broadcast') RETURNING o.id::text AS id, o.signer, ${MINED_FACTS}`,
        [items.map((m) => m.id), ...Array.from({ length: 6 }, (_, i) => column(i))],
      );
      const byId = new Map(rows.map((r) => [r.id, r]));
      return items.map((m) => byId.get(m.id));
    },
    { key: (m) => m.id, lanes: STATEMENT_LANES },
  );
  const openTogether = coalesce(
    async (ids: string[]) => {
      const rows = await db.query<OutboxRow>(`SELECT ${OUTBOX_COLUMNS} FROM settlement_outbox WHERE id = ANY($1::bigint[]) AND state IN ('signed', 'broadcast')`, [ids]);
      const byId = new Map(rows.map((r) => [r.id, r]));
      return ids.map((id) => byId.get(id));
    },
    { lanes: STATEMENT_LANES },
  );
  // What a transaction's mining says of its payment, read where another caller marked it mined first.
  const factsTogether = coalesce(
    async (ids: string[]) => {
      const rows = await db.query<MinedFacts & { id: string }>(`SELECT o.id::text AS id, ${MINED_FACTS} FROM settlement_outbox o WHERE o.id = ANY($1::bigint[])`, [ids]);
      const byId = new Map(rows.map((r) => [r.id, r]));
      return ids.map((id) => byId.get(id));
    },
    { lanes: STATEMENT_LANES },
  );

  // Transactions queued for storing, of every key: one store turn at a time per process takes them all.
  let allocationBatch: QueuedAllocation[] | undefined;
  async function storeTogether(queued: QueuedAllocation[]): Promise<void> {
    try {
      const outcomes = await db.transaction(async (tx) => {
        const seeds = new Map<string, number>();
        for (const q of queued) if (q.seed !== undefined) seeds.set(q.entry.signer, q.seed);
        if (seeds.size > 0) {
          // In the counters' lock order: two processes seeding the same new keys would otherwise each wait on the other's row.
          await tx.query(`INSERT INTO settlement_nonces (network, signer, next_nonce) SELECT $1, s.signer, s.next_nonce FROM unnest($2::text[], $3::bigint[]) AS s(signer, next_nonce) ORDER BY s.signer ON CONFLICT DO NOTHING`, [
            network,
            [...seeds.keys()],
            [...seeds.values()],
          ]);
        }
        // The keys' counters under row locks, taken in one order by every process (no deadlock), and
        // the fence with them: sign only while a run still holds its payment's claim (its row locked
        // too, so a take-over waits, and one that won first leaves no row here). The payment's own
        // transaction makes it `sent` (the trigger of migration 007: never taken over, never
        // released, never executed again); a funding or a deployment keeps it `claimed` with its
        // lease: until the payment's own transaction exists, a crashed run's claim may be taken over
        // (the preparation is found done, not repeated). A run re-sending on another nonce finds its payment `sent`.
        const signers = [...new Set(queued.map((q) => q.entry.signer))];
        const counters = await tx.query<{ signer: string; next_nonce: string }>(
          `SELECT signer, next_nonce::text AS next_nonce FROM settlement_nonces WHERE network = $1 AND signer = ANY($2::text[]) ORDER BY signer FOR UPDATE`,
          [network, signers],
        );
        const next = new Map(counters.map((c) => [c.signer, BigInt(c.next_nonce)]));
        for (const signer of signers) if (!next.has(signer)) throw new Error(`no nonce counter for ${signer}`);
        const fenced = queued.filter((q) => q.entry.claimOwner);
        const held = new Set<string>();
        if (fenced.length > 0) {
          const rows = await tx.query<{ payment_id: string; owner: string }>(
            `SELECT p.payment_id, p.owner FROM settlement_payments p JOIN unnest($2::text[], $3::text[]) AS c(payment_id, owner) ON p.payment_id = c.payment_id AND p.owner = c.owner
             WHERE p.network = $1 AND p.payment_id = ANY($2::text[]) AND p.state IN ('claimed', 'sent') FOR UPDATE OF p`,
            [network, fenced.map((q) => q.entry.paymentId), fenced.map((q) => q.entry.claimOwner!)],
          );
          for (const r of rows) held.add(`${r.payment_id}\0${r.owner}`);
        }
        const outcomes = new Map<QueuedAllocation, { signed?: SignedTransaction; nonce?: bigint; error?: unknown; row?: OutboxRow }>();
        for (const q of queued) {
          if (q.entry.claimOwner && !held.has(`${q.entry.paymentId}\0${q.entry.claimOwner}`)) {
            outcomes.set(q, { error: new ClaimLostError(`the claim on this payment passed to another request; nothing was signed`) });
            continue;
          }
          const nonce = next.get(q.entry.signer)!;
          try {
            outcomes.set(q, { signed: await q.sign(nonce), nonce });
            next.set(q.entry.signer, nonce + 1n);
          } catch (error) {
            outcomes.set(q, { error }); // its nonce goes to the key's next transaction
          }
        }
        const signed = queued.filter((q) => outcomes.get(q)!.signed);
        if (signed.length === 0) return outcomes;
        const column = <T>(f: (q: QueuedAllocation) => T) => signed.map(f);
        const moved = [...new Set(signed.map((q) => q.entry.signer))];
        const rows = await tx.query<OutboxRow>(
          `WITH counter AS (
             UPDATE settlement_nonces n SET next_nonce = c.next_nonce FROM unnest($2::text[], $3::bigint[]) AS c(signer, next_nonce) WHERE n.network = $1 AND n.signer = ANY($2::text[]) AND n.signer = c.signer
           )
           INSERT INTO settlement_outbox (network, payment_id, signer, nonce, to_address, data, gas, max_fee_per_gas, max_priority_fee_per_gas, raw_tx, hash, hashes, state, raw_txs, kind, value)
           SELECT $1, u.payment_id, u.signer, u.nonce, u.to_address, u.data, u.gas, u.max_fee, u.max_tip, u.raw_tx, u.hash, ARRAY[u.hash], 'signed', ARRAY[u.raw_tx], u.kind, u.value
           FROM unnest($4::text[], $5::text[], $6::bigint[], $7::text[], $8::text[], $9::numeric[], $10::numeric[], $11::numeric[], $12::text[], $13::text[], $14::text[], $15::numeric[])
             WITH ORDINALITY AS u(payment_id, signer, nonce, to_address, data, gas, max_fee, max_tip, raw_tx, hash, kind, value, ord)
           ORDER BY u.ord
           RETURNING ${OUTBOX_COLUMNS}`,
          [
            network,
            moved,
            moved.map((signer) => next.get(signer)!.toString()),
            column((q) => q.entry.paymentId),
            column((q) => q.entry.signer),
            column((q) => outcomes.get(q)!.nonce!.toString()),
            column((q) => q.entry.to),
            column((q) => q.entry.data),
            column((q) => q.entry.gas.toString()),
            column((q) => q.entry.maxFeePerGas.toString()),
            column((q) => q.entry.maxPriorityFeePerGas.toString()),
            column((q) => outcomes.get(q)!.signed!.raw),
            column((q) => outcomes.get(q)!.signed!.hash),
            column((q) => q.entry.kind ?? null),
            column((q) => (q.entry.value ?? 0n).toString()),
          ],
        );
        const byHash = new Map(rows.map((r) => [r.hash, r]));
        for (const q of signed) outcomes.get(q)!.row = byHash.get(outcomes.get(q)!.signed!.hash);
        return outcomes;
      });
      // Answered once committed: a reconciler that counted before reads the rows.
      for (const q of queued) {
        const { row, error } = outcomes.get(q)!;
        if (row) {
          transactionsStored++;
          countedKeys.add(q.entry.signer); // its counter exists now: no read before its next transaction
          q.resolve(row);
        } else q.reject(error ?? new Error("the transaction was not stored"));
      }
    } catch (e) {
      for (const q of queued) q.reject(e);
    }
  }

  let transactionsStored = 0;
  return {
    db,
    /** Whether this process is the store's only writer (the embedded engine): then no transaction appears that it did not store. */
    soleWriter: db.kind === "embedded",
    /** Transactions this process has stored so far. */
    transactionsStored: () => transactionsStored,

    /** Claims a payment id for this process and this payment (its digest). Returns "claimed" for the winner, or the existing row. */
    async claim(paymentId: string, digest: string, scheme: string, payer: string | null, successExtra: Record<string, unknown>, owner: string, leaseMs: number, terms: PaymentTerms = {}): Promise<{ claimed: true } | { claimed: false; row: PaymentRow }> {
      if (await claimTogether({ paymentId, values: [paymentId, digest, scheme, payer, JSON.stringify(successExtra), owner, String(leaseMs), ...termValues(terms)] })) return { claimed: true };
      const row = await this.payment(paymentId);
      if (!row) return this.claim(paymentId, digest, scheme, payer, successExtra, owner, leaseMs, terms); // released in between
      return { claimed: false, row };
    },

    /** Takes over, for this payment, a claim whose owner's lease ran out (still `claimed`: it never produced a transaction). */
    async takeOver(paymentId: string, digest: string, successExtra: Record<string, unknown>, owner: string, leaseMs: number, terms: PaymentTerms = {}): Promise<boolean> {
      const rows = await db.query(
        `UPDATE settlement_payments SET owner = $3, digest = $4, success_extra = $5, reserved = NULL, lease_until = now() + ($6 || ' milliseconds')::interval, updated_at = now(),
           token = $7, pay_to = $8, amount = $9, nonce = $10, tenant = $11, webhook_url = $12, webhook_facilitator = $13
         WHERE network = $1 AND payment_id = $2 AND state = 'claimed' AND lease_until < now()
         RETURNING payment_id`,
        [network, paymentId, owner, digest, JSON.stringify(successExtra), String(leaseMs), ...termValues(terms)],
      );
      return rows.length > 0;
    },

    /**
     * Reserves what a claimed payment takes from its payer. Payments of one (asset, payer) are
     * serialised by a transaction-scoped advisory lock, in any process. With nothing else in
     * flight for that payer the reservation needs no balance (the mechanism's own checks cover one
     * payment); otherwise it fits only within `balance`, and without a balance the caller is told
     * to read one and come back. Reservations of one payer that queue in this process meanwhile are
     * decided together, in arrival order, in one transaction (a group commit): a payer's burst is
     * not one round trip chain per payment.
     */
    reserve(paymentId: string, owner: string, asset: string, payer: string, amount: bigint, balance?: bigint): Promise<Reservation> {
      return new Promise((resolve, reject) => {
        const key = `${asset}:${payer}`;
        let batch = reservationBatches.get(key);
        if (!batch) {
          const queued: QueuedReservation[] = (batch = []);
          reservationBatches.set(key, queued);
          inTurn(`reserve:${key}`, () => {
            reservationBatches.delete(key); // later arrivals make the next batch
            return reserveTogether(asset, payer, queued);
          }).catch(() => undefined); // each reservation hears its own outcome
        }
        batch.push({ paymentId, owner, amount, balance, resolve, reject });
      });
    },

    /**
     * Binds a signer's payment identifier (`scope`: payment-id.ts identifierScope) to this payment,
     * unless it is bound already; returns the payment it is bound to (this one, or the one that
     * came first).
     */
    async bindIdentifier(identifier: string, scope: string, paymentId: string, digest: string): Promise<{ paymentId: string; digest: string }> {
      const [row] = await db.query<{ payment_id: string; digest: string }>(
        `INSERT INTO settlement_payment_identifiers (network, scope, identifier, payment_id, digest) VALUES ($1, $2, $3, $4, $5)
         ON CONFLICT (network, scope, identifier) DO UPDATE SET identifier = EXCLUDED.identifier
         RETURNING payment_id, digest`,
        [network, scope, identifier, paymentId, digest],
      );
      return { paymentId: row!.payment_id, digest: row!.digest };
    },

    /** The payment a signer's identifier is bound to, if any (read-only: /verify). */
    async identifierBinding(identifier: string, scope: string): Promise<{ paymentId: string; digest: string } | undefined> {
      const [row] = await db.query<{ payment_id: string; digest: string }>(
        "SELECT payment_id, digest FROM settlement_payment_identifiers WHERE network = $1 AND scope = $2 AND identifier = $3",
        [network, scope, identifier],
      );
      return row && { paymentId: row.payment_id, digest: row.digest };
    },

    payment: (paymentId: string): Promise<PaymentRow | undefined> => paymentsTogether(paymentId),

    /**
     * Records a payment's outcome (its state follows the answer) and returns it as stored; undefined
     * when it was final already (a final state is never overwritten by a later, staler write).
     */
    record: (paymentId: string, response: SettleResponse, owner?: string): Promise<SettleResponse | undefined> => recordTogether({ paymentId, response, owner }),

    /**
     * The one write that may change a final state: the outcome of a transaction mined again after
     * a reorg is what the canonical chain says, whatever was recorded before. True when a recorded
     * success became a failure.
     */
    async correct(paymentId: string, response: SettleResponse): Promise<boolean> {
      // What was answered before: the recorded state, or the one a reorg took back (see reorged).
      const [row] = await db.query<{ before: PaymentState }>(
        `UPDATE settlement_payments p SET state = $3, response = $4, reorged_from = NULL, lease_until = NULL, updated_at = now()
         FROM (SELECT CASE WHEN state = 'sent' THEN COALESCE(reorged_from, state) ELSE state END AS state FROM settlement_payments WHERE network = $1 AND payment_id = $2 FOR UPDATE) old
         WHERE p.network = $1 AND p.payment_id = $2 RETURNING old.state AS before`,
        [network, paymentId, response.success ? "succeeded" : "failed", JSON.stringify(response)],
      );
      return row?.before === "succeeded" && !response.success;
    },

    /** Forgets a claim that produced no transaction (still `claimed`: a payment-level refusal): a later retry may try again. Only its owner's. */
    async release(paymentId: string, owner: string): Promise<void> {
      await db.query(`DELETE FROM settlement_payments WHERE network = $1 AND payment_id = $2 AND state = 'claimed' AND owner = $3`, [network, paymentId, owner]);
    },

    /**
     * Allocates the key's next nonce, signs with it and stores the transaction, in one
     * transaction: the row lock on the key's counter orders every sender of that key, in any
     * process. `initialNonce` seeds a key the store has not seen (its pending count on chain).
     * Transactions that queue in this process while its previous store is in progress, of every
     * key, are stored together, in arrival order, in one transaction (a group commit: a burst is not
     * a thousand transactions one after the other, each holding a counter, nor one chain of them per key).
     */
    async allocateAndStore(entry: NewOutboxEntry, initialNonce: () => Promise<number>, sign: (nonce: bigint) => Promise<SignedTransaction>): Promise<OutboxRow> {
      // A key's first transactions (a burst right after start) share one read of its chain nonce.
      let seed: number | undefined;
      if (!(await this.hasNonce(entry.signer))) {
        let read = seeding.get(entry.signer);
        if (!read) {
          seeding.set(entry.signer, (read = initialNonce()));
          read.then(() => seeding.delete(entry.signer), () => seeding.delete(entry.signer));
        }
        seed = await read;
      }
      return new Promise<OutboxRow>((resolve, reject) => {
        let batch = allocationBatch;
        if (!batch || batch.length >= MAX_STORED_TOGETHER) {
          const queued: QueuedAllocation[] = (batch = allocationBatch = []);
          inTurn("nonces", () => {
            if (allocationBatch === queued) allocationBatch = undefined; // later arrivals make the next batch
            return storeTogether(queued);
          }).catch(() => undefined); // each transaction hears its own outcome
        }
        batch.push({ entry, seed, sign, resolve, reject });
      });
    },

    /** Whether the key has a nonce counter; a counter is never deleted, so a key seen once is not asked again. */
    async hasNonce(signer: string): Promise<boolean> {
      if (countedKeys.has(signer)) return true;
      // One read for the requests that ask meanwhile (a fresh key's first burst asks a thousand times at once).
      let read = nonceReads.get(signer);
      if (!read) {
        const started = db.query(`SELECT 1 FROM settlement_nonces WHERE network = $1 AND signer = $2`, [network, signer]).then((rows) => rows.length > 0);
        nonceReads.set(signer, (read = started));
        const done = () => nonceReads.get(signer) === started && nonceReads.delete(signer);
        started.then(done, done);
      }
      const found = await read;
      if (found) countedKeys.add(signer);
      return found;
    },

    /** Moves the key's counter forward when the chain is ahead of it (the key was used elsewhere). */
    async advanceNonce(signer: string, atLeast: number): Promise<void> {
      await db.query(`UPDATE settlement_nonces SET next_nonce = GREATEST(next_nonce, $3) WHERE network = $1 AND signer = $2`, [network, signer, atLeast]);
    },

    markBroadcast: (id: string, error?: string): Promise<void> => broadcastTogether({ id, error }),

    async noteError(id: string, error: string): Promise<void> {
      await db.query(`UPDATE settlement_outbox SET attempts = attempts + 1, last_error = $2, updated_at = now() WHERE id = $1`, [id, error.slice(0, 500)]);
    },

    /**
     * Replaces the current attempt (same nonce, higher fees) keeping every earlier hash. A
     * compare-and-set on the attempt being replaced: of several reconcilers, one wins.
     */
    async replace(id: string, replacedHash: string, fees: { maxFeePerGas: bigint; maxPriorityFeePerGas: bigint }, signed: SignedTransaction): Promise<boolean> {
      const rows = await db.query(
        `UPDATE settlement_outbox SET raw_tx = $3, hash = $4, hashes = array_append(hashes, $4), raw_txs = array_append(raw_txs, $3), max_fee_per_gas = $5, max_priority_fee_per_gas = $6, updated_at = now()
         WHERE id = $1 AND hash = $2 AND state IN ('signed', 'broadcast') RETURNING id`,
        [id, replacedHash, signed.raw, signed.hash, fees.maxFeePerGas.toString(), fees.maxPriorityFeePerGas.toString()],
      );
      return rows.length > 0;
    },

    /**
     * Records a mined transaction as the outcome of its payment (and of the outbox row). A funding
     * or a deployment is only marked mined: it prepared the payment and says nothing of its outcome.
     */
    async recordMined(paymentId: string, txId: string, minedHash: string, success: boolean, gasWei?: bigint, minedAt?: MinedAt): Promise<void> {
      const mined = await this.markMined(txId, minedHash, success, gasWei, minedAt);
      // Marked by another process first: read what it stored (it may have stopped before recording the payment).
      const tx = mined.row ?? (await factsTogether(txId));
      if (!tx?.decisive) return;
      const payment = await this.payment(paymentId);
      if (!payment) return;
      // A reorged transaction's outcome corrects the record, also when the process that marked it
      // mined stopped before correcting it.
      await this.settleRecord(paymentId, minedAnswer(network, payment, minedHash, success, { reason: tx.revert_reason, message: tx.revert_message }), tx.reorged);
    },

    /**
     * Marks a transaction mined; true for the one caller that changed it (others saw it done). A
     * revert is explained first, so whichever process records the payment finds the reason.
     */
    async markMined(id: string, minedHash: string, success: boolean, gasWei?: bigint, minedAt?: MinedAt): Promise<{ changed: boolean; reorged: boolean; row?: MinedFacts }> {
      let why: { code: string; message: string } | undefined;
      if (!success && hooks.explainRevert) {
        const [row] = await db.query<OutboxRow>(`SELECT ${OUTBOX_COLUMNS} FROM settlement_outbox WHERE id = $1 AND state IN ('signed', 'broadcast')`, [id]);
        if (row) why = await hooks.explainRevert(row, minedHash, minedAt).catch(() => undefined);
      }
      const row = await minedTogether({ id, values: [success ? "confirmed" : "reverted", minedHash, minedAt?.blockNumber.toString() ?? null, minedAt?.blockHash ?? null, why?.code ?? null, why?.message ?? null] });
      // Gas is counted at the first mining only: the same bytes mined again after a reorg paid once on the canonical chain.
      if (row && !row.reorged && gasWei !== undefined) hooks.onMined?.(row.signer, gasWei);
      return { changed: !!row, reorged: !!row?.reorged, row };
    },

    async markDropped(id: string, error: string, reason?: string): Promise<void> {
      await db.query(`UPDATE settlement_outbox SET state = 'dropped', last_error = $2, reject_reason = $3, updated_at = now() WHERE id = $1`, [id, error.slice(0, 500), reason ?? null]);
    },

    /** Notes why a broadcast was refused, keeping the row as it is (it is retried). */
    async noteRejection(id: string, reason: string, error: string): Promise<void> {
      await db.query(`UPDATE settlement_outbox SET attempts = attempts + 1, reject_reason = $2, last_error = $3, updated_at = now() WHERE id = $1`, [id, reason, error.slice(0, 500)]);
    },

    /**
     * Gives up a transaction the node refused for good, without leaving a gap in its key's nonces:
     * when nothing was allocated after it, the counter steps back and the next transaction takes
     * the nonce; otherwise a zero-value self-transfer (a row of its own, driven by the reconciler
     * like any other) fills it.
     */
    async retire(id: string, reason: string, error: string, signFiller: (nonce: bigint) => Promise<SignedTransaction & { maxFeePerGas: bigint; maxPriorityFeePerGas: bigint }>): Promise<RetiredNonce | undefined> {
      return db.transaction(async (tx) => {
        const [row] = await tx.query<OutboxRow>(`SELECT ${OUTBOX_COLUMNS} FROM settlement_outbox WHERE id = $1 AND state IN ('signed', 'broadcast')`, [id]);
        if (!row) return undefined; // already mined, dropped or retired by someone else
        await tx.query(`SELECT next_nonce FROM settlement_nonces WHERE network = $1 AND signer = $2 FOR UPDATE`, [network, row.signer]);
        await tx.query(`UPDATE settlement_outbox SET state = 'dropped', reject_reason = $2, last_error = $3, updated_at = now() WHERE id = $1`, [id, reason, error.slice(0, 500)]);
        const stepped = await tx.query(
          `UPDATE settlement_nonces SET next_nonce = $3 WHERE network = $1 AND signer = $2 AND next_nonce = $3::bigint + 1 RETURNING next_nonce`,
          [network, row.signer, row.nonce],
        );
        if (stepped.length) return { reused: true as const };
        const signed = await signFiller(BigInt(row.nonce));
        const [filler] = await tx.query<OutboxRow>(
          `INSERT INTO settlement_outbox (network, payment_id, signer, nonce, to_address, data, gas, max_fee_per_gas, max_priority_fee_per_gas, raw_tx, hash, hashes, state, raw_txs, kind)
           VALUES ($1, $2, $3, $4, $3, '0x', 21000, $5, $6, $7, $8, ARRAY[$8], 'signed', ARRAY[$7], 'nonce_filler') RETURNING ${OUTBOX_COLUMNS}`,
          [network, NONCE_FILLER_PAYMENT, row.signer, row.nonce, signed.maxFeePerGas.toString(), signed.maxPriorityFeePerGas.toString(), signed.raw, signed.hash],
        );
        return { reused: false as const, filler: filler! };
      });
    },

    /** A payment whose transaction was refused for good: recorded as failed (its nonce was retired); a correction when it had been mined before a reorg. */
    async recordRejected(paymentId: string, reason: string, reorged: boolean): Promise<void> {
      const payment = await this.payment(paymentId);
      if (payment) await this.settleRecord(paymentId, rejectedAnswer(network, payment.payer, reason), reorged);
    },

    /** Records an outcome; after a reorg, corrects whatever was recorded (and says so when a success became a failure). */
    async settleRecord(paymentId: string, response: SettleResponse, reorged: boolean): Promise<void> {
      if (!reorged) await this.record(paymentId, response);
      else if (await this.correct(paymentId, response)) hooks.onReversed?.(paymentId);
    },

    /** Mined rows not yet `confirmations` deep: the reconciler checks they are still on chain. */
    /**
     * Payments still `sent` whose own transaction is mined (confirmed or reverted) with none of
     * theirs open, untouched for a few seconds: their recorder stopped between the receipt and the
     * record (a crash, the database going away), and no caller has retried since.
     */
    async unrecordedMined(limit = 100): Promise<{ payment_id: string; id: string; mined_hash: string; confirmed: boolean }[]> {
      return db.query(
        `SELECT p.payment_id, o.id::text AS id, o.mined_hash, o.state = 'confirmed' AS confirmed FROM settlement_payments p
         JOIN settlement_outbox o ON o.network = p.network AND o.payment_id = p.payment_id AND o.state IN ('confirmed', 'reverted') AND o.mined_hash IS NOT NULL AND ${DECISIVE}
         WHERE p.network = $1 AND p.state = 'sent' AND p.updated_at < now() - interval '5 seconds'
           AND NOT EXISTS (SELECT 1 FROM settlement_outbox x WHERE x.network = p.network AND x.payment_id = p.payment_id AND x.state IN ('signed', 'broadcast') AND ${DECISIVE.replaceAll("o.", "x.")})
         ORDER BY o.id DESC LIMIT $2`,
        [network, limit],
      );
    },

    async watchedOutbox(signers: readonly string[], limit = 500): Promise<OutboxRow[]> {
      return db.query<OutboxRow>(`SELECT ${OUTBOX_COLUMNS} FROM settlement_outbox WHERE network = $1 AND watched AND signer = ANY($2) ORDER BY id LIMIT $3`, [network, signers, limit]);
    },

    /** Deep enough: no longer watched. */
    async settleWatch(ids: readonly string[]): Promise<void> {
      await db.query(`UPDATE settlement_outbox SET watched = false, updated_at = now() WHERE id = ANY($1)`, [ids]);
    },

    /**
     * A mined transaction left the canonical chain: back to 'broadcast' with the very bytes that
     * were mined (same nonce, same hash), so it is sent again. Compare-and-set on the block hash.
     */
    async reorged(id: string, blockHash: string): Promise<OutboxRow | undefined> {
      // In the same statement, a payment this transaction decided is `sent` again: its recorded
      // answer described a chain that no longer is, so no retry may be given it (pending until the
      // transaction is mined again, or refused for good); `reorged_from` keeps what was answered.
      const [row] = await db.query<OutboxRow>(
        `WITH moved AS (
           UPDATE settlement_outbox SET state = 'broadcast', watched = false,
             raw_tx = COALESCE(raw_txs[array_position(hashes, mined_hash)], raw_tx), hash = mined_hash,
             mined_hash = NULL, mined_block_number = NULL, mined_block_hash = NULL, reorged_at = now(), updated_at = now()
           WHERE id = $1 AND watched AND mined_block_hash = $2 RETURNING ${OUTBOX_COLUMNS}
         ), reopened AS (
           UPDATE settlement_payments p SET state = 'sent', response = NULL, reorged_from = p.state, lease_until = NULL, updated_at = now()
           FROM moved o WHERE p.network = $3 AND p.payment_id = o.payment_id AND p.state IN ('succeeded', 'failed') AND ${DECISIVE}
         )
         SELECT * FROM moved`,
        [id, blockHash, network],
      );
      return row;
    },

    /**
     * Records a gas funding before it is sent, or answers the funding already recorded for this
     * payer's approval nonce (by any payment, in any process: it is waited for, never sent again).
     * Refused when the payer once spent a funding on something else, or when today's fundings (UTC)
     * of the network or of this payer would pass their bound. Fundings of one network are
     * serialised, so replicas never pass a bound together.
     */
    async recordGasFunding(f: { approvalHash: string; approvalNonce: number; payer: string; paymentId: string; fundedWei: bigint; dailyBoundWei: bigint; payerDailyBoundWei: bigint }): Promise<GasFundingRecord> {
      return db.transaction(async (tx): Promise<GasFundingRecord> => {
        await tx.query(`SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, [`${network}|gas-funding`]);
        const [same] = await tx.query<FundingRow>(`${FUNDING_WITH_TX} WHERE f.network = $1 AND ((f.payer = $2 AND f.approval_nonce = $3) OR f.approval_hash = $4)`, [network, f.payer, f.approvalNonce, f.approvalHash]);
        if (same) return { recorded: false, why: "funded", funding: gasFundingOf(same) };
        const [abused] = await tx.query(`SELECT 1 FROM settlement_gas_fundings WHERE network = $1 AND payer = $2 AND state = 'abused'`, [network, f.payer]);
        if (abused) return { recorded: false, why: "abused" };
        const [day] = await tx.query<{ total: string; payer: string }>(
          `SELECT COALESCE(sum(funded_wei), 0)::text AS total, COALESCE(sum(funded_wei) FILTER (WHERE payer = $2), 0)::text AS payer
           FROM settlement_gas_fundings WHERE network = $1 AND day = (now() AT TIME ZONE 'UTC')::date`,
          [network, f.payer],
        );
        if (BigInt(day!.total) + f.fundedWei > f.dailyBoundWei) return { recorded: false, why: "daily_bound" };
        if (BigInt(day!.payer) + f.fundedWei > f.payerDailyBoundWei) return { recorded: false, why: "payer_daily_bound" };
        await tx.query(`INSERT INTO settlement_gas_fundings (network, approval_hash, approval_nonce, payer, payment_id, funded_wei, state) VALUES ($1, $2, $3, $4, $5, $6, 'funded')`, [
          network,
          f.approvalHash,
          f.approvalNonce,
          f.payer,
          f.paymentId,
          f.fundedWei.toString(),
        ]);
        return { recorded: true };
      });
    },

    /** The funding recorded for a payer's approval nonce, with its transaction. */
    async gasFunding(payer: string, approvalNonce: number): Promise<GasFunding | undefined> {
      const [row] = await db.query<FundingRow>(`${FUNDING_WITH_TX} WHERE f.network = $1 AND f.payer = $2 AND f.approval_nonce = $3`, [network, payer, approvalNonce]);
      return row && gasFundingOf(row);
    },

    /**
     * Takes over, for `paymentId`, a recorded funding that was never stored as a transaction and whose
     * payment can no longer send it (released or final: its run is over). True when taken.
     */
    async adoptGasFunding(payer: string, approvalNonce: number, paymentId: string): Promise<boolean> {
      const rows = await db.query(
        `UPDATE settlement_gas_fundings f SET payment_id = $4, updated_at = now()
         WHERE network = $1 AND payer = $2 AND approval_nonce = $3 AND state = 'funded'
           AND NOT EXISTS (SELECT 1 FROM settlement_outbox o WHERE o.network = f.network AND o.payment_id = f.payment_id AND o.kind = 'gas_funding' AND o.state <> 'dropped')
           AND NOT EXISTS (SELECT 1 FROM settlement_payments p WHERE p.network = f.network AND p.payment_id = f.payment_id AND p.state IN ('claimed', 'sent'))
         RETURNING 1`,
        [network, payer, approvalNonce, paymentId],
      );
      return rows.length > 0;
    },

    /** Forgets a recorded funding its payment could not send (no live transaction): it never counts against a bound, and another payment may fund the nonce. */
    async forgetGasFunding(payer: string, approvalNonce: number, paymentId: string): Promise<void> {
      await db.query(
        `DELETE FROM settlement_gas_fundings f WHERE network = $1 AND payer = $2 AND approval_nonce = $3 AND payment_id = $4 AND state = 'funded'
           AND NOT EXISTS (SELECT 1 FROM settlement_outbox o WHERE o.network = f.network AND o.payment_id = f.payment_id AND o.kind = 'gas_funding' AND o.state <> 'dropped')`,
        [network, payer, approvalNonce, paymentId],
      );
    },

    /** A funded approval landed (approved) or the funding was spent on something else (abused: the payer is never funded again). */
    async settleGasFunding(approvalHash: string, state: Exclude<GasFundingState, "funded">): Promise<boolean> {
      const rows = await db.query(`UPDATE settlement_gas_fundings SET state = $3, updated_at = now() WHERE network = $1 AND approval_hash = $2 AND state = 'funded' RETURNING 1`, [network, approvalHash, state]);
      return rows.length > 0;
    },

    /** Whether a payer once spent a gas funding on something else than its approval. */
    async fundingAbused(payer: string): Promise<boolean> {
      return (await db.query(`SELECT 1 FROM settlement_gas_fundings WHERE network = $1 AND payer = $2 AND state = 'abused'`, [network, payer])).length > 0;
    },

    /** A payment as the status API reads it. */
    async paymentRecord(paymentId: string): Promise<PaymentRecord | undefined> {
      return (await db.query<PaymentRecord>(`SELECT ${RECORD_COLUMNS} FROM settlement_payments WHERE network = $1 AND payment_id = $2`, [network, paymentId]))[0];
    },

    /** Payments of a payer with one of these nonces (its normalised forms); more than one only across schemes or tokens. */
    async paymentsByNonce(payer: string, nonces: readonly string[]): Promise<PaymentRecord[]> {
      return db.query<PaymentRecord>(`SELECT ${RECORD_COLUMNS} FROM settlement_payments WHERE network = $1 AND lower(payer) = lower($2) AND nonce = ANY($3) ORDER BY created_at LIMIT 10`, [network, payer, nonces]);
    },

    /** The payment a transaction (any attempt's hash) was sent for; none for a nonce filler. */
    async paymentIdByHash(hash: string): Promise<string | undefined> {
      const [row] = await db.query<{ payment_id: string }>(
        `SELECT payment_id FROM settlement_outbox WHERE network = $1 AND hashes @> ARRAY[$2]::text[] AND payment_id <> $3 ORDER BY id DESC LIMIT 1`,
        [network, hash.toLowerCase(), NONCE_FILLER_PAYMENT],
      );
      return row?.payment_id;
    },

    /** The payments a client's payment identifier is bound to, in one scope or in every scope. */
    async identifierBindings(identifier: string, scope?: string): Promise<{ paymentId: string; digest: string; scope: string }[]> {
      const rows = await db.query<{ payment_id: string; digest: string; scope: string }>(
        `SELECT payment_id, digest, scope FROM settlement_payment_identifiers WHERE network = $1 AND identifier = $2 AND ($3::text IS NULL OR scope = $3) ORDER BY created_at LIMIT 10`,
        [network, identifier, scope ?? null],
      );
      return rows.map((r) => ({ paymentId: r.payment_id, digest: r.digest, scope: r.scope }));
    },

    /**
     * Keeps the last refusal of a request nothing was sent for (`request`: the digest of the whole
     * request, payment-id.ts requestDigest), per tenant ('' without keys): its status says why, to
     * whoever sends that very request. An anonymous caller can make them: they are dropped after two
     * days, and beyond REFUSALS_KEPT per network the oldest go.
     */
    async recordRefusal(paymentId: string, request: string, refusal: { payer: string | null; tenant?: string; reason: string; message?: string }): Promise<void> {
      await db.query(
        `INSERT INTO settlement_refusals (network, payment_id, request, tenant, payer, reason, message) VALUES ($1, $2, $3, $4, $5, $6, $7)
         ON CONFLICT (network, payment_id, request, tenant) DO UPDATE SET reason = EXCLUDED.reason, message = EXCLUDED.message, updated_at = now()`,
        [network, paymentId, request, refusal.tenant ?? "", refusal.payer, refusal.reason, refusal.message?.slice(0, 500) ?? null],
      );
      if (Math.random() < 0.01) {
        await db.query(
          `DELETE FROM settlement_refusals r USING (
             SELECT payment_id, request, tenant FROM settlement_refusals WHERE network = $1 ORDER BY updated_at DESC OFFSET $2
           ) old WHERE r.network = $1 AND r.payment_id = old.payment_id AND r.request = old.request AND r.tenant = old.tenant`,
          [network, REFUSALS_KEPT],
        );
        await db.query(`DELETE FROM settlement_refusals WHERE network = $1 AND updated_at < now() - interval '2 days'`, [network]);
      }
    },

    async refusal(paymentId: string, request: string, tenant?: string): Promise<RefusalRecord | undefined> {
      const [row] = await db.query<RefusalRecord>(
        `SELECT payer, reason, message, ${iso("created_at")}, ${iso("updated_at")} FROM settlement_refusals WHERE network = $1 AND payment_id = $2 AND request = $3 AND tenant = $4`,
        [network, paymentId, request, tenant ?? ""],
      );
      return row;
    },

    /** A tenant that settled a payment (or was answered for it): it may read its status. */
    async addPaymentTenant(paymentId: string, tenant: string): Promise<void> {
      await db.query(`INSERT INTO settlement_payment_tenants (network, payment_id, tenant) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING`, [network, paymentId, tenant]);
    },

    async tenantOf(paymentId: string, tenant: string): Promise<boolean> {
      return (await db.query(`SELECT 1 FROM settlement_payment_tenants WHERE network = $1 AND payment_id = $2 AND tenant = $3`, [network, paymentId, tenant])).length > 0;
    },

    outboxForPayment: (paymentId: string): Promise<OutboxRow[]> => outboxTogether(paymentId),

    async outboxByHash(hash: string): Promise<OutboxRow | undefined> {
      return (await db.query<OutboxRow>(`SELECT ${OUTBOX_COLUMNS} FROM settlement_outbox WHERE network = $1 AND $2 = ANY(hashes)`, [network, hash]))[0];
    },

    /**
     * Open transactions of the given keys (a process can only drive transactions it can sign): each
     * key's unsent ones first, then by nonce, the keys taking turns, so one key's backlog never
     * hides another key's lowest nonces past the limit.
     */
    async openOutbox(signers: readonly string[], limit = 500): Promise<ListedOutboxRow[]> {
      // Listed without their bytes: a burst's pass lists hundreds a second and acts on few (openTransaction reads those).
      return db.query<ListedOutboxRow>(
        `SELECT ${LISTED_COLUMNS} FROM settlement_outbox JOIN (
           SELECT id AS listed_id, row_number() OVER (PARTITION BY signer ORDER BY state = 'broadcast', nonce) AS turn
           FROM settlement_outbox WHERE network = $1 AND state IN ('signed', 'broadcast') AND signer = ANY($2)
         ) t ON id = t.listed_id ORDER BY t.turn, id LIMIT $3`,
        [network, signers, limit],
      );
    },

    /** A listed transaction in full, if it is still open. */
    openTransaction: (id: string): Promise<OutboxRow | undefined> => openTogether(id),

    /**
     * Outbox gauges. Open rows (few, on a partial index) on every call; settled rows (every row the
     * network ever sent: a scan that grows with history) only when `settled` is asked for.
     */
    async stats(settled: boolean): Promise<{ states: Record<string, number>; oldestOpenSeconds: number; pendingBySigner: Record<string, number> }> {
      const open = await db.query<{ signer: string; state: string; n: number; age: number }>(
        `SELECT signer, state, count(*)::int AS n, EXTRACT(EPOCH FROM (now() - min(created_at)))::float8 AS age
         FROM settlement_outbox WHERE network = $1 AND state IN ('signed', 'broadcast') GROUP BY signer, state`,
        [network],
      );
      const states: Record<string, number> = { signed: 0, broadcast: 0 };
      const pendingBySigner: Record<string, number> = {};
      let oldestOpenSeconds = 0;
      for (const r of open) {
        states[r.state] = (states[r.state] ?? 0) + r.n;
        pendingBySigner[r.signer] = (pendingBySigner[r.signer] ?? 0) + r.n;
        oldestOpenSeconds = Math.max(oldestOpenSeconds, r.age);
      }
      if (settled) {
        const rows = await db.query<{ state: string; n: number }>(`SELECT state, count(*)::int AS n FROM settlement_outbox WHERE network = $1 AND state NOT IN ('signed', 'broadcast') GROUP BY state`, [network]);
        for (const r of rows) states[r.state] = r.n;
      }
      return { states, oldestOpenSeconds, pendingBySigner };
    },
  };
}

export type SettlementStore = ReturnType<typeof createSettlementStore>;
