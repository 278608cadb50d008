// Receipt lookups across every hash a transaction had (fee replacements keep the nonce and change
// the hash), with a configurable confirmation depth; and the shared poller every waiter of a
// process goes through, so N callers waiting on one payment cost the RPC as much as one.
import type { Hex, TransactionReceipt } from "viem";
import type { ChainClient } from "../chain.ts";

export interface MinedTransaction {
  hash: Hex;
  receipt: TransactionReceipt;
}

export async function findMined(chain: ChainClient, hashes: readonly Hex[], confirmations: number): Promise<MinedTransaction | undefined> {
  const receipts = await Promise.all(hashes.map((hash) => chain.client.getTransactionReceipt({ hash }).then((r) => ({ hash, receipt: r }), () => undefined)));
  const mined = receipts.find((r) => r !== undefined);
  if (!mined) return undefined;
  if (confirmations > 1) {
    // An RPC failure here means "not known yet", like a failed receipt lookup above: callers poll.
    const head = await chain.client.getBlockNumber({ cacheTime: 0 }).catch(() => undefined);
    if (head === undefined || head - mined.receipt.blockNumber + 1n < BigInt(confirmations)) return undefined;
  }
  return mined;
}

export const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

export interface ReceiptPollerOptions {
  /** First interval between two receipt lookups of one transaction. */
  intervalMs: number;
  /** The interval doubles after every lookup that found nothing, up to this. */
  maxIntervalMs: number;
  /** Receipt calls one wait may make; past it the wait stops asking (the reconciler still does). */
  maxCallsPerWait: number;
}

export const DEFAULT_RECEIPT_POLLING: ReceiptPollerOptions = { intervalMs: 100, maxIntervalMs: 1000, maxCallsPerWait: 40 };

interface Watch {
  inFlight?: Promise<MinedTransaction | undefined>;
  last?: MinedTransaction;
  nextAt: number;
  intervalMs: number;
  calls: number;
  lastUsed: number;
}

/**
 * One lookup loop per transaction (its set of hashes) and process: whoever asks while a lookup is
 * in flight shares it, whoever asks before the next lookup is due gets the last answer. A watch
 * nobody asked about for a while is forgotten, so a later wait starts with a fresh budget.
 */
export function createReceiptPoller(chain: ChainClient, opts: ReceiptPollerOptions = DEFAULT_RECEIPT_POLLING) {
  const watches = new Map<string, Watch>();
  const idleMs = Math.max(opts.maxIntervalMs * 3, 3000);

  function sweep(now: number) {
    if (watches.size < 256) return;
    for (const [key, w] of watches) if (!w.inFlight && now - w.lastUsed > idleMs) watches.delete(key);
  }

  return {
    /** The mined receipt of one of the hashes (deep enough), or undefined when not (yet) known. */
    async find(hashes: readonly Hex[], confirmations: number): Promise<MinedTransaction | undefined> {
      const key = `${confirmations}:${[...hashes].sort().join(",")}`;
      const now = Date.now();
      sweep(now);
      let w = watches.get(key);
      if (w && !w.inFlight && now - w.lastUsed > idleMs) w = undefined; // a new wait: a fresh budget
      if (!w) watches.set(key, (w = { nextAt: now, intervalMs: opts.intervalMs, calls: 0, lastUsed: now }));
      w.lastUsed = now;
      if (w.last) return w.last; // mined stays mined (reorgs are the reconciler's business)
      if (w.inFlight) return w.inFlight;
      if (now < w.nextAt || w.calls + hashes.length > opts.maxCallsPerWait) return undefined;
      const watch = w;
      watch.calls += hashes.length;
      watch.inFlight = findMined(chain, hashes, confirmations)
        .then((mined) => {
          watch.last = mined;
          watch.nextAt = Date.now() + watch.intervalMs;
          watch.intervalMs = Math.min(watch.intervalMs * 2, opts.maxIntervalMs);
          return mined;
        })
        .finally(() => (watch.inFlight = undefined));
      return watch.inFlight;
    },
    /** How many transactions are watched (tests, metrics). */
    size: () => watches.size,
  };
}

export type ReceiptPoller = ReturnType<typeof createReceiptPoller>;

// One poller per chain client, i.e. per facilitator process and network: the signer's receipt
// waits and the coordinator's waiters share it without being wired to each other.
const pollers = new WeakMap<ChainClient, ReceiptPoller>();

export function configureReceiptPolling(chain: ChainClient, opts: ReceiptPollerOptions): ReceiptPoller {
  const poller = createReceiptPoller(chain, opts);
  pollers.set(chain, poller);
  return poller;
}

export function receiptPoller(chain: ChainClient): ReceiptPoller {
  let poller = pollers.get(chain);
  if (!poller) pollers.set(chain, (poller = createReceiptPoller(chain)));
  return poller;
}

/** Shared, budgeted lookup: what a waiter calls on every turn of its loop. */
export function pollMined(chain: ChainClient, hashes: readonly Hex[], confirmations: number): Promise<MinedTransaction | undefined> {
  return receiptPoller(chain).find(hashes, confirmations);
}
