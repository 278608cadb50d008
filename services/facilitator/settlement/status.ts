// What became of a payment: the status API. A resource server that got settlement_pending, a
// timeout or a dropped connection names the payment by what it holds (the transaction hash, its
// payment identifier, the payer and nonce, or the very payment it sent to /settle) and reads the
// state the store and the chain agree on. Never a guess: an unknown payment is 404, a name that
// fits two payments is 409, and a failure is reported only once it is recorded (nothing was or
// will be sent for it).
//
// Vocabulary (docs/facilitator-interface.md): `state` is our lifecycle, `status` the protocol's
// (x402 PR #3325), derived from it.
//   state       status                         meaning
//   pending     pending                        claimed by a /settle, nothing sent yet
//   submitted   pending                        a transaction is sent, no receipt yet
//   confirmed   pending, settled once final    mined with success, `confirmations` of `finality` deep
//   reorged     pending                        its transaction left the chain; it is being sent again
//   failed      failed | blocked | expired | deferred_until
//                                              recorded failure (a revert, a refusal for good), or a
//                                              refusal before anything was sent (status by reason)
import type { PaymentPayload, PaymentRequirements } from "@x402/core/types";
import type { ChainClient } from "../chain.ts";
import { RequestError } from "../../x402/errors.ts";
import type { ProtocolStatus, SettlementState, SettlementStatus } from "../../x402/settlement-status.ts";
import { identifierScope, nonceForms, paymentDigest, paymentIdentity, requestDigest } from "./payment-id.ts";
import { isDecisive, type OutboxRow, type PaymentRecord, type SettlementStore } from "./store.ts";
import { isCanonical } from "./receipts.ts";

export type { ProtocolStatus, SettlementState, SettlementStatus } from "../../x402/settlement-status.ts";

const TERMINAL: ReadonlySet<ProtocolStatus> = new Set(["settled", "failed", "expired"]);

export interface StatusOptions {
  store: SettlementStore;
  chain: ChainClient;
  network: string;
  confirmations: number;
  /** The reason a payment gets whose nonce another payment holds (scheme-specific). */
  reusedReason(payload: PaymentPayload, requirements: PaymentRequirements): string;
}

/** Who asks: with API keys, a tenant reads only its own payments (another's is not found, never forbidden). */
export interface StatusCaller {
  tenant?: string;
}

type Mined = { hash: string; blockNumber: bigint; blockHash: string };

const HASH = /^0x[0-9a-fA-F]{64}$/;
/** The payment-identifier extension's id (@x402/extensions): what a stored identifier can be. */
const IDENTIFIER = /^[A-Za-z0-9_-]{16,128}$/;
const ADDRESS = /^0x[0-9a-fA-F]{40}$/;

