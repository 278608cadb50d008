// Extensions a facilitator supports, by the schemes it serves: EIP-2612 gas sponsoring rides in
// the payload of an exact Permit2 payment and is handled by the reference exact mechanism.
export const EIP2612_GAS_SPONSORING = "eip2612GasSponsoring";

export function extensionsFor(schemes: readonly string[]): string[] {
  return schemes.includes("exact") ? [EIP2612_GAS_SPONSORING] : [];
}
