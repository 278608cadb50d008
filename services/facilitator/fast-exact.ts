// A fast path for the most common verification: an `exact` EIP-3009 payment signed by a plain
// account (EOA). Same checks, order and reason codes as the reference mechanism (a differential
// test compares them), but signature recovery is native and the only RPC round trip in steady
// state is the transfer simulation: account code is classified once per short window and asset
// code is cached. Anything else (contract wallets, ERC-6492, Permit2) returns undefined and the
// reference mechanism decides. Where a block is provably still the head (settlement/head.ts), the
// simulation is pinned to it and its gas kept, so a settlement within that block sends at once
// (outbox-signer.ts takeSimulation).
import { startAssetContractCheck, eip3009ABI } from "@x402/evm";
import type { PaymentPayload, PaymentRequirements, VerifyResponse } from "@x402/core/types";
import { getAddress, isAddress, isErc6492Signature, toFunctionSelector, toHex, type Address, type Hex } from "viem";
import { MULTICALL3_ADDRESS, chainIdOf } from "../x402/networks.ts";
import { noteRpcFailure, type ChainClient, type RpcWatch } from "./chain.ts";
import { addressWord, authorizationDigest, uintWord } from "./crypto/eip712.ts";
import { recoverSigner, signatureParts } from "./crypto/secp256k1.ts";
import type { OutboxSigner } from "./settlement/outbox-signer.ts";

// Reference reason codes (@x402/evm exact facilitator).
const R = {
  scheme: "invalid_exact_evm_scheme",
  missingDomain: "invalid_exact_evm_missing_eip712_domain",
  network: "invalid_exact_evm_network_mismatch",
  signature: "invalid_exact_evm_signature",
  recipient: "invalid_exact_evm_recipient_mismatch",
  validBefore: "invalid_exact_evm_payload_authorization_valid_before",
  validAfter: "invalid_exact_evm_payload_authorization_valid_after",
  value: "invalid_exact_evm_payload_authorization_value_mismatch",
  notSupported: "invalid_exact_evm_eip3009_not_supported",
  nonceUsed: "invalid_exact_evm_nonce_already_used",
  nameMismatch: "invalid_exact_evm_token_name_mismatch",
  versionMismatch: "invalid_exact_evm_token_version_mismatch",
  balance: "invalid_exact_evm_insufficient_balance",
  simulation: "invalid_exact_evm_transaction_simulation_failed",
} as const;

/** The simulation's sender: transferWithAuthorization does not depend on it (the zero address holds no state we need). */
const ZERO: Address = "0x0000000000000000000000000000000000000000";

// The payload's fields were checked at the edge (services/x402/payloads.ts: 20-byte addresses,
// uint256 decimals, a 32-byte nonce), so the EIP-712 struct and the calldata are plain words put
// side by side: one keccak for the struct instead of viem's generic encoder and its type hashing.
const TRANSFER_SELECTOR = toFunctionSelector("transferWithAuthorization(address,address,uint256,uint256,uint256,bytes32,uint8,bytes32,bytes32)");
const sameAddress = (a: string, b: string) => a.toLowerCase() === b.toLowerCase();

interface Eip3009Authorization {
  from: Address;
  to: Address;
  value: string;
  validAfter: string;
  validBefore: string;
  nonce: Hex;
}

