// Per-chain settlement policy as data: the fee rules a chain's nodes enforce, how an L2's data fee
// is paid and bounded, when a settlement counts as final, how long blocks take, and what the RPC
// serves. Defaults per network below (docs/networks.md gives the reason for each); every field can
// be overridden per FacilitatorNetwork (config `policy`, env X402_POLICY as JSON).
import type { Address } from "viem";
import { z } from "zod";

export type DataFeeModel =
  /** No separate data fee (an L1, or a chain whose fee is all execution gas). */
  | { kind: "none" }
  /**
   * Arbitrum: the L1 calldata cost is charged as extra L2 gas ("poster fee"), counted in
   * eth_estimateGas and gasUsed. Each gas ceiling is raised by this allowance, no more.
   */
  | { kind: "l1-gas"; gasAllowance: bigint }
  /**
   * OP Stack (Base): the L1 data fee is taken from the sender's balance on top of gas x price,
   * as the GasPriceOracle predeploy quotes it. A transaction whose quote is above the bound is
   * never signed; the bound counts in the signer's minimum balance.
   */
  | { kind: "op-l1-fee"; oracle: Address; maxFeeWei: bigint };

export interface NetworkPolicy {
  /** The lowest tip (maxPriorityFeePerGas, or gasPrice of legacy transactions) the chain's nodes accept, in wei. */
  minPriorityFeePerGasWei: bigint;
  /** The protocol's floor of the base fee, in wei (0: none); fee caps are never set below base fee + tip. */
  minBaseFeePerGasWei: bigint;
  dataFee: DataFeeModel;
  /** Blocks a receipt needs (1 = included) before a settlement counts as final; also the reorg watch depth. */
  confirmations: number;
  /** Average block interval in ms: bounds receipt waits and what counts as a lagging endpoint. */
  blockTimeMs: number;
  /** Whether the endpoint serves eth_sendRawTransactionSync (EIP-7966); doctor reports what it finds. */
  sendRawTransactionSync: boolean;
  /**
   * The least time between two blocks the chain guarantees (a sequencer's fixed schedule), or 0 for
   * no guarantee. With a guarantee, the head block we saw is provably still the head for a while,
   * so a payment simulated at it during /verify is not simulated again at /settle within that
   * window (settlement/head.ts). 0 on a chain that can mine at any moment (anvil's automine).
   */
  minBlockIntervalMs: number;
}

const GWEI = 1_000_000_000n;
/** OP Stack GasPriceOracle predeploy. */
export const OP_GAS_PRICE_ORACLE: Address = "0x420000000000000000000000000000000000000F";

const bsc: NetworkPolicy = {
  // BSC runs EIP-1559 with a zero base fee; validators refuse gas prices below 0.05 gwei (since Oct 2025).
  minPriorityFeePerGasWei: GWEI / 20n,
  minBaseFeePerGasWei: 0n,
  dataFee: { kind: "none" },
  // Fast finality (BEP-126) finalises a block once the next two carry votes.
  confirmations: 3,
  blockTimeMs: 750,
  sendRawTransactionSync: false,
  // Block times have changed by hard fork (3 s, 1.5 s, 0.75 s): no schedule is relied on.
  minBlockIntervalMs: 0,
};

/** Base and Base Sepolia: one OP Stack rollup configuration. */
const opStack: NetworkPolicy = {
  minPriorityFeePerGasWei: 0n,
  minBaseFeePerGasWei: 0n,
  // 0.0001 ETH: a settlement's L1 data fee is a few hundred bytes of blob data, orders of magnitude below.
  dataFee: { kind: "op-l1-fee", oracle: OP_GAS_PRICE_ORACLE, maxFeeWei: 100_000_000_000_000n },
  // The sequencer's receipt: unsafe-head reorgs are rare and L1 finality takes ~15 minutes, too long for a payment.
  confirmations: 1,
  blockTimeMs: 2000,
  sendRawTransactionSync: false,
  // The OP Stack's block time is a rollup parameter: the sequencer makes one block every 2 s.
  minBlockIntervalMs: 2000,
};

