// The six EVM networks of the service contract and the facts a facilitator needs about each: the
// real tokens people pay with, as the chains report them. Only production facts live here: the
// devnet's stand-in tokens are in services/devnet/devnet-assets.ts, never in this table, because a
// facilitator accepts exactly these assets unless configured otherwise (facilitator.ts `accepted`).
// test/networks.test.ts checks every entry against the @x402/evm DEFAULT_ASSETS constants where
// they exist; docs/networks.md gives the sources of the others.
import type { Address } from "viem";

export type Caip2 = `eip155:${number}`;

export type TransferMethod = "eip3009" | "permit2";

export interface AssetInfo {
  symbol: string;
  address: Address;
  decimals: number;
  /** EIP-712 domain of the token (EIP-3009 / EIP-2612) as the token reports it; undefined for tokens without one. */
  eip712?: { name: string; version: string };
  /**
   * How a payer authorises a transfer: "eip3009" (transferWithAuthorization) and/or "permit2"
   * (every ERC-20 once the payer approved Permit2). A token with only "permit2" is "Permit2 only".
   */
  transferMethods: TransferMethod[];
  /** The token implements EIP-2612 permit(): a payer can approve Permit2 without gas (gas sponsoring). */
  eip2612?: boolean;
}

export interface NetworkInfo {
  network: Caip2;
  chainId: number;
  name: string;
  testnet: boolean;
  assets: AssetInfo[];
}

/** Circle's native USDC (FiatToken v2.2): EIP-3009 and EIP-2612, 6 decimals, EIP-712 version "2". */
const circleUsdc = (address: Address, name: string): AssetInfo => ({
  symbol: "USDC",
  address,
  decimals: 6,
  eip712: { name, version: "2" },
  transferMethods: ["eip3009", "permit2"],
  eip2612: true,
});

/** A BEP-20 without EIP-3009, EIP-2612 or an EIP-712 domain: Permit2 only (the payer approves Permit2 once, with gas). */
const permit2Only = (symbol: string, address: Address, decimals: number): AssetInfo => ({ symbol, address, decimals, transferMethods: ["permit2"] });

export const NETWORKS: readonly NetworkInfo[] = [
  {
    network: "eip155:56",
    chainId: 56,
    name: "BNB Smart Chain",
    testnet: false,
    assets: [
      // Binance-Peg BSC-USD ("Tether USD") and Binance-Peg USD Coin: 18 decimals, plain BEP-20s.
      permit2Only("USDT", "0x55d398326f99059fF775485246999027B3197955", 18),
      permit2Only("USDC", "0x8AC76a51cc950d9822D68b83fE1Ad97B32Cd580d", 18),
    ],
  },
  {
    network: "eip155:97",
    chainId: 97,
    name: "BNB Smart Chain Testnet",
    testnet: true,
    // The test USDT of BSC testnet (18 decimals, plain BEP-20). Testnet USDC varies by faucet: configure it.
    assets: [permit2Only("USDT", "0x337610d27c682E347C9cD60BD4b3b107C9d34dDd", 18)],
  },
  { network: "eip155:8453", chainId: 8453, name: "Base", testnet: false, assets: [circleUsdc("0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913", "USD Coin")] },
  // Circle's testnet deployments report the name "USDC" (mainnet ones "USD Coin").
  { network: "eip155:84532", chainId: 84532, name: "Base Sepolia", testnet: true, assets: [circleUsdc("0x036CbD53842c5426634e7929541eC2318f3dCF7e", "USDC")] },
  { network: "eip155:137", chainId: 137, name: "Polygon PoS", testnet: false, assets: [circleUsdc("0x3c499c542cEF5E3811e1192ce70d8cC03d5c3359", "USD Coin")] },
  { network: "eip155:42161", chainId: 42161, name: "Arbitrum One", testnet: false, assets: [circleUsdc("0xaf88d065e77c8cC2239327C5EDb3A432268e5831", "USD Coin")] },
];

export const CAIP2_PATTERN = /^eip155:[1-9][0-9]{0,18}$/;

export function chainIdOf(network: string): number {
  if (!CAIP2_PATTERN.test(network)) throw new Error(`not an eip155 CAIP-2 network: ${network}`);
  return Number(network.slice("eip155:".length));
}

export function networkInfo(network: string): NetworkInfo | undefined {
  return NETWORKS.find((n) => n.network === network);
}

/**
 * Testnet chain ids beyond the six served, so a mainnet facilitator can name what its RPC is on.
 * Ethereum's Sepolia/Holesky, Polygon Amoy, Arbitrum Sepolia, OP Sepolia, and the devnet's anvil default.
 */
const OTHER_TESTNETS = new Set([11155111, 17000, 80002, 421614, 11155420, 31337]);
const OTHER_MAINNETS = new Set([1, 10, 43114, 324, 59144]);

/** Whether a chain id is a testnet, a mainnet, or unknown here. */
export function chainKind(chainId: number): "testnet" | "mainnet" | "unknown" {
  const known = NETWORKS.find((n) => n.chainId === chainId);
  if (known) return known.testnet ? "testnet" : "mainnet";
  if (OTHER_TESTNETS.has(chainId)) return "testnet";
  if (OTHER_MAINNETS.has(chainId)) return "mainnet";
  return "unknown";
}

export const PERMIT2_ADDRESS: Address = "0x000000000022D473030F116dDEE9F6B43aC78BA3";
export const MULTICALL3_ADDRESS: Address = "0xcA11bde05977b3631167028862bE2a173976CA11";
export const EXACT_PERMIT2_PROXY_ADDRESS: Address = "0x402085c248EeA27D92E8b30b2C58ed07f9E20001";
