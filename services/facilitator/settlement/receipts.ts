// Receipt lookups across every hash a transaction had (fee replacements keep the nonce and change
// the hash), with a configurable confirmation depth; and the shared poller every waiter of a
// process goes through, so N callers waiting on one payment cost the RPC as much as one, and N
// payments waiting on the next block cost a block read and N receipts.
import { TransactionReceiptNotFoundError, type Hex, type TransactionReceipt } from "viem";
import type { ChainClient } from "../chain.ts";

export interface MinedTransaction {
  hash: Hex;
  receipt: TransactionReceipt;
}

// Canonical block hashes by height, shared by every receipt of a block (a burst's 400 settlements
// of one block cost one read) and kept briefly: a receipt is judged against the chain as it stands
// now, within half a second; the reconciler's depth watch catches a block that leaves the chain later.
const CANONICAL_TTL_MS = 500;
const canonicalBlocks = new WeakMap<ChainClient, Map<bigint, { at: number; block: Promise<{ hash: Hex; transactions: Set<string> } | undefined> }>>();

/**
 * Whether a receipt is of the canonical block at its height, and that block holds its transaction:
 * an endpoint on a fork (a load-balanced provider whose nodes disagree, or one that lies, even with a
 * real block's number and hash) must not make a settlement look mined. A failed read is "not
 * known": the caller polls again.
 */
export async function isCanonical(chain: ChainClient, receipt: Pick<TransactionReceipt, "blockNumber" | "blockHash" | "transactionHash">): Promise<boolean> {
  let byHeight = canonicalBlocks.get(chain);
  if (!byHeight) canonicalBlocks.set(chain, (byHeight = new Map()));
  const now = Date.now();
  let entry = byHeight.get(receipt.blockNumber);
  if (!entry || now - entry.at > CANONICAL_TTL_MS) {
    if (byHeight.size > 256) for (const [n, e] of byHeight) if (now - e.at > CANONICAL_TTL_MS) byHeight.delete(n);
    const block = chain.client.getBlock({ blockNumber: receipt.blockNumber }).then(
      (b) => (b.hash ? { hash: b.hash, transactions: new Set((b.transactions as Hex[]).map((t) => t.toLowerCase())) } : undefined),
      () => undefined,
    );
    byHeight.set(receipt.blockNumber, (entry = { at: now, block }));
    // a failed read is not remembered
    void block.then((b) => b === undefined && byHeight.get(receipt.blockNumber) === entry && byHeight.delete(receipt.blockNumber));
  }
  const block = await entry.block;
  return block !== undefined && block.hash === receipt.blockHash && block.transactions.has(receipt.transactionHash.toLowerCase());
}

export async function findMined(chain: ChainClient, hashes: readonly Hex[], confirmations: number): Promise<MinedTransaction | undefined> {
  const receipts = await Promise.all(hashes.map((hash) => chain.client.getTransactionReceipt({ hash }).then((r) => ({ hash, receipt: r }), () => undefined)));
  const mined = receipts.find((r) => r !== undefined);
  if (!mined) return undefined;
  if (!(await isCanonical(chain, mined.receipt))) return undefined;
  if (confirmations > 1) {
    // An RPC failure here means "not known yet", like a failed receipt lookup above: callers poll.
    const head = await chain.client.getBlockNumber({ cacheTime: 0 }).catch(() => undefined);
    if (head === undefined || head - mined.receipt.blockNumber + 1n < BigInt(confirmations)) return undefined;
  }
  return mined;
}

/**
 * Whether any of the hashes may be on chain: a receipt found (in any block), or a lookup the
 * provider did not answer. False only when every lookup answered "not found": what a decision that
 * our transaction was never mined (its nonce taken by another) must rest on.
 */
export async function maybeMined(chain: ChainClient, hashes: readonly Hex[]): Promise<boolean> {
  const found = await Promise.all(hashes.map((hash) => chain.client.getTransactionReceipt({ hash }).then(() => true, (e: unknown) => !(e instanceof TransactionReceiptNotFoundError))));
  return found.includes(true);
}

