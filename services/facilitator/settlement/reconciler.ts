// Drives every open outbox transaction of a network to a receipt, from any facilitator process:
// broadcasts what was stored but not sent (a crash, an unreachable node, a key waiting for funds),
// re-sends what a node forgot, replaces what is stuck below the fee market (a bounded number of
// times, under the fee cap), gives up the nonce of what a node refuses for good, records mined
// outcomes on the payment, and re-sends mined transactions a reorg removed.
// Compare-and-set updates keep two reconcilers from acting on one transaction twice.
import { safeMessage, type Logger } from "../../platform/logger.ts";
import type { Metrics } from "../../platform/metrics.ts";
import type { ChainClient } from "../chain.ts";
import { TransactionReceiptNotFoundError } from "viem";
import type { MarketFees, OutboxSigner, SendOutcome } from "./outbox-signer.ts";
import { findMined, maybeMined } from "./receipts.ts";
import { NONCE_FILLER_PAYMENT, type ListedOutboxRow, type OutboxRow, type SettlementStore } from "./store.ts";

export interface ReconcilerOptions {
  store: SettlementStore;
  signer: OutboxSigner;
  chain: ChainClient;
  network: string;
  confirmations: number;
  logger: Logger;
  metrics: Metrics;
  intervalMs?: number;
  /** A stored transaction not yet broadcast after this long is sent by the reconciler. */
  broadcastAfterMs?: number;
  /** A broadcast transaction without a receipt after this long is replaced with higher fees. */
  replaceAfterMs?: number;
  /** Fee replacements of one transaction at most; past them it waits for the market. */
  maxFeeBumps?: number;
  /** A key the node said cannot pay. */
  onInsufficientFunds?: (signer: `0x${string}`) => void;
}

const bump = (v: bigint) => (v * 1125n) / 1000n + 1n; // +12.5%: above every client's replacement threshold
const max = (a: bigint, b: bigint) => (a > b ? a : b);
const min = (a: bigint, b: bigint) => (a < b ? a : b);

export const DEFAULT_MAX_FEE_BUMPS = 5;

/**
 * Blocks (past the confirmations) a nonce the node calls used must stay without a receipt of ours
 * before the transaction is given up: behind a load balancer, the node that refuses a re-send may
 * be ahead of the one that answers receipt lookups, and the nonce may be taken by our own attempt.
 */
export const NONCE_TAKEN_GRACE_BLOCKS = 3n;

/** A transaction left to its receipt wait is checked to be in the node's pool once it is this old (seconds). */
const AWAITED_CHECK_S = 5;
/** A key's lowest open transaction is checked for being held once it is this old (seconds, per attempt). */
const HELD_CHECK_S = 1;
/**
 * How long a sighting of the node counting pooled transactions in its pending nonce (pending above
 * latest for a key) vouches for it: where it does, a held transaction is recognised at once.
 */
const POOL_COUNTED_MS = 60_000;

/**
 * Blocks the head must move while a key's next transaction looks held before it is replaced: a
 * provider whose pending nonce counts only mined transactions (many behind a balancer do) shows a
 * healthy one so until it is mined, a block or two later.
 */
const HELD_BLOCKS = 3n;
/** …or for this long where no block comes (a chain mining on demand, such as anvil's automine, with no other traffic). */
export const HELD_WAIT_MS = 20_000;

/** Replacements that may go above a relative fee cap the base fee's fall has lowered (1.125^5, 1.8x). */
const RELAXED_BUMPS = 5;

/** How often the outbox gauges of settled states (confirmed, reverted, dropped) are counted again. */
const SETTLED_STATS_MS = 10_000;

/** Transactions from the node's pending nonce on that one pass sends again. */
const RESEND_WINDOW = 64n;

/** Open transactions a pass works on at once. */
const PASS_CONCURRENCY = 16;

/** The longest an idle reconciler on the embedded engine goes without a pass all the same. */
const QUIET_PASS_MS = 30_000;

