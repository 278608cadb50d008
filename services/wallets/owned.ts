// Lookups by a caller: another platform's wallet answers 404 exactly like an id that does not exist.
import { WalletError } from "./errors.ts";
import type { Caller } from "./payments.ts";
import type { Wallet, WalletStore } from "./store.ts";

/** What a store lookup of one wallet found (the store answers undefined for a wallet not the platform's), or not_found. */
export async function owned<T>(lookup: Promise<T | undefined>, walletId: string): Promise<T> {
  const found = await lookup;
  if (found === undefined) throw new WalletError("not_found", `no wallet ${walletId}`);
  return found;
}

export const ownedWallet = (store: WalletStore, caller: Caller, walletId: string): Promise<Wallet> => owned(store.wallet(caller.platformId, walletId), walletId);
