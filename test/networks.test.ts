// The production network table against the reference packages' constants: every asset @x402/evm
// knows for a network must appear here with the same address, decimals and EIP-712 domain, and
// every entry must be a real token (checksummed, no devnet stand-in), so a typo fails here.
import { describe, expect, it } from "vitest";
import { getAddress } from "viem";
import { DEFAULT_ASSETS, PERMIT2_ADDRESS as REFERENCE_PERMIT2, x402ExactPermit2ProxyAddress } from "@x402/evm";
import { EXACT_PERMIT2_PROXY_ADDRESS, NETWORKS, PERMIT2_ADDRESS, chainKind, networkInfo } from "../services/x402/networks.ts";
import { DEVNET_ONLY_ASSETS, devnetAssets } from "../services/devnet/devnet-assets.ts";

type ReferenceAsset = { asset: string; name: string; version: string; decimals: number; symbol: string; assetTransferMethod?: string; supportsEip2612?: boolean };
const reference = DEFAULT_ASSETS as unknown as Record<string, ReferenceAsset[] | undefined>;

describe("the production asset table", () => {
  it("serves exactly the six networks, testnets flagged", () => {
    expect(NETWORKS.map((n) => [n.network, n.testnet])).toEqual([
      ["eip155:56", false],
      ["eip155:97", true],
      ["eip155:8453", false],
      ["eip155:84532", true],
      ["eip155:137", false],
      ["eip155:42161", false],
    ]);
    for (const n of NETWORKS) expect(n.network).toBe(`eip155:${n.chainId}`);
  });

  it.each(NETWORKS.filter((n) => reference[n.network]).map((n) => [n.network]))("%s: every reference default asset is listed with its facts", (network) => {
    const ours = networkInfo(network)!.assets;
    for (const ref of reference[network]!) {
      const entry = ours.find((a) => a.address === ref.asset); // exact, checksummed spelling
      expect(entry, `${network} ${ref.symbol} ${ref.asset}`).toBeDefined();
      expect(entry).toMatchObject({ symbol: ref.symbol, decimals: ref.decimals, eip712: { name: ref.name, version: ref.version } });
      // No assetTransferMethod in the reference means EIP-3009 (its default); "permit2" means Permit2 only.
      if (ref.assetTransferMethod === "permit2") expect(entry!.transferMethods).toEqual(["permit2"]);
      else expect(entry!.transferMethods).toContain("eip3009");
      if (ref.supportsEip2612) expect(entry!.eip2612).toBe(true);
    }
  });

  it("the reference knows no default asset for BNB Smart Chain: ours are the chain's Binance-Peg tokens, Permit2 only, 18 decimals", () => {
    expect(reference["eip155:56"]).toBeUndefined();
    expect(reference["eip155:97"]).toBeUndefined();
    expect(networkInfo("eip155:56")!.assets).toEqual([
      { symbol: "USDT", address: "0x55d398326f99059fF775485246999027B3197955", decimals: 18, transferMethods: ["permit2"] },
      { symbol: "USDC", address: "0x8AC76a51cc950d9822D68b83fE1Ad97B32Cd580d", decimals: 18, transferMethods: ["permit2"] },
    ]);
    expect(networkInfo("eip155:97")!.assets).toEqual([{ symbol: "USDT", address: "0x337610d27c682E347C9cD60BD4b3b107C9d34dDd", decimals: 18, transferMethods: ["permit2"] }]);
  });

  it("every entry is a checksummed address, no devnet stand-in, EIP-3009 only with an EIP-712 domain", () => {
    for (const n of NETWORKS) {
      for (const a of n.assets) {
        expect(getAddress(a.address)).toBe(a.address);
        expect(a.address.toLowerCase().startsWith("0x3009000000")).toBe(false);
        if (a.transferMethods.includes("eip3009") || a.eip2612) expect(a.eip712, `${n.network} ${a.symbol}`).toBeDefined();
        expect(a.transferMethods).toContain("permit2"); // every ERC-20 can pay through Permit2
      }
      // One symbol per network, so a symbol names one token.
      expect(new Set(n.assets.map((a) => a.symbol)).size).toBe(n.assets.length);
    }
  });

  it("Permit2 and the exact proxy are at the reference addresses", () => {
    expect(PERMIT2_ADDRESS).toBe(REFERENCE_PERMIT2);
    expect(EXACT_PERMIT2_PROXY_ADDRESS).toBe(x402ExactPermit2ProxyAddress);
  });

  it("testnet and mainnet chain ids are told apart", () => {
    expect(chainKind(8453)).toBe("mainnet");
    expect(chainKind(84532)).toBe("testnet");
    expect(chainKind(97)).toBe("testnet");
    expect(chainKind(80002)).toBe("testnet");
    expect(chainKind(1)).toBe("mainnet");
    expect(chainKind(424242)).toBe("unknown");
  });
});

describe("the devnet's tokens", () => {
  it("devnet-only stand-ins live in the devnet's list, never in the production table", () => {
    expect(devnetAssets("eip155:56").map((a) => a.address)).toEqual([
      "0x55d398326f99059fF775485246999027B3197955",
      "0x8AC76a51cc950d9822D68b83fE1Ad97B32Cd580d",
      "0x3009000000000000000000000000000000000056",
    ]);
    for (const [network, extra] of Object.entries(DEVNET_ONLY_ASSETS)) {
      for (const a of extra!) expect(networkInfo(network)!.assets.some((p) => p.address === a.address)).toBe(false);
    }
    expect(devnetAssets("eip155:8453")).toEqual(networkInfo("eip155:8453")!.assets);
  });
});
