// The whole request on the agent's behalf: fetch the resource, and when it answers 402 with a v2
// PAYMENT-REQUIRED, pay within the wallet's policy (the URL fetched is the host the policy checks)
// and retry once with PAYMENT-SIGNATURE. The outcome (status, PAYMENT-RESPONSE) joins the record.
//
// Outbound requests are bounded (timeout, response size, no redirects followed) and, unless the
// service allows private networks (the devnet does), cannot reach loopback, private, link-local or
// metadata addresses: the check runs on the resolved addresses inside the connection, so a DNS name
// cannot point past it.
import { fetch as undiciFetch } from "undici";
import { decodePaymentResponseHeader } from "@x402/core/http";
import { createEgress, DESTINATION_NOT_ALLOWED, literalDestinationProblem } from "../platform/egress.ts";
import { safeMessage } from "../platform/logger.ts";
import { WalletError } from "./errors.ts";
import { ownedWallet } from "./owned.ts";
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

const TEXTUAL = /^(text\/|application\/(json|[a-z0-9.+-]*\+json|xml|[a-z0-9.+-]*\+xml|javascript|x-www-form-urlencoded))/i;

export interface Fetcher {
  fetchAndPay(deps: PaymentsDeps, caller: Caller, walletId: string, req: FetchRequest): Promise<FetchResult>;
  close(): Promise<void>;
}

export function createFetcher(opts: FetchOptions): Fetcher {
  const { dispatcher } = createEgress({ allowPrivateNetworks: opts.allowPrivateNetworks, headersTimeoutMs: opts.timeoutMs, bodyTimeoutMs: opts.timeoutMs });

  const checkDestination = (url: URL) => {
    const problem = opts.allowPrivateNetworks ? undefined : literalDestinationProblem(url);
    if (problem) throw new WalletError("destination_not_allowed", `${problem}; the wallet service fetches public resources only`);
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
      if (err.cause?.code === DESTINATION_NOT_ALLOWED) throw new WalletError("destination_not_allowed", `${req.url.hostname} resolves to a non-public address; the wallet service fetches public resources only`);
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
      await ownedWallet(deps.store, caller, walletId);
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
      await deps.store.setOutcome(walletId, paid.record.id, outcome).catch((e: Error) => deps.logger.warn({ reason: safeMessage(e) }, "wallets: outcome not recorded"));
      return { response: retry.response, paid: true, payment: { record: { ...paid.record, outcome }, accepted: paid.accepted, settlement } };
    },
    close: () => dispatcher.close(),
  };
}
