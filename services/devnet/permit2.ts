// The genuine Permit2 runtime bytecode, read at run time from the npm dependency
// @uniswap/v4-periphery (lib/permit2/test/utils/DeployPermit2.sol, a hex"..." constant) and
// patched for the target chain: its two immutables are baked in for chain 31337.
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { encodeAbiParameters, keccak256, numberToHex, toHex, type Address, type Hex } from "viem";
import { PERMIT2_ADDRESS } from "../x402/networks.ts";

/** Byte offsets of the immutables inside the runtime bytecode shipped in DeployPermit2.sol. */
const CACHED_CHAIN_ID_OFFSET = 6945;
const CACHED_DOMAIN_SEPARATOR_OFFSET = 6983;
const BAKED_CHAIN_ID = 31337;
/**
 * The shipped _CACHED_DOMAIN_SEPARATOR was computed where the bytecode was built (a forge test
 * deployment address on chain 31337), not at the canonical Permit2 address.
 */
const BAKED_VERIFYING_CONTRACT: Address = "0xF62849F9A0B5Bf2913b396098F7c7019b51A820a";

const DOMAIN_TYPEHASH = keccak256(toHex("EIP712Domain(string name,uint256 chainId,address verifyingContract)"));
const NAME_HASH = keccak256(toHex("Permit2"));

/** Permit2's EIP-712 domain separator on `chainId` (name "Permit2", no version). */
export function permit2DomainSeparator(chainId: number): Hex {
  return domainSeparator(chainId, PERMIT2_ADDRESS);
}

function domainSeparator(chainId: number, verifyingContract: Address): Hex {
  return keccak256(
    encodeAbiParameters(
      [{ type: "bytes32" }, { type: "bytes32" }, { type: "uint256" }, { type: "address" }],
      [DOMAIN_TYPEHASH, NAME_HASH, BigInt(chainId), verifyingContract],
    ),
  );
}

let shipped: string | undefined;

/** The unpatched runtime bytecode (hex, no 0x) as shipped for chain 31337. */
function shippedRuntimeHex(): string {
  if (shipped) return shipped;
  const require = createRequire(import.meta.url);
  let file: string;
  try {
    file = require.resolve("@uniswap/v4-periphery/lib/permit2/test/utils/DeployPermit2.sol");
  } catch (e) {
    throw new Error(`Permit2 bytecode source not found: install @uniswap/v4-periphery (${(e as Error).message.split("\n")[0]})`);
  }
  const text = readFileSync(file, "utf8");
  const matches = [...text.matchAll(/hex"([0-9a-fA-F]+)"/g)];
  if (matches.length !== 1 || !matches[0]?.[1]) {
    throw new Error(`expected exactly one hex"..." constant in ${file}, found ${matches.length}`);
  }
  const hex = matches[0][1].toLowerCase();
  if (hex.length % 2 !== 0) throw new Error(`odd-length hex constant in ${file}`);
  shipped = hex;
  return hex;
}

function word(hex: string, byteOffset: number): string {
  return hex.slice(byteOffset * 2, (byteOffset + 32) * 2);
}

function replaceWord(hex: string, byteOffset: number, value: Hex): string {
  const w = value.slice(2).padStart(64, "0");
  if (w.length !== 64) throw new Error(`not a 32-byte word: ${value}`);
  return hex.slice(0, byteOffset * 2) + w + hex.slice((byteOffset + 32) * 2);
}

/** Permit2's runtime bytecode with _CACHED_CHAIN_ID and _CACHED_DOMAIN_SEPARATOR set for `chainId`. */
export function permit2RuntimeBytecode(chainId: number): Hex {
  if (!Number.isSafeInteger(chainId) || chainId <= 0) throw new Error(`invalid chain id ${chainId}`);
  const hex = shippedRuntimeHex();
  if (hex.length < (CACHED_DOMAIN_SEPARATOR_OFFSET + 32) * 2) throw new Error("Permit2 bytecode is shorter than expected");
  const bakedChainId = numberToHex(BAKED_CHAIN_ID, { size: 32 }).slice(2);
  const bakedSeparator = domainSeparator(BAKED_CHAIN_ID, BAKED_VERIFYING_CONTRACT).slice(2);
  if (word(hex, CACHED_CHAIN_ID_OFFSET) !== bakedChainId || word(hex, CACHED_DOMAIN_SEPARATOR_OFFSET) !== bakedSeparator) {
    throw new Error(
      `Permit2 bytecode from @uniswap/v4-periphery does not carry the chain-31337 immutables at byte offsets ` +
        `${CACHED_CHAIN_ID_OFFSET}/${CACHED_DOMAIN_SEPARATOR_OFFSET}: the package version changed, re-derive the offsets`,
    );
  }
  let patched = replaceWord(hex, CACHED_CHAIN_ID_OFFSET, numberToHex(chainId, { size: 32 }));
  patched = replaceWord(patched, CACHED_DOMAIN_SEPARATOR_OFFSET, permit2DomainSeparator(chainId));
  return `0x${patched}`;
}
