// A wallet's signing functions for one operation: the master key that wraps its data key is looked
// up first (a key not in the keyring is a clear 503, not a crash); each signature then unwraps,
// decrypts, signs and zeroes inside custody. Errors never carry key material.
import type { Address, Hex } from "viem";
import { CustodyError, signDigest, signDigestParts, withPrivateKey, type SealedKey } from "./custody.ts";
import { WalletError } from "./errors.ts";
import type { KeyringSource } from "./keyring.ts";

export interface UnlockedWallet {
  signDigest(digest: Hex): Hex;
  signTransaction(digest: Hex): { r: Hex; s: Hex; yParity: number };
}

export async function unlockWallet(keyring: KeyringSource, wallet: { id: string; address: Address; sealed: SealedKey }): Promise<UnlockedWallet> {
  const master = await keyring.find(wallet.sealed.masterKeyId);
  if (!master) {
    throw new WalletError(
      "master_key_unavailable",
      `the data key of wallet ${wallet.id} is wrapped by master key ${wallet.sealed.masterKeyId}, which is not in the service's master key file; add it back (rotation keeps old keys until every data key is re-wrapped)`,
    );
  }
  const run = <T>(fn: (privateKey: Uint8Array) => T): T => {
    try {
      return withPrivateKey(wallet.id, wallet.address, wallet.sealed, master, fn);
    } catch (e) {
      if (e instanceof CustodyError) throw new WalletError("master_key_unavailable", `the key of wallet ${wallet.id} cannot be opened with master key ${master.id}: ${e.message}`);
      throw e;
    }
  };
  return {
    signDigest: (digest) => run((pk) => signDigest(pk, digest)),
    signTransaction: (digest) => run((pk) => signDigestParts(pk, digest)),
  };
}
