// Extensions a facilitator supports, by the schemes it serves: EIP-2612 gas sponsoring rides in
// the payload of an exact Permit2 payment and is handled by the reference exact mechanism; the
// payment identifier is bound in our settlement record (facilitator.ts checkIdentifier).
export const EIP2612_GAS_SPONSORING = "eip2612GasSponsoring";

/** The client's idempotency id (payment-identifier extension), honoured for every scheme. */
export const PAYMENT_IDENTIFIER = "payment-identifier";

export function extensionsFor(schemes: readonly string[]): string[] {
  return [...(schemes.includes("exact") ? [EIP2612_GAS_SPONSORING] : []), PAYMENT_IDENTIFIER];
}
