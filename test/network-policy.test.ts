// Per-chain policy as data: the documented defaults, overrides per network (config or X402_POLICY),
// and what they change in the facilitator's configuration and gas policy.
import { describe, expect, it } from "vitest";
import { generatePrivateKey } from "viem/accounts";
import { parseGwei } from "viem";
import { DEFAULT_NETWORK_POLICIES, FALLBACK_POLICY, defaultReceiptTimeoutMs, maxHeadLagBlocks, resolveNetworkPolicy } from "../services/facilitator/network-policy.ts";
import { facilitatorConfigFromEnv, resolveFacilitatorConfig } from "../services/facilitator/config.ts";
import { createGasPolicy, BelowFeeFloorError, DEFAULT_GAS_CEILINGS } from "../services/facilitator/settlement/gas-policy.ts";
import { NETWORKS } from "../services/x402/networks.ts";

const base = { rpcUrls: ["http://127.0.0.1:1"], signerKeys: [generatePrivateKey()] };

describe("network policy defaults", () => {
  it("every served network has a policy; the chains' floors and data-fee models", () => {
    for (const n of NETWORKS) expect(DEFAULT_NETWORK_POLICIES[n.network], n.network).toBeDefined();
    expect(resolveNetworkPolicy("eip155:137").minPriorityFeePerGasWei).toBe(parseGwei("25"));
    expect(resolveNetworkPolicy("eip155:56").minPriorityFeePerGasWei).toBe(parseGwei("0.05"));
    expect(resolveNetworkPolicy("eip155:97")).toEqual(resolveNetworkPolicy("eip155:56"));
    expect(resolveNetworkPolicy("eip155:8453").dataFee.kind).toBe("op-l1-fee");
    expect(resolveNetworkPolicy("eip155:42161").dataFee).toEqual({ kind: "l1-gas", gasAllowance: 1_000_000n });
    expect(resolveNetworkPolicy("eip155:1")).toEqual(FALLBACK_POLICY);
  });

  it("overrides replace single fields; an unknown field or a bad value is an error", () => {
    expect(resolveNetworkPolicy("eip155:137", { minPriorityFeePerGasWei: "30000000000", confirmations: 5 })).toMatchObject({ minPriorityFeePerGasWei: parseGwei("30"), confirmations: 5, blockTimeMs: 2000 });
    expect(() => resolveNetworkPolicy("eip155:137", { minTip: 1 })).toThrow(/network policy/);
    expect(() => resolveNetworkPolicy("eip155:137", { confirmations: 0 })).toThrow(/confirmations/);
    expect(() => resolveNetworkPolicy("eip155:8453", { dataFee: { kind: "op-l1-fee" } })).toThrow(/dataFee/);
  });

  it("receipt waits and head lag follow the block time and confirmations", () => {
    expect(defaultReceiptTimeoutMs(resolveNetworkPolicy("eip155:137"))).toBe(40_000); // 4 x (3 + 2) x 2 s
    expect(defaultReceiptTimeoutMs(resolveNetworkPolicy("eip155:42161"))).toBe(15_000);
    expect(maxHeadLagBlocks(resolveNetworkPolicy("eip155:42161"))).toBe(40);
    expect(maxHeadLagBlocks(resolveNetworkPolicy("eip155:8453"))).toBe(5);
  });
});

describe("the facilitator configuration takes the policy", () => {
  it("confirmations and receipt timeout default from the network's policy; explicit values win", () => {
    const polygon = resolveFacilitatorConfig({ ...base, network: "eip155:137" });
    expect(polygon).toMatchObject({ confirmations: 3, receiptTimeoutMs: 40_000 });
    expect(resolveFacilitatorConfig({ ...base, network: "eip155:137", confirmations: 7 })).toMatchObject({ confirmations: 7, policy: { confirmations: 7 } });
    expect(resolveFacilitatorConfig({ ...base, network: "eip155:8453" }).confirmations).toBe(1);
  });

  it("X402_POLICY carries overrides as JSON; a malformed one is refused", () => {
    const env = facilitatorConfigFromEnv({ X402_NETWORK: "eip155:56", X402_POLICY: '{"minPriorityFeePerGasWei":"100000000","blockTimeMs":450}' });
    const c = resolveFacilitatorConfig({ ...base }, env);
    expect(c.policy).toMatchObject({ minPriorityFeePerGasWei: 100_000_000n, blockTimeMs: 450, confirmations: 3 });
    expect(() => facilitatorConfigFromEnv({ X402_POLICY: "{nope" })).toThrow(/X402_POLICY/);
    expect(() => resolveFacilitatorConfig({ ...base, network: "eip155:56", policy: { gasPriceFloor: 1 } })).toThrow(/network policy/);
  });
});

describe("the gas policy under a chain's rules", () => {
  it("the tip never goes under the floor; capped fees under it are refused", () => {
    const p = createGasPolicy({ baseFeeMultiplier: 3, minPriorityFeePerGas: parseGwei("25") });
    expect(p.tip(parseGwei("1"))).toBe(parseGwei("25"));
    expect(p.tip(parseGwei("40"))).toBe(parseGwei("40"));
    expect(() => p.checkFloor({ maxFeePerGas: parseGwei("30"), maxPriorityFeePerGas: parseGwei("24") }, parseGwei("1"))).toThrow(BelowFeeFloorError);
    expect(() => p.checkFloor({ maxFeePerGas: parseGwei("25"), maxPriorityFeePerGas: parseGwei("25") }, parseGwei("1"))).toThrow(BelowFeeFloorError);
    expect(() => p.checkFloor({ maxFeePerGas: parseGwei("26"), maxPriorityFeePerGas: parseGwei("25") }, parseGwei("1"))).not.toThrow();
  });

  it("Arbitrum: every gas ceiling includes the L1 poster-gas allowance, no more", () => {
    const p = createGasPolicy({ baseFeeMultiplier: 3, l1GasAllowance: 1_000_000n });
    expect(p.ceiling("eip3009_transfer")).toBe(DEFAULT_GAS_CEILINGS.eip3009_transfer + 1_000_000n);
    expect(() => p.checkGas("eip3009_transfer", DEFAULT_GAS_CEILINGS.eip3009_transfer + 1_000_001n)).toThrow(/ceiling/);
  });
});