export const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

export interface ReceiptPollerOptions {
  /** First interval between two reads of the head while transactions are awaited. */
  intervalMs: number;
  /** The interval doubles after every read that found the head unchanged, up to this; a transaction no followed block holds is looked up every 5 x this. */
  maxIntervalMs: number;
  /** Receipt calls one wait may make; past it the wait stops asking (the reconciler still does). */
  maxCallsPerWait: number;
}

export const DEFAULT_RECEIPT_POLLING: ReceiptPollerOptions = { intervalMs: 100, maxIntervalMs: 1000, maxCallsPerWait: 40 };

interface Watch {
  inFlight?: Promise<MinedTransaction | undefined>;
  last?: MinedTransaction;
  /** When a lookup is due even though no followed block holds the transaction (lagging endpoints, skipped blocks, reorgs). */
  fallbackAt: number;
  /** Before this, a followed block holding the transaction does not make a lookup due (one just missed: a lagging endpoint, or not deep yet). */
  retryAt: number;
  calls: number;
  lastUsed: number;
  hashes: readonly Hex[];
}

/** Blocks read back at most when the head moved by more than one since the last read. */
const MAX_BACKFILL = 8;

/**
 * One lookup per transaction and process, when it is due: whoever asks while a lookup is in flight
 * shares it. A transaction is looked up when first asked about, when a block the poller follows
 * holds it, and otherwise only every few seconds. The poller follows the head (one block read,
 * with its transaction hashes, shared by every wait) while someone asks, backing off while the head
 * stands still: N pending transactions cost a block read per block plus one receipt each, not N
 * polls per block. A watch nobody asked about for a while is forgotten.
 */
