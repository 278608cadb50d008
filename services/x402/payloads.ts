// Shapes of the scheme-specific `paymentPayload.payload`, checked before any mechanism sees them:
// the reference mechanisms call getAddress()/BigInt() on these fields and would throw on garbage.
import { z } from "zod";
import { RequestError } from "./errors.ts";
import { bytes32, hexAddress, hexBytes, isHexAddress, isObject, isUint, parseOrThrow, uintString } from "./wire.ts";

const signature = hexBytes.refine((s) => s.length >= 4 && s.length <= 2 + 2 * 4096, "signature length out of range");

/** `eip3009Payload`'s rules by hand (the common payload; see wire.ts on why): never accepts what the schema refuses. */
export function wellFormedEip3009(p: unknown): boolean {
  if (!isObject(p) || !isObject(p.authorization)) return false;
  const { signature: s, authorization: a } = p;
  return (
    typeof s === "string" && s.length >= 4 && s.length <= 2 + 2 * 4096 && /^0x(?:[0-9a-fA-F]{2})*$/.test(s) &&
    isHexAddress(a.from) && isHexAddress(a.to) && isUint(a.value) && isUint(a.validAfter) && isUint(a.validBefore) &&
    typeof a.nonce === "string" && /^0x[0-9a-fA-F]{64}$/.test(a.nonce)
  );
}

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

/** A Permit2 PermitWitnessTransferFrom as the x402 proxies take it; the witness differs by scheme. */
const permit2Payload = <W extends z.ZodRawShape>(witness: W) =>
  z.object({
    signature,
    permit2Authorization: z.object({
      from: hexAddress,
      permitted: z.object({ token: hexAddress, amount: uintString }),
      spender: hexAddress,
      nonce: uintString,
      deadline: uintString,
      witness: z.object({ to: hexAddress, ...witness, validAfter: uintString }),
    }),
  });

export const exactPermit2Payload = permit2Payload({});
export const uptoPayload = permit2Payload({ facilitator: hexAddress });

// batch-settlement: each type's fields as the reference types them. The mechanism and the payment's
// plan (facilitator/plan.ts) read payers, receivers and amounts from them: a malformed one is a 400
// here, never a mechanism's exception or a flow the plan cannot see.
const channelConfig = z
  .object({ payer: hexAddress, payerAuthorizer: hexAddress, receiver: hexAddress, receiverAuthorizer: hexAddress, token: hexAddress, withdrawDelay: z.union([z.number().int().nonnegative().max(2 ** 40), uintString]), salt: bytes32 })
  .passthrough();
const voucherFields = z.object({ channelId: bytes32, maxClaimableAmount: uintString, signature }).passthrough();
const voucherClaim = z.object({ voucher: z.object({ channel: channelConfig, maxClaimableAmount: uintString }).passthrough(), signature, totalClaimed: uintString }).passthrough();
const claims = z.array(voucherClaim).max(256);
const batchPayload = z.discriminatedUnion("type", [
  z.object({ type: z.literal("deposit"), channelConfig, voucher: voucherFields, deposit: z.object({ amount: uintString, authorization: z.object({}).passthrough() }).passthrough() }).passthrough(),
  z.object({ type: z.literal("voucher"), channelConfig, voucher: voucherFields }).passthrough(),
  z.object({ type: z.literal("claim"), claims: claims.min(1), claimAuthorizerSignature: signature.optional() }).passthrough(),
  z.object({ type: z.literal("settle"), receiver: hexAddress, token: hexAddress }).passthrough(),
  z.object({ type: z.literal("refund"), channelConfig, voucher: voucherFields, amount: uintString.optional(), refundNonce: uintString.optional(), claims: claims.optional(), refundAuthorizerSignature: signature.optional(), claimAuthorizerSignature: signature.optional() }).passthrough(),
]);

function schemaFor(scheme: string, payload: unknown): z.ZodTypeAny | undefined {
  const isObject = payload !== null && typeof payload === "object";
  if (scheme === "exact") return isObject && "permit2Authorization" in payload ? exactPermit2Payload : eip3009Payload;
  if (scheme === "upto") return uptoPayload;
  if (scheme === "batch-settlement") return batchPayload;
  return undefined;
}

/** Validates `paymentPayload.payload` for a scheme before a mechanism sees it. */
export function checkSchemePayload(scheme: string, payload: unknown): void {
  // One payload, one transfer method: a decoy EIP-3009 authorization beside a Permit2 one would be
  // what we identify and check while Permit2 is what the mechanism executes.
  if ((scheme === "exact" || scheme === "upto") && payload && typeof payload === "object" && "permit2Authorization" in payload && "authorization" in payload) {
    throw new RequestError("invalid_payload", "paymentPayload.payload carries both authorization (EIP-3009) and permit2Authorization; send one");
  }
  const schema = schemaFor(scheme, payload);
  if (schema === eip3009Payload && wellFormedEip3009(payload)) return;
  if (schema) parseOrThrow(schema, payload, "paymentPayload.payload", "invalid_payload");
}
