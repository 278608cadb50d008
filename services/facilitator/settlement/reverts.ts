// Why a settlement call reverted, as a reference reason code and one clean line. Revert data is
// decoded with the contracts' ABIs (@x402/evm: EIP-3009 token, exact and upto Permit2 proxies;
// the Permit2 and ERC-20 standard errors they bubble up; Error(string) and Panic(uint256)), then
// mapped per kind of transaction. A raw node error may quote calldata and the RPC URL: neither
// ever reaches an answer.
import { decodeErrorResult, decodeFunctionData, erc20Abi, isAddressEqual, parseAbi, type Abi, type Address, type Hex } from "viem";
import { eip3009ABI, x402ExactPermit2ProxyABI, x402UptoPermit2ProxyABI, x402UptoPermit2ProxyAddress } from "@x402/evm";
import type { SettleResponse } from "@x402/core/types";
import type { ChainClient } from "../chain.ts";
import { safeMessage } from "../../platform/logger.ts";
import { SETTLEMENT_PENDING, TRANSACTION_FAILED } from "./answers.ts";
import { settlementContext } from "./context.ts";
import type { TransactionKind } from "./gas-policy.ts";

export interface RevertExplanation {
  code: string;
  message: string;
}

// Errors of Permit2 and of OpenZeppelin ERC-20 tokens (the standard interfaces' definitions): the
// proxies and tokens let them bubble up unchanged.
const STANDARD_ERRORS = parseAbi([
  "error InvalidNonce()",
  "error SignatureExpired(uint256 signatureDeadline)",
  "error InvalidSigner()",
  "error InvalidSignature()",
  "error InvalidSignatureLength()",
  "error InvalidContractSignature()",
  "error InsufficientAllowance(uint256 amount)",
  "error AllowanceExpired(uint256 deadline)",
  "error ERC20InsufficientBalance(address sender, uint256 balance, uint256 needed)",
  "error ERC20InsufficientAllowance(address spender, uint256 allowance, uint256 needed)",
]);

const ERROR_ABI = [...eip3009ABI, ...x402ExactPermit2ProxyABI, ...x402UptoPermit2ProxyABI, ...STANDARD_ERRORS].filter((e) => (e as { type: string }).type === "error") as Abi;

type Rule = [RegExp, string];

const BALANCE = /exceeds balance|insufficient balance|ERC20InsufficientBalance|transfer amount exceeds/i;
const PERMIT2_RULES: Rule[] = [
  [BALANCE, "permit2_insufficient_balance"],
  [/InsufficientAllowance|exceeds allowance|AllowanceExpired/i, "permit2_allowance_required"],
  [/InvalidNonce/, "permit2_invalid_nonce"],
  [/SignatureExpired/, "permit2_deadline_expired"],
  [/InvalidSigner|InvalidSignature|InvalidContractSignature/, "invalid_permit2_signature"],
  [/PaymentTooEarly/, "permit2_payment_too_early"],
  [/Permit2612AmountMismatch/, "permit2_2612_amount_mismatch"],
  [/InvalidAmount/, "permit2_invalid_amount"],
  [/InvalidDestination/, "permit2_invalid_destination"],
  [/InvalidOwner/, "permit2_invalid_owner"],
  [/InvalidPermit2Address/, "permit2_proxy_not_deployed"],
];

