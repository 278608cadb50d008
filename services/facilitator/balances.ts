// Watches the native balance of every signer key: exported as a gauge, the basis of which keys may
// be picked and of the "a signer can pay" readiness check. A key leaves rotation while its balance
// does not cover the minimum: configured, or derived from what its next transaction may cost.
import type { Address } from "viem";
import type { Metrics } from "../platform/metrics.ts";
import type { ChainClient } from "./chain.ts";

export interface BalanceWatcher {
  /** Reads every balance (and the minimum) now. */
  refresh(): Promise<Map<Address, bigint>>;
  latest(): Map<Address, bigint>;
  /** Whether a key may be picked. Unknown yet (first read in flight) counts as funded: a slow RPC must not block settlement. */
  isFunded(address: Address): boolean;
  /** A node refused a transaction of this key for want of funds: out of rotation until a read says otherwise. */
  markUnfunded(address: Address): void;
  /** The minimum in force (wei), once known. */
  minimum(): bigint | undefined;
  /** True when at least one key holds more than the minimum. */
  anyFunded(): Promise<boolean>;
  stop(): void;
}

export interface BalanceWatcherOptions {
  chain: ChainClient;
  network: string;
  signers: readonly Address[];
  /** A fixed minimum, or how to derive it (read again on every refresh). */
  minBalanceWei: bigint | (() => Promise<bigint>);
  intervalMs: number;
  metrics: Metrics;
}

export function watchBalances(opts: BalanceWatcherOptions): BalanceWatcher {
  let balances = new Map<Address, bigint>();
  let min: bigint | undefined = typeof opts.minBalanceWei === "bigint" ? opts.minBalanceWei : undefined;
  let lastRead = 0;
  const refresh = async () => {
    lastRead = Date.now();
    const [values, minimum] = await Promise.all([
      Promise.all(opts.signers.map((a) => opts.chain.client.getBalance({ address: a }))),
      typeof opts.minBalanceWei === "bigint" ? opts.minBalanceWei : opts.minBalanceWei().catch(() => min),
    ]);
    min = minimum;
    balances = new Map(opts.signers.map((a, i) => [a, values[i]!]));
    for (const [signer, wei] of balances) opts.metrics.signerBalance.set({ network: opts.network, signer }, Number(wei));
    return balances;
  };
  const timer = setInterval(() => void refresh().catch(() => undefined), opts.intervalMs);
  timer.unref();
  void refresh().catch(() => undefined);
  const above = (wei: bigint | undefined) => wei === undefined || min === undefined || wei > min;
  return {
    refresh,
    latest: () => balances,
    isFunded(address) {
      const ok = above(balances.get(address));
      // A key out of rotation is read again soon (at most once a second), so funding it brings it back quickly.
      if (!ok && Date.now() - lastRead > 1000) void refresh().catch(() => undefined);
      return ok;
    },
    markUnfunded(address) {
      balances = new Map(balances).set(address, 0n);
      void refresh().catch(() => undefined);
    },
    minimum: () => min,
    anyFunded: async () => {
      await refresh();
      return opts.signers.some((a) => above(balances.get(a)));
    },
    stop: () => clearInterval(timer),
  };
}
