// Signer recovery for ECDSA signatures: the native libsecp256k1 binding (prebuilt inside the npm
// tarball of `secp256k1`) where it loads, viem's pure-JS implementation elsewhere. Both paths give
// the same answer for every input (a differential test proves it); the native one is ~20× faster.
import { createRequire } from "node:module";
import { hexToBytes, keccak256, recoverAddress as viemRecoverAddress, parseSignature, type Address, type Hex } from "viem";

interface NativeSecp256k1 {
  ecdsaRecover(sig: Uint8Array, recid: number, msg32: Uint8Array, compressed: boolean): Uint8Array;
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

/**
 * Recovers the address that signed a 32-byte hash, in lower case; throws where viem throws. (No
 * EIP-55 checksum: callers compare, and a checksum is one more keccak per new signer.)
 */
export async function recoverSigner(hash: Hex, signature: Hex): Promise<Address> {
  if (!native) return lower(await viemRecoverAddress({ hash, signature }));
  // parseSignature normalises v / yParity exactly as viem's own recovery does (and throws alike).
  const { r, s, v, yParity } = parseSignature(signature);
  let recovery = yParity ?? (v === 27n || v === 0n ? 0 : v === 28n || v === 1n ? 1 : -1);
  if (recovery !== 0 && recovery !== 1) return lower(await viemRecoverAddress({ hash, signature }));
  let sBig = BigInt(s);
  const rBig = BigInt(r);
  // Let viem decide anything outside the curve order (it throws); libsecp256k1 would reject it differently.
  if (rBig === 0n || rBig >= N || sBig === 0n || sBig >= N) return lower(await viemRecoverAddress({ hash, signature }));
  if (sBig > N / 2n) {
    // libsecp256k1 recovers low-s signatures only; (r, n - s) with the other parity is the same key.
    sBig = N - sBig;
    recovery ^= 1;
  }
  const compact = new Uint8Array(64);
  compact.set(hexToBytes(r, { size: 32 }), 0);
  compact.set(hexToBytes(`0x${sBig.toString(16).padStart(64, "0")}`, { size: 32 }), 32);
  let publicKey: Uint8Array;
  try {
    publicKey = native.ecdsaRecover(compact, recovery, hexToBytes(hash, { size: 32 }), false);
  } catch {
    return lower(await viemRecoverAddress({ hash, signature })); // no point on the curve for this r: viem's answer (an error) stands
  }
  return `0x${keccak256(publicKey.subarray(1)).slice(-40)}`;
}

const lower = (address: Address) => address.toLowerCase() as Address;
