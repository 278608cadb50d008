// Receipt lookups across every hash a transaction had (fee replacements keep the nonce and change
// the hash), with a configurable confirmation depth.
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
