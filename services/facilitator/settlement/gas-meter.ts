// What one /settle call may spend on gas, and what it did spend: the router's per-key daily gas
// budget (services/tenants) reserves an allowance before forwarding a settlement and charges what
// this meter reports afterwards, whatever the answer's status. The signer checks every transaction's
// worst case (gas limit x maxFeePerGas + value) against the allowance before signing, so an
// exhausted budget sends nothing; what is charged is what the signer lost: fees and value.
import type { TransactionReceipt } from "viem";
import type { TransactionKind } from "./gas-policy.ts";

import { CodedError } from "../../platform/errors.ts";
import { FLEET_HEADERS } from "../../platform/http.ts";

export const GAS_BUDGET_EXHAUSTED = "gas_budget_exhausted";

/** The transactions a scheme's settlement may sign (their ceilings bound its worst case). */
export const SCHEME_TRANSACTION_KINDS: Record<string, TransactionKind[]> = {
  exact: ["eip3009_transfer", "permit2_settle", "permit2_settle_with_permit"],
  upto: ["upto_settle", "upto_settle_with_permit"],
  "batch-settlement": ["batch_deposit", "batch_claim", "batch_settle", "batch_refund", "batch_withdraw", "batch_multicall"],
};

export class GasMeter {
  private committed = 0n;
  /** This call's transactions (outbox ids) and the value each carries. */
  private readonly sent = new Map<string, bigint>();
  private readonly costs = new Map<string, bigint>();
  /** The worst case of one settlement of this scheme at the current fee cap (set by the facilitator). */
  quote: bigint | undefined;

  /** `allowance` undefined: no limit, the meter only counts. */
  constructor(readonly allowance: bigint | undefined) {}

  /** Reads the allowance header; undefined when the caller sent none (a direct caller, or a keyless router). */
  static fromHeader(value: string | undefined): GasMeter | undefined {
    if (value === undefined) return undefined;
    if (value === "unlimited") return new GasMeter(undefined);
    return /^[0-9]{1,78}$/.test(value) ? new GasMeter(BigInt(value)) : undefined;
  }

  /** Commits a transaction's worst case; false (nothing committed) when it does not fit the allowance. */
  commit(worstWei: bigint): boolean {
    if (this.allowance !== undefined && this.committed + worstWei > this.allowance) return false;
    this.committed += worstWei;
    return true;
  }

  /** What is left of the allowance (for the refusal message). */
  remaining(): bigint | undefined {
    return this.allowance === undefined ? undefined : this.allowance - this.committed;
  }

  /** A transaction of this call left for the node (its outbox row), carrying `valueWei` (a gas funding's). */
  noteSent(outboxId: string, valueWei: bigint): void {
    this.sent.set(outboxId, valueWei);
  }

  /** A mined transaction's receipt; only this call's own transactions count. */
  noteMined(outboxId: string, receipt: MinedCost): void {
    const value = this.sent.get(outboxId);
    if (value !== undefined) this.costs.set(outboxId, signerCost(receipt, value));
  }

  /** Wei spent, once every transaction this call sent has a receipt; undefined while one has none. */
  spent(): bigint | undefined {
    if (this.costs.size < this.sent.size) return undefined;
    let total = 0n;
    for (const c of this.costs.values()) total += c;
    return total;
  }

  /** The answer's headers for the router: what was spent (once known) and the next reservation's size. */
  headers(): Record<string, string> {
    const spent = this.spent();
    return {
      ...(spent !== undefined ? { [FLEET_HEADERS.gasSpent]: spent.toString() } : {}),
      ...(this.quote !== undefined ? { [FLEET_HEADERS.gasQuote]: this.quote.toString() } : {}),
    };
  }

  /** An error answer carries the same headers: a 503 after a funding was mined still cost what it cost. */
  withHeaders(e: unknown): unknown {
    return e instanceof CodedError ? new CodedError(e.code, e.detail, e.status, { ...e.headers, ...this.headers() }) : e;
  }
}

export type MinedCost = Pick<TransactionReceipt, "gasUsed" | "effectiveGasPrice" | "status">;

/**
 * What a mined transaction took from its signer: gas used x effective price, the value it carried
 * unless it reverted (a reverted call keeps its value), and the L1 data fee where the receipt states
 * one (OP Stack nodes do; viem leaves it as the node's hex unless the chain has OP formatters).
 */
export function signerCost(receipt: MinedCost, valueWei: bigint): bigint {
  const l1Fee = (receipt as { l1Fee?: unknown }).l1Fee;
  const dataFee = typeof l1Fee === "bigint" ? l1Fee : typeof l1Fee === "string" && /^0x[0-9a-fA-F]{1,64}$/.test(l1Fee) ? BigInt(l1Fee) : 0n;
  return receipt.gasUsed * receipt.effectiveGasPrice + dataFee + (receipt.status === "success" ? valueWei : 0n);
}
