// The whole request on the agent's behalf: fetch the resource, and when it answers 402 with a v2
// PAYMENT-REQUIRED, pay within the wallet's policy (the URL fetched is the host the policy checks)
// and retry once with PAYMENT-SIGNATURE. The outcome (status, PAYMENT-RESPONSE) joins the record.
//
// Outbound requests are bounded (timeout, response size, no redirects followed) and, unless the
// service allows private networks (the devnet does), cannot reach loopback, private, link-local or
// metadata addresses: the check runs on the resolved addresses inside the connection, so a DNS name
// cannot point past it.
import { lookup as dnsLookup, type LookupAddress, type LookupOptions } from "node:dns";
import { BlockList, isIP } from "node:net";
import { Agent, fetch as undiciFetch, type Dispatcher } from "undici";
import { decodePaymentResponseHeader } from "@x402/core/http";
import { WalletError } from "./errors.ts";
import { payFor, type Caller, type PaymentsDeps, type PayResult } from "./payments.ts";
import type { SignatureOutcome, SignatureRecord } from "./store.ts";
import { decodePaymentRequired, type FetchRequest } from "./wire.ts";

export interface FetchOptions {
  allowPrivateNetworks: boolean;
  timeoutMs: number;
  maxResponseBytes: number;
}

export interface FetchedResponse {
  status: number;
  headers: Record<string, string>;
  /** The body as text (textual content types) or base64 (anything else). */
  body?: string;
  bodyBase64?: string;
}

export interface FetchResult {
  /** The final response (the paid retry when a payment was made). */
  response: FetchedResponse;
  paid: boolean;
  payment?: {
    record: SignatureRecord;
    accepted: PayResult["accepted"];
    /** The decoded PAYMENT-RESPONSE of the retry, when the server sent one. */
    settlement: Record<string, unknown> | null;
  };
}

/**
 * Destinations /fetch refuses (unless private networks are allowed), with why. IPv6 forms that
 * embed or translate to an IPv4 address (mapped, compatible, NAT64, 6to4) are refused whole: the
 * embedded address could be any of the IPv4 ranges above, and a public one has a plain IPv4 form.
 */
export const BLOCKED_RANGES: readonly (readonly [network: string, prefix: number, why: string])[] = [
  ["0.0.0.0", 8, "this network"],
  ["10.0.0.0", 8, "private"],
  ["100.64.0.0", 10, "carrier-grade NAT"],
  ["127.0.0.0", 8, "loopback"],
  ["169.254.0.0", 16, "link-local (cloud metadata)"],
  ["172.16.0.0", 12, "private"],
  ["192.0.0.0", 24, "IETF protocol assignments"],
  ["192.0.2.0", 24, "documentation"],
  ["192.88.99.0", 24, "6to4 relay anycast"],
  ["192.168.0.0", 16, "private"],
  ["198.18.0.0", 15, "benchmarking"],
  ["198.51.100.0", 24, "documentation"],
  ["203.0.113.0", 24, "documentation"],
  ["224.0.0.0", 4, "multicast"],
  ["240.0.0.0", 4, "reserved, broadcast"],
  ["::", 96, "unspecified, loopback, IPv4-compatible ::a.b.c.d"],
  ["::ffff:0:0", 96, "IPv4-mapped ::ffff:a.b.c.d"],
  ["64:ff9b::", 96, "NAT64 well-known prefix"],
  ["64:ff9b:1::", 48, "NAT64 local-use prefix"],
  ["100::", 64, "discard"],
  ["2001:db8::", 32, "documentation"],
  ["2002::", 16, "6to4"],
  ["fc00::", 7, "unique local"],
  ["fe80::", 10, "link-local"],
  ["fec0::", 10, "site-local (deprecated)"],
  ["ff00::", 8, "multicast"],
];

// One list per family: node's BlockList matches IPv4 addresses against IPv6 rules through their
// embedded forms (::/96 would then refuse every IPv4 address).
const blocked4 = new BlockList();
const blocked6 = new BlockList();
for (const [network, prefix] of BLOCKED_RANGES) {
  if (isIP(network) === 4) blocked4.addSubnet(network, prefix, "ipv4");
  else blocked6.addSubnet(network, prefix, "ipv6");
}

export function isPrivateAddress(address: string): boolean {
  const family = isIP(address);
  if (family === 4) return blocked4.check(address, "ipv4");
  if (family === 6) return blocked6.check(address.replace(/%.*$/, ""), "ipv6"); // a zone id does not change the address
  return true;
}

type LookupCallback = (err: NodeJS.ErrnoException | null, address: string | LookupAddress[], family?: number) => void;

/** dns.lookup that refuses names resolving to any non-public address (used inside undici's connect). */
export function guardedLookup(hostname: string, options: LookupOptions, callback: LookupCallback): void {
  dnsLookup(hostname, { ...options, all: true }, (err, addresses) => {
    if (err) return callback(err, "");
    const list = addresses as LookupAddress[];
    const bad = list.find((a) => isPrivateAddress(a.address));
    if (bad) {
      const e = new Error(`destination ${hostname} resolves to a non-public address`) as NodeJS.ErrnoException;
      e.code = "X402_DESTINATION_NOT_ALLOWED";
      return callback(e, "");
    }
    if (options.all) return callback(null, list);
    callback(null, list[0]!.address, list[0]!.family);
  });
}

