// Watches the native balance of every signer key: exported as a gauge, and the basis of the
// "a signer is funded" readiness check (and, later, of which keys may be picked).
import type { Address } from "viem";
import type { Metrics } from "../platform/metrics.ts";
import type { ChainClient } from "./chain.ts";

export interface BalanceWatcher {
  /** Reads every balance now. */
  refresh(): Promise<Map<Address, bigint>>;
  latest(): Map<Address, bigint>;
  /** True when at least one key holds more than the minimum. */
  anyFunded(): Promise<boolean>;
  stop(): void;
}

export function watchBalances(opts: { chain: ChainClient; network: string; signers: readonly Address[]; minBalanceWei: bigint; intervalMs: number; metrics: Metrics }): BalanceWatcher {
  let balances = new Map<Address, bigint>();
  const refresh = async () => {
    const values = await Promise.all(opts.signers.map((a) => opts.chain.client.getBalance({ address: a })));
    balances = new Map(opts.signers.map((a, i) => [a, values[i]!]));
    for (const [signer, wei] of balances) opts.metrics.signerBalance.set({ network: opts.network, signer }, Number(wei));
    return balances;
  };
  const timer = setInterval(() => void refresh().catch(() => undefined), opts.intervalMs);
  timer.unref();
  void refresh().catch(() => undefined);
  return {
    refresh,
    latest: () => balances,
    anyFunded: async () => [...(await refresh()).values()].some((b) => b > opts.minBalanceWei),
    stop: () => clearInterval(timer),
  };
}
