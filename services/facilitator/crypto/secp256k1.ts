// Signer recovery for ECDSA signatures (and settlement keys' transaction signing): the native libsecp256k1 binding (prebuilt inside the npm
// tarball of `secp256k1`) where it loads, viem's pure-JS implementation elsewhere. Both paths give
// the same answer for every input (a differential test proves it); the native one is ~20× faster.
import { createRequire } from "node:module";
import { bytesToHex, getAddress, hashTypedData, hexToBytes, recoverAddress as viemRecoverAddress, serializeTransaction, type Address, type Hex, type TypedDataDefinition } from "viem";
import { privateKeyToAccount, type PrivateKeyAccount } from "viem/accounts";
import { keccak256 as keccak256Bytes } from "./keccak.ts";

interface NativeSecp256k1 {
  ecdsaRecover(sig: Uint8Array, recid: number, msg32: Uint8Array, compressed: boolean): Uint8Array;
  ecdsaSign(msg32: Uint8Array, seckey: Uint8Array): { signature: Uint8Array; recid: number };
}

function loadNative(): NativeSecp256k1 | undefined {
  if (process.env.X402_DISABLE_NATIVE_SECP256K1 === "1") return undefined;
  try {
    const require = createRequire(import.meta.url);
    const lib = require("secp256k1/bindings") as NativeSecp256k1; // the N-API binding, not the JS fallback
    return lib;
  } catch {
    return undefined;
  }
}

const native = loadNative();
export const nativeRecoveryAvailable = native !== undefined;

const N = 0xfffffffffffffffffffffffffffffffebaaedce6af48a03bbfd25e8cd0364141n;
const SIGNATURE_65 = /^0x[0-9a-fA-F]{130}$/;
const HASH_32 = /^0x[0-9a-fA-F]{64}$/;

/**
 * r, s and the recovery bit of a 65-byte hex signature (r ‖ s ‖ v), read as viem's parseSignature
 * reads it, without its curve library: undefined where viem throws (v not 0, 1, 27 or 28; r or s
 * not in [1, n)). `v` is the last byte as signed.
 */
export function signatureParts(signature: Hex): { r: bigint; s: bigint; yParity: 0 | 1; v: number } | undefined {
  if (!SIGNATURE_65.test(signature)) return undefined;
  const v = parseInt(signature.slice(130), 16);
  const yParity = v === 0 || v === 27 ? 0 : v === 1 || v === 28 ? 1 : undefined;
  const r = BigInt(`0x${signature.slice(2, 66)}`);
  const s = BigInt(`0x${signature.slice(66, 130)}`);
  if (yParity === undefined || r === 0n || r >= N || s === 0n || s >= N) return undefined;
  return { r, s, yParity, v };
}

/**
 * Recovers the address that signed a 32-byte hash, in lower case; throws where viem throws. (No
 * EIP-55 checksum: callers compare, and a checksum is one more keccak per new signer.) `parts`:
 * the signature's, where the caller has read them already.
 */
export async function recoverSigner(hash: Hex, signature: Hex, parts = signatureParts(signature)): Promise<Address> {
  // Only r ‖ s ‖ v in 65 bytes goes native: viem would read a longer or oddly prefixed one that its
  // recovery refuses (and a contract's ecrecover would never see). Anything else, a v or an r or s
  // outside what viem parses included, is viem's to answer (it throws alike).
  if (!native || !parts || !HASH_32.test(hash)) return lower(await viemRecoverAddress({ hash, signature }));
  let { s, yParity: recovery } = parts;
  if (s > N / 2n) {
    // libsecp256k1 recovers low-s signatures only; (r, n - s) with the other parity is the same key.
    s = N - s;
    recovery ^= 1;
  }
  // Bytes through Buffer's native hex decoding (viem's hexToBytes is a loop in JavaScript).
  const compact = Buffer.from(`${signature.slice(2, 66)}${s.toString(16).padStart(64, "0")}`, "hex");
  let publicKey: Uint8Array;
  try {
    publicKey = native.ecdsaRecover(compact, recovery, Buffer.from(hash.slice(2), "hex"), false);
  } catch {
    return lower(await viemRecoverAddress({ hash, signature })); // no point on the curve for this r: viem's answer (an error) stands
  }
  return `0x${keccak256Bytes(publicKey.subarray(1)).slice(-40)}`;
}

const lower = (address: Address) => address.toLowerCase() as Address;

/** viem's `recoverAddress`, with its parameters and answers (checksummed): native for hex input, viem's own otherwise. */
export async function recoverAddress(args: Parameters<typeof viemRecoverAddress>[0]): Promise<Address> {
  return typeof args.hash === "string" && typeof args.signature === "string" ? getAddress(await recoverSigner(args.hash, args.signature)) : viemRecoverAddress(args);
}

/** viem's `recoverTypedDataAddress` (the typed data's hash, then `recoverAddress`). */
export function recoverTypedDataAddress(args: TypedDataDefinition & { signature: Parameters<typeof viemRecoverAddress>[0]["signature"] }): Promise<Address> {
  return recoverAddress({ hash: hashTypedData(args), signature: args.signature });
}

/**
 * A settlement key's account whose transactions are signed by libsecp256k1 where it loads: RFC 6979
 * and low s, so the very bytes viem's pure-JS signer makes (a differential test proves it), at a
 * fraction of the CPU. Everything else is viem's account.
 */
export function settlementAccount(privateKey: Hex): PrivateKeyAccount {
  const account = privateKeyToAccount(privateKey);
  if (!native) return account;
  const secret = hexToBytes(privateKey);
  const signTransaction: PrivateKeyAccount["signTransaction"] = async (transaction, options) => {
    // EIP-1559 only (all the outbox signs): legacy v and blob sidecars are viem's business.
    if (transaction.type !== "eip1559") return account.signTransaction(transaction, options);
    const serializer = options?.serializer ?? serializeTransaction;
    const unsigned = await serializer(transaction);
    const { signature, recid } = native.ecdsaSign(Buffer.from(keccak256Bytes(Buffer.from(unsigned.slice(2), "hex")).slice(2), "hex"), secret);
    return (await serializer(transaction, { r: bytesToHex(signature.subarray(0, 32)), s: bytesToHex(signature.subarray(32)), yParity: recid })) as never;
  };
  return { ...account, signTransaction };
}