export function createSettlementStatus(opts: StatusOptions) {
  const { store, network } = opts;
  const finality = { confirmations: opts.confirmations };

  // The head, read at most four times a second however many ask (an anonymous endpoint: its chain
  // reads are bounded); a depth may trail a block just mined, never lead it.
  let head: { at: number; value: Promise<bigint | undefined> } | undefined;
  function headBlock(): Promise<bigint | undefined> {
    if (!head || Date.now() - head.at > 250) head = { at: Date.now(), value: opts.chain.client.getBlockNumber({ cacheTime: 0 }).catch(() => undefined) };
    return head.value;
  }

  const notFound = (what: string) => new RequestError("payment_not_found", `no settlement on ${network} ${what}`);
  /** Without keys anyone who names a payment reads it; with keys, a tenant that settled it (or was answered for it). */
  async function visible(record: PaymentRecord | undefined, caller: StatusCaller): Promise<PaymentRecord | undefined> {
    if (!record || caller.tenant === undefined || record.tenant === caller.tenant) return record;
    return (await store.tenantOf(record.payment_id, caller.tenant)) ? record : undefined;
  }

  // Receipts of payments not recorded yet, per attempt hash, kept a moment: many askers of one payment make one lookup.
  const receipts = new Map<string, { at: number; value: Promise<Mined | undefined> }>();
  function receiptOf(hash: `0x${string}`): Promise<Mined | undefined> {
    const cached = receipts.get(hash);
    if (cached && Date.now() - cached.at < 500) return cached.value;
    if (receipts.size > 10_000) receipts.clear();
    const value = (async () => {
      const receipt = await opts.chain.client.getTransactionReceipt({ hash }).catch(() => undefined);
      if (receipt?.status !== "success") return undefined;
      return (await isCanonical(opts.chain, receipt)) ? { hash, blockNumber: receipt.blockNumber, blockHash: receipt.blockHash } : undefined;
    })();
    receipts.set(hash, { at: Date.now(), value });
    return value;
  }

  /** A receipt of the latest sent attempt of a payment whose outcome is not recorded yet (mined with success, or none). */
  async function minedNow(tx: OutboxRow): Promise<Mined | undefined> {
    for (const hash of [...tx.hashes].reverse().slice(0, 3)) {
      const mined = await receiptOf(hash);
      if (mined) return mined;
    }
    return undefined;
  }

  async function describe(record: PaymentRecord): Promise<SettlementStatus> {
    const txs = (await store.outboxForPayment(record.payment_id)).filter(isDecisive);
    const latest = txs[txs.length - 1];
    const base = {
      network,
      paymentId: record.payment_id,
      scheme: record.scheme,
      ...(record.payer ? { payer: record.payer } : {}),
      ...(record.pay_to ? { payTo: record.pay_to } : {}),
      ...(record.token ? { asset: record.token } : {}),
      ...(record.amount ? { amount: record.amount } : {}),
      finality,
      ...(record.reorged_from === "succeeded" || record.reorged_from === "failed" ? { reorgedFrom: record.reorged_from as "succeeded" | "failed" } : {}),
      createdAt: record.created_at,
      updatedAt: record.updated_at,
      ...(txs[0] ? { submittedAt: txs[0].created_at } : {}),
    };
    const depth = async (blockNumber: bigint) => {
      const now = await headBlock();
      return now !== undefined && now >= blockNumber ? Number(now - blockNumber + 1n) : undefined;
    };
    const at = (block: { blockNumber: bigint; blockHash: string }) => ({ blockNumber: block.blockNumber.toString(), blockHash: block.blockHash });

    if (record.state === "succeeded" && record.response) {
      const transaction = record.response.transaction;
      const mined = txs.find((t) => t.mined_hash && t.mined_hash.toLowerCase() === transaction.toLowerCase());
      const block = mined?.mined_block_number ? { blockNumber: BigInt(mined.mined_block_number), blockHash: mined.mined_block_hash ?? "" } : undefined;
      const confirmations = block && (await depth(block.blockNumber));
      const settledAmount = typeof record.response.amount === "string" ? { amount: record.response.amount } : {};
      return { ...base, ...settledAmount, status: "settled", terminal: true, state: "confirmed", transaction, ...(block ? at(block) : {}), ...(confirmations ? { confirmations } : {}) };
    }
    if (record.state === "failed" && record.response) {
      const { transaction, errorReason, errorMessage } = record.response;
      return { ...base, status: "failed", terminal: true, state: "failed", ...(transaction ? { transaction } : {}), ...(errorReason ? { errorReason } : {}), ...(errorMessage ? { errorMessage } : {}) };
    }
    if (record.state === "claimed" || !latest) return { ...base, status: "pending", terminal: false, state: "pending" };
    // `sent`: the chain may already hold its receipt before anyone recorded it (a reorged one's new outcome too).
    const open = [...txs].reverse().find((t) => t.state === "signed" || t.state === "broadcast") ?? latest;
    const mined = open.state === "confirmed" && open.mined_hash && open.mined_block_number ? { hash: open.mined_hash, blockNumber: BigInt(open.mined_block_number), blockHash: open.mined_block_hash ?? "" } : await minedNow(open);
    if (mined) {
      // Mined, not yet recorded: `settled` only once the engine records it (its receipt watched to
      // the finality depth, as /settle answers), never on a chain read here alone.
      const confirmations = await depth(mined.blockNumber);
      return { ...base, status: "pending", terminal: false, state: "confirmed", transaction: mined.hash, ...at(mined), ...(confirmations ? { confirmations } : {}) };
    }
    const state: SettlementState = record.reorged_from ? "reorged" : "submitted";
    return { ...base, status: "pending", terminal: false, state, transaction: open.hash };
  }

  const answer = async (record: PaymentRecord) => ({ status: 200, body: await describe(record) });

  return {
    /** GET: by transaction hash, by payment identifier (and payer), or by payer and nonce (and asset, scheme). */
    async lookup(query: Record<string, unknown>, caller: StatusCaller = {}) {
      const param = (name: string) => {
        const v = query[name];
        if (v === undefined) return undefined;
        if (typeof v !== "string" || !/^[\x21-\x7e]{1,200}$/.test(v)) throw new RequestError("invalid_status_query", `${name} must be one value of printable ASCII`);
        return v;
      };
      const [transaction, identifier, payer, nonce, asset, scheme, asked] = ["transaction", "paymentIdentifier", "payer", "nonce", "asset", "scheme", "network"].map(param);
      if (asked !== undefined && asked !== network) throw new RequestError("invalid_status_query", `this facilitator serves ${network}, not ${asked}`);
      if (payer !== undefined && !ADDRESS.test(payer)) throw new RequestError("invalid_status_query", "payer must be a 0x-prefixed address");
      const selectors = [transaction, identifier, nonce].filter((s) => s !== undefined).length;
      if (selectors !== 1) throw new RequestError("invalid_status_query", "name the payment by exactly one of: transaction, paymentIdentifier (with payer when several payers used it), payer and nonce");

      if (transaction !== undefined) {
        if (!HASH.test(transaction)) throw new RequestError("invalid_status_query", "transaction must be a 0x-prefixed 32-byte hash");
        const id = await store.paymentIdByHash(transaction);
        const record = await visible(id === undefined ? undefined : await store.paymentRecord(id), caller);
        if (!record) throw notFound(`sent in transaction ${transaction}`);
        return answer(record);
      }
      if (identifier !== undefined) {
        if (!IDENTIFIER.test(identifier)) throw new RequestError("invalid_status_query", "paymentIdentifier is 16 to 128 of A-Z a-z 0-9 _ -");
        const bound = await store.identifierBindings(identifier, payer ? `payer:${payer.toLowerCase()}` : undefined);
        const records = (await Promise.all(bound.map(async (b) => await visible(await store.paymentRecord(b.paymentId), caller)))).filter((r) => r !== undefined && bound.some((b) => b.paymentId === r.payment_id && b.digest === r.digest));
        if (records.length === 0) throw notFound(`with payment identifier ${identifier}${payer ? ` of ${payer}` : ""} (an identifier is bound once its payment sent a transaction)`);
        if (records.length > 1) throw new RequestError("ambiguous_payment", `${records.length} payers used payment identifier ${identifier}: add payer=<address>`);
        return answer(records[0]!);
      }
      if (payer === undefined) throw new RequestError("invalid_status_query", "nonce needs payer=<address>");
      const forms = nonceForms(nonce!);
      if (forms.length === 0) throw new RequestError("invalid_status_query", "nonce must be a decimal or 0x-prefixed hex number under 2^256");
      // A claim that sent nothing is not shown by name: it may be a forged body's, refused a moment later.
      const named = (await store.paymentsByNonce(payer, forms)).filter((r) => r.state !== "claimed" && (asset === undefined || r.token === asset.toLowerCase()) && (scheme === undefined || r.scheme === scheme));
      const records = (await Promise.all(named.map((r) => visible(r, caller)))).filter((r) => r !== undefined);
      if (records.length === 0) throw notFound(`of ${payer} with nonce ${nonce}`);
      if (records.length > 1) throw new RequestError("ambiguous_payment", `${records.length} payments of ${payer} use nonce ${nonce} (${records.map((r) => `${r.scheme} of ${r.token}`).join(", ")}): add asset=<token> or scheme=<scheme>`);
      return answer(records[0]!);
    },

    /**
     * POST: the very payment a resource server sent to /settle (same envelope). Only this form
     * also reports a refusal with nothing sent: it is shown to whoever holds the signed payment,
     * never to someone naming its payer and nonce (a forged body must not speak for the genuine one).
     */
    async ofPayment(payload: PaymentPayload, requirements: PaymentRequirements, caller: StatusCaller = {}) {
      const { id, payer } = paymentIdentity(payload, requirements);
      const digest = paymentDigest(payload, requirements);
      const record = await store.paymentRecord(id);
      const seen = await visible(record, caller);
      if (seen && seen.digest === digest) return answer(seen);
      if (seen && seen.digest !== digest && seen.state !== "claimed") {
        // Another payment holds this authorization's nonce and went ahead: this one can never execute.
        const now = new Date().toISOString();
        const body: SettlementStatus = {
          status: "failed",
          terminal: true,
          state: "failed",
          network,
          paymentId: id,
          scheme: requirements.scheme,
          ...(payer ? { payer } : {}),
          finality,
          errorReason: opts.reusedReason(payload, requirements),
          errorMessage: "this authorization's nonce is used by another payment",
          createdAt: now,
          updatedAt: now,
        };
        return { status: 200, body };
      }
      const refusal = await store.refusal(id, requestDigest(payload, requirements), caller.tenant);
      if (refusal) {
        const status = refusalStatus(refusal.reason);
        const body: SettlementStatus = {
          status,
          terminal: TERMINAL.has(status),
          state: "failed",
          network,
          paymentId: id,
          scheme: requirements.scheme,
          ...(refusal.payer ? { payer: refusal.payer } : {}),
          payTo: requirements.payTo.toLowerCase(),
          asset: requirements.asset.toLowerCase(),
          amount: requirements.amount,
          finality,
          errorReason: refusal.reason,
          ...(refusal.message ? { errorMessage: refusal.message } : {}),
          createdAt: refusal.created_at,
          updatedAt: refusal.updated_at,
        };
        return { status: 200, body };
      }
      throw notFound(`for this payment (it was never settled here${identifierScope(payload, payer) ? "" : ", or it has no identity to find it by"})`);
    },
  };
}

/**
 * The protocol status of a refusal with nothing sent, by its reason. Only what this very request
 * can never overcome is final: an authorization past its validity (expired), a nonce already used,
 * a signature that does not verify (failed). One not valid yet can pay later (deferred_until);
 * anything else (funds, screening, budgets, a simulation that failed) may pass on a later /settle
 * of the same request (blocked).
 */
export function refusalStatus(reason: string): ProtocolStatus {
  if (/valid_before|expired/.test(reason)) return "expired";
  if (/valid_after/.test(reason)) return "deferred_until";
  if (/nonce|signature/.test(reason)) return "failed";
  return "blocked";
}

export type SettlementStatusService = ReturnType<typeof createSettlementStatus>;