export function createReceiptPoller(chain: ChainClient, opts: ReceiptPollerOptions = DEFAULT_RECEIPT_POLLING) {
  const watches = new Map<string, Watch>();
  const idleMs = Math.max(opts.maxIntervalMs * 3, 3000);
  const fallbackMs = opts.maxIntervalMs * 5;
  // Hashes someone waits for (lower case), and the followed block each was seen in.
  const wanted = new Set<string>();
  const included = new Map<string, bigint>();
  // Hashes about to be sent on a chain that keeps a block schedule (by when): such a transaction
  // cannot be in a block yet, so its first wait looks it up once a followed block holds it, not at
  // once (a burst's thousand lookups that could only answer "not yet").
  const expected = new Map<string, number>();
  let head: { number: bigint; hash: Hex | null } | undefined;
  let following: Promise<void> | undefined;
  let followAt = 0;
  let followIntervalMs = opts.intervalMs;

  function forget(hashes: readonly Hex[]) {
    for (const h of hashes) {
      wanted.delete(h.toLowerCase());
      included.delete(h.toLowerCase());
      expected.delete(h.toLowerCase());
    }
  }

  // Forgets idle watches at most once a second: on every lookup it would walk a burst's thousand
  // watches for each of their thousand waiters.
  let sweptAt = 0;
  function sweep(now: number) {
    if ((watches.size < 256 && expected.size < 256) || now - sweptAt < 1000) return;
    sweptAt = now;
    for (const [h, at] of expected) {
      if (now - at <= idleMs) continue;
      expected.delete(h); // never awaited (its send failed): nothing follows it any more
      if (!wanted.has(h)) included.delete(h);
    }
    for (const [key, w] of watches) {
      if (w.inFlight || now - w.lastUsed <= idleMs) continue;
      watches.delete(key);
      forget(w.hashes);
    }
  }

  async function readBlocks(): Promise<void> {
    const latest = await chain.client.getBlock({ blockTag: "latest" });
    const number = latest.number!;
    if (head && number <= head.number && latest.hash === head.hash) {
      followIntervalMs = Math.min(followIntervalMs * 2, opts.maxIntervalMs); // the head stands still: ask less often
      return;
    }
    // A new head (or another block at the same height: a reorg, another endpoint): read it, and what it skipped.
    followIntervalMs = opts.intervalMs;
    const missed: bigint[] = [];
    for (let n = number - 1n; head && n > head.number && missed.length < MAX_BACKFILL; n--) missed.push(n);
    const blocks = [latest, ...(await Promise.all(missed.map((n) => chain.client.getBlock({ blockNumber: n }).catch(() => undefined))))];
    for (const block of blocks) {
      for (const hash of (block?.transactions ?? []) as Hex[]) {
        const h = hash.toLowerCase();
        if (wanted.has(h) || expected.has(h)) included.set(h, block!.number!);
      }
    }
    head = { number, hash: latest.hash };
  }

  /** Reads the head (and blocks it skipped) unless a read is in flight or was made too recently. */
  function follow(now: number): Promise<void> {
    if (following) return following;
    if (now < followAt) return Promise.resolve();
    followAt = now + followIntervalMs;
    following = readBlocks()
      .catch(() => undefined) // an RPC failure: the fallback lookups still run
      .finally(() => (following = undefined));
    return following;
  }

  return {
    /**
     * The mined receipt of one of the hashes (deep enough), or undefined when not (yet) known.
     * `since`: when a reorg last put the transaction back on its way; a receipt found before then
     * is of a block that left the chain, so the watch starts afresh.
     */
    async find(hashes: readonly Hex[], confirmations: number, since?: string): Promise<MinedTransaction | undefined> {
      const key = `${confirmations}:${since ?? ""}:${[...hashes].sort().join(",")}`;
      let now = Date.now();
      sweep(now);
      let w = watches.get(key);
      if (w && !w.inFlight && now - w.lastUsed > idleMs) w = undefined; // a new wait: a fresh budget
      const first = !w;
      // Announced before its send: no block held it then, so the first look waits for one that does.
      const fresh = first && hashes.every((h) => expected.has(h.toLowerCase()));
      if (!w) {
        watches.set(key, (w = { fallbackAt: now + fallbackMs, retryAt: 0, calls: 0, lastUsed: now, hashes }));
        for (const h of hashes) wanted.add(h.toLowerCase());
      }
      w.lastUsed = now;
      if (w.last) return w.last; // mined stays mined (reorgs are the reconciler's business)
      if (w.inFlight) return w.inFlight;
      // In a followed block, as deep as asked (by the head followed), and not just missed.
      const seen = () =>
        Date.now() >= w.retryAt &&
        hashes.some((h) => {
          const at = included.get(h.toLowerCase());
          return at !== undefined && head !== undefined && head.number - at + 1n >= BigInt(confirmations);
        });
      if ((!first || fresh) && !seen()) {
        await follow(now);
        now = Date.now();
        if (w.inFlight) return w.inFlight; // another waiter started the lookup meanwhile
        if (!seen() && now < w.fallbackAt) return undefined;
      }
      if (w.calls + hashes.length > opts.maxCallsPerWait) return undefined;
      const watch = w;
      watch.calls += hashes.length;
      watch.fallbackAt = now + fallbackMs;
      watch.inFlight = findMined(chain, hashes, confirmations)
        .then((mined) => {
          watch.last = mined;
          if (mined) forget(hashes);
          // A followed block holds it but the lookup found nothing (yet): a lagging endpoint, or not
          // deep enough. The block still counts, a second later.
          else watch.retryAt = Date.now() + opts.maxIntervalMs;
          return mined;
        })
        .finally(() => (watch.inFlight = undefined));
      return watch.inFlight;
    },
    /**
     * Announces transactions about to be sent where blocks keep a schedule: a block read from now on
     * that holds one is noted, and the first wait for it looks it up only then (or at the fallback).
     */
    expect(hashes: readonly Hex[]): void {
      const now = Date.now();
      sweep(now);
      for (const h of hashes) expected.set(h.toLowerCase(), now);
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
export function pollMined(chain: ChainClient, hashes: readonly Hex[], confirmations: number, since?: string): Promise<MinedTransaction | undefined> {
  return receiptPoller(chain).find(hashes, confirmations, since);
}