export function startReconciler(opts: ReconcilerOptions) {
  const { store, signer, chain, network, logger } = opts;
  const broadcastAfter = (opts.broadcastAfterMs ?? 2000) / 1000;
  const replaceAfter = (opts.replaceAfterMs ?? 15_000) / 1000;
  const maxBumps = opts.maxFeeBumps ?? DEFAULT_MAX_FEE_BUMPS;
  // Rows already reported as waiting at a limit: say it once per row, not once per pass.
  const waitingAtLimit = new Set<string>();
  // Rows whose nonce a node called used, with the head when that was first seen.
  const nonceTakenAt = new Map<string, bigint>();
  // Rows whose current attempt looks held by the node, with the head when first seen so.
  const heldSince = new Map<string, { hash: string; head: bigint; at: number }>();
  // When the node was last seen counting pooled transactions in a key's pending nonce (see replaceHeld).
  let poolCountedAt = -Infinity;
  let running: Promise<void> | undefined;
  let stopped = false;
  // Where this process is the store's only writer (the embedded engine), a pass that found nothing
  // open or watched, with every gauge counted, is followed by the next only once a transaction is
  // stored (or QUIET_PASS_MS on): an idle facilitator otherwise spent a few milliseconds of CPU a
  // second on queries that could find nothing. With a shared database other replicas add rows.
  let quiet: { stored: number; at: number } | undefined;

  async function pass(): Promise<void> {
    const storedBefore = store.transactionsStored();
    // Unsent transactions come first (the store orders them so): each is a nonce gap every later
    // transaction of its key waits behind. The rows' RPC round trips overlap, a few at a time: one
    // after another, a burst's thousand open transactions took minutes per pass at 25 ms a call.
    const rows = await store.openOutbox(signer.getAddresses());
    const view: PassView = { pending: new Map(), fees: undefined, lowest: new Map() };
    for (const tx of rows) {
      const nonce = BigInt(tx.nonce);
      if (nonce < (view.lowest.get(tx.signer) ?? nonce + 1n)) view.lowest.set(tx.signer, nonce);
    }
    // Every key with open transactions: read once a pass, it tells whether the node counts its pool.
    const counted = [...view.lowest.keys()].map((address) => pendingNonce(view, address as `0x${string}`));
    let next = 0;
    const worker = async () => {
      for (let i = next++; i < rows.length; i = next++) {
        const tx = rows[i]!;
        try {
          await reconcile(tx, view);
        } catch (e) {
          logger.warn({ id: tx.id, signer: tx.signer, nonce: tx.nonce, err: (e as Error).name }, "could not reconcile a transaction; will retry");
        }
      }
    };
    await Promise.all([...counted, ...Array.from({ length: Math.min(PASS_CONCURRENCY, rows.length) }, worker)]);
    const watched = await watchDepth().catch((e) => {
      logger.warn({ err: (e as Error).name }, "could not check mined transactions for reorgs; will retry");
      return -1;
    });
    await recordUnrecorded().catch((e) => logger.warn({ err: (e as Error).name }, "could not record mined payments; will retry"));
    const countedSettled = await exportStats();
    quiet = store.soleWriter && rows.length === 0 && watched === 0 && countedSettled ? { stored: storedBefore, at: Date.now() } : undefined;
  }

  /** A payment whose transaction is mined but whose record still says sent gets its outcome recorded (what a retry would do). */
  async function recordUnrecorded(): Promise<void> {
    for (const row of await store.unrecordedMined()) {
      // One row that cannot be recorded never holds up the others.
      await store.recordMined(row.payment_id, row.id, row.mined_hash, row.confirmed).catch((e) => logger.warn({ paymentId: row.payment_id, err: (e as Error).name }, "could not record a mined payment; will retry"));
    }
  }

  /** What one pass reads once and shares between its rows. */
  interface PassView {
    /** Per key, the node's next nonce counting its pool: the first nonce it lacks (undefined: no answer, ask next pass). */
    pending: Map<string, Promise<bigint | undefined>>;
    fees: Promise<MarketFees> | undefined;
    /** Per key, its lowest open nonce: the transaction every later one of the key waits on. */
    lowest: Map<string, bigint>;
  }
  const pendingNonce = (view: PassView, address: `0x${string}`) => {
    let p = view.pending.get(address);
    if (!p) {
      const count = (blockTag: "pending" | "latest") => chain.client.getTransactionCount({ address, blockTag }).then(BigInt, () => undefined);
      p = Promise.all([count("pending"), count("latest")]).then(([pending, latest]) => {
        // Above the mined count: the node counts the transactions its pool holds ready (anvil, geth).
        if (pending !== undefined && latest !== undefined && pending > latest) poolCountedAt = Date.now();
        return pending;
      });
      view.pending.set(address, p);
    }
    return p;
  };

  async function reconcile(listed: ListedOutboxRow, view: PassView): Promise<void> {
    // Most of a burst's rows: sent, young, and watched by their receipt wait (see below). Only the
    // others are read in full (their bytes), as they are now.
    const young = listed.age_seconds < (BigInt(listed.nonce) === view.lowest.get(listed.signer) ? HELD_CHECK_S : AWAITED_CHECK_S);
    if (young && listed.state === "broadcast" && signer.awaited(listed.hash) && listed.age_seconds < replaceAfter * listed.hashes.length) return;
    const tx = await store.openTransaction(listed.id);
    if (!tx) return; // mined or dropped since it was listed
    const dueReplacement = tx.age_seconds >= replaceAfter * tx.hashes.length;
    const nonce = BigInt(tx.nonce);
    const blocking = nonce === view.lowest.get(tx.signer);
    // The transaction its key's later ones wait on is replaced on the bump schedule once due (a node
    // may accept fees the block builders do not). One behind it is replaced only when priced under
    // the market: otherwise it waits for the one before it, not for fees, and a replacement would
    // only cost a signature and a send (a burst's backlog re-signed row by row). A fee read that
    // fails is no reason to replace.
    const worthReplacing = async () =>
      dueReplacement && (blocking || (await (view.fees ??= signer.marketFees()).then((market) => underpriced(tx, market), () => false)));
    // A transaction a receipt wait of this process is watching is left to it: a lookup per pass of
    // every transaction of a burst would double the receipt calls.
    if (tx.state === "broadcast" && signer.awaited(tx.hash) && !(await worthReplacing())) {
      // Still, once unmined a while it is checked against the node's pool: a node that lost it
      // leaves a gap every later nonce of the key waits behind. One read per key and pass (the
      // first nonce the node lacks), not a lookup per transaction: the rows from that nonce on are
      // sent again with their stored bytes (the node answers "already known" for those it has), a
      // window at a time (a lagging node behind a balancer would otherwise get the whole backlog).
      // Where that read fails, or the node counts transactions queued behind a gap, the key's
      // lowest open transaction is looked up by hash.
      if (tx.age_seconds < (blocking ? HELD_CHECK_S : AWAITED_CHECK_S)) return;
      const pending = await pendingNonce(view, tx.signer);
      if (blocking && nonce === pending) {
        // The node does not count it, though it may hold it: see replaceHeld.
        const known = await chain.client.getTransaction({ hash: tx.hash }).catch(() => undefined);
        if (known && known.blockNumber === null) await replaceHeld(tx);
        else if (!known) await handle(tx, await signer.send(tx));
        return;
      }
      const missing = (pending !== undefined && nonce >= pending && nonce < pending + RESEND_WINDOW) || (blocking && !(await chain.client.getTransaction({ hash: tx.hash }).catch(() => undefined)));
      if (missing) await handle(tx, await signer.send(tx));
      return;
    }
    const mined = await findMined(chain, tx.hashes, opts.confirmations);
    if (mined) {
      const { receipt } = mined;
      waitingAtLimit.delete(tx.id);
      nonceTakenAt.delete(tx.id);
      heldSince.delete(tx.id);
      await store.recordMined(tx.payment_id, tx.id, mined.hash, receipt.status === "success", receipt.gasUsed * receipt.effectiveGasPrice, { blockNumber: receipt.blockNumber, blockHash: receipt.blockHash });
      return;
    }
    if (tx.state === "signed") {
      // Stored but not sent (a crash, an unreachable node, a refusal waiting for funds). The same bytes twice are harmless.
      if (tx.age_seconds >= broadcastAfter || tx.payment_id === NONCE_FILLER_PAYMENT) await handle(tx, await signer.send(tx));
      return;
    }
    // Each attempt gets `replaceAfter` to mine before the next, higher-fee one; at its limits it waits, still in the pool.
    if ((await worthReplacing()) && (await replace(tx, false))) return;
    const known = await chain.client.getTransaction({ hash: tx.hash }).catch(() => undefined);
    // The node forgot it (restart, eviction, a reorg): send the same bytes again.
    if (!known) await handle(tx, await signer.send(tx));
    else if (blocking && known.blockNumber === null && tx.age_seconds >= HELD_CHECK_S && nonce === (await pendingNonce(view, tx.signer))) await replaceHeld(tx);
  }

  /**
   * The key's lowest open transaction, which the node holds but does not count as pending (its
   * pending nonce is still this one's): a pool that took it in while it saw a gap before it, and
   * never promoted it once the gap closed (anvil does so under concurrent sends; a node whose pool
   * lost track of the sender can too). The same bytes again are "already known" and change
   * nothing, and every later transaction of the key waits behind it: a replacement, which the node
   * takes in afresh, once the attempt has looked held for HELD_BLOCKS blocks or HELD_WAIT_MS
   * (within the bump limit). Where the node was seen counting its pool in pending nonces, a pooled
   * transaction at the pending nonce is held for sure (a ready one would be counted), and is
   * replaced at once: anvil holds one so when a send lands while the block mining its predecessor
   * is written, and in a burst every block it waits costs a whole block of the key's backlog. Only
   * a first attempt goes so, and only if the node's pending nonce, read again now that it is known
   * to hold the transaction, still leaves it out (the pass's read may predate its arrival): a
   * balancer whose nodes disagree costs at most one bump a transaction, then the blocks decide.
   */
  async function replaceHeld(tx: OutboxRow): Promise<void> {
    if (Date.now() - poolCountedAt < POOL_COUNTED_MS && tx.hashes.length === 1 && tx.age_seconds >= HELD_CHECK_S) {
      const pending = await chain.client.getTransactionCount({ address: tx.signer, blockTag: "pending" }).then(BigInt, () => undefined);
      if (pending !== BigInt(tx.nonce)) return;
      heldSince.delete(tx.id);
      if (!waitingAtLimit.has(tx.id)) logger.warn({ signer: tx.signer, nonce: tx.nonce, hash: tx.hash }, "the node holds the key's next transaction without executing it; replacing it");
      await replace(tx, false);
      return;
    }
    if (tx.age_seconds < AWAITED_CHECK_S * tx.hashes.length) return;
    const head = await chain.client.getBlockNumber({ cacheTime: 0 }).catch(() => undefined);
    if (head === undefined) return;
    const seen = heldSince.get(tx.id);
    if (seen?.hash !== tx.hash) return void heldSince.set(tx.id, { hash: tx.hash, head, at: Date.now() });
    if (head < seen.head + HELD_BLOCKS && Date.now() - seen.at < HELD_WAIT_MS) return;
    heldSince.delete(tx.id);
    // Said once an attempt; at a limit, replace() says so once.
    if (!waitingAtLimit.has(tx.id)) logger.warn({ signer: tx.signer, nonce: tx.nonce, hash: tx.hash }, "the node holds the key's next transaction without executing it; replacing it");
    await replace(tx, false);
  }

  /** What a refused broadcast of a stored transaction leads to. */
  async function handle(tx: OutboxRow, outcome: SendOutcome): Promise<void> {
    if (outcome === "sent" || outcome === "unreachable" || outcome === "nonce_too_high") return;
    const filler = tx.payment_id === NONCE_FILLER_PAYMENT;
    switch (outcome) {
      case "underpriced":
      case "replacement_underpriced":
        await replace(tx, true); // priced under the market (or under another pooled transaction): reprice
        return;
      case "insufficient_funds":
        opts.onInsufficientFunds?.(tx.signer);
        if (!waitingAtLimit.has(tx.id)) logger.warn({ signer: tx.signer, nonce: tx.nonce }, "the key cannot pay this transaction; it is sent once the key is funded");
        waitingAtLimit.add(tx.id);
        return;
      case "nonce_too_low": {
        // Ours, mined where this node cannot see it yet, or another transaction of the key (sent
        // outside the fleet): only the chain moving on without a receipt of ours tells them apart.
        const head = await chain.client.getBlockNumber({ cacheTime: 0 });
        const seen = nonceTakenAt.get(tx.id);
        if (seen === undefined) nonceTakenAt.set(tx.id, head);
        if (seen === undefined || head < seen + BigInt(opts.confirmations) + NONCE_TAKEN_GRACE_BLOCKS) return;
        // Mined after all (the next pass records it), or not known (a lookup the provider failed): nothing concluded.
        if (await maybeMined(chain, tx.hashes)) return;
        nonceTakenAt.delete(tx.id);
        await store.markDropped(tx.id, "nonce used outside the fleet", outcome);
        await store.advanceNonce(tx.signer, await chain.client.getTransactionCount({ address: tx.signer, blockTag: "pending" }));
        if (!filler) await store.recordRejected(tx.payment_id, outcome, tx.reorged);
        return;
      }
      default:
        if (filler) return; // a zero-value self-transfer refused for good cannot be fixed by another one: keep trying
        await signer.retire(tx, outcome, outcome);
        await store.recordRejected(tx.payment_id, outcome, tx.reorged);
    }
  }

  /** Fees under what the market asks now: the base fee plus its tip, or a smaller tip than it. */
  function underpriced(tx: OutboxRow, market: MarketFees): boolean {
    const tip = BigInt(tx.max_priority_fee_per_gas);
    return BigInt(tx.max_fee_per_gas) < market.baseFeePerGas + market.maxPriorityFeePerGas || tip < market.maxPriorityFeePerGas;
  }

  /** Re-signs with the same nonce at higher fees, within the bump limit and the fee cap; false when it may not. */
  async function replace(tx: OutboxRow, reprice: boolean): Promise<boolean> {
    const bumps = tx.hashes.length - 1;
    if (bumps >= maxBumps) return waitAtLimit(tx, "bumps");
    const market = await signer.marketFees();
    // The cap no longer reaches the chain's floor (base fee + minimum tip): the chain would refuse any replacement.
    if (market.belowFloor) return waitAtLimit(tx, "fee_cap");
    // A repricing of a refused transaction needs only the market; a replacement must outbid its predecessor.
    const floor = reprice ? { maxFeePerGas: 0n, maxPriorityFeePerGas: 0n } : { maxFeePerGas: bump(BigInt(tx.max_fee_per_gas)), maxPriorityFeePerGas: bump(BigInt(tx.max_priority_fee_per_gas)) };
    const maxFeePerGas = max(floor.maxFeePerGas, market.maxFeePerGas);
    // The relative cap follows the base fee: once that has fallen since the predecessor was signed,
    // any replacement (it must outbid it) is above the cap, and a transaction priced above the
    // market would "wait for the market" for ever. A replacement may go one bump above a
    // predecessor, for the first RELAXED_BUMPS replacements (1.8x of the last fee within the cap,
    // whatever X402_MAX_FEE_BUMPS says); the absolute cap (X402_MAX_FEE_PER_GAS_WEI) always holds.
    // What is paid is the base fee plus the tip.
    const relaxed = bumps < RELAXED_BUMPS ? max(market.cap, floor.maxFeePerGas) : market.cap;
    const cap = reprice ? market.cap : market.absoluteCap === undefined ? relaxed : min(relaxed, market.absoluteCap);
    if (maxFeePerGas > cap) return waitAtLimit(tx, "fee_cap");
    let maxPriorityFeePerGas = max(floor.maxPriorityFeePerGas, market.maxPriorityFeePerGas);
    if (maxPriorityFeePerGas > maxFeePerGas) maxPriorityFeePerGas = maxFeePerGas;
    if (reprice && maxFeePerGas === BigInt(tx.max_fee_per_gas) && maxPriorityFeePerGas === BigInt(tx.max_priority_fee_per_gas)) return waitAtLimit(tx, "fee_cap");
    const signed = await signer.resign(tx, { maxFeePerGas, maxPriorityFeePerGas });
    if (!(await store.replace(tx.id, tx.hash, { maxFeePerGas, maxPriorityFeePerGas }, signed))) return true; // another reconciler replaced it first
    waitingAtLimit.delete(tx.id);
    logger.info({ signer: tx.signer, nonce: tx.nonce, replaces: tx.hash, hash: signed.hash, bump: bumps + 1 }, "replaced a stuck transaction with higher fees");
    const outcome = await signer.send({ id: tx.id, raw_tx: signed.raw, hash: signed.hash, hashes: [...tx.hashes, signed.hash] });
    if (outcome !== "sent") logger.warn({ signer: tx.signer, nonce: tx.nonce, outcome }, "replacement not accepted; the earlier attempt stays in the pool");
    return true;
  }

  function waitAtLimit(tx: OutboxRow, limit: "bumps" | "fee_cap"): false {
    if (waitingAtLimit.has(tx.id)) return false;
    waitingAtLimit.add(tx.id);
    opts.metrics.replacementCapped.inc({ network, limit });
    logger.warn({ signer: tx.signer, nonce: tx.nonce, hash: tx.hash, limit, bumps: tx.hashes.length - 1 }, "stuck transaction not replaced: at its fee limit; it waits for the market");
    return false;
  }

  /**
   * Mined transactions stay watched until `confirmations` blocks deep: one whose block left the
   * canonical chain goes back to 'broadcast' with the very bytes that were mined and is sent again.
   * Returns how many were watched.
   */
  async function watchDepth(): Promise<number> {
    const watched = await store.watchedOutbox(signer.getAddresses());
    if (watched.length === 0) return 0;
    const head = await chain.client.getBlockNumber({ cacheTime: 0 });
    // One block read per block, not a receipt per transaction: a block still at its height with the
    // hash we recorded holds every transaction recorded in it.
    const byBlock = new Map<string, OutboxRow[]>();
    for (const tx of watched) {
      const key = `${tx.mined_block_number}:${tx.mined_block_hash}`;
      byBlock.set(key, [...(byBlock.get(key) ?? []), tx]);
    }
    for (const rows of byBlock.values()) {
      const at = BigInt(rows[0]!.mined_block_number!);
      const block = await chain.client.getBlock({ blockNumber: at }).catch(() => undefined);
      if (block === undefined) continue; // the node did not answer (or lags behind): ask again next pass
      if (block.hash === rows[0]!.mined_block_hash) {
        if (head >= at + BigInt(opts.confirmations)) await store.settleWatch(rows.map((tx) => tx.id));
        continue;
      }
      for (const tx of rows) await recheck(tx);
    }
    return watched.length;
  }

  /** A transaction whose recorded block is no longer at its height: where it is now, or sent again. */
  async function recheck(tx: OutboxRow): Promise<void> {
    const receipt = await chain.client.getTransactionReceipt({ hash: tx.mined_hash! }).catch((e) => (e instanceof TransactionReceiptNotFoundError ? null : undefined));
    if (receipt === undefined) return; // the node did not answer: ask again next pass
    if (receipt?.blockHash === tx.mined_block_hash) return; // nodes behind a balancer disagree for now: ask again next pass
    const row = await store.reorged(tx.id, tx.mined_block_hash!);
    if (!row) return; // another reconciler handled it
    opts.metrics.reorged.inc({ network });
    logger.warn({ signer: tx.signer, nonce: tx.nonce, hash: row.hash, block: tx.mined_block_number }, "a mined settlement transaction left the canonical chain; sending it again");
    // Already included again in the new chain: recorded like any sent transaction, once its block is
    // canonical and `confirmations` deep (findMined, next passes), never before (a success answered early).
    if (receipt) return;
    await handle(row, await signer.send(row));
  }

  // Settled rows are counted every SETTLED_STATS_MS, not every pass: that count scans the network's history.
  let settledCountedAt = 0;
  /** Sets the outbox gauges; whether the settled states were counted too. */
  async function exportStats(): Promise<boolean> {
    const settled = Date.now() - settledCountedAt >= SETTLED_STATS_MS;
    const stats = await store.stats(settled);
    if (settled) settledCountedAt = Date.now();
    for (const state of settled ? ["signed", "broadcast", "confirmed", "reverted", "dropped"] : ["signed", "broadcast"]) opts.metrics.outbox.set({ network, state }, stats.states[state] ?? 0);
    opts.metrics.pendingAge.set({ network }, stats.oldestOpenSeconds);
    for (const address of signer.getAddresses()) opts.metrics.signerPending.set({ network, signer: address }, stats.pendingBySigner[address] ?? 0);
    return settled;
  }

  const timer = setInterval(() => {
    if (running || stopped) return;
    if (quiet && store.transactionsStored() === quiet.stored && Date.now() - quiet.at < QUIET_PASS_MS) return;
    running = pass()
      .catch((e) => logger.warn({ err: (e as Error).name, message: safeMessage(e) }, "reconcile pass failed"))
      .finally(() => (running = undefined));
  }, opts.intervalMs ?? 1000);
  timer.unref();

  return {
    /** Runs one pass now (tests, shutdown). */
    pass,
    async stop() {
      stopped = true;
      clearInterval(timer);
      await running;
    },
  };
}
