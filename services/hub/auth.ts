// Write authorisation: every write carries an EIP-712 signature by the owner's wallet over the
// store's domain (name, version, chain id) and the whole write (operation, owner, bucket, id, kind,
// keccak256 of the message), a single-use nonce and a short expiry. EOAs are checked by ECDSA
// recovery; deployed contract wallets (ERC-1271) through an RPC when one is configured.
import {
  BaseError,
  HttpRequestError,
  TimeoutError,
  hashTypedData,
  isAddressEqual,
  keccak256,
  parseAbi,
  recoverTypedDataAddress,
  stringToBytes,
  type Address,
  type Hex,
  type PublicClient,
  type TypedDataDefinition,
} from "viem";
import { randomBytes } from "node:crypto";
import { HubError } from "./errors.ts";
import type { Kind } from "./wire.ts";

export const DEFAULT_HUB_DOMAIN_NAME = "x402-fleet hub";
export const HUB_DOMAIN_VERSION = "1";
/** The longest a signed write may stay valid: expiries further out are refused. */
export const DEFAULT_MAX_EXPIRY_SECONDS = 600;

/**
 * The EIP-712 domain. `name`, `version` and `chainId` always; `verifyingContract` and `salt` only
 * when a deployment sets them (the default domain stays the one existing clients sign for).
 */
export interface HubDomain {
  name: string;
  version: string;
  chainId: number;
  verifyingContract?: Address;
  salt?: Hex;
}

/** A domain with only the optional fields that are set (GET /api/info shows exactly what is signed). */
export function hubDomain(d: Omit<HubDomain, "version">): HubDomain {
  return {
    name: d.name,
    version: HUB_DOMAIN_VERSION,
    chainId: d.chainId,
    ...(d.verifyingContract ? { verifyingContract: d.verifyingContract } : {}),
    ...(d.salt ? { salt: d.salt.toLowerCase() as Hex } : {}),
  };
}

export const HUB_WRITE_TYPES = {
  HubWrite: [
    { name: "operation", type: "string" },
    { name: "owner", type: "address" },
    { name: "bucket", type: "string" },
    { name: "id", type: "string" },
    { name: "kind", type: "string" },
    { name: "messageHash", type: "bytes32" },
    { name: "nonce", type: "bytes32" },
    { name: "expiry", type: "uint64" },
  ],
} as const;

export type HubOperation = "upload";

/** What a signature covers: everything that is stored, plus replay protection. */
export interface HubWrite {
  operation: HubOperation;
  owner: Address;
  bucket: string;
  id: string;
  kind: Kind;
  messageHash: Hex;
  nonce: Hex;
  /** Unix seconds after which the signature is refused. */
  expiry: bigint;
}

export type HubWriteTypedData = TypedDataDefinition<typeof HUB_WRITE_TYPES, "HubWrite">;

/** The keccak256 of the message's UTF-8 bytes: the stored bytes are exactly these. */
export function hubMessageHash(message: string): Hex {
  return keccak256(stringToBytes(message));
}

export function hubWriteTypedData(domain: HubDomain, write: HubWrite): HubWriteTypedData {
  return { domain, types: HUB_WRITE_TYPES, primaryType: "HubWrite", message: write };
}

/** A fresh single-use nonce: 32 random bytes. */
export function newHubNonce(): Hex {
  return `0x${randomBytes(32).toString("hex")}`;
}

/** The authorisation a write carries, from the X-Hub-* headers or (fallback) body fields; never the query string. */
export interface WriteAuthorization {
  signature: Hex;
  nonce: Hex;
  expiry: bigint;
}

export const AUTH_HEADERS = { signature: "x-hub-signature", nonce: "x-hub-nonce", expiry: "x-hub-expiry" } as const;

const MAX_UINT64 = (1n << 64n) - 1n;

/**
 * Reads the authorisation of a write. Undefined when none of its parts is present; a partial or
 * malformed one is refused with 401 and says which part is wrong.
 */
export function readAuthorization(headers: Record<string, string | string[] | undefined>, fields: Record<string, unknown>): WriteAuthorization | undefined {
  const part = (key: keyof typeof AUTH_HEADERS): unknown => {
    const h = headers[AUTH_HEADERS[key]];
    return h !== undefined ? h : fields[key];
  };
  const [signature, nonce, expiry] = (["signature", "nonce", "expiry"] as const).map(part);
  if (signature === undefined && nonce === undefined && expiry === undefined) return undefined;
  const missing = Object.entries({ signature, nonce, expiry })
    .filter(([, v]) => v === undefined || v === "")
    .map(([k]) => AUTH_HEADERS[k as keyof typeof AUTH_HEADERS]);
  if (missing.length) throw new HubError("missing_signature", `incomplete write authorisation: ${missing.join(", ")} missing`);
  if (typeof signature !== "string" || !/^0x(?:[0-9a-fA-F]{2}){1,8192}$/.test(signature)) throw new HubError("invalid_signature", `${AUTH_HEADERS.signature} must be 0x-prefixed hex bytes`);
  if (typeof nonce !== "string" || !/^0x[0-9a-fA-F]{64}$/.test(nonce)) throw new HubError("invalid_signature", `${AUTH_HEADERS.nonce} must be 0x-prefixed 32-byte hex`);
  const expiryText = typeof expiry === "number" && Number.isSafeInteger(expiry) ? String(expiry) : expiry;
  if (typeof expiryText !== "string" || !/^\d{1,20}$/.test(expiryText) || BigInt(expiryText) > MAX_UINT64) {
    throw new HubError("invalid_signature", `${AUTH_HEADERS.expiry} must be unix seconds (a uint64)`);
  }
  return { signature: signature as Hex, nonce: nonce.toLowerCase() as Hex, expiry: BigInt(expiryText) };
}

