// Drives every open outbox transaction of a network to a receipt, from any facilitator process:
// broadcasts what was stored but not sent (a crash, an unreachable node), re-sends what a node
// forgot, replaces what is stuck below the fee market, and records mined outcomes on the payment.
// Row locks with SKIP LOCKED keep two reconcilers from acting on one transaction at once.
import type { Logger } from "../../platform/logger.ts";
import type { Metrics } from "../../platform/metrics.ts";
import type { ChainClient } from "../chain.ts";
import type { OutboxSigner } from "./outbox-signer.ts";
import { findMined } from "./receipts.ts";
import type { OutboxRow, SettlementStore } from "./store.ts";

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
  maxFeePerGasWei?: bigint;
}

const bump = (v: bigint) => (v * 1125n) / 1000n + 1n; // +12.5%: above every client's replacement threshold

export function startReconciler(opts: ReconcilerOptions) {
  const { store, signer, chain, network, logger } = opts;
  const broadcastAfter = (opts.broadcastAfterMs ?? 2000) / 1000;
  const replaceAfter = (opts.replaceAfterMs ?? 15_000) / 1000;
  let running: Promise<void> | undefined;
  let stopped = false;

  async function pass(): Promise<void> {
    for (const tx of await store.openOutbox(signer.getAddresses())) {
      try {
        await reconcile(tx);
      } catch (e) {
        logger.warn({ id: tx.id, signer: tx.signer, nonce: tx.nonce, err: (e as Error).name }, "could not reconcile a transaction; will retry");
      }
    }
    await exportStats();
  }

  async function reconcile(tx: OutboxRow): Promise<void> {
    const mined = await findMined(chain, tx.hashes, opts.confirmations);
    if (mined) {
      await store.recordMined(tx.payment_id, tx.id, mined.hash, mined.receipt.status === "success", mined.receipt.gasUsed * mined.receipt.effectiveGasPrice);
      return;
    }
    if (tx.state === "signed") {
      // Stored but not sent (a crash, an unreachable node). The same bytes twice are harmless.
      if (tx.age_seconds >= broadcastAfter) await signer.broadcast(tx).catch((e) => logger.warn({ id: tx.id, err: (e as Error).name }, "broadcast retry failed"));
      return;
    }
    // Each attempt gets `replaceAfter` to mine before the next, higher-fee one.
    if (tx.age_seconds >= replaceAfter * tx.hashes.length) return replace(tx);
    const known = await chain.client.getTransaction({ hash: tx.hash }).catch(() => undefined);
    // The node forgot it (restart, eviction): send the same bytes again.
    if (!known) await signer.broadcast(tx).catch(() => undefined);
  }

  async function replace(tx: OutboxRow) {
    const market = await chain.client.estimateFeesPerGas();
      let maxFeePerGas = bump(BigInt(tx.max_fee_per_gas)) > market.maxFeePerGas ? bump(BigInt(tx.max_fee_per_gas)) : market.maxFeePerGas;
      let maxPriorityFeePerGas = bump(BigInt(tx.max_priority_fee_per_gas)) > market.maxPriorityFeePerGas ? bump(BigInt(tx.max_priority_fee_per_gas)) : market.maxPriorityFeePerGas;
      if (opts.maxFeePerGasWei !== undefined && maxFeePerGas > opts.maxFeePerGasWei) {
        if (BigInt(tx.max_fee_per_gas) >= opts.maxFeePerGasWei) return; // already at the cap: wait for the market
        maxFeePerGas = opts.maxFeePerGasWei;
      }
      if (maxPriorityFeePerGas > maxFeePerGas) maxPriorityFeePerGas = maxFeePerGas;
      const signed = await signer.resign(tx, { maxFeePerGas, maxPriorityFeePerGas });
      if (!(await store.replace(tx.id, tx.hash, { maxFeePerGas, maxPriorityFeePerGas }, signed))) return; // another reconciler replaced it first
      logger.info({ signer: tx.signer, nonce: tx.nonce, replaces: tx.hash, hash: signed.hash }, "replaced a stuck transaction with higher fees");
    await signer.broadcast({ id: tx.id, raw_tx: signed.raw, hash: signed.hash }).catch((e) => logger.warn({ err: (e as Error).name }, "replacement broadcast failed"));
  }

  async function exportStats() {
    const stats = await store.stats();
    for (const state of ["signed", "broadcast", "confirmed", "reverted", "dropped"]) opts.metrics.outbox.set({ network, state }, stats.states[state] ?? 0);
    opts.metrics.pendingAge.set({ network }, stats.oldestOpenSeconds);
    for (const address of signer.getAddresses()) opts.metrics.signerPending.set({ network, signer: address }, stats.pendingBySigner[address] ?? 0);
  }

  const timer = setInterval(() => {
    if (running || stopped) return;
    running = pass()
      .catch((e) => logger.warn({ err: (e as Error).name, message: String((e as Error).message).split("\n")[0]!.replace(/https?:\/\/\S+/g, "<rpc>") }, "reconcile pass failed"))
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
