// What one /settle call may spend on gas, and what it did spend: the router's per-key daily gas
// budget (services/tenants) reserves an allowance before forwarding a settlement and charges what
// this meter reports afterwards. The signer checks every transaction's worst case (gas limit x
// maxFeePerGas) against the allowance before signing, so an exhausted budget sends nothing.
import type { TransactionKind } from "./gas-policy.ts";

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
  private readonly sent = new Set<string>();
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

  /** A transaction of this call left for the node (its outbox row). */
  noteSent(outboxId: string): void {
    this.sent.add(outboxId);
  }

  /** A mined transaction's cost (gas used x effective price); only this call's own transactions count. */
  noteMined(outboxId: string, costWei: bigint): void {
    if (this.sent.has(outboxId)) this.costs.set(outboxId, costWei);
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
}
