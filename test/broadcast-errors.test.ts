// The one classifier of refused broadcasts, against the texts the common nodes answer with (the
// anvil ones are also provoked for real in signer-trust.test.ts).
import { describe, expect, it } from "vitest";
import { RpcRequestError } from "viem";
import { classifySendError } from "../services/facilitator/settlement/broadcast-errors.ts";

const nodeError = (message: string) => new RpcRequestError({ body: {}, url: "http://rpc.invalid/key-secret", error: { code: -32000, message } });

describe("broadcast error classifier", () => {
  it.each([
    ["already known", "already_known"], // geth, reth
    ["transaction already imported", "already_known"], // anvil
    ["ALREADY_EXISTS: already known", "already_known"], // erigon
    ["AlreadyKnown", "already_known"], // nethermind
    ["TRANSACTION_ALREADY_KNOWN", "already_known"], // besu
    ["nonce too low", "nonce_too_low"], // geth, reth, anvil, erigon
    ["nonce too low: next nonce 5, tx nonce 3", "nonce_too_low"],
    ["OldNonce, Current nonce: 5, nonce of rejected tx: 3", "nonce_too_low"], // nethermind
    ["NONCE_TOO_LOW", "nonce_too_low"], // besu
    ["insufficient funds for gas * price + value: balance 0, tx cost 21000", "insufficient_funds"], // geth, reth
    ["Insufficient funds for gas * price + value", "insufficient_funds"], // anvil
    ["InsufficientFunds, Account balance: 0, cumulative cost: 21000", "insufficient_funds"], // nethermind
    ["UPFRONT_COST_EXCEEDS_BALANCE", "insufficient_funds"], // besu
    ["replacement transaction underpriced", "replacement_underpriced"], // geth, anvil
    ["could not replace existing tx", "replacement_underpriced"], // erigon
    ["ReplacementNotAllowed", "replacement_underpriced"], // nethermind
    ["TRANSACTION_REPLACEMENT_UNDERPRICED", "replacement_underpriced"], // besu
    ["transaction underpriced", "underpriced"], // geth, reth
    ["max fee per gas less than block base fee: address 0x.., maxFeePerGas: 1, baseFee: 7", "underpriced"], // geth, anvil
    ["fee cap less than block base fee", "underpriced"], // erigon
    ["FeeTooLow, MaxFeePerGas too low", "underpriced"], // nethermind
    ["GAS_PRICE_TOO_LOW", "underpriced"], // besu
    ["MAX_FEE_PER_GAS_BELOW_CURRENT_BASE_FEE", "underpriced"], // besu
    ["intrinsic gas too low", "intrinsic_gas_too_low"], // geth, anvil
    ["INTRINSIC_GAS_EXCEEDS_GAS_LIMIT", "intrinsic_gas_too_low"], // besu
    ["exceeds block gas limit", "exceeds_block_gas_limit"], // geth, reth
    ["intrinsic gas too high -- tx.gas_limit > env.block.gas_limit", "exceeds_block_gas_limit"], // anvil
    ["EXCEEDS_BLOCK_GAS_LIMIT", "exceeds_block_gas_limit"], // besu
    ["GasLimitExceeded", "exceeds_block_gas_limit"], // nethermind
    ["nonce too high", "nonce_too_high"],
    ["something else entirely", "rejected"],
  ])("%s → %s", (message, outcome) => {
    expect(classifySendError(nodeError(message))).toBe(outcome);
  });

  it("a node that cannot be reached is not a refusal", () => {
    expect(classifySendError(new Error("fetch failed"))).toBe("unreachable");
    expect(classifySendError(Object.assign(new Error("HTTP request failed."), { details: "Status: 503" }))).toBe("unreachable");
  });
});
