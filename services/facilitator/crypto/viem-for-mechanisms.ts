// viem as the bundled @x402/evm mechanisms import it (scripts/build.mjs): signature recovery is the
// native one (secp256k1.ts, the same answers), everything else viem itself. Their settle checks the
// payer's signature again, and viem's pure-JS recovery was about a quarter of a settlement's CPU.
export * from "viem";
export { recoverAddress, recoverTypedDataAddress } from "./secp256k1.ts";