// Per kind: the first matching rule names the code; the last entry is the kind's generic failure.
const RULES: Record<TransactionKind, { rules: Rule[]; fallback: string }> = {
  eip3009_transfer: {
    rules: [
      [/authorization is used|used or canceled|AuthorizationAlreadyUsed|AuthorizationUsedOrCanceled/i, "invalid_exact_evm_nonce_already_used"],
      [BALANCE, "invalid_exact_evm_insufficient_balance"],
      [/authorization is expired|AuthorizationExpired/i, "invalid_exact_evm_payload_authorization_valid_before"],
      [/not yet valid|AuthorizationNotYetValid/i, "invalid_exact_evm_payload_authorization_valid_after"],
      [/invalid signature|SignerMismatch|InvalidSignature/i, "invalid_exact_evm_signature"],
    ],
    fallback: "invalid_exact_evm_transaction_failed",
  },
  permit2_settle: { rules: PERMIT2_RULES, fallback: "invalid_exact_evm_transaction_failed" },
  permit2_settle_with_permit: { rules: PERMIT2_RULES, fallback: "invalid_exact_evm_transaction_failed" },
  upto_settle: {
    rules: [[/AmountExceedsPermitted/, "upto_amount_exceeds_permitted"], [/UnauthorizedFacilitator/, "upto_unauthorized_facilitator"], ...PERMIT2_RULES],
    fallback: "invalid_upto_evm_transaction_failed",
  },
  upto_settle_with_permit: {
    rules: [[/AmountExceedsPermitted/, "upto_amount_exceeds_permitted"], [/UnauthorizedFacilitator/, "upto_unauthorized_facilitator"], ...PERMIT2_RULES],
    fallback: "invalid_upto_evm_transaction_failed",
  },
  batch_deposit: { rules: [[BALANCE, "invalid_batch_settlement_evm_insufficient_balance"]], fallback: "invalid_batch_settlement_evm_deposit_transaction_failed" },
  batch_claim: { rules: [[/ClaimExceedsBalance/, "invalid_batch_settlement_evm_cumulative_exceeds_balance"]], fallback: "invalid_batch_settlement_evm_claim_transaction_failed" },
  batch_settle: { rules: [], fallback: "invalid_batch_settlement_evm_settle_transaction_failed" },
  batch_refund: { rules: [], fallback: "invalid_batch_settlement_evm_refund_transaction_failed" },
  batch_withdraw: { rules: [], fallback: "invalid_transaction_state" },
  batch_multicall: { rules: [], fallback: "invalid_transaction_state" },
  nonce_filler: { rules: [], fallback: "invalid_transaction_state" },
  gas_funding: { rules: [], fallback: "erc20_approval_broadcast_failed" },
  wallet_deployment: { rules: [], fallback: "smart_wallet_deployment_failed" },
  other: { rules: [], fallback: "invalid_transaction_state" },
};

/** Revert data somewhere in a viem error chain (RPC error data, RawContractError, ...). */
export function revertDataOf(e: unknown): Hex | undefined {
  let cur: unknown = e;
  for (let i = 0; cur && i < 10; i++) {
    const c = cur as { data?: unknown; cause?: unknown };
    const data = typeof c.data === "object" && c.data !== null ? (c.data as { data?: unknown }).data : c.data;
    if (typeof data === "string" && /^0x[0-9a-fA-F]{8,}$/.test(data)) return data as Hex;
    cur = c.cause;
  }
  return undefined;
}

/** A node's own revert text when it gave no data ("execution reverted: <reason>"). */
function revertTextOf(e: unknown): string | undefined {
  let cur: unknown = e;
  for (let i = 0; cur && i < 10; i++) {
    const c = cur as { details?: unknown; shortMessage?: unknown; message?: unknown; cause?: unknown };
    for (const t of [c.details, c.shortMessage]) {
      const m = typeof t === "string" ? /reverted(?: with reason)?:?\s*(.+)/i.exec(t) : null;
      if (m && m[1]!.trim()) return m[1]!.trim();
    }
    cur = c.cause;
  }
  return undefined;
}

/** Decodes revert data into a short description: `Error name(args)`, the revert string, or the panic. */
export function describeRevertData(data: Hex): string {
  try {
    const decoded = decodeErrorResult({ abi: ERROR_ABI, data });
    if (decoded.errorName === "Error") return String(decoded.args?.[0] ?? "");
    if (decoded.errorName === "Panic") return `panic 0x${BigInt(decoded.args?.[0] as bigint).toString(16)}`;
    const args = (decoded.args ?? []).map((a) => String(a)).join(", ");
    return `${decoded.errorName}(${args})`;
  } catch {
    return `custom error ${data.slice(0, 10)}`;
  }
}

/** One line for an answer: no URL, no calldata, bounded. */
export const cleanLine = (text: string) => safeMessage(text, 200);

/** Explains a revert (an error of estimateGas or eth_call) for a transaction of this kind. */
export function explainRevert(kind: TransactionKind, e: unknown): RevertExplanation | undefined {
  const data = revertDataOf(e);
  const reason = data ? describeRevertData(data) : revertTextOf(e);
  if (reason === undefined) return undefined;
  return explainReason(kind, reason);
}

/** The generic failure code of a kind (a call that failed for a reason no rule names). */
export function failureCodeOf(kind: TransactionKind): string {
  return RULES[kind].fallback;
}

export function explainReason(kind: TransactionKind, reason: string): RevertExplanation {
  const table = RULES[kind];
  const code = table.rules.find(([re]) => re.test(reason))?.[1] ?? table.fallback;
  return { code, message: cleanLine(`the ${kind} call reverted: ${reason}`) };
}

const PERMIT2_CONTRACT: Address = "0x000000000022D473030F116dDEE9F6B43aC78BA3";
const PERMIT2_KINDS = new Set<TransactionKind>(["permit2_settle", "permit2_settle_with_permit", "upto_settle", "upto_settle_with_permit"]);

/**
 * Permit2 reports any failed token pull as the bare string TRANSFER_FROM_FAILED: tell a payer
 * without the balance from one without the Permit2 allowance by reading both (the payment's
 * owner, token and amount come from the settle call's own arguments).
 */
