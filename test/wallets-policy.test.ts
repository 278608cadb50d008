// The wallet API without chains: credentials, wallets, policies and their audit trail, the pay flow
// for exact (EIP-3009, Permit2) and upto, every policy refusal with its code and nothing signed,
// daily caps under concurrency, isolation between platforms, and bad input that never becomes a 500.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { encodePaymentRequiredHeader, decodePaymentSignatureHeader } from "@x402/core/http";
import { guardedLookup, isPrivateAddress } from "../services/platform/egress.ts";
import {
  ADMIN_TOKEN,
  ENGINES,
  call,
  createPlatform,
  createWallet,
  errorCode,
  paymentRequired,
  randomHex,
  signerOfPayment,
  startTestWallets,
  type TestWallets,
  type WalletView,
} from "./helpers/wallets.ts";

const USDC_BASE = "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913";
const USDT_BSC = "0x55d398326f99059fF775485246999027B3197955";
const RECEIVER = "0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC";
const FACILITATOR = "0x976EA74026E726554dB657fA54763abd0C3a0aa9";

const exact3009 = (amount = "10000", over: Record<string, unknown> = {}) => ({
  scheme: "exact",
  network: "eip155:8453",
  asset: USDC_BASE,
  amount,
  payTo: RECEIVER,
  maxTimeoutSeconds: 60,
  extra: { name: "USD Coin", version: "2" },
  ...over,
});
const exactPermit2Bsc = (amount = "10000000000000000") => ({
  scheme: "exact",
  network: "eip155:56",
  asset: USDT_BSC,
  amount,
  payTo: RECEIVER,
  maxTimeoutSeconds: 60,
  extra: { assetTransferMethod: "permit2" },
});
const upto = (amount = "50000") => ({ scheme: "upto", network: "eip155:8453", asset: USDC_BASE, amount, payTo: RECEIVER, maxTimeoutSeconds: 60, extra: { facilitatorAddress: FACILITATOR } });

