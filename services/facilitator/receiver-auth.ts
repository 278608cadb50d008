// Who may make the facilitator's receiver-authorizer key sign. A batch-settlement claim moves a
// channel's vouchers into the receiver's balance and a refund hands the rest back to the payer: a
// refund signed for anyone who asks would let a payer take back what it already spent. So the key
// signs only for a caller that proves it is the channel's receiver, with a bearer token whose
// SHA-256 the operator registered for that receiver (a mounted Secret: tokens themselves are never stored).
import { createHash, timingSafeEqual } from "node:crypto";
import { readFileSync } from "node:fs";
import { getAddress, isAddress, type Address } from "viem";
import { RequestError } from "../x402/errors.ts";

export type ReceiverCredentials = Map<Address, Buffer[]>;

/** Parses `<receiver address> <sha256 hex of its token>` lines; blank lines and # comments ignored. */
export function parseReceiverCredentials(text: string): ReceiverCredentials {
  const credentials: ReceiverCredentials = new Map();
  text.split(/\r?\n/).forEach((raw, i) => {
    const line = raw.trim();
    if (line === "" || line.startsWith("#")) return;
    const [address, digest, ...rest] = line.split(/\s+/);
    const hex = digest?.replace(/^sha256:/, "");
    // Never echo the line: the operator may have pasted a token by mistake.
    if (!address || !isAddress(address) || !hex || !/^[0-9a-fA-F]{64}$/.test(hex) || rest.length) {
      throw new Error(`receiver credentials file: line ${i + 1} is not "<0x receiver address> <sha256 hex of its token>"`);
    }
    const receiver = getAddress(address);
    credentials.set(receiver, [...(credentials.get(receiver) ?? []), Buffer.from(hex, "hex")]);
  });
  return credentials;
}

export function readReceiverCredentials(path: string): ReceiverCredentials {
  let text: string;
  try {
    text = readFileSync(path, "utf8");
  } catch (e) {
    throw new Error(`cannot read receiver credentials file ${path}: ${(e as NodeJS.ErrnoException).code ?? "error"}`);
  }
  return parseReceiverCredentials(text);
}

interface ChannelFields {
  receiver?: string;
  receiverAuthorizer?: string;
}
interface SigningRequest {
  type?: string;
  channelConfig?: ChannelFields;
  claims?: { voucher?: { channel?: ChannelFields } }[];
  claimAuthorizerSignature?: string;
  refundAuthorizerSignature?: string;
}

/**
 * The receivers a batch-settlement settle request would make `authorizer` sign for: claims and
 * refunds of channels naming it as receiverAuthorizer that do not carry the server's own signature.
 */
export function receiversNeedingAuthorizer(payload: Record<string, unknown>, authorizer: Address): Address[] {
  const p = payload as SigningRequest;
  const claims = Array.isArray(p.claims) ? p.claims : [];
  const channels: ChannelFields[] = [];
  if (p.type === "claim" && !p.claimAuthorizerSignature) channels.push(...claims.map((c) => c?.voucher?.channel ?? {}));
  if (p.type === "refund") {
    if (!p.refundAuthorizerSignature && p.channelConfig) channels.push(p.channelConfig);
    if (!p.claimAuthorizerSignature) channels.push(...claims.map((c) => c?.voucher?.channel ?? {}));
  }
  const ours = channels.filter((c) => typeof c.receiverAuthorizer === "string" && isAddress(c.receiverAuthorizer) && getAddress(c.receiverAuthorizer) === authorizer);
  return [...new Set(ours.map((c) => (typeof c.receiver === "string" && isAddress(c.receiver) ? getAddress(c.receiver) : ("0x" as Address))))];
}

/** Throws the contract's 401/403 unless the bearer token is registered for every receiver. */
export function authenticateReceivers(receivers: Address[], authorization: string | undefined, credentials: ReceiverCredentials | undefined): void {
  if (receivers.length === 0) return;
  const why = "the facilitator's receiver-authorizer key signs claims and refunds only for the channel's receiver";
  if (!credentials || credentials.size === 0) {
    throw new RequestError("forbidden", `${why}, and no receiver credentials are configured (X402_RECEIVER_CREDENTIALS_FILE); sign with the server's own receiverAuthorizerSigner instead`);
  }
  const token = /^Bearer\s+(\S+)$/i.exec(authorization ?? "")?.[1];
  if (!token) throw new RequestError("unauthorized", `${why}: send Authorization: Bearer <the receiver's token>`);
  const presented = createHash("sha256").update(token).digest();
  for (const receiver of receivers) {
    const known = credentials.get(receiver) ?? [];
    if (!known.some((digest) => timingSafeEqual(digest, presented))) throw new RequestError("forbidden", `${why}; this token is not registered for ${receiver}`);
  }
}
