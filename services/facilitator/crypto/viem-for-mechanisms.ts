// viem as the bundled @x402/evm mechanisms import it (scripts/build.mjs): signature recovery is the
// native one (secp256k1.ts, the same answers), everything else viem itself. Their settle checks the
// payer's signature again, and viem's pure-JS recovery was about a quarter of a settlement's CPU.
// Named, not `export *`: Node checks every name against viem when the bundle loads, and a name a new
// @x402/evm imports that is not listed here fails the build instead of being undefined at run time.
export {
  createPublicClient,
  decodeFunctionData,
  decodeFunctionResult,
  encodeAbiParameters,
  encodeFunctionData,
  getAddress,
  hexToBigInt,
  http,
  isAddress,
  isAddressEqual,
  isHash,
  keccak256,
  maxUint256,
  parseErc6492Signature,
  parseEventLogs,
  parseSignature,
  parseTransaction,
  recoverTransactionAddress,
  toBytes,
  toHex,
  verifyTypedData,
  zeroAddress,
} from "viem";
export { recoverAddress, recoverTypedDataAddress } from "./secp256k1.ts";
export { hashTypedData } from "./eip712.ts";
