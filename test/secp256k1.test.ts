// The native and pure-JS recovery paths give identical answers over thousands of random inputs,
// including high-s, wrong v and malformed signatures; native transaction signing makes the very
// bytes viem's signer makes.
import { describe, expect, it } from "vitest";
import { randomBytes } from "node:crypto";
import { hexToBytes, parseSignature, parseTransaction, recoverAddress, recoverTransactionAddress, recoverTypedDataAddress, toHex, type Hex } from "viem";
import { generatePrivateKey, sign, privateKeyToAccount } from "viem/accounts";
import * as ours from "../services/facilitator/crypto/secp256k1.ts";
import { nativeRecoveryAvailable, recoverSigner } from "../services/facilitator/crypto/secp256k1.ts";

const N = 0xfffffffffffffffffffffffffffffffebaaedce6af48a03bbfd25e8cd0364141n;
const hex32 = (n: bigint) => n.toString(16).padStart(64, "0");

async function outcome(f: () => Promise<string>): Promise<string> {
  try {
    return (await f()).toLowerCase();
  } catch {
    return "error";
  }
}

function variants(sig: Hex): Hex[] {
  const r = sig.slice(2, 66);
  const s = BigInt(`0x${sig.slice(66, 130)}`);
  const v = parseInt(sig.slice(130, 132), 16);
  const flipped = v === 27 ? 28 : 27;
  return [
    sig,
    `0x${r}${hex32(N - s)}${flipped.toString(16)}`, // high-s with the other parity: the same signer
    `0x${r}${hex32(N - s)}${v.toString(16)}`, // high-s, same parity: another key
    `0x${r}${sig.slice(66, 130)}${(v - 27).toString(16).padStart(2, "0")}`, // v as yParity 0/1
    `0x${r}${sig.slice(66, 130)}1d`, // v = 29
    `0x${r}${sig.slice(66, 130)}ff`, // v = 255
    `0x${r}${sig.slice(66, 130)}25`, // v = 37 (EIP-155 style)
    `0x${"00".repeat(32)}${sig.slice(66, 132)}`, // r = 0
    `0x${r}${hex32(N)}${v.toString(16)}`, // s = n
    `0x${hex32(N + 1n)}${sig.slice(66, 132)}`, // r >= n
    sig.slice(0, 130) as Hex, // 64 bytes (compact, no v)
    `${sig}00` as Hex, // 66 bytes
    `0x${sig.slice(2, 130)}00${sig.slice(130)}` as Hex, // r ‖ s ‖ 00 ‖ v: 66 bytes whose last byte is a valid v
    `0x${sig.slice(2, 130)}0000${sig.slice(130)}` as Hex, // 67 bytes, the same
    `0X${sig.slice(2)}` as Hex, // upper-case prefix
    toHex(randomBytes(65)),
  ];
}

