// The settlement status API as a resource server sees it (docs/facilitator-interface.md
// "Settlement status"): its answer's shape, a call by the payment itself, and a hook for the
// reference x402ResourceServer that turns a settle which did not say success (settlement_pending,
// a lost answer, a 503) into the payment's real outcome, within a bound, before the client is
// answered. It reports success only for a payment the facilitator says is settled (mined and as
// deep as its finality), and never turns a failure into anything else.
import type { PaymentPayload, PaymentRequirements, SettleResponse } from "@x402/core/types";

/** Our lifecycle of a settlement. */
export type SettlementState = "pending" | "submitted" | "confirmed" | "reorged" | "failed";
/** The protocol's status vocabulary (x402 PR #3325), as far as an EVM facilitator meets it. */
export type ProtocolStatus = "pending" | "settled" | "failed" | "blocked" | "expired" | "deferred_until";

export interface SettlementStatus {
  status: ProtocolStatus;
  /** Whether the status can still change (false: settled, failed for good, expired). */
  terminal: boolean;
  state: SettlementState;
  network: string;
  /** The facilitator's id of the payment (webhook events name it too). */
  paymentId: string;
  scheme: string;
  payer?: string;
  payTo?: string;
  asset?: string;
  /** What was settled (upto: the settled amount), or what the payment asks while it is not settled. */
  amount?: string;
  /** The transaction that decides the payment: the mined one once there is one, else the latest sent. */
  transaction?: string;
  blockNumber?: string;
  blockHash?: string;
  /** How deep its block is now (1: the head); absent while it is not mined, or when the chain cannot be read. */
  confirmations?: number;
  /** The network's finality target: a settlement is answered success, and final, at this depth. */
  finality: { confirmations: number };
  /** A reorg once took its transaction off the chain (what it had been answered then). */
  reorgedFrom?: "succeeded" | "failed";
  errorReason?: string;
  errorMessage?: string;
  /** ISO 8601, UTC. */
  createdAt: string;
  updatedAt: string;
  submittedAt?: string;
}

export interface StatusClientOptions {
  /** The facilitator's (or router's) base URL, ending in /v2: what HTTPFacilitatorClient is given. */
  url: string;
  /** Headers for each call (an API key: `{ "x-api-key": key }`). */
  headers?: () => Record<string, string> | Promise<Record<string, string>>;
  fetch?: typeof fetch;
}

/** The status of the very payment sent to /settle; undefined when the facilitator does not know it (404). */
export async function settlementStatusOf(opts: StatusClientOptions, payment: { paymentPayload: PaymentPayload; paymentRequirements: PaymentRequirements }): Promise<SettlementStatus | undefined> {
  const res = await (opts.fetch ?? fetch)(`${opts.url.replace(/\/$/, "")}/settlements/status`, {
    method: "POST",
    headers: { "content-type": "application/json", ...(await opts.headers?.()) },
    body: JSON.stringify({ x402Version: payment.paymentPayload.x402Version, ...payment }),
    signal: AbortSignal.timeout(10_000),
  });
  if (res.status === 404) return undefined;
  if (!res.ok) throw new Error(`settlement status: HTTP ${res.status}: ${(await res.text()).slice(0, 200)}`);
  return (await res.json()) as SettlementStatus;
}

type SettleFailure = { paymentPayload: unknown; requirements: unknown };

/**
 * An onSettleFailure hook for x402ResourceServer: asks the facilitator what became of the payment
 * while its settlement is in flight (claimed, sent, mined but not yet final): settled, it is
 * recovered (the client gets its resource and a success PAYMENT-RESPONSE); unknown, refused or
 * failed, or still in flight after `waitMs`, the failure stands (ask again later by hash or with
 * the payment, or take the webhook).
 */
export function recoverPendingSettlements(opts: StatusClientOptions & { waitMs?: number; intervalMs?: number }) {
  const waitMs = opts.waitMs ?? 30_000;
  const intervalMs = opts.intervalMs ?? 1_000;
  return async (context: SettleFailure): Promise<void | { recovered: true; result: SettleResponse }> => {
    const payment = { paymentPayload: context.paymentPayload as PaymentPayload, paymentRequirements: context.requirements as PaymentRequirements };
    const deadline = Date.now() + waitMs;
    for (;;) {
      const status = await settlementStatusOf(opts, payment).catch(() => undefined);
      if (status?.status === "settled" && status.transaction) {
        const result = { success: true, transaction: status.transaction, network: status.network, ...(status.payer ? { payer: status.payer } : {}), ...(status.amount ? { amount: status.amount } : {}) };
        return { recovered: true, result: result as SettleResponse };
      }
      // Waited for only while something is in flight: unknown (nothing was done) or refused, the failure stands at once.
      if (!status || status.state === "failed" || status.terminal || Date.now() + intervalMs > deadline) return;
      await new Promise((r) => setTimeout(r, intervalMs));
    }
  };
}