export function createFastExactVerifier(opts: { chain: ChainClient; signer: OutboxSigner }) {
  const { chain, signer } = opts;
  async function diagnose(asset: Address, auth: Eip3009Authorization, requirements: PaymentRequirements, payer: Address, watch: RpcWatch): Promise<VerifyResponse> {
    try {
      const [balance, name, version, used] = await chain.client.multicall({
        multicallAddress: MULTICALL3_ADDRESS,
        allowFailure: true,
        contracts: [
          { address: asset, abi: eip3009ABI, functionName: "balanceOf", args: [auth.from] },
          { address: asset, abi: eip3009ABI, functionName: "name" },
          { address: asset, abi: eip3009ABI, functionName: "version" },
          { address: asset, abi: eip3009ABI, functionName: "authorizationState", args: [auth.from, auth.nonce] },
        ],
      });
      // A read the provider did not answer is a failure of the RPC, not of the payment (a multicall's own failure comes back per call).
      for (const read of [balance, name, version, used]) if (read.status === "failure") noteRpcFailure(read.error, watch);
      if (used.status === "failure") return { isValid: false, invalidReason: R.notSupported, payer };
      if (used.result === true) return { isValid: false, invalidReason: R.nonceUsed, payer };
      if (name.status === "success" && requirements.extra?.name && name.result !== requirements.extra.name) return { isValid: false, invalidReason: R.nameMismatch, payer };
      if (version.status === "success" && requirements.extra?.version && version.result !== requirements.extra.version) return { isValid: false, invalidReason: R.versionMismatch, payer };
      if (balance.status === "success" && (balance.result as bigint) < BigInt(requirements.amount)) return { isValid: false, invalidReason: R.balance, payer };
    } catch (e) {
      noteRpcFailure(e, watch); // diagnosis is best effort, as in the reference
    }
    return { isValid: false, invalidReason: R.simulation, payer };
  }

  /**
   * The verdict, or undefined when the reference mechanism must decide. The caller passes what it
   * would otherwise hold in AsyncLocalStorage: the asset's code (read first, as withAssetCode does:
   * the reference's asset check is answered from it) and the request's RPC watch.
   */
  async function verify(payload: PaymentPayload, requirements: PaymentRequirements, context: { assetCode: Hex | undefined; watch: RpcWatch }): Promise<VerifyResponse | undefined> {
    if (!fastExactApplies(payload)) return undefined;
    const { watch } = context;
    const { authorization: auth, signature } = payload.payload as { signature: Hex; authorization: Eip3009Authorization };
    const payer = auth.from;
    if (payload.accepted.scheme !== "exact" || requirements.scheme !== "exact") return { isValid: false, invalidReason: R.scheme, payer };
    const { name, version } = requirements.extra as { name?: unknown; version?: unknown };
    if (!name || !version) return { isValid: false, invalidReason: R.missingDomain, payer };
    // A domain of anything but strings is the reference's to judge (viem hashes other values as other bytes).
    if (typeof name !== "string" || typeof version !== "string") return undefined;
    if (payload.accepted.network !== requirements.network) return { isValid: false, invalidReason: R.network, payer };
    const asset = getAddress(requirements.asset);
    const assetCheck = startAssetContractCheck({ getCode: async () => context.assetCode } as unknown as OutboxSigner, requirements.network, requirements.asset);
    // Overlapped with the checks below, most of which return early: a handler now, so a failure
    // never becomes an unhandled rejection; the verdict reads it through await().
    assetCheck.results.catch(() => undefined);
    // Unknown account code is not "no code": a contract wallet would read as a bad signature. The
    // error goes to the caller (as in the reference), which answers that the RPC is unavailable.
    const code = await signer.getCode({ address: payer });
    if (code && code !== "0x") return undefined; // a contract account: ERC-1271 through the reference
    let digest: Hex;
    let fields: string;
    try {
      // A mixed-case address with a wrong EIP-55 checksum: the reference's typed-data hashing refuses it.
      if (!isAddress(auth.from) || !isAddress(auth.to)) throw new Error("invalid address checksum");
      fields = `${addressWord(auth.from)}${addressWord(auth.to)}${uintWord(auth.value)}${uintWord(auth.validAfter)}${uintWord(auth.validBefore)}${auth.nonce.slice(2).toLowerCase()}`;
      digest = authorizationDigest({ name, version, chainId: chainIdOf(requirements.network), verifyingContract: asset }, fields);
    } catch {
      return { isValid: false, invalidReason: R.signature, payer };
    }
    // Read once, for recovery and the calldata; a signature viem would not parse is not valid (its recovery throws).
    const sig = signatureParts(signature);
    const recovered = sig && (await recoverSigner(digest, signature, sig).catch(() => undefined));
    if (!sig || !recovered || !sameAddress(recovered, payer)) return { isValid: false, invalidReason: R.signature, payer };
    if (!sameAddress(auth.to, requirements.payTo)) return { isValid: false, invalidReason: R.recipient, payer };
    const now = BigInt(Math.floor(Date.now() / 1000));
    if (BigInt(auth.validBefore) < now + 6n) return { isValid: false, invalidReason: R.validBefore, payer };
    if (BigInt(auth.validAfter) > now) return { isValid: false, invalidReason: R.validAfter, payer };
    if (BigInt(auth.value) !== BigInt(requirements.amount)) return { isValid: false, invalidReason: R.value, payer };
    const assetReason = await assetCheck.await();
    if (assetReason) return { isValid: false, invalidReason: assetReason, payer };
    try {
      // transferWithAuthorization(from, to, value, validAfter, validBefore, nonce, v, r, s): the calldata
      // the reference settlement sends, byte for byte (the key under which its simulation is kept).
      const data: Hex = `${TRANSFER_SELECTOR}${fields}${uintWord(BigInt(sig.v))}${uintWord(sig.r)}${uintWord(sig.s)}`;
      // Simulated at the block that is provably still the head, with the gas it needs: a settlement
      // of this very call while that block is still the head reuses it instead of simulating again.
      // Plain JSON-RPC requests (chain.rpc): viem's actions and transport layers cost more CPU than the call.
      const head = signer.head();
      const pinned =
        head === undefined
          ? undefined
          : await chain.rpc<string>("eth_estimateGas", [{ from: ZERO, to: asset, data }, toHex(head)], watch).then(
              (gas) => signer.noteSimulated(asset, data, head, BigInt(gas)),
              () => "retry" as const, // a node without that block yet, or a revert: the plain call decides
            );
      if (head === undefined || pinned === "retry") await chain.rpc("eth_call", [{ to: asset, data }, "latest"], watch);
    } catch (e) {
      const diagnosis = await diagnose(asset, auth, requirements, payer, watch);
      return { ...diagnosis, invalidMessage: (e as Error).message };
    }
    return { isValid: true, invalidReason: undefined, payer };
  }

  return { verify };
}

/**
 * Whether the fast path judges a payload: EIP-3009 with a plain 65-byte signature. Contract
 * wallets' shapes (ERC-1271, ERC-6492, checked before any deployment by the facilitator) and
 * Permit2 go to the reference mechanism.
 */
export function fastExactApplies(payload: PaymentPayload): boolean {
  const inner = payload.payload as { signature?: unknown; authorization?: unknown };
  const signature = inner.signature;
  return !!inner.authorization && !("permit2Authorization" in inner) && typeof signature === "string" && /^0x[0-9a-fA-F]{130}$/.test(signature) && !isErc6492Signature(signature as Hex);
}