describe.each(ENGINES)("wallet API (%s engine)", (engine) => {
  let w: TestWallets;
  let a: { platformId: string; apiKey: string; apiKeyId: string };
  let b: { platformId: string; apiKey: string; apiKeyId: string };

  beforeAll(async () => {
    w = await startTestWallets(engine);
    [a, b] = await Promise.all([createPlatform(w, "platform-a"), createPlatform(w, "platform-b")]);
  });
  afterAll(async () => w?.stop());

  const api = <T = Record<string, unknown>>(key: string | undefined, method: string, path: string, body?: unknown) => call<T>(w.url, key, method, path, body);
  const pay = (key: string, walletId: string, body: unknown) =>
    api<{ paymentSignature: string; paymentPayload: { accepted: Record<string, unknown>; payload: Record<string, unknown>; resource?: unknown }; accepted: Record<string, unknown>; record: Record<string, unknown> }>(
      key,
      "POST",
      `/v1/wallets/${walletId}/pay`,
      body,
    );
  const signatureCount = async (key: string, walletId: string) => (await api<{ signatures: unknown[] }>(key, "GET", `/v1/wallets/${walletId}/signatures?limit=200`)).json.signatures.length;

  it("authenticates platforms by API key and the operator by the admin token", async () => {
    const noKey = await api(undefined, "GET", "/v1/wallets");
    expect(noKey.status).toBe(401);
    expect(errorCode(noKey)).toBe("unauthorized");
    expect(noKey.headers.get("www-authenticate")).toMatch(/^Bearer/);
    expect(errorCode(await api("nonsense", "GET", "/v1/wallets"))).toBe("unauthorized");
    const forged = `x402w_${a.apiKeyId}_${"A".repeat(43)}`;
    expect((await api(forged, "GET", "/v1/wallets")).status).toBe(401);
    expect((await api(ADMIN_TOKEN, "GET", "/v1/wallets")).status).toBe(401);
    expect((await api(a.apiKey, "GET", "/v1/admin/platforms")).status).toBe(401);
    expect((await call(w.url, undefined, "GET", "/v1/wallets", undefined, { "x-api-key": a.apiKey })).status).toBe(200);

    // a second key for the platform, then revoked: refused from then on; the first key is unaffected
    const second = await api<{ id: string; key: string }>(ADMIN_TOKEN, "POST", `/v1/admin/platforms/${a.platformId}/api-keys`, { label: "rotation" });
    expect(second.status).toBe(201);
    expect((await api(second.json.key, "GET", "/v1/platform")).json).toMatchObject({ platform: { id: a.platformId, name: "platform-a" }, apiKeyId: second.json.id });
    const revoked = await api<{ revokedAt: string }>(ADMIN_TOKEN, "DELETE", `/v1/admin/platforms/${a.platformId}/api-keys/${second.json.id}`);
    expect(revoked.json.revokedAt).toBeTruthy();
    const after = await api(second.json.key, "GET", "/v1/wallets");
    expect(after.status).toBe(401);
    expect(JSON.stringify(after.json)).toContain("revoked");
    expect((await api(a.apiKey, "GET", "/v1/wallets")).status).toBe(200);
    const keys = await api<{ apiKeys: { id: string; revokedAt: string | null }[] }>(ADMIN_TOKEN, "GET", `/v1/admin/platforms/${a.platformId}/api-keys`);
    // Listings never show a key's secret (the part after the id; base64url may itself contain "_").
    const secret = a.apiKey.slice("x402w_".length + 16 + 1);
    expect(secret).toHaveLength(43);
    expect(JSON.stringify(keys.json)).not.toContain(secret);
    expect(keys.json.apiKeys.find((k) => k.id === second.json.id)?.revokedAt).toBeTruthy();
  });

  it("creates, lists and fetches wallets; policies are normalised, and every change is audited", async () => {
    const agentId = `agent-${randomHex(3)}`;
    const created = await createWallet(w, a.apiKey, {
      label: "research bot",
      agentId,
      policy: { assets: [{ network: "eip155:8453", asset: "usdc", maxPerPayment: "100000", maxPerDay: "500000" }], hosts: ["API.example.com", "*.data.example"], expiresAt: "2999-01-01T00:00:00+02:00" },
    });
    expect(created.id).toMatch(/^wal_[0-9a-f]{24}$/);
    expect(created.address).toMatch(/^0x[0-9a-fA-F]{40}$/);
    expect(created.policy).toEqual({
      assets: [{ network: "eip155:8453", asset: USDC_BASE, symbol: "USDC", maxPerPayment: "100000", maxPerDay: "500000" }],
      hosts: ["api.example.com", "*.data.example"],
      expiresAt: "2998-12-31T22:00:00.000Z",
    });
    const second = await createWallet(w, a.apiKey, { agentId });
    expect(second.policy).toEqual({ assets: [] }); // deny by default
    expect(second.address).not.toBe(created.address);

    expect((await api<WalletView>(a.apiKey, "GET", `/v1/wallets/${created.id}`)).json).toMatchObject({ id: created.id, address: created.address, label: "research bot", agentId });
    const page1 = await api<{ wallets: WalletView[]; next: string | null }>(a.apiKey, "GET", `/v1/wallets?agentId=${agentId}&limit=1`);
    expect(page1.json.wallets.map((x) => x.id)).toEqual([created.id]);
    const page2 = await api<{ wallets: WalletView[]; next: string | null }>(a.apiKey, "GET", `/v1/wallets?agentId=${agentId}&limit=1&cursor=${page1.json.next}`);
    expect(page2.json.wallets.map((x) => x.id)).toEqual([second.id]);

    const bad = await api(a.apiKey, "PUT", `/v1/wallets/${created.id}/policy`, { assets: [{ network: "eip155:8453", asset: "DOGE" }] });
    expect(bad.status).toBe(400);
    expect(errorCode(bad)).toBe("invalid_policy");
    expect(errorCode(await api(a.apiKey, "PUT", `/v1/wallets/${created.id}/policy`, { assets: [], maxPerPayment: "1" }))).toBe("invalid_policy");
    expect(errorCode(await api(a.apiKey, "PUT", `/v1/wallets/${created.id}/policy`, { assets: [{ network: "eip155:8453", asset: "USDC", maxPerPayment: "1.5" }] }))).toBe("invalid_policy");
    expect(errorCode(await api(a.apiKey, "POST", "/v1/wallets", { policy: { assets: "all" } }))).toBe("invalid_policy");

    const put = await api<{ version: number; policy: unknown }>(a.apiKey, "PUT", `/v1/wallets/${created.id}/policy`, { assets: [{ network: "eip155:8453", asset: USDC_BASE.toLowerCase(), maxPerPayment: "5" }], payTo: [RECEIVER.toLowerCase()] });
    expect(put.status).toBe(200);
    expect(put.json.version).toBe(2);
    expect(put.json.policy).toEqual({ assets: [{ network: "eip155:8453", asset: USDC_BASE, symbol: "USDC", maxPerPayment: "5" }], payTo: [RECEIVER] });
    const history = await api<{ changes: { version: number; apiKeyId: string; previous: unknown; policy: unknown; changedAt: string }[] }>(a.apiKey, "GET", `/v1/wallets/${created.id}/policy/history`);
    expect(history.json.changes.map((c) => c.version)).toEqual([2, 1]);
    expect(history.json.changes[0]).toMatchObject({ apiKeyId: a.apiKeyId, previous: created.policy, policy: put.json.policy });
    expect(history.json.changes[1]).toMatchObject({ previous: null, policy: created.policy });
  });

  it("signs exact (EIP-3009 and Permit2) and upto as the wallet, returns the PAYMENT-SIGNATURE value, and records every signature", async () => {
    const wallet = await createWallet(w, a.apiKey, {
      policy: { assets: [{ network: "eip155:8453", asset: "USDC" }, { network: "eip155:56", asset: "USDT" }] },
    });
    const cases = [
      { accepts: [exact3009()], method: "eip3009", scheme: "exact" },
      { accepts: [exactPermit2Bsc()], method: "permit2", scheme: "exact" },
      { accepts: [upto()], method: "permit2", scheme: "upto" },
    ];
    for (const c of cases) {
      const required = paymentRequired({ accepts: c.accepts });
      // the decoded PaymentRequired and the header value are both accepted
      for (const body of [{ paymentRequired: required }, { paymentRequiredHeader: encodePaymentRequiredHeader(required as never) }]) {
        const r = await pay(a.apiKey, wallet.id, body);
        expect(r.status, JSON.stringify(r.json)).toBe(200);
        expect(await signerOfPayment(r.json.paymentSignature)).toBe(wallet.address);
        const decoded = decodePaymentSignatureHeader(r.json.paymentSignature);
        expect(decoded).toEqual(r.json.paymentPayload);
        expect(decoded.x402Version).toBe(2);
        expect(decoded.accepted).toEqual(c.accepts[0]); // echoed unchanged
        expect(decoded.resource).toEqual(required.resource);
        expect(r.json.record).toMatchObject({ kind: "payment", scheme: c.scheme, method: c.method, amount: c.accepts[0]!.amount, payTo: RECEIVER, resource: required.resource.url, apiKeyId: a.apiKeyId });
      }
    }
    const upToPayload = decodePaymentSignatureHeader((await pay(a.apiKey, wallet.id, { paymentRequired: paymentRequired({ accepts: [upto()] }) })).json.paymentSignature);
    expect((upToPayload.payload as { permit2Authorization: { witness: { facilitator: string } } }).permit2Authorization.witness.facilitator).toBe(FACILITATOR);

    const list = await api<{ signatures: { id: string; scheme: string; createdAt: string; signatureHash: string }[] }>(a.apiKey, "GET", `/v1/wallets/${wallet.id}/signatures`);
    expect(list.json.signatures).toHaveLength(7);
    expect(list.json.signatures[0]!.scheme).toBe("upto"); // newest first
    expect(list.json.signatures.every((s) => /^0x[0-9a-f]{64}$/.test(s.signatureHash))).toBe(true);

    // an authorisation is valid for at most maxAuthorizationSeconds (1 h), whatever the server asks
    const long = await pay(a.apiKey, wallet.id, { paymentRequired: paymentRequired({ accepts: [exact3009("1", { maxTimeoutSeconds: 86_400 * 30 })] }) });
    const validBefore = Number((decodePaymentSignatureHeader(long.json.paymentSignature).payload as { authorization: { validBefore: string } }).authorization.validBefore);
    expect(validBefore).toBeLessThanOrEqual(Math.floor(Date.now() / 1000) + 3600 + 5);
    expect(long.json.paymentPayload.accepted.maxTimeoutSeconds).toBe(86_400 * 30);

    // several requirements: the first one the policy allows is chosen
    const mixed = await pay(a.apiKey, wallet.id, { paymentRequired: paymentRequired({ accepts: [{ ...exact3009(), network: "eip155:137", asset: "0x3c499c542cEF5E3811e1192ce70d8cC03d5c3359" }, exactPermit2Bsc("7")] }) });
    expect(mixed.status).toBe(200);
    expect(mixed.json.accepted).toMatchObject({ network: "eip155:56", amount: "7" });
  });

  it("refuses what the policy forbids, with a clear code, and signs nothing", async () => {
    const wallet = await createWallet(w, a.apiKey, {
      policy: {
        assets: [{ network: "eip155:8453", asset: "USDC", maxPerPayment: "20000", maxPerDay: "30000" }],
        hosts: ["api.example.com", "*.trusted.example"],
        payTo: [RECEIVER],
      },
    });
    const refused = async (body: unknown, code: string, status = 403) => {
      const before = await signatureCount(a.apiKey, wallet.id);
      const r = await pay(a.apiKey, wallet.id, body);
      expect(r.status, JSON.stringify(r.json)).toBe(status);
      expect(errorCode(r), JSON.stringify(r.json)).toBe(code);
      expect(r.json).not.toHaveProperty("paymentSignature");
      expect(await signatureCount(a.apiKey, wallet.id)).toBe(before);
      return (r.json as unknown as { error: string }).error;
    };
    expect(await refused({ paymentRequired: paymentRequired({ amount: "20001" }) }, "amount_over_cap")).toContain("exceeds the cap of 20000 per payment");
    expect((await pay(a.apiKey, wallet.id, { paymentRequired: paymentRequired({ amount: "20000" }) })).status).toBe(200);
    expect((await pay(a.apiKey, wallet.id, { paymentRequired: paymentRequired({ amount: "10000", url: "https://x.trusted.example/a" }) })).status).toBe(200);
    expect(await refused({ paymentRequired: paymentRequired({ amount: "1" }) }, "daily_cap_exceeded")).toContain("30000 signed in the last 24 hours");
    await api(a.apiKey, "PUT", `/v1/wallets/${wallet.id}/policy`, { assets: [{ network: "eip155:8453", asset: "USDC", maxPerPayment: "20000" }], hosts: ["api.example.com", "*.trusted.example"], payTo: [RECEIVER] });
    expect(await refused({ paymentRequired: paymentRequired({ url: "https://evil.example/pay" }) }, "host_not_allowed")).toContain("evil.example");
    expect(await refused({ paymentRequired: paymentRequired({ url: "https://trusted.example/x" }) }, "host_not_allowed")).toContain("trusted.example");
    await refused({ paymentRequired: paymentRequired(), url: "https://elsewhere.example/weather" }, "host_not_allowed"); // the URL requested counts too
    await refused({ paymentRequired: { ...paymentRequired(), resource: undefined } }, "host_not_allowed");
    await refused({ paymentRequired: paymentRequired({ payTo: "0x90F79bf6EB2c4f870365E785982E1f101E93b906" }) }, "payto_not_allowed");
    await refused({ paymentRequired: paymentRequired({ accepts: [exactPermit2Bsc()] }) }, "network_not_allowed");
    await refused({ paymentRequired: paymentRequired({ accepts: [exact3009("1", { asset: "0x0000000000000000000000000000000000000bad" })] }) }, "asset_not_allowed");
    await refused({ paymentRequired: paymentRequired({ accepts: [{ ...exact3009(), scheme: "batch-settlement" }] }) }, "unsupported_requirement", 422);
    await refused({ paymentRequired: paymentRequired({ accepts: [{ ...upto(), extra: {} }] }) }, "unsupported_requirement", 422);
    // the most specific refusal is reported when several requirements are refused
    const several = await refused({ paymentRequired: paymentRequired({ accepts: [exactPermit2Bsc(), exact3009("999999")] }) }, "amount_over_cap");
    expect(several).toContain("other requirements: exact@eip155:56: network_not_allowed");

    await api(a.apiKey, "PUT", `/v1/wallets/${wallet.id}/policy`, { assets: [{ network: "eip155:8453", asset: "USDC" }], schemes: ["exact"] });
    await refused({ paymentRequired: paymentRequired({ accepts: [upto()] }) }, "scheme_not_allowed");
    await api(a.apiKey, "PUT", `/v1/wallets/${wallet.id}/policy`, { assets: [{ network: "eip155:8453", asset: "USDC" }], expiresAt: new Date(Date.now() - 1000).toISOString() });
    expect(await refused({ paymentRequired: paymentRequired() }, "policy_expired")).toContain("expired at");
    await api(a.apiKey, "PUT", `/v1/wallets/${wallet.id}/policy`, { assets: [{ network: "eip155:8453", asset: "USDC" }], networks: ["eip155:56"] });
    await refused({ paymentRequired: paymentRequired() }, "network_not_allowed");

    const empty = await createWallet(w, a.apiKey);
    const r = await pay(a.apiKey, empty.id, { paymentRequired: paymentRequired() });
    expect(errorCode(r)).toBe("network_not_allowed");
    expect(await signatureCount(a.apiKey, empty.id)).toBe(0);

    const metrics = await (await fetch(`${w.adminUrl}/metrics`)).text();
    expect(metrics).toMatch(/x402_wallet_payments_total\{[^}]*result="refused"[^}]*reason="daily_cap_exceeded"[^}]*\} 1/);
  });

  it("holds the daily cap under concurrent payments", async () => {
    const wallet = await createWallet(w, a.apiKey, { policy: { assets: [{ network: "eip155:8453", asset: "USDC", maxPerDay: "50000" }] } });
    const results = await Promise.all(Array.from({ length: 10 }, () => pay(a.apiKey, wallet.id, { paymentRequired: paymentRequired({ amount: "10000" }) })));
    expect(results.filter((r) => r.status === 200)).toHaveLength(5);
    expect(results.filter((r) => errorCode(r) === "daily_cap_exceeded")).toHaveLength(5);
    expect(await signatureCount(a.apiKey, wallet.id)).toBe(5);
  });

  it("one platform cannot see or touch another's wallet", async () => {
    const wallet = await createWallet(w, a.apiKey, { label: "a's", policy: { assets: [{ network: "eip155:8453", asset: "USDC" }] } });
    const unknown = `wal_${"0".repeat(24)}`;
    const attempts: [string, string, unknown?][] = [
      ["GET", ""],
      ["GET", "/policy"],
      ["PUT", "/policy", { assets: [{ network: "eip155:8453", asset: "USDC" }], payTo: [RECEIVER] }],
      ["GET", "/policy/history"],
      ["POST", "/pay", { paymentRequired: paymentRequired() }],
      ["POST", "/fetch", { url: "https://api.example.com/weather" }],
      ["GET", "/signatures"],
      ["GET", "/balances"],
      ["POST", "/permit2-approval", { network: "eip155:8453", asset: "USDC" }],
    ];
    for (const [method, suffix, body] of attempts) {
      const theirs = await api(b.apiKey, method, `/v1/wallets/${wallet.id}${suffix}`, body);
      const nobodys = await api(b.apiKey, method, `/v1/wallets/${unknown}${suffix}`, body);
      expect(theirs.status, `${method} ${suffix}`).toBe(404);
      expect(errorCode(theirs)).toBe("not_found");
      expect(JSON.stringify(theirs.json).replace(wallet.id, "ID")).toBe(JSON.stringify(nobodys.json).replace(unknown, "ID")); // indistinguishable
    }
    const listed = await api<{ wallets: WalletView[] }>(b.apiKey, "GET", "/v1/wallets?limit=200");
    expect(listed.json.wallets.map((x) => x.id)).not.toContain(wallet.id);
    const mine = await api<WalletView>(a.apiKey, "GET", `/v1/wallets/${wallet.id}`);
    expect(mine.json).toMatchObject({ policyVersion: 1, label: "a's" });
    expect(await signatureCount(a.apiKey, wallet.id)).toBe(0);
  });

  it("answers bad input with clear codes, never a 500", async () => {
    const wallet = await createWallet(w, a.apiKey, { policy: { assets: [{ network: "eip155:8453", asset: "USDC" }] } });
    const p = `/v1/wallets/${wallet.id}`;
    const expectCode = async (r: Promise<{ status: number; json: unknown }>, status: number, code: string) => {
      const got = await r;
      expect(got.status, JSON.stringify(got.json)).toBe(status);
      expect((got.json as { error: string }).error.split(":")[0]).toBe(code);
    };
    await expectCode(call(w.url, a.apiKey, "POST", `${p}/pay`, "{not json"), 400, "invalid_json");
    await expectCode(api(a.apiKey, "POST", `${p}/pay`, {}), 400, "invalid_request");
    await expectCode(api(a.apiKey, "POST", `${p}/pay`, { paymentRequired: paymentRequired(), paymentRequiredHeader: "eyJ9" }), 400, "invalid_request");
    await expectCode(api(a.apiKey, "POST", `${p}/pay`, { paymentRequiredHeader: "!!!not base64!!!" }), 400, "invalid_payment_required");
    await expectCode(api(a.apiKey, "POST", `${p}/pay`, { paymentRequiredHeader: Buffer.from("[1,2]").toString("base64") }), 400, "invalid_payment_required");
    await expectCode(api(a.apiKey, "POST", `${p}/pay`, { paymentRequired: { ...paymentRequired(), x402Version: 1 } }), 400, "unsupported_version");
    await expectCode(api(a.apiKey, "POST", `${p}/pay`, { paymentRequired: { ...paymentRequired(), accepts: [] } }), 400, "invalid_payment_required");
    await expectCode(api(a.apiKey, "POST", `${p}/pay`, { paymentRequired: paymentRequired({ accepts: [exact3009("-5")] }) }), 422, "unsupported_requirement");
    await expectCode(api(a.apiKey, "POST", `${p}/pay`, { paymentRequired: paymentRequired({ accepts: [exact3009("1", { payTo: "nobody" })] }) }), 422, "unsupported_requirement");
    await expectCode(api(a.apiKey, "POST", `${p}/pay`, { paymentRequired: paymentRequired(), url: "ftp://x" }), 400, "invalid_request");
    await expectCode(api(a.apiKey, "POST", `${p}/fetch`, { url: "file:///etc/passwd" }), 400, "invalid_request");
    await expectCode(api(a.apiKey, "POST", `${p}/fetch`, { url: "http://127.0.0.1:9/x" }), 403, "destination_not_allowed");
    await expectCode(api(a.apiKey, "POST", `${p}/fetch`, { url: "http://[::1]:9/x" }), 403, "destination_not_allowed");
    await expectCode(api(a.apiKey, "POST", `${p}/fetch`, { url: "http://localhost:9/x" }), 403, "destination_not_allowed");
    await expectCode(api(a.apiKey, "POST", `${p}/fetch`, { url: "https://api.example.com/", headers: { "payment-signature": "x" } }), 400, "invalid_request");
    await expectCode(api(a.apiKey, "GET", `${p}/balances`), 422, "network_not_configured");
    await expectCode(api(a.apiKey, "GET", `${p}/balances?network=base`), 400, "invalid_request");
    await expectCode(api(a.apiKey, "POST", `${p}/permit2-approval`, { network: "eip155:8453", asset: "USDC" }), 422, "network_not_configured");
    await expectCode(api(a.apiKey, "GET", "/v1/wallets?limit=0"), 400, "invalid_request");
    await expectCode(api(a.apiKey, "GET", "/v1/wallets?limit=201"), 400, "invalid_request");
    await expectCode(api(a.apiKey, "GET", "/v1/wallets?color=red"), 400, "invalid_request");
    await expectCode(api(a.apiKey, "GET", "/v1/wallets/not-an-id"), 404, "not_found");
    await expectCode(api(a.apiKey, "GET", "/v1/nothing"), 404, "not_found");
    await expectCode(api(a.apiKey, "DELETE", p), 405, "method_not_allowed");
    await expectCode(api(a.apiKey, "GET", `${p}/pay`), 405, "method_not_allowed");
    await expectCode(api(a.apiKey, "POST", "/v1/wallets", { label: "x".repeat(500) }), 400, "invalid_request");
    await expectCode(api(a.apiKey, "POST", "/v1/wallets", { label: "a\u0000b" }), 400, "invalid_request");
    await expectCode(api(ADMIN_TOKEN, "POST", "/v1/admin/platforms", { name: "" }), 400, "invalid_request");
    await expectCode(api(ADMIN_TOKEN, "POST", "/v1/admin/platforms/plt_0000000000000000/api-keys", {}), 404, "not_found");
    await expectCode(call(w.url, a.apiKey, "POST", `${p}/pay`, JSON.stringify({ paymentRequired: paymentRequired(), pad: "x".repeat(3 * 1024 * 1024) })), 413, "payload_too_large");

    // anything at all in a body: a 4xx, never a 5xx
    const shapes: unknown[] = [null, 0, "s", [], [1], true, { paymentRequired: null }, { paymentRequired: { x402Version: 2, accepts: [{}] } }, { paymentRequired: { x402Version: 2, accepts: [exact3009("1", { maxTimeoutSeconds: -1 })] } }, { paymentRequired: { x402Version: 2, accepts: [exact3009("1", { extra: "x" })] } }, { paymentRequired: { x402Version: 2, accepts: [exact3009(`1${"0".repeat(90)}`)] } }, { paymentRequired: { x402Version: 2, accepts: [exact3009("1", { network: "eip155:0" })] } }, { paymentRequired: { x402Version: 2, accepts: [exact3009("1", { network: "solana:mainnet" })] } }, { url: 5 }, { assets: [{}] }, { network: "eip155:8453", asset: "0x" }];
    for (const body of shapes) {
      for (const path of [`${p}/pay`, `${p}/fetch`, `${p}/permit2-approval`, "/v1/wallets"]) {
        const r = await api(a.apiKey, "POST", path, body);
        expect(r.status, `${path} ${JSON.stringify(body)} → ${JSON.stringify(r.json)}`).toBeGreaterThanOrEqual(400);
        expect(r.status, `${path} ${JSON.stringify(body)} → ${JSON.stringify(r.json)}`).toBeLessThan(500);
        expect(typeof (r.json as { error?: unknown }).error).toBe("string");
      }
      const put = await api(a.apiKey, "PUT", `${p}/policy`, body);
      expect(put.status).toBeLessThan(500);
    }
    expect(await signatureCount(a.apiKey, wallet.id)).toBe(0);
  });
});

describe("the outbound guard of /fetch", () => {
  it("classifies addresses and refuses names that resolve to non-public ones", async () => {
    for (const a of ["127.0.0.1", "10.1.2.3", "172.20.0.1", "192.168.1.1", "169.254.169.254", "100.64.1.1", "0.0.0.0", "::1", "fe80::1", "fd00::1", "::ffff:127.0.0.1"]) expect(isPrivateAddress(a), a).toBe(true);
    for (const a of ["8.8.8.8", "1.1.1.1", "2606:4700::1111"]) expect(isPrivateAddress(a), a).toBe(false);
    const code = await new Promise<string | undefined>((resolve) => guardedLookup("localhost", { all: true }, (err) => resolve(err?.code)));
    expect(code).toBe("X402_DESTINATION_NOT_ALLOWED");
  });
});
