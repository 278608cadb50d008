// What a facilitator key may sign: a gas ceiling per kind of transaction (recognised by its target
// and 4-byte selector) and a fee cap relative to the network's current fees. A hostile token or a
// payer-controlled call can make a settlement cost arbitrary gas; a misbehaving RPC or a fee
// escalation can make it cost an arbitrary price. Neither is ever signed.
import { isAddressEqual, type Address, type Hex } from "viem";
import { x402ExactPermit2ProxyAddress, x402UptoPermit2ProxyAddress } from "@x402/evm";

export const BATCH_SETTLEMENT_CONTRACT: Address = "0x4020074e9dF2ce1deE5A9C1b5c3f541D02a10003";

export type TransactionKind =
  | "eip3009_transfer"
  | "permit2_settle"
  | "permit2_settle_with_permit"
  | "upto_settle"
  | "upto_settle_with_permit"
  | "batch_deposit"
  | "batch_claim"
  | "batch_settle"
  | "batch_refund"
  | "batch_withdraw"
  | "batch_multicall"
  | "nonce_filler"
  | "gas_funding"
  | "wallet_deployment"
  | "other";

/**
 * Generous defaults: several times what the reference contracts use (USDC transferWithAuthorization
 * ~90k, a Permit2 proxy settle ~130k), room for ERC-1271 wallets and proxies, and for claims that
 * carry many vouchers. Anything beyond is a transaction that burns the key's gas, not a payment.
 */
export const DEFAULT_GAS_CEILINGS: Record<TransactionKind, bigint> = {
  eip3009_transfer: 300_000n,
  permit2_settle: 400_000n,
  permit2_settle_with_permit: 500_000n,
  upto_settle: 400_000n,
  upto_settle_with_permit: 500_000n,
  batch_deposit: 500_000n,
  batch_claim: 5_000_000n,
  batch_settle: 300_000n,
  batch_refund: 400_000n,
  batch_withdraw: 300_000n,
  batch_multicall: 5_000_000n,
  nonce_filler: 21_000n,
  gas_funding: 21_000n,
  wallet_deployment: 1_000_000n,
  other: 1_000_000n,
};

/**
 * Transactions that prepare a payment but do not settle it (native gas for a payer's approval, a
 * counterfactual wallet's deployment): they never decide a payment's outcome, only the
 * mechanism's own transaction does (store.ts, coordinator.ts).
 */
export const AUXILIARY_KINDS: readonly TransactionKind[] = ["gas_funding", "wallet_deployment"];

export const TRANSACTION_KINDS = Object.keys(DEFAULT_GAS_CEILINGS) as TransactionKind[];

// Selectors of the reference ABIs (@x402/evm eip3009ABI, x402ExactPermit2ProxyABI,
// x402UptoPermit2ProxyABI, and the batch-settlement contract's functions).
const EIP3009 = new Set(["0xe3ee160e", "0xcf092995"]); // transferWithAuthorization (v,r,s) and (bytes)
const EXACT_PROXY: Record<string, TransactionKind> = { "0x13cd3b53": "permit2_settle", "0xfa340378": "permit2_settle_with_permit" };
const UPTO_PROXY: Record<string, TransactionKind> = { "0xff11e7b4": "upto_settle", "0x016c1748": "upto_settle_with_permit" };
const BATCH: Record<string, TransactionKind> = {
  "0x140f1e75": "batch_deposit",
  "0x29237b0c": "batch_claim",
  "0xe43ce1f2": "batch_claim",
  "0x9db32a8f": "batch_settle",
  "0xdce4bfae": "batch_refund",
  "0xb77433e9": "batch_refund",
  "0xcf5cf3dc": "batch_withdraw",
  "0xe88377b1": "batch_withdraw",
  "0xac9650d8": "batch_multicall",
};

/**
 * The kind of a transaction, from its target and the first four bytes of its calldata; a plain
 * value transfer to someone else funds a payer's gas, a call to an allowed ERC-6492 factory deploys
 * a wallet.
 */
export function transactionKind(from: Address, to: Address, data: Hex, context: { value?: bigint; factories?: readonly Address[] } = {}): TransactionKind {
  const selector = data.slice(0, 10).toLowerCase();
  if (data.length <= 2 && isAddressEqual(from, to)) return "nonce_filler";
  if (data.length <= 2 && (context.value ?? 0n) > 0n) return "gas_funding";
  if (context.factories?.some((f) => isAddressEqual(f, to))) return "wallet_deployment";
  if (isAddressEqual(to, x402ExactPermit2ProxyAddress)) return EXACT_PROXY[selector] ?? "other";
  if (isAddressEqual(to, x402UptoPermit2ProxyAddress)) return UPTO_PROXY[selector] ?? "other";
  if (isAddressEqual(to, BATCH_SETTLEMENT_CONTRACT)) return BATCH[selector] ?? "other";
  if (EIP3009.has(selector)) return "eip3009_transfer";
  return "other";
}

/** maxFeePerGas <= 3 x the current base fee + tip: room for a few full blocks of base-fee rises. */
export const DEFAULT_BASE_FEE_MULTIPLIER = 3;

