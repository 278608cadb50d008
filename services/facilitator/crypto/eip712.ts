// EIP-712 digests of EIP-3009 authorizations with native Keccak (keccak.ts): the typed data every
// `exact` payment signs, hashed at /verify by the fast path and again by the reference mechanism's
// settle. viem's generic hashTypedData (type encoding, ABI encoding, a JS Keccak per step) was about
// a fifteenth of a settlement's CPU. Only the exact shape the mechanisms build takes this way; any
// other typed data, or a value viem would refuse, is viem's own to hash (or to throw for).
import { hashTypedData as viemHashTypedData, isAddress, type Address, type Hex, type TypedDataDefinition } from "viem";
import { keccak256 } from "./keccak.ts";

const hex = (s: string) => Buffer.from(s, "hex");
const typeHash = (type: string) => keccak256(Buffer.from(type)).slice(2);
const DOMAIN_TYPEHASH = typeHash("EIP712Domain(string name,string version,uint256 chainId,address verifyingContract)");
const FIELDS = ["from", "to", "value", "validAfter", "validBefore", "nonce"] as const;
const TYPES = ["address", "address", "uint256", "uint256", "uint256", "bytes32"] as const;
const AUTHORIZATION_TYPEHASH: Record<string, string> = {
  TransferWithAuthorization: typeHash("TransferWithAuthorization(address from,address to,uint256 value,uint256 validAfter,uint256 validBefore,bytes32 nonce)"),
  ReceiveWithAuthorization: typeHash("ReceiveWithAuthorization(address from,address to,uint256 value,uint256 validAfter,uint256 validBefore,bytes32 nonce)"),
};
const MAX_UINT256 = 2n ** 256n - 1n;
const BYTES32 = /^0x[0-9a-fA-F]{64}$/;

/** ABI words (hex, no 0x) of an address and of an unsigned integer. */
export const addressWord = (a: string) => `000000000000000000000000${a.slice(2).toLowerCase()}`;
export const uintWord = (v: string | bigint) => BigInt(v).toString(16).padStart(64, "0");

export interface Eip712Domain {
  name: string;
  version: string;
  chainId: number | bigint;
  verifyingContract: Address;
}

// A token's domain separator never changes: hashed once per token and chain.
const separators = new Map<string, string>();

/** The domain separator of a token's {name, version, chainId, verifyingContract} domain (hex, no 0x). */
export function domainSeparator(domain: Eip712Domain): string {
  // Strings only: anything else would hash as other bytes under a key that reads like the token's
  // own (a payload's `extra` is the caller's JSON), and the cache serves every later payment.
  if (typeof domain.name !== "string" || typeof domain.version !== "string") throw new TypeError("EIP-712 domain name and version must be strings");
  const key = JSON.stringify([domain.name, domain.version, String(domain.chainId), domain.verifyingContract.toLowerCase()]);
  let separator = separators.get(key);
  if (separator === undefined) {
    const name = keccak256(Buffer.from(domain.name, "utf8")).slice(2);
    const version = keccak256(Buffer.from(domain.version, "utf8")).slice(2);
    separator = keccak256(hex(`${DOMAIN_TYPEHASH}${name}${version}${uintWord(BigInt(domain.chainId))}${addressWord(domain.verifyingContract)}`)).slice(2);
    if (separators.size > 10_000) separators.clear();
    separators.set(key, separator);
  }
  return separator;
}

/** The digest a payer signs for an EIP-3009 authorization whose fields are already 32-byte words (hex, no 0x), in FIELDS order. */
export function authorizationDigest(domain: Eip712Domain, words: string, primaryType: keyof typeof AUTHORIZATION_TYPEHASH = "TransferWithAuthorization"): Hex {
  const struct = keccak256(hex(`${AUTHORIZATION_TYPEHASH[primaryType]}${words}`)).slice(2);
  return keccak256(hex(`1901${domainSeparator(domain)}${struct}`));
}

const sameFields = (entries: unknown): boolean =>
  Array.isArray(entries) &&
  entries.length === FIELDS.length &&
  entries.every((e, i) => typeof e === "object" && e !== null && Object.keys(e).length === 2 && (e as { name: unknown }).name === FIELDS[i] && (e as { type: unknown }).type === TYPES[i]);

const hasExactly = (o: object, keys: readonly string[]) => Object.keys(o).length === keys.length && keys.every((k) => Object.hasOwn(o, k));
const validAddress = (a: unknown): a is Address => typeof a === "string" && isAddress(a);
const uint256 = (v: unknown): v is bigint => typeof v === "bigint" && v >= 0n && v <= MAX_UINT256;

/**
 * viem's hashTypedData, with EIP-3009 authorizations (Transfer- and ReceiveWithAuthorization, the
 * domain of name, version, chainId and verifyingContract, the message's integers as bigints) hashed
 * natively: the same digest (a differential test proves it); anything else goes to viem.
 */
export function hashTypedData(args: TypedDataDefinition): Hex {
  const { domain, types, primaryType, message } = args as { domain?: Record<string, unknown>; types?: Record<string, unknown>; primaryType?: string; message?: Record<string, unknown> };
  if (
    typeof primaryType === "string" &&
    Object.hasOwn(AUTHORIZATION_TYPEHASH, primaryType) &&
    typeof types === "object" && types !== null && hasExactly(types, [primaryType]) && sameFields(types[primaryType]) &&
    typeof domain === "object" && domain !== null && hasExactly(domain, ["name", "version", "chainId", "verifyingContract"]) &&
    typeof domain.name === "string" && typeof domain.version === "string" &&
    ((typeof domain.chainId === "number" && Number.isSafeInteger(domain.chainId) && domain.chainId >= 0) || uint256(domain.chainId)) &&
    validAddress(domain.verifyingContract) &&
    typeof message === "object" && message !== null && hasExactly(message, FIELDS) &&
    validAddress(message.from) && validAddress(message.to) &&
    uint256(message.value) && uint256(message.validAfter) && uint256(message.validBefore) &&
    typeof message.nonce === "string" && BYTES32.test(message.nonce)
  ) {
    const words = `${addressWord(message.from)}${addressWord(message.to)}${uintWord(message.value)}${uintWord(message.validAfter)}${uintWord(message.validBefore)}${message.nonce.slice(2).toLowerCase()}`;
    return authorizationDigest(domain as unknown as Eip712Domain, words, primaryType);
  }
  return viemHashTypedData(args);
}
