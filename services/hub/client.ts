// A small client of the hub: signs every write with the owner's wallet (any viem account, or
// anything that signs EIP-712 typed data) and reads with plain requests.
//
//   const hub = createHubClient({ url: "http://127.0.0.1:4030", signer: privateKeyToAccount(key) });
//   await hub.upload({ id: "chat1_0", message: JSON.stringify({ role: "user", content: "hi" }) });
//   await hub.getConversation({ id: "chat1" });   // ['{"role":"user","content":"hi"}']
import type { Address, Hex } from "viem";
import { AUTH_HEADERS, hubMessageHash, hubWriteTypedData, newHubNonce, type HubDomain, type HubWriteTypedData } from "./auth.ts";
import { deriveBucket, type Kind } from "./wire.ts";

export interface HubSigner {
  address: Address;
  signTypedData(typedData: HubWriteTypedData): Promise<Hex>;
}

export interface HubClientOptions {
  /** The hub's base URL (the part before /api). */
  url: string;
  /** Signs writes; a viem LocalAccount fits. Needed only for writes. */
  signer?: HubSigner;
  /** Whose space to write and read by default: the signer's address, or a contract wallet (ERC-1271) the signer controls. */
  owner?: Address;
  /** How long a signed write stays valid, in seconds (the hub refuses more than its maximum, 600 s by default). */
  expirySeconds?: number;
  /** The hub's EIP-712 domain; fetched from GET /api/info on first write when not given. */
  domain?: HubDomain;
  fetch?: typeof fetch;
  /** Clock in ms. */
  now?: () => number;
}

export interface UploadOptions {
  id: string;
  message: string;
  bucket?: string;
  kind?: Kind;
  owner?: Address;
  /** A specific nonce (default: 32 fresh random bytes). */
  nonce?: Hex;
  /** A specific expiry in unix seconds (default: now + expirySeconds). */
  expiry?: bigint;
}

export interface UploadResult {
  owner: Address;
  bucket: string;
  id: string;
  kind: Kind;
  version: number;
  messageHash: Hex;
  size: number;
  createdAt: string;
}

export interface HubVersion {
  version: number;
  bucket: string;
  kind: Kind;
  messageHash: Hex;
  createdAt: string;
  message: string;
}

/** GET|POST /api/history: the key, its latest version and the versions kept, oldest first. */
export interface HubHistory {
  owner: Address;
  id: string;
  latest: number;
  versions: HubVersion[];
}

export interface HubInfo {
  domain: HubDomain;
  maxExpirySeconds: number;
  bodyLimit: number;
  contractWallets: boolean;
}

interface Page {
  offset?: number;
  length?: number;
}

/** A hub answer other than success: the HTTP status and the error code of the body. */
export class HubClientError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
  ) {
    super(message);
  }
}

export interface HubClient {
  info(): Promise<HubInfo>;
  /** Signs and stores a value; overwriting keeps the earlier versions. */
  upload(opts: UploadOptions): Promise<UploadResult>;
  /** The latest value (or a given version); undefined when there is none. */
  download(opts: { id: string; owner?: Address; version?: number }): Promise<string | undefined>;
  /** The owner's conversation ids, newest first. */
  listConversations(opts?: { owner?: Address; bucket?: string } & Page): Promise<string[]>;
  /** The messages of a conversation (`<id>_<n>` records) in write order. */
  getConversation(opts: { id: string; owner?: Address; bucket?: string } & Page): Promise<string[]>;
  /** The versions of a key that are kept, oldest first, as /api/history answers (undefined when the key does not exist). */
  history(opts: { id: string; owner?: Address } & Page): Promise<HubHistory | undefined>;
}

export function createHubClient(opts: HubClientOptions): HubClient {
  const base = opts.url.replace(/\/+$/, "");
  const doFetch = opts.fetch ?? fetch;
  const now = opts.now ?? Date.now;
  let info: Promise<HubInfo> | undefined;

  const ownerOf = (owner?: Address): Address => {
    const o = owner ?? opts.owner ?? opts.signer?.address;
    if (!o) throw new Error("hub client: no owner (give owner, or a signer)");
    return o;
  };

  async function call(path: string, init: RequestInit): Promise<Response> {
    const res = await doFetch(`${base}${path}`, init);
    if (res.ok) return res;
    const text = await res.text();
    let message = text;
    try {
      message = (JSON.parse(text) as { error?: string }).error ?? text;
    } catch {
      // not JSON: keep the text
    }
    throw new HubClientError(res.status, message.split(":")[0] ?? "", `hub ${path}: HTTP ${res.status} ${message}`);
  }

  const form = (fields: Record<string, string | number | undefined>) =>
    new URLSearchParams(Object.entries(fields).flatMap(([k, v]) => (v === undefined ? [] : [[k, String(v)]])));

  const post = (path: string, fields: Record<string, string | number | undefined>) =>
    call(path, { method: "POST", headers: { "content-type": "application/x-www-form-urlencoded" }, body: form(fields) });
  const json = async <T>(res: Promise<Response>) => (await (await res).json()) as T;

  /** A 404 is no such value: undefined. */
  const notFound = (e: unknown): undefined => {
    if (e instanceof HubClientError && e.status === 404) return undefined;
    throw e;
  };

  const getInfo = () => {
    info ??= call("/api/info", { method: "GET" })
      .then((r) => r.json() as Promise<HubInfo>)
      .catch((e: unknown) => {
        info = undefined;
        throw e;
      });
    return info;
  };

  return {
    info: getInfo,

    async upload(u) {
      const signer = opts.signer;
      if (!signer) throw new Error("hub client: writes need a signer");
      const owner = ownerOf(u.owner).toLowerCase() as Address;
      const bucket = u.bucket || deriveBucket(owner, u.message);
      const kind = u.kind ?? "memory";
      const domain = opts.domain ?? (await getInfo()).domain;
      const nonce = u.nonce ?? newHubNonce();
      const expiry = u.expiry ?? BigInt(Math.floor(now() / 1000) + (opts.expirySeconds ?? 120));
      const signature = await signer.signTypedData(
        hubWriteTypedData(domain, { operation: "upload", owner, bucket, id: u.id, kind, messageHash: hubMessageHash(u.message), nonce, expiry }),
      );
      const res = await call("/api/upload", {
        method: "POST",
        headers: { "content-type": "application/json", [AUTH_HEADERS.signature]: signature, [AUTH_HEADERS.nonce]: nonce, [AUTH_HEADERS.expiry]: expiry.toString() },
        body: JSON.stringify({ owner, bucket, id: u.id, message: u.message, kind }),
      });
      return (await res.json()) as UploadResult;
    },

    async download(d) {
      const res = await post("/api/download", { owner: ownerOf(d.owner), id: d.id, version: d.version }).catch(notFound);
      return res?.text();
    },

    listConversations: async (l = {}) => json<string[]>(post("/api/conversation", { owner: ownerOf(l.owner), bucket: l.bucket, offset: l.offset, length: l.length })),

    getConversation: async (g) => json<string[]>(post("/api/conversation", { owner: ownerOf(g.owner), id: g.id, bucket: g.bucket, offset: g.offset, length: g.length })),

    async history(h) {
      const res = await post("/api/history", { owner: ownerOf(h.owner), id: h.id, offset: h.offset, length: h.length }).catch(notFound);
      return res && ((await res.json()) as HubHistory);
    },
  };
}
