// Exactly-once settlement. The invariant: only a `claimed` payment is executed, and it leaves
// `claimed` when its first decisive transaction is stored (store.ts allocateAndStore).
//
// Guarantees
// - A payment id (payment-id.ts) is claimed by exactly one request, on any replica, for one payment
//   (its digest); that request runs the mechanism. Retries (same id and digest) wait for and return
//   the recorded answer, the very same body from any replica.
// - A different payment with the same id (same nonce, another payee or amount) is refused as a used
//   nonce once the holder is `sent` or final, and is never answered from the record.
// - A `sent` payment is never executed again: only its transactions are driven to a receipt, and its
//   outcome is what the mechanism's own transaction did on chain (a gas funding or a wallet
//   deployment before it prepared the payment and moved none of its money: store.isDecisive).
// - Waits are bounded: past the bound the answer is `settlement_pending` with the transaction's
//   hash (built on read, never stored), and a retry reports the current state.
// Assumptions
// - Every process of a network shares one store, and its clock is close enough to the database's
//   that a lease (`leaseMs`) outlives a healthy run.
// - The mechanism signs only through the outbox signer, inside `settlementContext`, so the fence in
//   allocateAndStore sees every transaction of the payment.
// Caveats
// - A run that outlives its lease before sending anything loses the claim; its late answer is
//   `unexpected_settle_error` (retryable) and it stores nothing.
// - A refusal before any transaction releases the claim: a retry is judged afresh.
import { randomUUID } from "node:crypto";
import type { PaymentPayload, PaymentRequirements, SettleResponse } from "@x402/core/types";
import { erc20Abi, type Address, type Hex } from "viem";
import type { ChainClient } from "../chain.ts";
import type { GasMeter } from "./gas-meter.ts";
import type { PaymentPlan } from "../plan.ts";
import { SETTLEMENT_PENDING, SettlementBusyError, failureAnswer, pendingAnswer } from "./answers.ts";
import { settlementContext, type SettlementContext } from "./context.ts";
import { AUXILIARY_KINDS } from "./gas-policy.ts";
import { identifierScope, paymentDigest, paymentIdentity, paymentNonce, requestDigest } from "./payment-id.ts";
import { pollMined, sleep } from "./receipts.ts";
import { isDecisive, isFinal, type OutboxRow, type PaymentTerms, type SettlementStore } from "./store.ts";

export interface CoordinatorOptions {
  store: SettlementStore;
  chain: ChainClient;
  network: string;
  /** How long a caller waits for an outcome before answering settlement_pending. */
  waitBoundMs: number;
  confirmations: number;
  /** A claim with no transaction is taken over by another caller after this long. */
  leaseMs?: number;
  pollIntervalMs?: number;
  /**
   * Settlement webhooks (webhooks.ts): whether this facilitator's own receiver gets every payment's
   * events, and the tenant webhook URL a payment keeps (undefined: refused, or no signing secret).
   */
  webhooks?: { facilitator: boolean; tenantUrl(url: string | undefined): string | undefined };
}

export interface SettleJob {
  payload: PaymentPayload;
  requirements: PaymentRequirements;
  /** A key the transaction must be sent from (upto). */
  signer?: Address;
  /** Fields every success answer carries besides the transaction (upto: the settled amount). */
  extra?: Record<string, unknown>;
  /** A request with no replay identity (a batch sweep): its own id, so repeats are new settlements. */
  unique?: boolean;
  /** The client's payment identifier (payment-identifier extension): a retried unique request is the same settlement. */
  clientId?: string;
  /** The reference reason for an identity (nonce) that another payment already holds. */
  reusedReason: string;
  /** What the payment takes from its payer: reserved while in flight, so payments sharing a balance never overdraw it. */
  reservation?: { asset: Address; payer: Address; amount: bigint; insufficientReason: string };
  /** The caller's gas allowance and spend (the router's tenant budgets). */
  gas?: GasMeter;
  /** Every transaction the run may send (plan.ts); the signer refuses any other. */
  plan?: PaymentPlan;
  /** The API key (router tenant) it is settled under: only that tenant reads its status. */
  tenant?: string;
  /** The tenant's webhook URL, as its router sent it (FLEET_HEADERS.tenantWebhook). */
  webhook?: string;
  run: () => Promise<SettleResponse>;
}