async function refineTransferFromFailed(chain: ChainClient, kind: TransactionKind, to: Address, data: Hex, why: RevertExplanation, blockNumber?: bigint): Promise<RevertExplanation> {
  if (!PERMIT2_KINDS.has(kind) || !/TRANSFER_FROM_FAILED/.test(why.message)) return why;
  try {
    const abi = isAddressEqual(to, x402UptoPermit2ProxyAddress) ? x402UptoPermit2ProxyABI : x402ExactPermit2ProxyABI;
    const { args } = decodeFunctionData({ abi, data });
    // settle(permit, [amount,] owner, witness, signature) and settleWithPermit(permit2612, permit, ...).
    const withPermit = kind.endsWith("_with_permit");
    const permit = args[withPermit ? 1 : 0] as { permitted: { token: Address; amount: bigint } };
    const owner = args.find((a, i) => i > (withPermit ? 1 : 0) && typeof a === "string" && /^0x[0-9a-fA-F]{40}$/.test(a)) as Address;
    const at = blockNumber !== undefined ? { blockNumber } : {};
    const [balance, allowance] = await Promise.all([
      chain.client.readContract({ address: permit.permitted.token, abi: erc20Abi, functionName: "balanceOf", args: [owner], ...at }),
      chain.client.readContract({ address: permit.permitted.token, abi: erc20Abi, functionName: "allowance", args: [owner, PERMIT2_CONTRACT], ...at }),
    ]);
    const needed = permit.permitted.amount;
    if (balance < needed) return { code: "permit2_insufficient_balance", message: cleanLine(`${why.message} (the payer holds less than the amount)`) };
    if (allowance < needed) return { code: "permit2_allowance_required", message: cleanLine(`${why.message} (the payer's Permit2 allowance is below the amount)`) };
  } catch {
    // the calldata or the reads did not answer: keep the generic explanation
  }
  return why;
}

/** Explains a failed call of a settlement transaction (estimateGas, eth_call), reading state when the revert alone is ambiguous. */
export async function explainCallFailure(chain: ChainClient, kind: TransactionKind, to: Address, data: Hex, e: unknown, blockNumber?: bigint): Promise<RevertExplanation | undefined> {
  const why = explainRevert(kind, e);
  return why && refineTransferFromFailed(chain, kind, to, data, why, blockNumber);
}

/** Why a mined transaction reverted: replays its call on the state of its block. */
export async function explainMinedRevert(chain: ChainClient, tx: { from: Address; to: Address; data: Hex; gas: bigint; blockNumber?: bigint; kind: TransactionKind }): Promise<RevertExplanation> {
  try {
    // On the state after its block (so a front-running transfer in that block is seen); latest when unknown.
    await chain.client.call({ account: tx.from, to: tx.to, data: tx.data, gas: tx.gas, ...(tx.blockNumber !== undefined ? { blockNumber: tx.blockNumber } : {}) });
  } catch (e) {
    const explained = await explainCallFailure(chain, tx.kind, tx.to, tx.data, e, tx.blockNumber);
    if (explained) return explained;
  }
  // The replay passed (the state that made it fail is gone) or said nothing: the kind's generic code.
  return explainReason(tx.kind, "reverted on chain");
}

/** A reason code alone: "code: detail" answers (the reference Permit2 path) are split. */
export function reasonCodeOf(reason: string): { code: string; detail?: string } {
  const i = reason.indexOf(":");
  const code = (i < 0 ? reason : reason.slice(0, i)).trim();
  return /^[a-z0-9_]{1,80}$/.test(code) ? { code, detail: i < 0 ? undefined : reason.slice(i + 1).trim() } : { code: TRANSACTION_FAILED, detail: reason };
}

/**
 * Runs a mechanism's settle and makes its failure answer precise and clean: a revert the signer
 * decoded (at estimateGas or from a mined receipt) names the reason code, `errorReason` is always a
 * bare code, and `errorMessage` one line without calldata or URLs.
 */
export async function withDecodedReverts(settle: () => Promise<SettleResponse>): Promise<SettleResponse> {
  const result = await settle();
  if (result.success) return result;
  const { code, detail } = reasonCodeOf(result.errorReason ?? TRANSACTION_FAILED);
  // A pending answer is about a transaction still on its way: nothing reverted.
  const decoded = code === SETTLEMENT_PENDING ? undefined : settlementContext.getStore()?.failure;
  const errorReason = decoded?.code ?? code;
  const message = decoded?.message ?? result.errorMessage ?? detail;
  return { ...result, errorReason, ...(message !== undefined ? { errorMessage: cleanLine(message) } : {}) };
}