export interface GasPolicyOptions {
  /** Per-kind ceilings replacing the defaults. */
  ceilings?: Partial<Record<TransactionKind, bigint>>;
  /** Ceiling of kinds with no own value ("other"). */
  defaultCeiling?: bigint;
  /** Absolute fee cap per gas (X402_MAX_FEE_PER_GAS_WEI). */
  maxFeePerGasWei?: bigint;
  /** Relative fee cap: maxFeePerGas <= multiplier x current base fee + tip. */
  baseFeeMultiplier: number;
  /** The chain's tip floor (network-policy.ts): no transaction is signed with a lower tip. */
  minPriorityFeePerGas?: bigint;
  /** Arbitrum's poster fee is paid in L2 gas: every ceiling is raised by this allowance. */
  l1GasAllowance?: bigint;
}

export class BelowFeeFloorError extends Error {
  override name = "BelowFeeFloorError";
  constructor(
    readonly fees: Fees,
    readonly floor: { baseFeePerGas: bigint; minPriorityFeePerGas: bigint },
  ) {
    super(
      `the fee cap allows maxFeePerGas ${fees.maxFeePerGas} / tip ${fees.maxPriorityFeePerGas}, below the chain's floor (base fee ${floor.baseFeePerGas} + minimum tip ${floor.minPriorityFeePerGas}); the transaction was not signed`,
    );
  }
}

export class GasCeilingExceededError extends Error {
  override name = "GasCeilingExceededError";
  constructor(
    readonly kind: TransactionKind,
    readonly gas: bigint,
    readonly ceiling: bigint,
  ) {
    super(`the ${kind} transaction needs ${gas} gas, above its ceiling of ${ceiling}; it was not signed`);
  }
}

export interface Fees {
  maxFeePerGas: bigint;
  maxPriorityFeePerGas: bigint;
}

export function createGasPolicy(opts: GasPolicyOptions) {
  const configured: Record<TransactionKind, bigint> = { ...DEFAULT_GAS_CEILINGS, ...(opts.defaultCeiling !== undefined ? { other: opts.defaultCeiling } : {}), ...opts.ceilings };
  // The L1 allowance applies to every kind but the plain nonce filler (a 21k self-transfer pays its poster fee too).
  const allowance = opts.l1GasAllowance ?? 0n;
  const ceilings = Object.fromEntries(Object.entries(configured).map(([kind, gas]) => [kind, gas + allowance])) as Record<TransactionKind, bigint>;
  const minTip = opts.minPriorityFeePerGas ?? 0n;
  // Multiplier in thousandths, so the arithmetic stays in bigint.
  const k = BigInt(Math.round(opts.baseFeeMultiplier * 1000));
  return {
    ceilings,
    ceiling: (kind: TransactionKind) => ceilings[kind],
    /** The largest ceiling: what one transaction may cost a key at most, in gas. */
    largestCeiling: () => Object.values(ceilings).reduce((a, b) => (b > a ? b : a), 0n),
    /** Throws (nothing is signed, no nonce is taken) when the gas is above the kind's ceiling. */
    checkGas(kind: TransactionKind, gas: bigint): void {
      if (gas > ceilings[kind]) throw new GasCeilingExceededError(kind, gas, ceilings[kind]);
    },
    /** The chain's tip floor. */
    minPriorityFeePerGas: minTip,
    /** The absolute fee cap per gas, where one is set. */
    maxFeePerGasWei: opts.maxFeePerGasWei,
    /** The tip to offer: the market's, never under the chain's floor. */
    tip: (market: bigint) => (market < minTip ? minTip : market),
    /** Throws when fees (after the cap) are under the chain's tip floor (base fee + minimum tip): such a transaction is never signed. */
    checkFloor(fees: Fees, baseFeePerGas: bigint): void {
      if (minTip > 0n && (fees.maxPriorityFeePerGas < minTip || fees.maxFeePerGas < baseFeePerGas + minTip)) throw new BelowFeeFloorError(fees, { baseFeePerGas, minPriorityFeePerGas: minTip });
    },
    /** The highest maxFeePerGas we sign at, given the current base fee and tip. */
    feeCap(baseFeePerGas: bigint, tip: bigint): bigint {
      const relative = (baseFeePerGas * k) / 1000n + tip;
      return opts.maxFeePerGasWei !== undefined && opts.maxFeePerGasWei < relative ? opts.maxFeePerGasWei : relative;
    },
    /** Fees clamped to the cap (a tip never above the max fee). */
    clamp(fees: Fees, cap: bigint): Fees {
      const maxFeePerGas = fees.maxFeePerGas > cap ? cap : fees.maxFeePerGas;
      return { maxFeePerGas, maxPriorityFeePerGas: fees.maxPriorityFeePerGas > maxFeePerGas ? maxFeePerGas : fees.maxPriorityFeePerGas };
    },
  };
}

export type GasPolicy = ReturnType<typeof createGasPolicy>;

/** Parses "kind=gas,kind=gas" (X402_GAS_CEILINGS); unknown kinds are an error, never ignored. */
export function parseGasCeilings(text: string): Partial<Record<TransactionKind, bigint>> {
  const out: Partial<Record<TransactionKind, bigint>> = {};
  for (const part of text.split(",").map((s) => s.trim()).filter(Boolean)) {
    const m = /^([a-z0-9_]+)=([0-9]+)$/.exec(part);
    if (!m || !TRANSACTION_KINDS.includes(m[1] as TransactionKind)) throw new Error(`gas ceilings: "${part}" is not kind=gas with a kind of ${TRANSACTION_KINDS.join(", ")}`);
    out[m[1] as TransactionKind] = BigInt(m[2]!);
  }
  return out;
}
