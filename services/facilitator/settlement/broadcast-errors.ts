// One table that turns a node's answer to eth_sendRawTransaction into what the outbox does next.
// Nodes word the same rejection differently (geth, reth, anvil, erigon, nethermind, besu); viem
// already maps the common texts to typed errors (getNodeError), and the table covers the rest.
import { FeeCapTooLowError, InsufficientFundsError, IntrinsicGasTooHighError, IntrinsicGasTooLowError, NonceTooHighError, NonceTooLowError, TipAboveFeeCapError, type BaseError } from "viem";
import { getNodeError } from "viem/utils";
import { safeMessage } from "../../platform/logger.ts";
import { isRpcUnavailable } from "../chain.ts";

export type BroadcastOutcome =
  /** The node has it already: as good as sent. */
  | "already_known"
  /** The nonce is used: by this very transaction (check) or by another one of the key. */
  | "nonce_too_low"
  /** The key cannot pay gas x fee. */
  | "insufficient_funds"
  /** Fees below what the node or the block accepts. */
  | "underpriced"
  /** Another transaction holds this nonce in the pool with fees at least as high. */
  | "replacement_underpriced"
  | "intrinsic_gas_too_low"
  | "exceeds_block_gas_limit"
  /** Accepted but queued behind a gap (some nodes refuse instead). */
  | "nonce_too_high"
  /** The node could not be asked (down, timeout, 5xx): nothing is known, try again. */
  | "unreachable"
  /** Anything else the node refused. */
  | "rejected";

interface Rule {
  outcome: BroadcastOutcome;
  /** viem's typed node errors, derived from the node's message. */
  types?: (new (...args: never[]) => Error)[];
  pattern: RegExp;
}

// Order matters: "replacement transaction underpriced" before "underpriced".
const RULES: Rule[] = [
  // geth/reth "already known", anvil "transaction already imported", erigon ALREADY_EXISTS,
  // nethermind AlreadyKnown, besu TRANSACTION_ALREADY_KNOWN
  { outcome: "already_known", pattern: /already known|already imported|known transaction|already exists|alreadyknown|transaction_already_known|tx already in mempool/i },
  // geth/reth/anvil/erigon "nonce too low", nethermind OldNonce, besu NONCE_TOO_LOW
  { outcome: "nonce_too_low", types: [NonceTooLowError], pattern: /nonce too low|oldnonce|nonce_too_low|nonce has already been used|nonce.*already.*used|nonce_expired/i },
  // geth/reth "insufficient funds for gas * price + value", nethermind InsufficientFunds, besu UPFRONT_COST_EXCEEDS_BALANCE
  { outcome: "insufficient_funds", types: [InsufficientFundsError], pattern: /insufficient funds|insufficientfunds|upfront_cost_exceeds_balance|insufficient balance for transfer|sender doesn't have enough funds/i },
  // geth/anvil "replacement transaction underpriced", erigon "could not replace existing tx", nethermind ReplacementNotAllowed/FeeTooLowToCompete, besu TRANSACTION_REPLACEMENT_UNDERPRICED
  { outcome: "replacement_underpriced", pattern: /replacement transaction underpriced|replacement_underpriced|could not replace existing tx|replacementnotallowed|feetoolowtocompete/i },
  // geth "transaction underpriced", "max fee per gas less than block base fee", erigon "fee cap less than block base fee",
  // nethermind FeeTooLow, besu GAS_PRICE_TOO_LOW / MAX_FEE_PER_GAS_BELOW_CURRENT_BASE_FEE, "tip above fee cap"
  {
    outcome: "underpriced",
    types: [FeeCapTooLowError, TipAboveFeeCapError],
    pattern: /underpriced|fee (cap|per gas) less than block base fee|max fee per gas less than|feetoolow|gas_price_too_low|below_current_base_fee|priority fee.*(higher|greater) than|tip_above_fee_cap|gas price below minimum|minimum.*tip/i,
  },
  // geth/anvil "intrinsic gas too low", besu INTRINSIC_GAS_EXCEEDS_GAS_LIMIT, nethermind IntrinsicGas
  { outcome: "intrinsic_gas_too_low", types: [IntrinsicGasTooLowError], pattern: /intrinsic gas too low|intrinsic_gas_exceeds_gas_limit|gas too low|intrinsicgas/i },
  // geth "exceeds block gas limit", anvil "intrinsic gas too high -- tx.gas_limit > env.block.gas_limit", besu EXCEEDS_BLOCK_GAS_LIMIT, nethermind GasLimitExceeded
  { outcome: "exceeds_block_gas_limit", types: [IntrinsicGasTooHighError], pattern: /exceeds block gas limit|exceeds_block_gas_limit|gas_limit > env.block.gas_limit|gaslimitexceeded|intrinsic gas too high/i },
  { outcome: "nonce_too_high", types: [NonceTooHighError], pattern: /nonce too high|noncegap|nonce_too_far_in_future/i },
  { outcome: "unreachable", pattern: /fetch failed|econnrefused|econnreset|ehostunreach|timed? ?out|socket hang up|http request failed|status: 5\d\d|\b50[234]\b|rate limit|429|too many requests/i },
];

/** Every message an error chain carries (viem nests the node's text in details and causes). */
function texts(e: unknown): string {
  const parts: string[] = [];
  let cur: unknown = e;
  for (let i = 0; cur && i < 8; i++) {
    const err = cur as { name?: string; message?: string; details?: string; shortMessage?: string; cause?: unknown };
    parts.push(err.name ?? "", err.details ?? "", err.shortMessage ?? "", String(err.message ?? cur).split("\n")[0]!);
    cur = err.cause;
  }
  return parts.join(" | ");
}

function hasType(e: unknown, types: Rule["types"]): boolean {
  if (!types) return false;
  let cur: unknown = e;
  for (let i = 0; cur && i < 8; i++) {
    if (types.some((t) => cur instanceof t)) return true;
    cur = (cur as { cause?: unknown }).cause;
  }
  return false;
}

/** Classifies a failed broadcast. */
export function classifySendError(e: unknown): BroadcastOutcome {
  let derived: unknown;
  try {
    derived = getNodeError(e as BaseError, {});
  } catch {
    derived = undefined;
  }
  const text = texts(e);
  for (const rule of RULES) {
    if (hasType(e, rule.types) || hasType(derived, rule.types) || rule.pattern.test(text)) return rule.outcome;
  }
  // No answer about the transaction (a timeout, a rate limit, a provider's internal error): it may
  // be on its way, so it is sent again, and its nonce is never filled.
  return isRpcUnavailable(e) ? "unreachable" : "rejected";
}

/** A short, URL-free line for logs and the outbox row. */
export function broadcastErrorLine(e: unknown): string {
  const err = e as { details?: string; shortMessage?: string; message?: string };
  return safeMessage(String(err?.details ?? err?.shortMessage ?? err?.message ?? e), 200);
}