const TEXTUAL = /^(text\/|application\/(json|[a-z0-9.+-]*\+json|xml|[a-z0-9.+-]*\+xml|javascript|x-www-form-urlencoded))/i;

export interface Fetcher {
  fetchAndPay(deps: PaymentsDeps, caller: Caller, walletId: string, req: FetchRequest): Promise<FetchResult>;
  close(): Promise<void>;
}

export function createFetcher(opts: FetchOptions): Fetcher {
  const dispatcher: Dispatcher = new Agent({
    connect: opts.allowPrivateNetworks ? {} : { lookup: guardedLookup as never },
    headersTimeout: opts.timeoutMs,
    bodyTimeout: opts.timeoutMs,
  });

  const checkDestination = (url: URL) => {
    if (opts.allowPrivateNetworks) return;
    const host = url.hostname.replace(/^\[|\]$/g, "");
    if (host === "localhost" || host.endsWith(".localhost") || (isIP(host) && isPrivateAddress(host))) {
      throw new WalletError("destination_not_allowed", `${url.hostname} is not a public address; the wallet service fetches public resources only`);
    }
  };

  async function send(req: FetchRequest, extraHeaders: Record<string, string> = {}): Promise<{ response: FetchedResponse; paymentRequired: string | null; paymentResponse: string | null }> {
    checkDestination(req.url);
    let res;
    try {
      res = await undiciFetch(req.url, {
        method: req.method,
        headers: { ...req.headers, ...extraHeaders },
        body: req.body ? new Uint8Array(req.body) : undefined,
        redirect: "manual",
        signal: AbortSignal.timeout(opts.timeoutMs),
        dispatcher,
      });
    } catch (e) {
      const err = e as { name?: string; cause?: { code?: string; name?: string } };
      if (err.cause?.code === "X402_DESTINATION_NOT_ALLOWED") throw new WalletError("destination_not_allowed", `${req.url.hostname} resolves to a non-public address; the wallet service fetches public resources only`);
      if (err.name === "TimeoutError" || err.cause?.name === "TimeoutError" || err.cause?.code === "UND_ERR_HEADERS_TIMEOUT") {
        throw new WalletError("upstream_timeout", `${req.url.host} did not answer within ${opts.timeoutMs} ms`);
      }
      throw new WalletError("upstream_unreachable", `${req.url.host} could not be reached (${err.cause?.code ?? "connection failed"})`);
    }
    const chunks: Buffer[] = [];
    let size = 0;
    try {
      if (res.body) {
        for await (const chunk of res.body) {
          size += (chunk as Uint8Array).byteLength;
          if (size > opts.maxResponseBytes) {
            throw new WalletError("response_too_large", `${req.url.host} answered more than ${opts.maxResponseBytes} bytes`);
          }
          chunks.push(Buffer.from(chunk as Uint8Array));
        }
      }
    } catch (e) {
      if (e instanceof WalletError) throw e;
      throw new WalletError("upstream_timeout", `${req.url.host} did not finish its answer within ${opts.timeoutMs} ms`);
    }
    const bytes = Buffer.concat(chunks);
    const headers: Record<string, string> = {};
    res.headers.forEach((value, name) => {
      headers[name] = value;
    });
    const textual = TEXTUAL.test(headers["content-type"] ?? "") || bytes.length === 0;
    return {
      response: { status: res.status, headers, ...(textual ? { body: bytes.toString("utf8") } : { bodyBase64: bytes.toString("base64") }) },
      paymentRequired: res.headers.get("payment-required"),
      paymentResponse: res.headers.get("payment-response"),
    };
  }

  return {
    async fetchAndPay(deps, caller, walletId, req) {
      // The wallet must exist (and be the caller's) before anything goes out.
      if (!(await deps.store.wallet(caller.platformId, walletId))) throw new WalletError("not_found", `no wallet ${walletId}`);
      const first = await send(req);
      if (first.response.status !== 402 || !first.paymentRequired) return { response: first.response, paid: false };
      const paymentRequired = decodePaymentRequired(first.paymentRequired);
      const paid = await payFor(deps, caller, walletId, { paymentRequired, url: req.url });
      let retry;
      try {
        retry = await send(req, { "payment-signature": paid.paymentSignature });
      } catch (e) {
        const reason = e instanceof WalletError ? e.code : "upstream_unreachable";
        await deps.store.setOutcome(walletId, paid.record.id, { settled: false, errorReason: reason }).catch(() => undefined);
        throw e;
      }
      let settlement: Record<string, unknown> | null = null;
      if (retry.paymentResponse) {
        try {
          settlement = decodePaymentResponseHeader(retry.paymentResponse) as unknown as Record<string, unknown>;
        } catch {
          settlement = null;
        }
      }
      const outcome: SignatureOutcome = {
        status: retry.response.status,
        settled: settlement?.success === true,
        ...(typeof settlement?.transaction === "string" && settlement.transaction ? { transaction: settlement.transaction } : {}),
        ...(typeof settlement?.errorReason === "string" ? { errorReason: settlement.errorReason } : {}),
      };
      await deps.store.setOutcome(walletId, paid.record.id, outcome).catch((e: Error) => deps.logger.warn({ reason: e.message.split("\n")[0] }, "wallets: outcome not recorded"));
      return { response: retry.response, paid: true, payment: { record: { ...paid.record, outcome }, accepted: paid.accepted, settlement } };
    },
    close: () => dispatcher.close(),
  };
}