describe("secp256k1", () => {
  it("loads the native binding on this platform", () => {
    expect(nativeRecoveryAvailable).toBe(true);
  });

  it("native and viem agree on 4,000+ valid, high-s, wrong-v and malformed signatures", async () => {
    let compared = 0;
    let recoveredSigner = 0;
    for (let i = 0; i < 320; i++) {
      const key = generatePrivateKey();
      const hash = toHex(randomBytes(32));
      const sig = await sign({ hash, privateKey: key, to: "hex" });
      for (const candidate of variants(sig)) {
        const expected = await outcome(() => recoverAddress({ hash, signature: candidate }));
        const actual = await outcome(() => recoverSigner(hash, candidate));
        expect(actual, `${hash} ${candidate}`).toBe(expected);
        if (actual === privateKeyToAccount(key).address.toLowerCase()) recoveredSigner++;
        compared++;
      }
    }
    expect(compared).toBeGreaterThanOrEqual(4000);
    expect(recoveredSigner).toBeGreaterThanOrEqual(320 * 3); // valid, low/high-s twin, yParity form
  });

  it("signatureParts reads r, s and v as viem's parseSignature does, and refuses exactly what it throws on", async () => {
    let refused = 0;
    for (let i = 0; i < 100; i++) {
      const sig = await sign({ hash: toHex(randomBytes(32)), privateKey: generatePrivateKey(), to: "hex" });
      for (const candidate of [...variants(sig), `0x${sig.slice(2, 130)}1c` as Hex, `0x${sig.slice(2, 130)}00` as Hex, `0x${sig.slice(2, 130)}01` as Hex]) {
        let expected: { r: bigint; s: bigint; yParity: number; v: number } | undefined;
        try {
          const parsed = parseSignature(candidate);
          // viem's v where it has one, else the byte was the parity itself.
          expected = { r: BigInt(parsed.r), s: BigInt(parsed.s), yParity: parsed.yParity!, v: parsed.v === undefined ? parsed.yParity! : Number(parsed.v) };
        } catch {
          expected = undefined;
        }
        // viem reads a longer signature by its first 64 bytes and last byte; ours takes 65 bytes only.
        if (candidate.length !== 132 || !candidate.startsWith("0x")) expected = undefined;
        expect(ours.signatureParts(candidate), candidate).toEqual(expected);
        if (!expected) refused++;
      }
    }
    expect(refused).toBeGreaterThanOrEqual(100 * 6); // v 29, 255, 37; r 0; s n; r > n (and malformed lengths)
  });

  it("the stand-ins the bundled mechanisms get for viem's recoverAddress and recoverTypedDataAddress answer as viem does", async () => {
    const account = privateKeyToAccount(generatePrivateKey());
    const typed = {
      domain: { name: "USD Coin", version: "2", chainId: 8453, verifyingContract: "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913" as const },
      types: { Transfer: [{ name: "to", type: "address" }, { name: "value", type: "uint256" }] },
      primaryType: "Transfer" as const,
      message: { to: account.address, value: 5n },
    };
    const signature = await account.signTypedData(typed);
    expect(await ours.recoverTypedDataAddress({ ...typed, signature })).toBe(account.address);
    expect(await ours.recoverTypedDataAddress({ ...typed, signature })).toBe(await recoverTypedDataAddress({ ...typed, signature }));
    const hash = toHex(randomBytes(32));
    const signed = await sign({ hash, privateKey: generatePrivateKey(), to: "hex" });
    for (const candidate of variants(signed)) {
      expect(await outcome(() => ours.recoverAddress({ hash, signature: candidate }))).toBe(await outcome(() => recoverAddress({ hash, signature: candidate })));
      // Bytes go to viem's own recovery, with the same answer.
      expect(await outcome(() => ours.recoverAddress({ hash: hexToBytes(hash), signature: hexToBytes(candidate) }))).toBe(await outcome(() => recoverAddress({ hash: hexToBytes(hash), signature: hexToBytes(candidate) })));
    }
  });

  it("settlement keys sign transactions natively to the very bytes viem signs, recoverable to the key's address", async () => {
    expect(nativeRecoveryAvailable).toBe(true);
    for (let i = 0; i < 200; i++) {
      const key = generatePrivateKey();
      const tx = {
        chainId: 1 + (i % 50_000),
        type: "eip1559" as const,
        to: toHex(randomBytes(20)),
        data: toHex(randomBytes(i % 300)),
        gas: 21_000n + BigInt(i) * 1000n,
        nonce: i * 7,
        maxFeePerGas: BigInt(`0x${randomBytes(6).toString("hex")}`) + 1n,
        maxPriorityFeePerGas: BigInt(i),
        ...(i % 3 === 0 ? { value: BigInt(`0x${randomBytes(8).toString("hex")}`) } : {}),
      };
      const native = await ours.settlementAccount(key).signTransaction(tx);
      expect(native).toBe(await privateKeyToAccount(key).signTransaction(tx));
      const parsed = parseTransaction(native);
      expect(await recoverTransactionAddress({ serializedTransaction: native as never })).toBe(privateKeyToAccount(key).address);
      expect(parsed.nonce).toBe(tx.nonce);
    }
  });
});