export const DEFAULT_NETWORK_POLICIES: Readonly<Record<string, NetworkPolicy>> = {
  "eip155:56": bsc,
  "eip155:97": bsc,
  "eip155:8453": opStack,
  "eip155:84532": opStack,
  "eip155:137": {
    // Polygon PoS nodes refuse tips below 25 gwei (docs.polygon.technology, gas station).
    minPriorityFeePerGasWei: 25n * GWEI,
    minBaseFeePerGasWei: 0n,
    dataFee: { kind: "none" },
    // Milestones (Heimdall v2) finalise within a few blocks; 3 blocks is ~6 s.
    confirmations: 3,
    blockTimeMs: 2000,
    sendRawTransactionSync: false,
    minBlockIntervalMs: 0, // the producer's period is a target, not a guarantee
  },
  "eip155:42161": {
    minPriorityFeePerGasWei: 0n, // the sequencer ignores tips
    minBaseFeePerGasWei: 10_000_000n, // ArbOS minimum L2 base fee: 0.01 gwei
    // Poster fee in L2 gas on top of execution: 1M gas of room, at the fee cap a bounded cost.
    dataFee: { kind: "l1-gas", gasAllowance: 1_000_000n },
    confirmations: 1,
    blockTimeMs: 250,
    sendRawTransactionSync: false,
    minBlockIntervalMs: 0, // the sequencer makes blocks as transactions come, up to every 250 ms
  },
};

/** Networks outside the table (a custom chain): no floors, one confirmation, Ethereum's 12 s blocks. */
export const FALLBACK_POLICY: NetworkPolicy = {
  minPriorityFeePerGasWei: 0n,
  minBaseFeePerGasWei: 0n,
  dataFee: { kind: "none" },
  confirmations: 1,
  blockTimeMs: 12_000,
  sendRawTransactionSync: false,
  minBlockIntervalMs: 0,
};

const wei = z.union([z.string().regex(/^[0-9]+$/), z.number().int().min(0)]).transform((v) => BigInt(v));
const dataFeeSchema = z.discriminatedUnion("kind", [
  z.object({ kind: z.literal("none") }),
  z.object({ kind: z.literal("l1-gas"), gasAllowance: wei }),
  z.object({ kind: z.literal("op-l1-fee"), oracle: z.string().regex(/^0x[0-9a-fA-F]{40}$/), maxFeeWei: wei }),
]);
export const policyOverrideSchema = z
  .object({
    minPriorityFeePerGasWei: wei,
    minBaseFeePerGasWei: wei,
    dataFee: dataFeeSchema,
    confirmations: z.number().int().min(1).max(1000),
    blockTimeMs: z.number().int().min(1).max(600_000),
    sendRawTransactionSync: z.boolean(),
    minBlockIntervalMs: z.number().int().min(0).max(600_000),
  })
  .strict()
  .partial();

export type NetworkPolicyOverride = z.input<typeof policyOverrideSchema>;

/** The network's defaults with the overrides over them; an unknown field is an error, never ignored. */
export function resolveNetworkPolicy(network: string, override: unknown = {}): NetworkPolicy {
  const parsed = policyOverrideSchema.safeParse(override);
  if (!parsed.success) {
    const issue = parsed.error.issues[0]!;
    throw new Error(`network policy: ${issue.path.join(".") || "(root)"}: ${issue.message}`);
  }
  const base = DEFAULT_NETWORK_POLICIES[network] ?? FALLBACK_POLICY;
  return { ...base, ...(parsed.data as Partial<NetworkPolicy>) };
}

/**
 * How long a settlement may wait for its receipt by default: inclusion plus the confirmations at
 * the chain's block time, four times over for slow blocks, never under 15 s.
 */
export function defaultReceiptTimeoutMs(policy: NetworkPolicy): number {
  return Math.max(15_000, 4 * (policy.confirmations + 2) * policy.blockTimeMs);
}

/** Blocks an endpoint may trail the highest head before it counts as lagging: ~10 s of blocks, at least 3. */
export function maxHeadLagBlocks(policy: NetworkPolicy): number {
  return Math.max(3, Math.ceil(10_000 / policy.blockTimeMs));
}

/** What the costliest transaction a key may sign costs at the fee cap: gas x price, plus an OP Stack L1 data fee at its bound. */
export function minimumSignerBalance(largestCeiling: bigint, feeCap: bigint, policy: NetworkPolicy): bigint {
  return largestCeiling * feeCap + (policy.dataFee.kind === "op-l1-fee" ? policy.dataFee.maxFeeWei : 0n);
}
