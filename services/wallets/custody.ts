// Key custody: envelope encryption of each wallet's private key, and signing with it.
//
//   private key ──AES-256-GCM(data key, AAD = wallet id + address)──► encrypted key   (stored)
//   data key    ──AES-256-GCM(KEK of a master key, AAD = wallet id + master key id)──► wrapped data key (stored)
//
// One random data key per wallet; master keys never touch the database (only their id and a public
// fingerprint do). A private key exists in plaintext only inside `withPrivateKey`, in a Buffer that
// is zeroed when the callback returns; it is never turned into a string, so it cannot end up in a
// log line, an error, a metric or a span. Rotation re-wraps data keys; private keys never change.
import { createCipheriv, createDecipheriv, randomBytes } from "node:crypto";
import secp256k1 from "secp256k1";
import { bytesToHex, getAddress, keccak256, type Address, type Hex } from "viem";
import type { MasterKey } from "./keyring.ts";

const FORMAT = 1;
const IV_BYTES = 12;
const TAG_BYTES = 16;

/** What the database keeps of a wallet's key: two ciphertexts and the id of the master key. */
export interface SealedKey {
  masterKeyId: string;
  /** format byte | iv | tag | AES-256-GCM(KEK, data key) */
  wrappedDataKey: Uint8Array;
  /** format byte | iv | tag | AES-256-GCM(data key, private key) */
  encryptedKey: Uint8Array;
}

/** A key that cannot be opened: wrong master key, tampered row, or a row moved to another wallet. */
export class CustodyError extends Error {}

function seal(key: Buffer, plaintext: Buffer, aad: string): Buffer {
  const iv = randomBytes(IV_BYTES);
  const cipher = createCipheriv("aes-256-gcm", key, iv);
  cipher.setAAD(Buffer.from(aad));
  const body = Buffer.concat([cipher.update(plaintext), cipher.final()]);
  return Buffer.concat([Buffer.from([FORMAT]), iv, cipher.getAuthTag(), body]);
}

function open(key: Buffer, sealed: Uint8Array, aad: string, what: string): Buffer {
  const buf = Buffer.from(sealed.buffer, sealed.byteOffset, sealed.byteLength);
  if (buf.length < 1 + IV_BYTES + TAG_BYTES + 1 || buf[0] !== FORMAT) throw new CustodyError(`${what} has an unknown format`);
  const decipher = createDecipheriv("aes-256-gcm", key, buf.subarray(1, 1 + IV_BYTES));
  decipher.setAAD(Buffer.from(aad));
  decipher.setAuthTag(buf.subarray(1 + IV_BYTES, 1 + IV_BYTES + TAG_BYTES));
  try {
    return Buffer.concat([decipher.update(buf.subarray(1 + IV_BYTES + TAG_BYTES)), decipher.final()]);
  } catch {
    throw new CustodyError(`${what} does not authenticate`);
  }
}

const dataKeyAad = (walletId: string, masterKeyId: string) => `x402-fleet/wallets/data-key/v1|${walletId}|${masterKeyId}`;
const privateKeyAad = (walletId: string, address: Address) => `x402-fleet/wallets/private-key/v1|${walletId}|${address.toLowerCase()}`;

function addressOf(privateKey: Uint8Array): Address {
  const publicKey = secp256k1.publicKeyCreate(privateKey, false);
  return getAddress(`0x${keccak256(publicKey.subarray(1)).slice(-40)}`);
}

/** A fresh secp256k1 key for a new wallet, sealed under the master key; the plaintext is zeroed before returning. */
export function createSealedKey(walletId: string, master: MasterKey): { address: Address; sealed: SealedKey } {
  let privateKey = randomBytes(32);
  while (!secp256k1.privateKeyVerify(privateKey)) {
    privateKey.fill(0);
    privateKey = randomBytes(32);
  }
  const dataKey = randomBytes(32);
  try {
    const address = addressOf(privateKey);
    return {
      address,
      sealed: {
        masterKeyId: master.id,
        encryptedKey: seal(dataKey, privateKey, privateKeyAad(walletId, address)),
        wrappedDataKey: seal(master.kek, dataKey, dataKeyAad(walletId, master.id)),
      },
    };
  } finally {
    privateKey.fill(0);
    dataKey.fill(0);
  }
}

function unwrapDataKey(walletId: string, sealed: SealedKey, master: MasterKey): Buffer {
  if (master.id !== sealed.masterKeyId) throw new CustodyError(`the data key of wallet ${walletId} is wrapped by master key ${sealed.masterKeyId}, not ${master.id}`);
  return open(master.kek, sealed.wrappedDataKey, dataKeyAad(walletId, master.id), `the data key of wallet ${walletId} (master key ${master.id})`);
}

/** The same data key wrapped by another master key (rotation); the private key's ciphertext is unchanged. */
export function rewrapSealedKey(walletId: string, sealed: SealedKey, from: MasterKey, to: MasterKey): SealedKey {
  const dataKey = unwrapDataKey(walletId, sealed, from);
  try {
    return { masterKeyId: to.id, encryptedKey: sealed.encryptedKey, wrappedDataKey: seal(to.kek, dataKey, dataKeyAad(walletId, to.id)) };
  } finally {
    dataKey.fill(0);
  }
}

/**
 * Runs fn with the wallet's private key and zeroes it afterwards. The key must derive the wallet's
 * address (a row moved to another wallet or a wrong key fails here, before anything is signed).
 */
export function withPrivateKey<T>(walletId: string, address: Address, sealed: SealedKey, master: MasterKey, fn: (privateKey: Uint8Array) => T): T {
  const dataKey = unwrapDataKey(walletId, sealed, master);
  let privateKey: Buffer | undefined;
  try {
    privateKey = open(dataKey, sealed.encryptedKey, privateKeyAad(walletId, address), `the private key of wallet ${walletId}`);
    if (privateKey.length !== 32 || addressOf(privateKey) !== getAddress(address)) throw new CustodyError(`the key of wallet ${walletId} does not derive its address`);
    return fn(privateKey);
  } finally {
    dataKey.fill(0);
    privateKey?.fill(0);
  }
}

/** An Ethereum signature (r ‖ s ‖ v, v = 27 + recovery id, low s) of a 32-byte digest. */
export function signDigest(privateKey: Uint8Array, digest: Hex): Hex {
  const hash = Buffer.from(digest.slice(2), "hex");
  if (hash.length !== 32) throw new CustodyError("a digest is 32 bytes");
  const { signature, recid } = secp256k1.ecdsaSign(hash, privateKey);
  const out = new Uint8Array(65);
  out.set(signature, 0);
  out[64] = 27 + recid;
  return bytesToHex(out);
}

/** r, s and yParity of a digest's signature (transactions). */
export function signDigestParts(privateKey: Uint8Array, digest: Hex): { r: Hex; s: Hex; yParity: number } {
  const hash = Buffer.from(digest.slice(2), "hex");
  if (hash.length !== 32) throw new CustodyError("a digest is 32 bytes");
  const { signature, recid } = secp256k1.ecdsaSign(hash, privateKey);
  return { r: bytesToHex(signature.subarray(0, 32)), s: bytesToHex(signature.subarray(32, 64)), yParity: recid };
}
