// The public /v2 edge: validates and normalises requests once, routes on (scheme, network) to the
// chain's facilitator service over keep-alive pools, and aggregates /supported from the table.
import type { IncomingHttpHeaders } from "node:http";
import { Pool } from "undici";
import type { SupportedResponse } from "@x402/core/types";
import { RequestError } from "../x402/errors.ts";
import { pairKey, routeOf } from "../x402/wire.ts";
import { rawBodyOf } from "../platform/http-kit.ts";
import { FLEET_HEADERS, type CallerHeaders, type ContractHandlers, type HandlerResult } from "../platform/http.ts";
import type { Logger } from "../platform/logger.ts";
import type { Metrics } from "../platform/metrics.ts";
import type { RouterToken } from "../platform/router-token.ts";
import { traceHeaders } from "../platform/tracing.ts";
import { API_KEY_PREFIX, outOfScope, type ApiKeyInfo, type ApiKeyStore, type GasReservation } from "../tenants/api-keys.ts";
import type { Backend, RoutingTable } from "./routing-table.ts";
import { declaresBazaar, type RouterDiscovery } from "./discovery.ts";
import { SETTLEMENT_STATUS, type ConfirmationPolicy } from "../x402/extensions.ts";

export interface RouterOptions {
  logger: Logger;
  metrics: Metrics;
  /** When set, /verify and /settle need a valid API key in scope (services/tenants/api-keys.ts). */
  apiKeys?: ApiKeyStore;
  /** When set, settled payments' bazaar declarations are catalogued and /v2/discovery/* is served. */
  discovery?: RouterDiscovery;
  verifyTimeoutMs?: number;
  settleTimeoutMs?: number;
  /** Our credential at the facilitators (platform/router-token.ts): sent with every forwarded call. */
  routerToken?: RouterToken;
}

export interface Router extends ContractHandlers {
  setTable(table: RoutingTable): void;
  /** Probes every backend once (GET /supported) and updates x402_router_backend_up. */
  probeBackends(): Promise<void>;
  close(): Promise<void>;
}

interface Route {
  backend: Backend;
  pool: Pool;
  basePath: string;
  paths: { verify: string; settle: string };
}

interface Answer {
  statusCode: number;
  headers: IncomingHttpHeaders;
  /** Whether the answer is JSON; only then is its body kept (as `text`). */
  json: boolean;
  text: string;
}

/**
 * POSTs to a facilitator and reads its whole answer through undici's dispatch API: `pool.request`
 * makes a stream and a chain of promises for every answer (4 KB of garbage per request).
 * A non-JSON answer is read and dropped, even one that breaks off (as `body.dump()` did).
 */
function post(pool: Pool, path: string, headers: Record<string, string>, body: string, timeout: number): Promise<Answer> {
  return new Promise((resolve, reject) => {
    let answer: Answer | undefined;
    const chunks: Buffer[] = [];
    pool.dispatch(
      { method: "POST", path, headers, body, headersTimeout: timeout, bodyTimeout: timeout },
      {
        // Its presence tells undici this handler speaks the current interface.
        onRequestStart() {},
        onResponseStart(_controller, statusCode, headers) {
          answer = { statusCode, headers, json: String(headers["content-type"] ?? "").includes("application/json"), text: "" };
        },
        onResponseData(_controller, chunk) {
          if (answer!.json) chunks.push(chunk);
        },
        onResponseEnd() {
          // As undici's body.text(): UTF-8, without a leading byte order mark.
          const text = Buffer.concat(chunks).toString("utf8");
          answer!.text = text.charCodeAt(0) === 0xfeff ? text.slice(1) : text;
          resolve(answer!);
        },
        onResponseError(_controller, error) {
          if (answer && !answer.json) resolve(answer);
          else reject(error);
        },
      },
    );
  });
}

