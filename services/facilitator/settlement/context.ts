// Carries the payment being settled into the signer: the reference mechanisms call
// writeContract without knowing about payments, and the outbox must record which payment each
// transaction belongs to.
import { AsyncLocalStorage } from "node:async_hooks";
import type { Address, Hex } from "viem";
import type { TransactionKind } from "./gas-policy.ts";
import type { GasMeter } from "./gas-meter.ts";
import type { PaymentPlan } from "../plan.ts";

export interface SettlementContext {
  paymentId: string;
  /** The claim this run holds: a transaction is stored only while it still does (store.allocateAndStore). */
  owner?: string;
  /** A key the transaction must come from (upto: the key named in witness.facilitator). */
  signer?: Address;
  /**
   * Set by the signer when the settlement call failed in a way it understands (a decoded revert at
   * estimateGas or on chain, a gas ceiling, a refused broadcast): the reason code and one clean line.
   */
  failure?: { code: string; message: string };
  /** The caller's gas allowance (a tenant's budget), checked before each transaction is signed. */
  gas?: GasMeter;
  /** What the payment may make the signer send (plan.ts): every transaction of the run is admitted by it first. */
  plan?: PaymentPlan;
  /**
   * Every transaction this run stored in the outbox (so may have sent), in order: what an answer
   * rests on when the store fails afterwards (coordinator.ts answers from the chain then).
   */
  stored?: { hash: Hex; kind: TransactionKind }[];
}

export const settlementContext = new AsyncLocalStorage<SettlementContext>();