const OPEN = new Set(["signed", "broadcast"]);

type StoredTransaction = NonNullable<SettlementContext["stored"]>[number];

/** What the payment pays and for whom, kept beside its claim for the status API. */
function termsOf(job: SettleJob): PaymentTerms {
  const { asset, payTo, amount } = job.requirements;
  return { token: asset.toLowerCase(), payTo: payTo.toLowerCase(), amount: /^\d{1,78}$/.test(amount) ? amount : undefined, nonce: paymentNonce(job.payload), tenant: job.tenant };
}

export function createSettlementCoordinator(opts: CoordinatorOptions) {
  // Claims are owned per request, not per process: two requests of one process must not pass for
  // each other when one takes over the other's expired claim.
  const processId = randomUUID();
  const leaseMs = opts.leaseMs ?? 30_000;
  const poll = opts.pollIntervalMs ?? 50;
  const { store, network } = opts;

  // Payments being executed in this process, by asset and payer: a hint that a reservation will need a balance.
  const settlingHere = new Map<string, number>();

  const failure = (reason: string, payer: string | null, message: string) => failureAnswer(network, reason, payer, message);

  /** Waits (bounded) for a `sent` payment's outcome; every caller gets the very same stored body. */
  async function awaitOutcome(paymentId: string, deadline: number, gas?: GasMeter): Promise<SettleResponse> {
    for (;;) {
      const row = (await store.payment(paymentId))!;
      if (isFinal(row)) return row.response;
      const txs = (await store.outboxForPayment(paymentId)).filter(isDecisive);
      const open = txs.filter((t) => OPEN.has(t.state));
      if (await recordOutcome(paymentId, txs, open, gas)) continue; // answered from the record
      // `sent` means a decisive transaction is stored, so a pending answer always names one.
      if (Date.now() >= deadline) return pendingAnswer(network, row.payer, (open[open.length - 1] ?? txs[txs.length - 1]!).hash);
      await sleep(poll);
    }
  }

  /**
   * Records the outcome of a `sent` payment when one is known: a receipt of an open transaction,
   * a mined one nobody recorded (its recorder died), or every transaction dropped long enough ago
   * that no run is still replacing it (a crash between dropping a nonce and taking the next).
   */
  async function recordOutcome(paymentId: string, txs: OutboxRow[], open: OutboxRow[], gas?: GasMeter): Promise<boolean> {
    for (const tx of open) {
      // One shared, budgeted poller per process; a watch per reorg, so a receipt of a block that left the chain is never reused.
      const mined = await pollMined(opts.chain, tx.hashes, opts.confirmations, tx.reorged_at ?? undefined);
      if (mined) {
        const { receipt } = mined;
        await store.recordMined(paymentId, tx.id, mined.hash, receipt.status === "success", receipt.gasUsed * receipt.effectiveGasPrice, { blockNumber: receipt.blockNumber, blockHash: receipt.blockHash });
        gas?.noteMined(tx.id, receipt);
        return true;
      }
    }
    if (open.length > 0) return false;
    const settled = txs.find((t) => t.state === "confirmed" || t.state === "reverted");
    if (settled) {
      await store.recordMined(paymentId, settled.id, settled.mined_hash!, settled.state === "confirmed");
      return true;
    }
    const last = txs[txs.length - 1];
    if (last && txs.every((t) => t.state === "dropped" && t.age_seconds * 1000 > leaseMs)) {
      await store.recordRejected(paymentId, last.reject_reason ?? "dropped", false);
      return true;
    }
    return false;
  }

  /** This caller holds the claim: run the mechanism, then record what happened. */
  async function execute(job: SettleJob, paymentId: string, payer: string | null, deadline: number, owner: string, stored: StoredTransaction[]): Promise<SettleResponse> {
    const key = job.reservation && `${job.reservation.asset}|${job.reservation.payer}`;
    if (key) settlingHere.set(key, (settlingHere.get(key) ?? 0) + 1);
    try {
      return await executeClaimed(job, paymentId, payer, deadline, owner, stored);
    } finally {
      if (key) {
        const left = settlingHere.get(key)! - 1;
        if (left > 0) settlingHere.set(key, left);
        else settlingHere.delete(key);
      }
    }
  }

  async function executeClaimed(job: SettleJob, paymentId: string, payer: string | null, deadline: number, owner: string, stored: StoredTransaction[]): Promise<SettleResponse> {
    let result: SettleResponse;
    try {
      const refusal = await reserve(job, paymentId, payer, owner);
      if (refusal) {
        await store.release(paymentId, owner);
        return refusal;
      }
      result = await settlementContext.run({ paymentId, owner, signer: job.signer, gas: job.gas, plan: job.plan && { ...job.plan, admitted: new Set() }, stored }, job.run);
    } catch (e) {
      await store.release(paymentId, owner); // a no-op when a transaction exists: that one is still driven to its end
      throw e;
    }
    // A run that outlived its lease lost the claim to another request (which may be another
    // payment): it stored nothing (the fence in allocateAndStore) and must not read their outcome.
    const row = await store.payment(paymentId);
    if (row?.owner !== owner) {
      throw new SettlementBusyError("this request took too long and another request took over this payment; retry /settle");
    }
    if (isFinal(row)) return row.response;
    if (row.state === "claimed") {
      if (!result.success) {
        await store.release(paymentId, owner); // refused before any transaction: a later retry may try again
        return result;
      }
      return (await store.record(paymentId, result, owner)) ?? answerOf(paymentId); // nothing to send (upto with 0)
    }
    // The answer names the mechanism's own transaction (a counterfactual wallet's deployment may come before it).
    const txs = (await store.outboxForPayment(paymentId)).filter(isDecisive);
    const confirmed = txs.filter((t) => t.state === "confirmed" && t.mined_hash);
    const mined = confirmed.find((t) => (t.hashes ?? [t.hash]).some((h) => h.toLowerCase() === String(result.transaction).toLowerCase())) ?? confirmed[confirmed.length - 1];
    if (result.success && mined) {
      // The mined hash may be a fee replacement of the one the mechanism sent.
      return (await store.record(paymentId, { ...result, transaction: mined.mined_hash! })) ?? answerOf(paymentId);
    }
    if (mined && txs.every((t) => t.state === "confirmed" || t.state === "dropped")) {
      // The mechanism gave up (its receipt wait ended) while another process saw the transaction
      // mined: the chain's outcome is the answer, never the mechanism's failure.
      await store.recordMined(paymentId, mined.id, mined.mined_hash!, true);
      return answerOf(paymentId);
    }
    if (!result.success && result.errorReason !== SETTLEMENT_PENDING && txs.every((t) => !OPEN.has(t.state))) {
      return (await store.record(paymentId, result)) ?? answerOf(paymentId);
    }
    // A transaction exists but its outcome is not known: drive it (bounded), never re-execute.
    return awaitOutcome(paymentId, deadline, job.gas);
  }

  /** The answer another process recorded first; none if the claim passed to another request meanwhile. */
  async function answerOf(paymentId: string): Promise<SettleResponse> {
    const row = await store.payment(paymentId);
    if (row && isFinal(row)) return row.response;
    throw new SettlementBusyError("another request took over this payment; retry /settle");
  }

  /**
   * Reserves the payment's amount against its payer's balance; a refusal when the payments in
   * flight for that payer would overdraw it (nothing is sent for the ones that cannot be covered).
   * The balance is read only when other payments of the payer are in flight.
   */
  async function reserve(job: SettleJob, paymentId: string, payer: string | null, owner: string): Promise<SettleResponse | undefined> {
    const r = job.reservation;
    if (!r || r.amount === 0n) return undefined;
    // Another payment of this payer running here: the store will ask for a balance, so read it first
    // (one reservation instead of two, each summing the payer's payments in flight).
    let balance = (settlingHere.get(`${r.asset}|${r.payer}`) ?? 0) > 1 ? await balanceOf(r.asset, r.payer) : undefined;
    for (;;) {
      const outcome = await store.reserve(paymentId, owner, r.asset, r.payer, r.amount, balance);
      if (outcome.reserved) return undefined;
      if (balance !== undefined) {
        return failure(r.insufficientReason, payer, `the payer's balance does not cover this payment besides ${outcome.inFlight} already being settled`);
      }
      balance = await balanceOf(r.asset, r.payer);
    }
  }

  // A payer's burst reads its balance once per round trip, not once per payment: a caller shares a
  // read only if that read started after it asked (so it is as fresh as one of its own); one that
  // asks while a read is in flight waits for the next, which everyone who asked meanwhile shares.
  const balanceReads = new Map<string, { inFlight?: Promise<bigint>; next?: Promise<bigint> }>();
  function balanceOf(asset: Address, holder: Address): Promise<bigint> {
    const key = `${asset}|${holder}`.toLowerCase();
    let reads = balanceReads.get(key);
    if (!reads) balanceReads.set(key, (reads = {}));
    const r = reads;
    const start = (): Promise<bigint> => {
      const read = opts.chain.client.readContract({ address: asset, abi: erc20Abi, functionName: "balanceOf", args: [holder] });
      r.inFlight = read;
      const done = () => {
        if (r.inFlight === read) r.inFlight = undefined;
        if (!r.inFlight && !r.next && balanceReads.get(key) === r) balanceReads.delete(key);
      };
      read.then(done, done);
      return read;
    };
    if (!r.inFlight) return start();
    if (!r.next) {
      const next = r.inFlight.then(
        () => undefined,
        () => undefined,
      ).then(() => {
        r.next = undefined;
        return start();
      });
      r.next = next;
    }
    return r.next;
  }

  /** Whether a client's payment identifier already names another payment (see identifierConflict). */
  const conflicts = (bound: { paymentId: string; digest: string } | undefined, id: string, digest: string) => bound !== undefined && (bound.paymentId !== id || bound.digest !== digest);

  /** The outcome of the payment's transaction as the chain has it, without the store: success once mined and deep enough, else pending. */
  async function answerFromChain(job: SettleJob, hash: Hex): Promise<SettleResponse> {
    const payer = paymentIdentity(job.payload, job.requirements).payer;
    const mined = await pollMined(opts.chain, [hash], opts.confirmations).catch(() => undefined);
    // A revert is left to the store's record (a reorg may still bring it back): pending until then.
    if (mined?.receipt.status === "success") return { success: true, transaction: mined.hash, network: network as SettleResponse["network"], ...(payer ? { payer } : {}), ...(job.extra ?? {}) };
    return pendingAnswer(network, payer, hash);
  }

  async function settleOnce(job: SettleJob, stored: StoredTransaction[]): Promise<SettleResponse> {
    const identity = paymentIdentity(job.payload, job.requirements);
    const digest = paymentDigest(job.payload, job.requirements);
    const { payer } = identity;
    const id = job.unique ? `${identity.id}:${job.clientId ?? randomUUID()}` : identity.id;
    const extra = job.extra ?? {};
    const deadline = Date.now() + opts.waitBoundMs;
    const owner = `${processId}:${randomUUID()}`;
    const terms = termsOf(job);
    if (opts.webhooks) {
      // A tenant's URL only with its tenant: its events are signed with that tenant's key.
      terms.webhookUrl = job.tenant ? opts.webhooks.tenantUrl(job.webhook) : undefined;
      terms.webhookFacilitator = opts.webhooks.facilitator;
    }
    for (;;) {
      const claim = await store.claim(id, digest, job.requirements.scheme, payer, extra, owner, leaseMs, terms);
      if (claim.claimed) return execute(job, id, payer, deadline, owner, stored);
      const row = claim.row;
      if (row.digest !== digest) {
        // Another payment holds this nonce. Once it is sent (or final) this one can never execute;
        // before that it may still be refused and release the id, so a forged body cannot lock
        // the genuine payment out: wait for that within the bound.
        if (row.state !== "claimed") return failure(job.reusedReason, payer, "this authorization's nonce is already used by another payment");
      } else {
        if (isFinal(row)) return row.response;
        if (row.state === "sent") return awaitOutcome(id, deadline);
      }
      if (row.lease_expired && (await store.takeOver(id, digest, extra, owner, leaseMs, terms))) return execute(job, id, payer, deadline, owner, stored);
      if (Date.now() >= deadline) throw new SettlementBusyError("another request is settling a payment with this nonce and has sent no transaction yet; retry /settle");
      await sleep(poll);
    }
  }

  return {
    processId,
    /**
     * Keeps a refusal of a payment nothing was sent for, so its status can say why (to whoever
     * holds that very payment: status.ts). Not for a unique request (a sweep has no identity to ask by).
     */
    async noteRefusal(job: Pick<SettleJob, "payload" | "requirements" | "unique" | "tenant">, answer: SettleResponse): Promise<void> {
      if (job.unique || answer.success || answer.transaction) return;
      const { id, payer } = paymentIdentity(job.payload, job.requirements);
      await store.recordRefusal(id, requestDigest(job.payload, job.requirements), { payer, tenant: job.tenant, reason: answer.errorReason ?? "unexpected_settle_error", message: answer.errorMessage });
    },
    /** A tenant was answered for a payment it sent or that is on chain: it may read the payment's status. */
    async noteTenant(job: Pick<SettleJob, "payload" | "requirements" | "unique" | "tenant">): Promise<void> {
      if (job.unique || !job.tenant) return;
      await store.addPaymentTenant(paymentIdentity(job.payload, job.requirements).id, job.tenant);
    },
    /**
     * The payment-identifier extension: whether the payer's identifier is already bound to a
     * different payment (read-only). Another payer's use of the same id is no conflict, nor is any
     * id of a payload no signer's own (claims, sweeps: see identifierScope).
     */
    async identifierConflict(identifier: string, payload: PaymentPayload, requirements: PaymentRequirements): Promise<boolean> {
      const identity = paymentIdentity(payload, requirements);
      const scope = identifierScope(payload, identity.payer);
      return scope !== undefined && conflicts(await store.identifierBinding(identifier, scope), identity.id, paymentDigest(payload, requirements));
    },
    /**
     * Binds the payer's identifier to this payment once it settled or sent a transaction (a refused
     * or forged payment never takes an id from the genuine one). First come per payer; idempotent
     * for retries.
     */
    async bindIdentifier(identifier: string, payload: PaymentPayload, requirements: PaymentRequirements): Promise<void> {
      const identity = paymentIdentity(payload, requirements);
      const scope = identifierScope(payload, identity.payer);
      if (scope !== undefined) await store.bindIdentifier(identifier, scope, identity.id, paymentDigest(payload, requirements));
    },
    /**
     * Settles a payment exactly once. The answer is the chain's truth: when the store fails after
     * this call stored the payment's own transaction, the answer is read from the chain (its
     * outcome, or settlement_pending with its hash), never an error; with nothing of the payment's
     * stored, a store failure is thrown (not a verdict: the caller answers 503).
     */
    async settle(job: SettleJob): Promise<SettleResponse> {
      const stored: StoredTransaction[] = [];
      try {
        return await settleOnce(job, stored);
      } catch (e) {
        const own = stored.filter((t) => !AUXILIARY_KINDS.includes(t.kind)).pop();
        if (!own) throw e;
        return answerFromChain(job, own.hash);
      }
    },
  };
}

export type SettlementCoordinator = ReturnType<typeof createSettlementCoordinator>;