export function createRouter(opts: RouterOptions): Router {
  let routes = new Map<string, Route>();
  let pools = new Map<string, Pool>();
  let supported: SupportedResponse = { kinds: [], extensions: [], signers: {} };
  // The facilitators' confirmation policies, as their /supported last said (probeBackends).
  const policies = new Map<string, { confirmations: number }>();
  // The facilitators' latest worst case of one settlement per (scheme, network): the size of a gas reservation.
  const gasQuotes = new Map<string, bigint>();

  function setTable(table: RoutingTable) {
    const nextPools = new Map<string, Pool>();
    const nextRoutes = new Map<string, Route>();
    for (const backend of table.backends) {
      const url = new URL(backend.url);
      const pool = pools.get(url.origin) ?? nextPools.get(url.origin) ?? new Pool(url.origin, { connections: 128, keepAliveTimeout: 30_000 });
      nextPools.set(url.origin, pool);
      const basePath = url.pathname.replace(/\/$/, "");
      const route = { backend, pool, basePath, paths: { verify: `${basePath}/verify`, settle: `${basePath}/settle` } };
      for (const k of backend.kinds) nextRoutes.set(pairKey(k.scheme, k.network), route);
    }
    for (const [origin, pool] of pools) if (!nextPools.has(origin)) void pool.close();
    const nextNetworks = new Set(table.backends.map((b) => b.network));
    for (const route of routes.values()) if (!nextNetworks.has(route.backend.network)) opts.metrics.backendUp.remove({ network: route.backend.network });
    pools = nextPools;
    routes = nextRoutes;
    const signers = [...new Set(table.backends.flatMap((b) => b.signers))];
    supported = {
      kinds: table.backends.flatMap((b) => b.kinds),
      // The catalog is the router's own: advertised when it serves /v2/discovery/*.
      extensions: [...new Set([...table.backends.flatMap((b) => b.extensions), ...(opts.discovery ? ["bazaar"] : [])])],
      signers: signers.length ? { "eip155:*": signers } : {},
    };
  }

  async function forward(action: "verify" | "settle", body: unknown, caller: CallerHeaders): Promise<HandlerResult> {
    // Only what routing needs is checked here; the chain's facilitator validates and normalises the
    // rest (it is callable on its own, so it must), and its 400s come back unchanged.
    // Our API key may arrive as Authorization: Bearer x402k_…; it is ours, never forwarded.
    const bearer = caller.authorization ? /^Bearer\s+(\S+)$/i.exec(caller.authorization)?.[1] : undefined;
    const ownKey = bearer?.startsWith(API_KEY_PREFIX) ? bearer : undefined;
    const forwardedAuthorization = ownKey ? undefined : caller.authorization;
    // With keys: who calls and their request rate before anything else (a bad body counts too)…
    const key = opts.apiKeys ? await authenticate(opts.apiKeys, caller.apiKey ?? ownKey) : undefined;
    const { scheme, network } = routeOf(body);
    const pair = pairKey(scheme, network);
    // …then what they may do, and a settlement counted before it is forwarded: an exhausted key sends nothing.
    if (key) await authorize(opts.apiKeys!, key, action, scheme, network);
    const route = routes.get(pair);
    if (!route) {
      const registered = [...routes.keys()];
      throw new RequestError("unsupported_scheme_network", `no facilitator for ${pair}; registered pairs: ${registered.length ? registered.join(", ") : "(none)"}`);
    }
    // A settlement of a key with a gas budget on this network holds its worst case until the answer says what it cost.
    const gas = key && action === "settle" ? await reserveGas(opts.apiKeys!, key, pair, network) : undefined;
    // What the settlement cost the signer, once the answer says; until then (no answer) the whole reservation.
    let charged: bigint | undefined;
    let usageRecorded = false;
    try {
      const timeout = action === "verify" ? (opts.verifyTimeoutMs ?? 30_000) : (opts.settleTimeoutMs ?? 60_000);
      const sentAt = performance.now();
      // One object, no spreads: this runs for every request.
      const headers = traceHeaders();
      headers["content-type"] = "application/json";
      // The caller's credentials go to the facilitator as sent (receiver authentication for batch-settlement).
      if (forwardedAuthorization) headers.authorization = forwardedAuthorization;
      if (opts.routerToken) headers[FLEET_HEADERS.routerToken] = opts.routerToken.current();
      // Whose settlement it is: only that key reads its status.
      if (key) headers[FLEET_HEADERS.tenant] = key.id;
      // Where that key's settlement events go: the facilitator keeps it with the payment (settlement/webhooks.ts).
      if (action === "settle" && key?.webhookUrl) headers[FLEET_HEADERS.tenantWebhook] = key.webhookUrl;
      // A facilitator that knows us refuses a settle without an allowance: without keys, or for a
      // key with no budget on this network, it is "unlimited" (metering only).
      if (action === "settle" && (gas || opts.routerToken)) headers[FLEET_HEADERS.gasAllowance] = gas?.day ? gas.wei.toString() : "unlimited";
      let res: Answer;
      try {
        // The body as received (the facilitator validates it all): no second serialisation on the hot path.
        res = await post(route.pool, route.paths[action], headers, rawBodyOf(body) ?? JSON.stringify(body), timeout);
      } catch (e) {
        // No answer, or one that broke off (the facilitator died or stalled mid-body): never a 500.
        throw unreachable(e, network, timeout);
      }
      if (!res.json) {
        opts.logger.warn({ network, status: res.statusCode }, "facilitator backend answered non-JSON");
        throw new RequestError("backend_unavailable", `the facilitator for ${network} answered HTTP ${res.statusCode} without a JSON body`);
      }
      // Our facilitator's JSON goes back byte for byte: no parse and re-serialise on the hot path.
      const text = res.text;
      if (gas) {
        // The facilitator says what the call's transactions took from the signer (fees and value),
        // whatever the status: a 503 may follow a mined funding. It says nothing while one is
        // unmined, or when it failed without knowing: then the reservation is charged whole, never 0.
        charged = bigintHeader(res.headers[FLEET_HEADERS.gasSpent]) ?? gas.wei;
        const quote = bigintHeader(res.headers[FLEET_HEADERS.gasQuote]);
        if (quote !== undefined) gasQuotes.set(pair, quote);
      }
      // Server-Timing: how long the facilitator took, so a caller (and the bench) sees what the router itself adds.
      const upstream = `upstream;dur=${(performance.now() - sentAt).toFixed(2)}`;
      if (key && (res.statusCode === 200 || (charged ?? 0n) > 0n)) {
        await recordUsage(key, action, network, body, res.statusCode === 200 ? text : undefined, charged);
        usageRecorded = true;
      }
      // Only a payment that was settled declares a resource (a verify moves nothing), and for its tenant.
      const extra = opts.discovery && action === "settle" && res.statusCode === 200 && declaresBazaar(body) && sentTransaction(text) ? await opts.discovery.afterSettlement(body, { tenant: key?.id }) : undefined;
      const answerHeaders: Record<string, string> = extra ? { ...extra, "server-timing": upstream } : { "server-timing": upstream };
      // A facilitator shedding load says when to come back: the caller hears it too.
      const retryAfter = res.statusCode === 503 ? res.headers["retry-after"] : undefined;
      if (typeof retryAfter === "string") answerHeaders["retry-after"] = retryAfter;
      return { status: res.statusCode, body: text, headers: answerHeaders };
    } finally {
      if (gas) {
        const charge = charged ?? gas.wei;
        await finishGas(gas, charge, key!);
        // No answer (the facilitator unreachable, timed out, not JSON): the charge is in usage too.
        if (!usageRecorded && charge > 0n) await recordUsage(key!, action, network, body, undefined, charge);
      }
    }
  }

  /** Holds a key's gas for one settlement, or refuses it (nothing is forwarded, nothing sent). */
  async function reserveGas(keys: ApiKeyStore, key: ApiKeyInfo, pair: string, network: string): Promise<GasReservation> {
    const outcome = await keyStore(() => keys.reserveGas(key, network, gasQuotes.get(pair)));
    if ("refused" in outcome) {
      opts.metrics.tenantRequests.inc({ key: key.id, network, action: "settle", result: "gas_budget_exhausted" });
      throw new RequestError("gas_budget_exhausted", outcome.refused);
    }
    return outcome.reservation;
  }

  /** Releases a reservation and charges what the settlement cost. */
  async function finishGas(gas: GasReservation, charged: bigint, key: ApiKeyInfo) {
    if (charged > 0n) opts.metrics.tenantGasSpent.inc({ key: key.id, network: gas.network }, Number(charged));
    try {
      await opts.apiKeys!.settleGas(gas, charged);
    } catch (e) {
      // The reservation stays held (counted as spent for the day): the budget errs on the safe side.
      opts.logger.warn({ err: { name: (e as Error).name }, key: key.id }, "gas reservation not settled");
    }
  }

  /** Whether the facilitator found the payment valid (verify) or settled it (settle). */
  function paid(action: "verify" | "settle", answer: string): boolean {
    try {
      const parsed = JSON.parse(answer) as { isValid?: unknown; success?: unknown };
      return action === "verify" ? parsed.isValid === true : parsed.success === true;
    } catch {
      return false;
    }
  }

  /** Whether a settle answer says the payment is on chain: success with its transaction's hash. */
  function sentTransaction(answer: string): boolean {
    try {
      const parsed = JSON.parse(answer) as { success?: unknown; transaction?: unknown };
      return parsed.success === true && typeof parsed.transaction === "string" && /^0x[0-9a-fA-F]{64}$/.test(parsed.transaction);
    } catch {
      return false;
    }
  }

  /**
   * A keyed call's outcome into the key's usage (billing) and metrics; never fails the answer.
   * `answer` undefined: an error answer (or none) to a settlement that was charged gas, counted as a failed settle.
   */
  async function recordUsage(key: ApiKeyInfo, action: "verify" | "settle", network: string, body: unknown, answer: string | undefined, gasWei: bigint | undefined) {
    const ok = answer !== undefined && paid(action, answer);
    opts.metrics.tenantRequests.inc({ key: key.id, network, action, result: ok ? "ok" : "refused" });
    const requirements = (body as { paymentRequirements?: { asset?: unknown; amount?: unknown; maxAmountRequired?: unknown } }).paymentRequirements ?? {};
    const asset = typeof requirements.asset === "string" ? requirements.asset : "unknown";
    let amount = 0n;
    try {
      // The service contract's shape names the amount maxAmountRequired (the facilitator settles either).
      amount = BigInt(String(requirements.amount ?? requirements.maxAmountRequired ?? 0));
    } catch {
      amount = 0n;
    }
    try {
      await opts.apiKeys!.recordUsage(key.id, { network, asset, action, ok, amount, gasWei });
    } catch (e) {
      opts.logger.warn({ err: { name: (e as Error).name }, key: key.id }, "usage not recorded");
    }
  }

  async function authenticate(keys: ApiKeyStore, presented: string | undefined): Promise<ApiKeyInfo> {
    if (!presented) throw new RequestError("api_key_required", "this facilitator needs an API key: Authorization: Bearer <key> or X-API-Key: <key>");
    const auth = await keyStore(() => keys.authenticate(presented));
    if (!auth.ok) throw new RequestError(auth.code, auth.detail);
    await consume(keys, auth.key, "requests");
    return auth.key;
  }

  async function authorize(keys: ApiKeyStore, key: ApiKeyInfo, action: "verify" | "settle", scheme: string, network: string) {
    const denied = outOfScope(key, scheme, network);
    if (denied) throw new RequestError("api_key_out_of_scope", denied);
    if (action === "settle") await consume(keys, key, "settlements");
  }

  /** Counts one request or settlement against the key's quota, or refuses when it is used up. */
  async function consume(keys: ApiKeyStore, key: ApiKeyInfo, counter: "requests" | "settlements") {
    const exhausted = await keyStore(() => keys.consume(key, counter));
    if (exhausted) throw new RequestError("quota_exceeded", exhausted);
  }

  async function keyStore<T>(fn: () => Promise<T>): Promise<T> {
    try {
      return await fn();
    } catch (e) {
      // The key store (shared database) is down: refuse, never let an unchecked caller through.
      opts.logger.warn({ err: { name: (e as Error).name } }, "API key store unavailable");
      throw new RequestError("backend_unavailable", "API keys cannot be checked right now; try again");
    }
  }

  function bigintHeader(value: string | string[] | undefined): bigint | undefined {
    return typeof value === "string" && /^[0-9]{1,78}$/.test(value) ? BigInt(value) : undefined;
  }

  function unreachable(e: unknown, network: string, timeout: number): RequestError {
    const code = (e as { code?: string }).code;
    opts.logger.warn({ network, code }, "facilitator backend request failed");
    if (code === "UND_ERR_HEADERS_TIMEOUT" || code === "UND_ERR_BODY_TIMEOUT") {
      return new RequestError("backend_timeout", `the facilitator for ${network} did not answer within ${timeout} ms`);
    }
    return new RequestError("backend_unavailable", `the facilitator for ${network} cannot be reached (${code ?? "connection failed"})`);
  }

  /**
   * A status question (GET by what names the payment, POST with the payment) goes to its network's
   * facilitator. With keys the caller must hold one in scope of the network (no quota is counted:
   * asking costs no gas), and the facilitator answers only about that key's own settlements.
   */
  async function forwardStatus(method: "GET" | "POST", network: unknown, query: Record<string, unknown>, body: unknown, caller: CallerHeaders): Promise<HandlerResult> {
    const bearer = caller.authorization ? /^Bearer\s+(\S+)$/i.exec(caller.authorization)?.[1] : undefined;
    const ownKey = bearer?.startsWith(API_KEY_PREFIX) ? bearer : undefined;
    const key = opts.apiKeys ? await authenticate(opts.apiKeys, caller.apiKey ?? ownKey) : undefined;
    if (typeof network !== "string" || network.length === 0) throw new RequestError("invalid_status_query", "name the payment's network: network=<CAIP-2> (GET) or paymentRequirements.network (POST)");
    const route = [...routes.values()].find((r) => r.backend.network === network);
    if (!route) throw new RequestError("unsupported_scheme_network", `no facilitator for ${network}; networks: ${[...new Set([...routes.values()].map((r) => r.backend.network))].join(", ") || "(none)"}`);
    if (key?.networks.length && !key.networks.includes(network)) throw new RequestError("api_key_out_of_scope", `the key is not allowed on ${network} (allowed: ${key.networks.join(", ")})`);
    const headers = traceHeaders();
    if (opts.routerToken) headers[FLEET_HEADERS.routerToken] = opts.routerToken.current();
    if (key) headers[FLEET_HEADERS.tenant] = key.id;
    const search = new URLSearchParams();
    for (const [name, value] of Object.entries(query)) if (typeof value === "string") search.set(name, value);
    const path = `${route.basePath}/settlements/status${method === "GET" ? `?${search}` : ""}`;
    const timeout = opts.verifyTimeoutMs ?? 30_000;
    let res;
    try {
      res = await route.pool.request({
        method,
        path,
        headers: method === "POST" ? { ...headers, "content-type": "application/json" } : headers,
        ...(method === "POST" ? { body: rawBodyOf(body) ?? JSON.stringify(body) } : {}),
        headersTimeout: timeout,
        bodyTimeout: timeout,
      });
    } catch (e) {
      throw unreachable(e, network, timeout);
    }
    const text = await res.body.text().catch((e: unknown) => {
      throw unreachable(e, network, timeout);
    });
    if (!String(res.headers["content-type"] ?? "").includes("application/json")) throw new RequestError("backend_unavailable", `the facilitator for ${network} answered HTTP ${res.statusCode} without a JSON body`);
    return { status: res.statusCode, body: text };
  }

  async function probeBackends() {
    const unique = new Map([...routes.values()].map((r) => [r.backend.network, r]));
    await Promise.all(
      [...unique.values()].map(async (route) => {
        const network = route.backend.network;
        const up = await route.pool
          .request({ method: "GET", path: `${route.basePath}/supported`, headersTimeout: 2000, bodyTimeout: 2000 })
          .then(async (res) => {
            if (res.statusCode !== 200) return (await res.body.dump(), 0);
            // Its confirmation policy is the facilitator's own (its configuration): published as it says.
            const policy = ((await res.body.json().catch(() => undefined)) as { confirmationPolicy?: ConfirmationPolicy } | undefined)?.confirmationPolicy?.[network];
            if (policy && Number.isInteger(policy.confirmations) && policy.confirmations > 0) policies.set(network, { confirmations: policy.confirmations });
            return 1;
          })
          .catch(() => 0);
        opts.metrics.backendUp.set({ network: route.backend.network }, up);
      }),
    );
  }

  return {
    setTable,
    probeBackends,
    verify: (body, caller) => forward("verify", body, caller),
    settle: (body, caller) => forward("settle", body, caller),
    supported: async () => {
      const known = Object.fromEntries([...policies].filter(([network]) => supported.kinds.some((k) => k.network === network)));
      if (Object.keys(known).length === 0) return { status: 200, body: supported };
      const extensions = supported.extensions.includes(SETTLEMENT_STATUS) ? supported.extensions : [...supported.extensions, SETTLEMENT_STATUS];
      return { status: 200, body: { ...supported, extensions, confirmationPolicy: known } };
    },
    status: {
      lookup: (query, caller) => forwardStatus("GET", query.network, query, undefined, caller),
      ofPayment: (body, caller) => forwardStatus("POST", (body as { paymentRequirements?: { network?: unknown } } | null)?.paymentRequirements?.network, {}, body, caller),
    },
    ...(opts.discovery ? { discovery: { resources: opts.discovery.resources, search: opts.discovery.search } } : {}),
    close: async () => {
      await Promise.all([...pools.values()].map((p) => p.close()));
    },
  };
}
