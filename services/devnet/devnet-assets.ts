// The tokens of each devnet chain: the production table's assets (placed at their real addresses
// by chain-setup.ts) plus the devnet's own stand-ins, which exist on no real chain. BNB Smart Chain
// has no EIP-3009 stablecoin, so its devnet chains carry an EIP-3009 stand-in at 0x3009…00<chain>
// for the EIP-3009 paths; the devnet configures its facilitators with this list, the production
// table (services/x402/networks.ts) never holds it.
import type { Address } from "viem";
import { networkInfo, type AssetInfo, type Caip2 } from "../x402/networks.ts";

/** The EIP-3009 / EIP-2612 stand-in of a devnet chain without a native EIP-3009 stablecoin. */
function eip3009StandIn(address: Address): AssetInfo {
  return { symbol: "USDC3009", address, decimals: 6, eip712: { name: "USD Coin", version: "2" }, transferMethods: ["eip3009", "permit2"], eip2612: true };
}

export const DEVNET_ONLY_ASSETS: Readonly<Partial<Record<Caip2, readonly AssetInfo[]>>> = {
  "eip155:56": [eip3009StandIn("0x3009000000000000000000000000000000000056")],
  "eip155:97": [eip3009StandIn("0x3009000000000000000000000000000000000097")],
};

/** Every token of a devnet chain: the network's real assets, then its devnet-only stand-ins. */
export function devnetAssets(network: Caip2): AssetInfo[] {
  const info = networkInfo(network);
  if (!info) throw new Error(`unknown network ${network}`);
  return [...info.assets, ...(DEVNET_ONLY_ASSETS[network] ?? [])];
}
