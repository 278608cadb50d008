// The /settle answers the settlement engine gives, built from the facts the store keeps (a mined
// hash, a receipt's status, a decoded revert, a node's refusal). One place for their shape, so an
// answer recorded by any process, or built on read for a payment still in flight, is the same body.
import type { SettleResponse } from "@x402/core/types";

/** The transaction is sent but not mined within the caller's bound: a retry reports its outcome. */
export const SETTLEMENT_PENDING = "settlement_pending";
/** A defect of ours with nothing stored for the payment (never for one that may have moved money). */
export const UNEXPECTED_SETTLE_ERROR = "unexpected_settle_error";

/**
 * Another request holds the payment's claim and has stored no transaction yet (or took it over
 * from this one): not a verdict, answered 503 with Retry-After; a retry gets the payment's outcome.
 */
export class SettlementBusyError extends Error {
  override name = "SettlementBusyError";
}
/** A transaction that reverted with no decoded reason, or that a node refused for good. */
export const TRANSACTION_FAILED = "invalid_transaction_state";

type Network = SettleResponse["network"];
const payerOf = (payer: string | null | undefined) => (payer ? { payer } : {});

/** A failure answer (a refusal, a busy claim, a payment in flight). */
export function failureAnswer(network: string, reason: string, payer: string | null, message: string, transaction = ""): SettleResponse {
  return { success: false, errorReason: reason, errorMessage: message, transaction, network: network as Network, ...payerOf(payer) };
}

/** Built on read, never stored: the payment has a transaction that is not mined yet. */
export const pendingAnswer = (network: string, payer: string | null, transaction: string): SettleResponse =>
  failureAnswer(network, SETTLEMENT_PENDING, payer, "the transaction is not mined yet; retry /settle to get its outcome", transaction);

/** The outcome of the payment's mined transaction. */
export function minedAnswer(
  network: string,
  payment: { payer: string | null; success_extra: Record<string, unknown> },
  minedHash: string,
  success: boolean,
  revert?: { reason: string | null; message: string | null },
): SettleResponse {
  if (success) return { success: true, transaction: minedHash, network: network as Network, ...payerOf(payment.payer), ...payment.success_extra };
  return failureAnswer(network, revert?.reason ?? TRANSACTION_FAILED, payment.payer, revert?.message ?? "the settlement transaction reverted", minedHash);
}

/** The node refused the payment's transaction for good (its nonce was retired): nothing moved. */
export const rejectedAnswer = (network: string, payer: string | null, reason: string): SettleResponse =>
  failureAnswer(network, TRANSACTION_FAILED, payer, `the node refused the settlement transaction (${reason}); nothing was transferred`);