/** Answers whether `signature` is the owner's over the typed data. Throws HubError(503) when the RPC cannot answer. */
export interface SignatureVerifier {
  verify(owner: Address, typedData: HubWriteTypedData, signature: Hex): Promise<boolean>;
}

const ERC1271_MAGIC = "0x1626ba7e";
const erc1271Abi = parseAbi(["function isValidSignature(bytes32 hash, bytes signature) view returns (bytes4 magicValue)"]);

function isTransportFailure(e: unknown): boolean {
  if (!(e instanceof BaseError)) return false;
  return Boolean(e.walk((x) => x instanceof HttpRequestError || x instanceof TimeoutError));
}

/**
 * ECDSA recovery first (no RPC); then, with a public client, ERC-1271 `isValidSignature` on the
 * owner's deployed code. Without a client only EOAs can write.
 */
export function createSignatureVerifier(opts: { publicClient?: PublicClient } = {}): SignatureVerifier {
  return {
    async verify(owner, typedData, signature) {
      if (/^0x[0-9a-fA-F]{130}$/.test(signature)) {
        try {
          if (isAddressEqual(await recoverTypedDataAddress({ ...typedData, signature }), owner)) return true;
        } catch {
          // not a valid ECDSA signature: maybe a contract wallet's
        }
      }
      const client = opts.publicClient;
      if (!client) return false;
      try {
        const code = await client.getCode({ address: owner });
        if (!code || code === "0x") return false;
        const magic = await client.readContract({ address: owner, abi: erc1271Abi, functionName: "isValidSignature", args: [hashTypedData(typedData), signature] });
        return magic.toLowerCase() === ERC1271_MAGIC;
      } catch (e) {
        if (isTransportFailure(e)) throw new HubError("backend_unavailable", "the chain RPC used to check contract-wallet signatures cannot be reached");
        return false; // reverted or answered garbage: not a valid signature
      }
    },
  };
}

export interface AuthorizeWriteOptions {
  domain: HubDomain;
  verifier: SignatureVerifier;
  nowSeconds: number;
  maxExpirySeconds: number;
}

/**
 * Checks a write's authorisation: present, not expired, not valid for too long, signed by the owner.
 * The nonce's single use is enforced by the store, in the write's own transaction.
 */
export async function authorizeWrite(write: Omit<HubWrite, "nonce" | "expiry">, auth: WriteAuthorization | undefined, opts: AuthorizeWriteOptions): Promise<HubWrite> {
  if (!auth) {
    throw new HubError(
      "missing_signature",
      `writes must be signed by the owner's wallet (EIP-712 HubWrite in ${AUTH_HEADERS.signature}, ${AUTH_HEADERS.nonce}, ${AUTH_HEADERS.expiry}); see GET /api/info`,
    );
  }
  const now = BigInt(Math.floor(opts.nowSeconds));
  if (auth.expiry <= now) throw new HubError("expired_signature", `the authorisation expired at ${auth.expiry} (now ${now})`);
  if (auth.expiry > now + BigInt(opts.maxExpirySeconds)) throw new HubError("expiry_too_far", `the expiry ${auth.expiry} is more than ${opts.maxExpirySeconds} s ahead (now ${now}); sign shorter-lived writes`);
  const signed: HubWrite = { ...write, nonce: auth.nonce, expiry: auth.expiry };
  const ok = await opts.verifier.verify(write.owner, hubWriteTypedData(opts.domain, signed), auth.signature);
  if (!ok) {
    throw new HubError(
      "invalid_signature",
      `the signature is not the owner's (${write.owner}) over this write (domain ${opts.domain.name} v${opts.domain.version} chain ${opts.domain.chainId}${opts.domain.verifyingContract ? ` contract ${opts.domain.verifyingContract}` : ""}${opts.domain.salt ? ` salt ${opts.domain.salt}` : ""} from GET /api/info, operation, owner, bucket, id, kind, message hash, nonce, expiry)`,
    );
  }
  return signed;
}
