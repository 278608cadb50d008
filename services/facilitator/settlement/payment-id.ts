// A payment's identity: what the chain itself can execute only once. For EIP-3009 that is the
// (token, from, nonce) authorization; for Permit2 the (owner, nonce) pair; anything else is
// identified by its canonical signed payload. Network and scheme are always part of it.
// Its digest: everything that decides what moves where (payload, extensions, asset, payTo,
// amount). One identity with two digests is two different payments competing for one nonce.
import { getAddress } from "viem";
import { keccak256 } from "../crypto/keccak.ts";
import type { PaymentPayload, PaymentRequirements } from "@x402/core/types";

type Json = null | boolean | number | string | Json[] | { [k: string]: Json };

/** JSON with sorted keys and lower-cased hex strings, so equal payloads give equal text. */
export function canonicalJson(value: unknown): string {
  const norm = (v: unknown): Json => {
    if (Array.isArray(v)) return v.map(norm);
    if (v && typeof v === "object") {
      return Object.fromEntries(Object.keys(v).sort().map((k) => [k, norm((v as Record<string, unknown>)[k])]));
    }
    if (typeof v === "string" && /^0x[0-9a-fA-F]*$/.test(v)) return v.toLowerCase();
    return v as Json;
  };
  return JSON.stringify(norm(value));
}

export function paymentIdentity(payload: PaymentPayload, requirements: PaymentRequirements): { id: string; payer: string | null } {
  const p = payload.payload as Record<string, Record<string, unknown> | undefined>;
  const scope = `${requirements.network}|${requirements.scheme}`;
  let id: string;
  let payer: string | null = null;
  const auth = p.authorization;
  const permit = p.permit2Authorization;
  // Permit2 first, as the reference mechanisms execute it whenever it is present. Its nonces are the
  // owner's across every spender, so exact and upto share one scope.
  if (permit && typeof permit.from === "string" && typeof permit.nonce === "string") {
    payer = getAddress(permit.from);
    id = `${requirements.network}|permit2|${payer}|${BigInt(permit.nonce)}`;
  } else if (auth && typeof auth.from === "string" && typeof auth.nonce === "string") {
    payer = getAddress(auth.from);
    id = `${scope}|eip3009|${getAddress(requirements.asset)}|${payer}|${auth.nonce.toLowerCase()}`;
  } else {
    id = `${scope}|payload|${canonicalJson(payload.payload)}`;
  }
  return { id: keccak256(Buffer.from(id)), payer };
}

const ADDRESS = /^0x[0-9a-fA-F]{40}$/;

/**
 * The nonce a payment's identity is made of, normalised: an EIP-3009 nonce as lower-case hex, a
 * Permit2 nonce in decimal; none for other payloads. With the payer, how a resource server names it.
 */
export function paymentNonce(payload: PaymentPayload): string | undefined {
  const p = payload.payload as { authorization?: { nonce?: unknown }; permit2Authorization?: { nonce?: unknown } };
  const permit = p.permit2Authorization?.nonce;
  if (typeof permit === "string") return nonceForms(permit).find((f) => !f.startsWith("0x"));
  const auth = p.authorization?.nonce;
  return typeof auth === "string" ? auth.toLowerCase() : undefined;
}

/** Every stored form a nonce as a caller writes it may have (hex as given, and its decimal value; a decimal and its 32-byte hex). */
export function nonceForms(nonce: string): string[] {
  try {
    const value = BigInt(nonce);
    if (value < 0n || value >= 2n ** 256n) return [];
    const hex = `0x${value.toString(16).padStart(64, "0")}`;
    return /^0x/i.test(nonce) ? [nonce.toLowerCase(), value.toString(), hex] : [value.toString(), hex];
  } catch {
    return [];
  }
}

/**
 * Whose a client's payment identifier is (the payment-identifier extension): the one identity
 * whose signature alone makes the payment, as `<kind>:<address>…` in lower case, or undefined for
 * a payload nobody's signature makes (its ids are neither bound nor checked).
 * - `payer:<from>`: a payer's authorization of its own tokens: EIP-3009 or Permit2 (`from`, the
 *   identity's payer) and a batch-settlement deposit (its Permit2 `from`, else the channel's
 *   payer, who signs the ERC-3009 deposit). Only that key makes one, so only it binds its ids.
 * - `refund:<receiver>:<receiverAuthorizer>`: a batch-settlement refund, which the channel's
 *   receiver authorizer signs (or the facilitator's, for the receiver's credential holders only),
 *   never the payer it pays: keyed by both, as any channel opener may name any receiver.
 * - none: a batch-settlement claim or sweep (`settle`), which anyone may send, and a voucher, which
 *   sends nothing. A sweep's id still makes a retried sweep the same settlement, by its payment id
 *   (coordinator.ts: the sweep of that receiver and token, with that id).
 */
export function identifierScope(payload: PaymentPayload, identityPayer: string | null): string | undefined {
  if (identityPayer) return `payer:${identityPayer.toLowerCase()}`;
  const p = payload.payload as {
    type?: unknown;
    channelConfig?: { payer?: unknown; receiver?: unknown; receiverAuthorizer?: unknown };
    deposit?: { authorization?: { permit2Authorization?: { from?: unknown } } };
  };
  const address = (a: unknown) => (typeof a === "string" && ADDRESS.test(a) ? a.toLowerCase() : undefined);
  if (p.type === "deposit") {
    const signer = address(p.deposit?.authorization?.permit2Authorization?.from ?? p.channelConfig?.payer);
    return signer && `payer:${signer}`;
  }
  if (p.type === "refund") {
    const [receiver, authorizer] = [address(p.channelConfig?.receiver), address(p.channelConfig?.receiverAuthorizer)];
    return receiver && authorizer && `refund:${receiver}:${authorizer}`;
  }
  return undefined;
}

/**
 * The digest of the whole payment as it would be executed: the signed payload and its extensions
 * (an EIP-2612 permit rides there) and the requirements that decide the transfer. Fields that do
 * not change what moves (description, resource, timeouts, extra) are left out, so honest retries of
 * one payment always agree.
 */
/**
 * The digest of the whole request as /settle judged it: the payment's digest and the requirements'
 * `extra` (the EIP-712 domain a signature is checked against rides there). A refusal is kept under
 * it, so a copy of a payment with another `extra` never speaks for the genuine one.
 */
export function requestDigest(payload: PaymentPayload, requirements: PaymentRequirements): string {
  return keccak256(Buffer.from(canonicalJson({ payment: paymentDigest(payload, requirements), extra: requirements.extra ?? null })));
}

export function paymentDigest(payload: PaymentPayload, requirements: PaymentRequirements): string {
  const { scheme, network, asset, payTo, amount } = requirements;
  return keccak256(Buffer.from(canonicalJson({ scheme, network, asset, payTo, amount, payload: payload.payload, extensions: payload.extensions ?? null })));
}
