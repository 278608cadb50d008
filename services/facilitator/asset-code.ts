// The reference mechanisms (exact over EIP-3009 and Permit2, upto) start an eth_getCode of the
// asset in the background (`startAssetContractCheck`) and return early on most refusals without
// awaiting it. When the RPC fails, that promise rejects with no handler, and Node's default for
// an unhandled rejection is to exit: a provider rate limit would crash every replica. So the
// facilitator reads the asset's code itself, awaited (a failure is the request's to handle), and
// the mechanisms' signer answers getCode of that asset, within that request, from the value read:
// their background check can no longer fail.
import { AsyncLocalStorage } from "node:async_hooks";
import type { PaymentRequirements } from "@x402/core/types";
import type { FacilitatorEvmSigner } from "@x402/evm";
import { getAddress, type Hex } from "viem";

const checked = new AsyncLocalStorage<{ asset: string; code: Hex | undefined }>();

// Schemes whose reference mechanisms run the background asset check.
const CHECKING = new Set(["exact", "upto"]);

/** Reads the asset's code (through the signer's short cache), then runs fn with it on record. */
export async function withAssetCode<T>(signer: Pick<FacilitatorEvmSigner, "getCode">, requirements: PaymentRequirements, fn: () => Promise<T>): Promise<T> {
  if (!CHECKING.has(requirements.scheme)) return fn();
  const asset = getAddress(requirements.asset);
  const code = await signer.getCode({ address: asset });
  return checked.run({ asset: asset.toLowerCase(), code }, fn);
}

/** The signer the mechanisms get: getCode of the asset on record comes from the record. */
export function servingAssetCode<S extends FacilitatorEvmSigner>(signer: S): S {
  return {
    ...signer,
    getCode: (args) => {
      const record = checked.getStore();
      if (record && args.address.toLowerCase() === record.asset) return Promise.resolve(record.code);
      return signer.getCode(args);
    },
  };
}
