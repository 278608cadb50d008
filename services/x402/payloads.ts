// Shapes of the scheme-specific `paymentPayload.payload`, checked before any mechanism sees them:
// the reference mechanisms call getAddress()/BigInt() on these fields and would throw on garbage.
import { z } from "zod";
import { RequestError } from "./errors.ts";
import { bytes32, hexAddress, hexBytes, uintString } from "./wire.ts";

const signature = hexBytes.refine((s) => s.length >= 4 && s.length <= 2 + 2 * 4096, "signature length out of range");

export const eip3009Payload = z.object({
  signature,
  authorization: z.object({
    from: hexAddress,
    to: hexAddress,
    value: uintString,
    validAfter: uintString,
    validBefore: uintString,
    nonce: bytes32,
  }),
});

const permitted = z.object({ token: hexAddress, amount: uintString });

export const exactPermit2Payload = z.object({
  signature,
  permit2Authorization: z.object({
    from: hexAddress,
    permitted,
    spender: hexAddress,
    nonce: uintString,
    deadline: uintString,
    witness: z.object({ to: hexAddress, validAfter: uintString }),
  }),
});

/** Validates `paymentPayload.payload` for a scheme; unknown schemes are left to their mechanism. */
export function checkSchemePayload(scheme: string, payload: unknown): void {
  const schema = scheme === "exact" ? (payload && typeof payload === "object" && "permit2Authorization" in payload ? exactPermit2Payload : eip3009Payload) : undefined;
  if (!schema) return;
  const result = schema.safeParse(payload);
  if (!result.success) {
    const issue = result.error.issues[0]!;
    const path = ["paymentPayload.payload", ...issue.path].join(".");
    throw new RequestError("invalid_payload", issue.code === "invalid_type" && issue.received === "undefined" ? `${path} is required` : `${path}: ${issue.message}`);
  }
}
