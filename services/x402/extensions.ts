// Extensions a facilitator supports, by the schemes it serves: EIP-2612 gas sponsoring rides in
// the payload of an exact Permit2 payment and is handled by the reference exact mechanism; ERC-20
// approval gas sponsoring is served where it is switched on (settlement/approval-sponsor.ts); the
// payment identifier is bound in our settlement record (facilitator.ts checkIdentifier).
export const EIP2612_GAS_SPONSORING = "eip2612GasSponsoring";

/** A raw approve(Permit2) transaction funded and relayed by the facilitator (tokens without EIP-2612). */
export const ERC20_APPROVAL_GAS_SPONSORING = "erc20ApprovalGasSponsoring";

/** The client's idempotency id (payment-identifier extension), honoured for every scheme. */
export const PAYMENT_IDENTIFIER = "payment-identifier";

/** Our extension entry: GET/POST /v2/settlements/status is served, and /supported carries `confirmationPolicy`. */
export const SETTLEMENT_STATUS = "settlement-status";

/** Per network: the depth at which a settlement is answered success and counted final (/supported `confirmationPolicy`). */
export type ConfirmationPolicy = Record<string, { confirmations: number }>;

export function extensionsFor(schemes: readonly string[], opts: { erc20ApprovalSponsoring?: boolean } = {}): string[] {
  const permit2 = schemes.includes("exact") || schemes.includes("upto");
  return [
    ...(schemes.includes("exact") ? [EIP2612_GAS_SPONSORING] : []),
    ...(opts.erc20ApprovalSponsoring && permit2 ? [ERC20_APPROVAL_GAS_SPONSORING] : []),
    PAYMENT_IDENTIFIER,
  ];
}
