// Signing one approved payment: the reference @x402/evm client mechanisms (exact over EIP-3009 or
// Permit2, upto over Permit2) build the typed data; our signer signs it only if it is exactly the
// payment the policy approved (primary type, chain, token, amount, recipient, spender, facilitator),
// and only once. The signer has no RPC and no transaction signing, so the mechanisms cannot sign
// anything else (no EIP-2612 or approval extensions).
import { ExactEvmScheme } from "@x402/evm/exact/client";
import { UptoEvmScheme } from "@x402/evm/upto/client";
import { x402ExactPermit2ProxyAddress, x402UptoPermit2ProxyAddress } from "@x402/evm";
import type { ClientEvmSigner } from "@x402/evm";
import { encodePaymentSignatureHeader } from "@x402/core/http";
import type { PaymentPayload, PaymentRequired, PaymentRequirements } from "@x402/core/types";
import { hashTypedData, isAddressEqual, type Address, type Hex, type TypedDataDefinition } from "viem";
import { chainIdOf, networkInfo, PERMIT2_ADDRESS } from "../x402/networks.ts";
import type { Candidate } from "./policy.ts";

/** Signs a 32-byte digest with the wallet's key (custody does the unwrapping and zeroing). */
export type DigestSigner = (digest: Hex) => Hex;

/** The typed data the mechanism asked for is not the approved payment: nothing was signed. */
export class SigningGuardError extends Error {}

type TypedDataArgs = Parameters<ClientEvmSigner["signTypedData"]>[0];

const eq = (a: unknown, b: string) => typeof a === "string" && /^0x[0-9a-fA-F]{40}$/.test(a) && isAddressEqual(a as Address, b as Address);
const big = (v: unknown): bigint | undefined => {
  try {
    return typeof v === "bigint" ? v : typeof v === "string" || typeof v === "number" ? BigInt(v) : undefined;
  } catch {
    return undefined;
  }
};

/** Checks typed data against the approved payment; throws SigningGuardError on any difference. */
export function checkTypedData(address: Address, c: Candidate, facilitator: Address | undefined, args: TypedDataArgs): void {
  const fail = (what: string): never => {
    throw new SigningGuardError(`refused to sign: ${what} differs from the approved payment`);
  };
  const domain = args.domain as Record<string, unknown>;
  const m = args.message as Record<string, unknown>;
  if (big(domain.chainId) !== BigInt(chainIdOf(c.network))) fail("the chain id");
  if (args.primaryType === "TransferWithAuthorization") {
    if (c.method !== "eip3009" || c.scheme !== "exact") fail("the transfer method");
    if (!eq(domain.verifyingContract, c.asset)) fail("the token");
    if (!eq(m.from, address)) fail("the payer");
    if (!eq(m.to, c.payTo)) fail("the recipient");
    if (big(m.value) !== c.amount) fail("the amount");
    return;
  }
  if (args.primaryType === "PermitWitnessTransferFrom") {
    if (c.method !== "permit2") fail("the transfer method");
    if (domain.name !== "Permit2" || !eq(domain.verifyingContract, PERMIT2_ADDRESS)) fail("the Permit2 domain");
    const permitted = (m.permitted ?? {}) as Record<string, unknown>;
    const witness = (m.witness ?? {}) as Record<string, unknown>;
    if (!eq(permitted.token, c.asset)) fail("the token");
    if (big(permitted.amount) !== c.amount) fail("the amount");
    if (!eq(m.spender, c.scheme === "upto" ? x402UptoPermit2ProxyAddress : x402ExactPermit2ProxyAddress)) fail("the spender");
    if (!eq(witness.to, c.payTo)) fail("the recipient");
    if (c.scheme === "upto" && (!facilitator || !eq(witness.facilitator, facilitator))) fail("the facilitator");
    return;
  }
  fail(`the primary type ${String(args.primaryType)}`);
}

/** A ClientEvmSigner for exactly one approved payment. */
export function guardedSigner(address: Address, c: Candidate, facilitator: Address | undefined, sign: DigestSigner): ClientEvmSigner & { signatures: Hex[] } {
  const signatures: Hex[] = [];
  return {
    address,
    signatures,
    async signTypedData(args) {
      if (signatures.length > 0) throw new SigningGuardError("refused to sign: one payment, one signature");
      checkTypedData(address, c, facilitator, args);
      const signature = sign(hashTypedData(args as unknown as TypedDataDefinition));
      signatures.push(signature);
      return signature;
    },
  };
}

export interface SignedPayment {
  paymentPayload: PaymentPayload;
  /** The PAYMENT-SIGNATURE header value. */
  header: string;
  signature: Hex;
  nonce: string | null;
  /** Unix seconds: EIP-3009 validBefore or the Permit2 deadline. */
  validBefore: number | null;
}

export interface SignPaymentInput {
  address: Address;
  candidate: Candidate;
  /** The server's requirement, echoed unchanged as `accepted`. */
  requirement: PaymentRequirements;
  paymentRequired: PaymentRequired;
  /** Authorisations are valid for at most this long, whatever maxTimeoutSeconds says. */
  maxAuthorizationSeconds: number;
  sign: DigestSigner;
}

export async function signPayment(input: SignPaymentInput): Promise<SignedPayment> {
  const { candidate: c, requirement } = input;
  const extra = { ...(requirement.extra ?? {}) } as Record<string, unknown>;
  if (c.method === "eip3009" && (typeof extra.name !== "string" || typeof extra.version !== "string")) {
    const known = networkInfo(c.network)?.assets.find((a) => a.address.toLowerCase() === c.asset.toLowerCase())?.eip712;
    if (known) Object.assign(extra, known);
  }
  const facilitator = c.scheme === "upto" ? (extra.facilitatorAddress as Address) : undefined;
  const signer = guardedSigner(input.address, c, facilitator, input.sign);
  // What the mechanism signs from: the server's terms with our validity bound and the token's domain.
  const terms: PaymentRequirements = { ...requirement, extra, maxTimeoutSeconds: Math.min(requirement.maxTimeoutSeconds, input.maxAuthorizationSeconds) };
  const mechanism = c.scheme === "upto" ? new UptoEvmScheme(signer) : new ExactEvmScheme(signer);
  const result = await mechanism.createPaymentPayload(2, terms);
  if (signer.signatures.length !== 1) throw new SigningGuardError("the mechanism produced no signature");
  const paymentPayload: PaymentPayload = {
    x402Version: 2,
    payload: result.payload,
    accepted: requirement,
    ...(input.paymentRequired.resource ? { resource: input.paymentRequired.resource } : {}),
    ...(input.paymentRequired.extensions ? { extensions: input.paymentRequired.extensions } : {}),
  };
  const payload = result.payload as { authorization?: { nonce?: string; validBefore?: string }; permit2Authorization?: { nonce?: string; deadline?: string } };
  const nonce = payload.authorization?.nonce ?? payload.permit2Authorization?.nonce ?? null;
  const validBefore = payload.authorization?.validBefore ?? payload.permit2Authorization?.deadline;
  return {
    paymentPayload,
    header: encodePaymentSignatureHeader(paymentPayload),
    signature: signer.signatures[0]!,
    nonce: nonce === null ? null : String(nonce),
    validBefore: validBefore !== undefined ? Number(validBefore) : null,
  };
}
