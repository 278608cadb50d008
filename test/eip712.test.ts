// The native EIP-3009 typed-data hash the mechanisms' settle goes through: viem's digest for every
// authorization, viem's own answer (or error) for anything off the exact shape, and a payer's real
// signature still recovers to the payer through it.
import { randomBytes } from "node:crypto";
import { authorizationTypes } from "@x402/evm";
import { describe, expect, it } from "vitest";
import { getAddress, hashTypedData as viemHashTypedData, recoverTypedDataAddress, toHex, type Hex, type TypedDataDefinition } from "viem";
import { generatePrivateKey, privateKeyToAccount } from "viem/accounts";
import { authorizationDigest, hashTypedData } from "../services/facilitator/crypto/eip712.ts";

// The mechanisms' own type list (what their settle hashes), copied so a test may bend it.
const fields = authorizationTypes.TransferWithAuthorization.map((f) => ({ ...f }));
const address = () => getAddress(toHex(randomBytes(20)));
const uint = () => [0n, 1n, 2n ** 256n - 1n, BigInt(toHex(randomBytes(1 + (randomBytes(1)[0]! % 32))))][randomBytes(1)[0]! % 4]!;
const NAMES = ["USD Coin", "USDC", "", "Ünïcødé 币 🪙", "a".repeat(300)];

function authorization(primaryType = "TransferWithAuthorization"): TypedDataDefinition {
  return {
    domain: { name: NAMES[randomBytes(1)[0]! % NAMES.length]!, version: ["1", "2", ""][randomBytes(1)[0]! % 3]!, chainId: [8453, 84532, 56, 1n, 2n ** 64n][randomBytes(1)[0]! % 5]!, verifyingContract: address() },
    types: { [primaryType]: fields },
    primaryType,
    message: { from: address(), to: address(), value: uint(), validAfter: uint(), validBefore: uint(), nonce: toHex(randomBytes(32)) },
  } as unknown as TypedDataDefinition;
}

/** Typed data as a test may bend it out of shape. */
type Loose = { domain: Record<string, unknown>; types: Record<string, unknown>; primaryType: string; message: Record<string, unknown> & { from: string; to: string; nonce: string } };

/** viem's answer: its digest, or the name of the error it throws. */
const answer = (hash: (a: TypedDataDefinition) => Hex, args: TypedDataDefinition) => {
  try {
    return hash(args);
  } catch (e) {
    return (e as Error).name;
  }
};

describe("hashTypedData (native for EIP-3009 authorizations)", () => {
  it("gives viem's digest for Transfer- and ReceiveWithAuthorization, whatever the domain and values", () => {
    for (let i = 0; i < 400; i++) {
      const args = authorization(i % 2 ? "ReceiveWithAuthorization" : "TransferWithAuthorization");
      expect(hashTypedData(args)).toBe(viemHashTypedData(args));
    }
  });

  it("gives viem's answer, digest or error, for everything off the exact shape", () => {
    const variants: ((a: Loose) => void)[] = [
      (a) => (a.message.from = a.message.from.toLowerCase()), // unchecksummed: valid
      (a) => (a.message.to = `0x${a.message.to.slice(2, 41)}${a.message.to[41] === "a" ? "A" : "a"}`), // bad checksum
      (a) => (a.message.value = 2n ** 256n), // out of range
      (a) => (a.message.value = -1n),
      (a) => (a.message.value = 5), // a number
      (a) => (a.message.nonce = `0x${"ab".repeat(31)}`), // 31 bytes
      (a) => (a.message.nonce = a.message.nonce.toUpperCase().replace("0X", "0x")),
      (a) => (a.message.extra = 1n), // viem ignores what its types do not name
      (a) => delete (a.message as Record<string, unknown>).nonce,
      (a) => (a.domain.salt = toHex(randomBytes(32))),
      (a) => delete a.domain.version,
      (a) => (a.domain.chainId = -1),
      (a) => (a.domain.chainId = 1.5),
      (a) => (a.domain.verifyingContract = "0x1234"),
      (a) => (a.types.EIP712Domain = [{ name: "name", type: "string" }]),
      (a) => (a.types.TransferWithAuthorization = [...fields].reverse()),
      (a) => (a.types.TransferWithAuthorization = fields.map((f) => (f.name === "value" ? { ...f, type: "uint128" } : f))),
      (a) => (a.primaryType = "Permit"),
    ];
    for (const change of variants) {
      for (let i = 0; i < 10; i++) {
        const args = authorization() as unknown as Loose;
        change(args);
        expect(answer(hashTypedData, args as unknown as TypedDataDefinition), change.toString()).toBe(answer(viemHashTypedData, args as unknown as TypedDataDefinition));
      }
    }
  });

  it("a payer's signature over the authorization recovers to the payer from the native digest", async () => {
    const payer = privateKeyToAccount(generatePrivateKey());
    const args = authorization() as TypedDataDefinition & { message: Record<string, unknown> };
    args.message.from = payer.address;
    const signature = await payer.signTypedData(args as Parameters<typeof payer.signTypedData>[0]);
    expect(await recoverTypedDataAddress({ ...args, signature } as Parameters<typeof recoverTypedDataAddress>[0])).toBe(payer.address);
    const { recoverAddress } = await import("viem");
    expect(await recoverAddress({ hash: hashTypedData(args), signature })).toBe(payer.address);
  });
});

describe("the domain separator cache", () => {
  it("refuses a domain of anything but strings, and one such request leaves the token's digest intact", () => {
    const args = authorization() as unknown as Loose;
    const domain = args.domain as { name: string; version: string; chainId: number; verifyingContract: `0x${string}` };
    // ["2"] prints as "2": under a naive key it would stand for the token's real domain.
    expect(() => authorizationDigest({ ...domain, version: [domain.version] as unknown as string }, "00".repeat(192))).toThrow(TypeError);
    expect(hashTypedData(args as unknown as TypedDataDefinition)).toBe(viemHashTypedData(args as unknown as TypedDataDefinition));
  });

  it("keeps domains apart whose fields only join alike", () => {
    for (const [name, version] of [["a\0b", "c"], ["a", "b\0c"], ["a\u0000", "b"], ["a", "\u0000b"]]) {
      const args = authorization() as unknown as Loose;
      Object.assign(args.domain, { name, version, chainId: 8453, verifyingContract: "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913" });
      expect(hashTypedData(args as unknown as TypedDataDefinition)).toBe(viemHashTypedData(args as unknown as TypedDataDefinition));
    }
  });
});
