// The six EVM networks of the service contract and the facts a facilitator needs about each.
// Addresses of default assets are the real tokens' addresses; the devnet places its stand-ins there.
import type { Address } from "viem";

export type Caip2 = `eip155:${number}`;

export interface AssetInfo {
  symbol: string;
  address: Address;
  decimals: number;
  /** EIP-712 domain of the token (EIP-3009 / EIP-2612); undefined for tokens without one. */
  eip712?: { name: string; version: string };
  transferMethods: ("eip3009" | "permit2")[];
}

export interface NetworkInfo {
  network: Caip2;
  chainId: number;
  name: string;
  testnet: boolean;
  assets: AssetInfo[];
}

const usdc = (address: Address, name = "USD Coin"): AssetInfo => ({
  symbol: "USDC",
  address,
  decimals: 6,
  eip712: { name, version: "2" },
  transferMethods: ["eip3009", "permit2"],
});

const usdt18 = (address: Address): AssetInfo => ({
  symbol: "USDT",
  address,
  decimals: 18,
  transferMethods: ["permit2"],
});

export const NETWORKS: readonly NetworkInfo[] = [
  {
    network: "eip155:56",
    chainId: 56,
    name: "BNB Smart Chain",
    testnet: false,
    assets: [usdt18("0x55d398326f99059fF775485246999027B3197955"), usdc("0x3009000000000000000000000000000000000056")],
  },
  {
    network: "eip155:97",
    chainId: 97,
    name: "BNB Smart Chain Testnet",
    testnet: true,
    assets: [usdt18("0x337610d27c682E347C9cD60BD4b3b107C9d34dDd"), usdc("0x3009000000000000000000000000000000000097")],
  },
  { network: "eip155:8453", chainId: 8453, name: "Base", testnet: false, assets: [usdc("0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913")] },
  { network: "eip155:84532", chainId: 84532, name: "Base Sepolia", testnet: true, assets: [usdc("0x036CbD53842c5426634e7929541eC2318f3dCF7e", "USDC")] },
  { network: "eip155:137", chainId: 137, name: "Polygon", testnet: false, assets: [usdc("0x3c499c542cEF5E3811e1192ce70d8cC03d5c3359")] },
  { network: "eip155:42161", chainId: 42161, name: "Arbitrum One", testnet: false, assets: [usdc("0xaf88d065e77c8cC2239327C5EDb3A432268e5831")] },
];

export const CAIP2_PATTERN = /^eip155:[1-9][0-9]{0,18}$/;

export function chainIdOf(network: string): number {
  if (!CAIP2_PATTERN.test(network)) throw new Error(`not an eip155 CAIP-2 network: ${network}`);
  return Number(network.slice("eip155:".length));
}

export function networkInfo(network: string): NetworkInfo | undefined {
  return NETWORKS.find((n) => n.network === network);
}

export const PERMIT2_ADDRESS: Address = "0x000000000022D473030F116dDEE9F6B43aC78BA3";
export const MULTICALL3_ADDRESS: Address = "0xcA11bde05977b3631167028862bE2a173976CA11";
export const EXACT_PERMIT2_PROXY_ADDRESS: Address = "0x402085c248EeA27D92E8b30b2C58ed07f9E20001";
