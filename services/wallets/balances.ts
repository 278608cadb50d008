// A wallet's balances per network and asset, read from the chains: the native balance (gas for a
// Permit2 approval), and for every asset we know on the network or the policy lists there, the token
// balance and the Permit2 allowance. A network whose RPC fails is reported as such, not as an error
// of the whole request.
import type { Address } from "viem";
import { networkInfo, type Caip2 } from "../x402/networks.ts";
import type { ChainAccess } from "./chain.ts";
import { WalletError } from "./errors.ts";
import type { Policy } from "./policy.ts";

export interface AssetBalance {
  asset: Address;
  symbol: string | null;
  decimals: number | null;
  balance: string;
  permit2Allowance: string;
}

export interface NetworkBalances {
  network: Caip2;
  native: string | null;
  assets: AssetBalance[];
  /** Set when the network's RPC could not be read. */
  error?: string;
}

export async function walletBalances(chain: ChainAccess, address: Address, policy: Policy, only?: Caip2): Promise<NetworkBalances[]> {
  if (only && !chain.has(only)) throw new WalletError("network_not_configured", `the wallet service has no RPC for ${only} (configured: ${chain.networks().join(", ") || "none"})`);
  const networks = only ? [only] : chain.networks();
  return Promise.all(
    networks.map(async (network): Promise<NetworkBalances> => {
      const known = networkInfo(network)?.assets ?? [];
      const assets = new Map<string, { address: Address; symbol: string | null; decimals: number | null }>();
      for (const a of known) assets.set(a.address.toLowerCase(), { address: a.address, symbol: a.symbol, decimals: a.decimals });
      for (const a of policy.assets) {
        if (a.network === network && !assets.has(a.asset.toLowerCase())) assets.set(a.asset.toLowerCase(), { address: a.asset, symbol: a.symbol ?? null, decimals: null });
      }
      try {
        const [native, rows] = await Promise.all([
          chain.nativeBalance(network, address),
          Promise.all(
            [...assets.values()].map(async (a): Promise<AssetBalance> => {
              const [balance, allowance, decimals] = await Promise.all([
                chain.tokenBalance(network, a.address, address),
                chain.permit2Allowance(network, a.address, address),
                a.decimals ?? chain.tokenDecimals(network, a.address).catch(() => null),
              ]);
              return { asset: a.address, symbol: a.symbol, decimals, balance: balance.toString(), permit2Allowance: allowance.toString() };
            }),
          ),
        ]);
        return { network, native: native.toString(), assets: rows };
      } catch (e) {
        const err = e instanceof WalletError ? e : new WalletError("rpc_unavailable", `the RPC of ${network} failed`);
        return { network, native: null, assets: [], error: err.message };
      }
    }),
  );
}
