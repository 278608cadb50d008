// Settlement webhooks (docs/facilitator-interface.md, "Webhooks"), judged on chain: a receiver that
// is down for 30 s, then hangs, then answers, gets every event of real settlements on the devnet
// afterwards, each exactly in order per payment, each verifiable by its signature; a hanging
// receiver never holds up /settle; the documented verification refuses forged, tampered, stale and
// replayed deliveries. On the embedded engine, and on PostgreSQL when DATABASE_URL is set.
import { createServer, type IncomingHttpHeaders, type ServerResponse } from "node:http";
import { randomBytes } from "node:crypto";
import { writeFile } from "node:fs/promises";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { erc20Abi, parseEventLogs, parseGwei, type Address, type Hex } from "viem";
import { privateKeyToAccount } from "viem/accounts";
import { freePort } from "../services/devnet/anvil.ts";
import { createReplayGuard, signWebhook, tenantWebhookKey, verifyWebhook, webhookHeaders, webhookUrlProblem, type SettlementEvent } from "../services/x402/webhooks.ts";
import { ENGINES, startRig, type Rig } from "./helpers/settlement-rig.ts";
import { balanceOf } from "./helpers/chain.ts";
import { metricSum, nonceOf, publicClient, transferToken } from "./helpers/onchain.ts";
import { postJson } from "./helpers/payments.ts";
import { startRouterService } from "../services/router/service.ts";
import type { RoutingTable } from "../services/router/routing-table.ts";
import { pino } from "pino";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { generatePrivateKey } from "viem/accounts";
import { facilitatorConfigFromEnv, resolveFacilitatorConfig } from "../services/facilitator/config.ts";
import { acceptTenantWebhook, facilitatorWebhookKey, retryDelayMs } from "../services/facilitator/settlement/webhooks.ts";
import { SETTLEMENT_MIGRATIONS, createSettlementStore } from "../services/facilitator/settlement/store.ts";
import { openDatabase } from "../services/platform/storage.ts";
import { DATABASE_URL } from "./helpers/settlement-rig.ts";
import { runApiKeyCommand } from "../services/tenants/api-key-command.ts";
import { until } from "./helpers/cluster.ts";

const DOWN_MS = 30_000;
const sink = privateKeyToAccount("0x1111111111111111111111111111111111111111111111111111111111111111").address;

interface Request {
  body: string;
  headers: IncomingHttpHeaders;
  event: { paymentId: string; sequence: number };
  /** The highest sequence of this payment the receiver had accepted when this request arrived. */
  acceptedBefore: number;
  status?: number;
}

/** A webhook receiver on a fixed port: down (nothing listens), hanging (never answers), or verifying and answering. */
function receiver(port: number, secret: string) {
  let mode: "hang" | "ok" = "hang";
  const requests: Request[] = [];
  const accepted: { event: SettlementEvent; body: string; headers: IncomingHttpHeaders }[] = [];
  const hung = new Set<ServerResponse>();
  const replay = createReplayGuard();
  let duplicates = 0;
  const highest = (paymentId: string) => Math.max(0, ...accepted.filter((a) => a.event.paymentId === paymentId).map((a) => a.event.sequence));
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      const body = Buffer.concat(chunks).toString("utf8");
      const event = JSON.parse(body) as SettlementEvent;
      const r: Request = { body, headers: req.headers, event, acceptedBefore: highest(event.paymentId) };
      requests.push(r);
      if (mode === "hang") return void hung.add(res);
      const v = verifyWebhook({ body, headers: req.headers, secret, replay });
      // A replay of an event handled before is answered 2xx, not handled again (the sender lost our answer).
      if (v.ok) {
        accepted.push({ event: v.event, body, headers: req.headers });
        v.handled();
      }
      else if (v.reason === "replayed") duplicates++;
      r.status = v.ok || v.reason === "replayed" ? 200 : 400;
      res.writeHead(r.status).end();
    });
  });
  return {
    requests,
    accepted,
    hung,
    duplicates: () => duplicates,
    up: () => new Promise<void>((resolve) => server.listen(port, "127.0.0.1", resolve)),
    answer() {
      mode = "ok";
      for (const res of hung) res.destroy(); // the hung deliveries fail now instead of at their timeout
      hung.clear();
    },
    close: () => new Promise<void>((resolve) => {
      for (const res of hung) res.destroy();
      server.closeAllConnections();
      server.close(() => resolve());
    }),
  };
}

describe("verifyWebhook", () => {
  const secret = "s".repeat(40);
  const body = JSON.stringify({ id: "evt-1", type: "confirmed", sequence: 2 });
  const now = 1_800_000_000_000;
  const headers = webhookHeaders(secret, "evt-1", body, now);

  it("accepts a delivery signed with the key over this body and timestamp, once", () => {
    const replay = createReplayGuard();
    const first = verifyWebhook({ body, headers, secret, now, replay });
    expect(first).toMatchObject({ ok: true, event: { id: "evt-1" } });
    // Not handled yet (the receiver failed and answered 500): the sender's retry is accepted, not a replay.
    const retried = verifyWebhook({ body, headers, secret, now: now + 500, replay });
    expect(retried.ok).toBe(true);
    if (retried.ok) retried.handled();
    expect(verifyWebhook({ body, headers, secret, now: now + 1000, replay })).toEqual({ ok: false, reason: "replayed" });
    // Headers as fetch's Headers, bytes as the body, and a key list (rotation) work alike.
    expect(verifyWebhook({ body: Buffer.from(body), headers: new Headers(headers), secret: ["other".repeat(8), secret], now }).ok).toBe(true);
  });

  it("refuses a forged key, a tampered body, a stale or future timestamp, missing headers, another event's body", () => {
    expect(verifyWebhook({ body, headers, secret: "f".repeat(40), now })).toEqual({ ok: false, reason: "bad_signature" });
    expect(verifyWebhook({ body: body.replace('"sequence":2', '"sequence":3'), headers, secret, now })).toEqual({ ok: false, reason: "bad_signature" });
    expect(verifyWebhook({ body, headers, secret, now: now + 301_000 })).toEqual({ ok: false, reason: "stale_timestamp" });
    expect(verifyWebhook({ body, headers, secret, now: now - 301_000 })).toEqual({ ok: false, reason: "stale_timestamp" });
    // A fresh timestamp on a captured signature does not pass: the timestamp is signed.
    expect(verifyWebhook({ body, headers: { ...headers, "x402-webhook-timestamp": String(now / 1000 + 60) }, secret, now })).toEqual({ ok: false, reason: "bad_signature" });
    expect(verifyWebhook({ body, headers: { "x402-webhook-id": "evt-1" }, secret, now })).toEqual({ ok: false, reason: "missing_headers" });
    const other = JSON.stringify({ id: "evt-2" });
    expect(verifyWebhook({ body: other, headers: { ...headers, "x402-webhook-signature": signWebhook(secret, now / 1000, other) }, secret, now })).toEqual({ ok: false, reason: "invalid_body" });
    // Anyone may send anything: a signature of the right length in characters but not in bytes (a
    // header's bytes arrive as Latin-1) is refused, never thrown (it crashed a receiver).
    for (const odd of [`v1=${"a".repeat(63)}\u00e9`, `v1=${"A".repeat(64)}`, "v1=", `v1=${"a".repeat(64)}, v1=\u00e9\u00e9`]) {
      expect(verifyWebhook({ body, headers: { ...headers, "x402-webhook-signature": odd }, secret, now }), odd).toEqual({ ok: false, reason: "bad_signature" });
    }
    // An empty key would accept whatever anyone signs with it: refused as misconfiguration.
    const signedWithNothing = { ...headers, "x402-webhook-signature": signWebhook("", now / 1000, body) };
    expect(() => verifyWebhook({ body, headers: signedWithNothing, secret: "", now })).toThrow(/empty webhook key/);
    expect(() => verifyWebhook({ body, headers: signedWithNothing, secret: [secret, ""], now })).toThrow(/empty webhook key/);
    expect(() => verifyWebhook({ body, headers: signedWithNothing, secret: [], now })).toThrow(/empty webhook key/);
  });

  it("a tenant's key is derived from the fleet secret and the API key id, and differs per tenant", () => {
    expect(tenantWebhookKey(secret, "0123456789abcdef")).toMatch(/^[0-9a-f]{64}$/);
    expect(tenantWebhookKey(secret, "0123456789abcdef")).not.toBe(tenantWebhookKey(secret, "0123456789abcdee"));
  });
});

describe("webhook configuration", () => {
  const dir = mkdtempSync(join(tmpdir(), "x402-webhook-config-"));
  const good = join(dir, "good.secret");
  const short = join(dir, "short.secret");
  writeFileSync(good, "g".repeat(40) + "\n");
  writeFileSync(short, "tooshort\n");
  const base = { network: "eip155:8453", rpcUrls: ["http://127.0.0.1:8545"], signerKeys: [generatePrivateKey()] };
  const resolve = (extra: Record<string, unknown>) => resolveFacilitatorConfig({ ...base, ...extra });

  it("a webhook URL is printable ASCII (it travels in a header): a newline or non-ASCII is refused, not a broken settle", () => {
    for (const url of ["https://hooks.example.com/x402\n", "https://hooks.example.com/\u00e9v\u00e8nements/\u4e2d", "https://hooks.example.com/a b"]) {
      expect(webhookUrlProblem(url, { allowPrivateNetworks: false }), JSON.stringify(url)).toMatch(/percent-encode/);
    }
    expect(webhookUrlProblem("https://hooks.example.com/%C3%A9v?token=abc", { allowPrivateNetworks: false })).toBeUndefined();
  });

  it("is off without a secret; a URL needs the secret, passes the URL rules, and is never echoed", () => {
    expect(resolve({}).webhooks).toBeUndefined();
    expect(() => resolve({ webhookUrl: "https://hooks.example.com/x?token=s3cret" })).toThrow(/needs webhookSecretFile/);
    expect(() => resolve({ webhookUrl: "http://hooks.example.com/x?token=s3cret", webhookSecretFile: good })).toThrow(/not an https URL/);
    expect(() => resolve({ webhookUrl: "https://u:p@hooks.example.com/", webhookSecretFile: good })).toThrow(/credentials/);
    expect(() => resolve({ webhookSecretFile: short })).toThrow(/fewer than 32 characters/);
    for (const bad of [{ webhookUrl: "http://hooks.example.com/x?token=s3cret", webhookSecretFile: good }, { webhookUrl: "https://u:s3cret@hooks.example.com/", webhookSecretFile: good }]) {
      expect(() => resolve(bad)).toThrow(expect.objectContaining({ message: expect.not.stringContaining("s3cret") }));
    }
    expect(resolve({ webhookUrl: "https://hooks.example.com/x", webhookSecretFile: good }).webhooks).toMatchObject({ url: "https://hooks.example.com/x", secret: "g".repeat(40), allowPrivateNetworks: false, tenantAllowPrivateNetworks: false, maxAttempts: 40, giveUpAfterMs: 86_400_000 });
    // http (an in-cluster receiver, tests) only where private networks are allowed.
    const env = facilitatorConfigFromEnv({ X402_WEBHOOK_URL: "http://receiver.default.svc/x", X402_WEBHOOK_SECRET_FILE: good, X402_WEBHOOK_ALLOW_PRIVATE_NETWORKS: "true", X402_WEBHOOK_MAX_ATTEMPTS: "5" });
    expect(resolveFacilitatorConfig(base, env).webhooks).toMatchObject({ url: "http://receiver.default.svc/x", allowPrivateNetworks: true, tenantAllowPrivateNetworks: false, maxAttempts: 5 });
    // Tenants' URLs on private addresses: a setting of their own (tests, devnets), never the operator's.
    expect(resolveFacilitatorConfig(base, facilitatorConfigFromEnv({ X402_WEBHOOK_SECRET_FILE: good, X402_WEBHOOK_TENANT_ALLOW_PRIVATE_NETWORKS: "true" })).webhooks).toMatchObject({ allowPrivateNetworks: false, tenantAllowPrivateNetworks: true });
  });

  it("retries back off exponentially from the base to the largest delay, jittered by at most a half", () => {
    const bounds = { retryBaseMs: 1000, retryMaxMs: 3_600_000 };
    for (let attempts = 1; attempts <= 60; attempts++) {
      const full = Math.min(bounds.retryMaxMs, bounds.retryBaseMs * 2 ** (attempts - 1));
      const delay = retryDelayMs(attempts, bounds);
      expect(delay).toBeGreaterThanOrEqual(full / 2);
      expect(delay).toBeLessThanOrEqual(full);
    }
  });

  it("a tenant's URL is kept only where the facilitator can sign and would send to it", () => {
    const hooks = resolve({ webhookSecretFile: good }).webhooks!;
    expect(acceptTenantWebhook(undefined, "https://t.example.com/")).toBeUndefined();
    expect(acceptTenantWebhook(hooks, "https://t.example.com/x?k=1")).toBe("https://t.example.com/x?k=1");
    expect(acceptTenantWebhook(hooks, "http://127.0.0.1/")).toBeUndefined();
    expect(acceptTenantWebhook({ ...hooks, allowPrivateNetworks: true }, "http://127.0.0.1/")).toBeUndefined(); // the operator's setting, not tenants'
    expect(acceptTenantWebhook({ ...hooks, tenantAllowPrivateNetworks: true }, "http://127.0.0.1/")).toBe("http://127.0.0.1/");
    expect(acceptTenantWebhook(hooks, "not a url")).toBeUndefined();
  });
});

describe.each(ENGINES)("settlement events in the store on the %s engine", (engine) => {
  it("every state change after claimed is one event, numbered per payment, with a delivery per receiver: submitted, confirmed, reorged, failed; none without a receiver", async () => {
    const db = await openDatabase({ url: engine === "postgres" ? DATABASE_URL : undefined, migrations: SETTLEMENT_MIGRATIONS });
    // A network of its own: rows other runs left in a shared PostgreSQL never meet these.
    const network = `eip155:${900_000_000 + Math.floor(Math.random() * 99_999_999)}`;
    const store = createSettlementStore(db, network);
    const signer = privateKeyToAccount(generatePrivateKey()).address;
    try {
      const terms = { token: "0xt", payTo: "0xp", amount: "5", tenant: "0123456789abcdef", webhookUrl: "https://t.example.com/h", webhookFacilitator: true };
      await store.claim("watched", "d", "exact", "0xpayer", {}, "run", 30_000, terms);
      await store.claim("quiet", "d", "exact", "0xpayer", {}, "run", 30_000, {});
      const send = (paymentId: string, hash: Hex) =>
        store.allocateAndStore({ paymentId, claimOwner: "run", signer, to: signer, data: "0x", gas: 1n, maxFeePerGas: 1n, maxPriorityFeePerGas: 1n, kind: "eip3009_transfer" }, async () => 0, async () => ({ raw: "0x01", hash }));
      const tx = await send("watched", `0x${"a".repeat(64)}`);
      const quiet = await send("quiet", `0x${"b".repeat(64)}`);
      await store.recordMined("watched", tx.id, tx.hash, true, 1n, { blockNumber: 5n, blockHash: "0xb5" });
      await store.recordMined("quiet", quiet.id, quiet.hash, true, 1n, { blockNumber: 5n, blockHash: "0xb5" });
      await store.reorged(tx.id, "0xb5"); // its block left the chain: back in flight
      await store.recordMined("watched", tx.id, tx.hash, false, 1n, { blockNumber: 6n, blockHash: "0xb6" }); // mined again, reverted
      const events = await db.query<{ payment_id: string; sequence: number; type: string; body: SettlementEvent }>(`SELECT payment_id, sequence, type, body FROM settlement_events WHERE network = $1 ORDER BY id`, [network]);
      expect(events.map((e) => [e.payment_id, e.sequence, e.type, e.body.status, e.body.transaction])).toEqual([
        ["watched", 1, "submitted", "pending", tx.hash],
        ["watched", 2, "confirmed", "settled", tx.hash],
        ["watched", 3, "reorged", "pending", tx.hash],
        ["watched", 4, "failed", "failed", tx.hash],
      ]);
      expect(events[3]!.body).toMatchObject({ network, paymentId: "watched", tenant: terms.tenant, payTo: "0xp", token: "0xt", amount: "5", errorReason: "invalid_transaction_state" });
      const deliveries = await db.query<{ sequence: number; target: string; state: string }>(`SELECT sequence, target, state FROM settlement_webhook_deliveries WHERE network = $1 ORDER BY sequence, target`, [network]);
      expect(deliveries.map((d) => [d.sequence, d.target, d.state])).toEqual([1, 2, 3, 4].flatMap((n) => [[n, "facilitator", "pending"], [n, "tenant", "pending"]]));
    } finally {
      await db.query(`DELETE FROM settlement_events WHERE network = $1`, [network]);
      await db.query(`DELETE FROM settlement_outbox WHERE network = $1`, [network]);
      await db.query(`DELETE FROM settlement_payments WHERE network = $1`, [network]);
      await db.query(`DELETE FROM settlement_nonces WHERE network = $1`, [network]);
      await db.close();
    }
  });
});

describe.each(ENGINES)("settlement webhooks on the %s engine", (engine) => {
  let rig: Rig;
  let hook: ReturnType<typeof receiver>;
  const secret = randomBytes(32).toString("hex");

  beforeAll(async () => {
    rig = await startRig({ engine });
    await writeFile(join(rig.dir, "webhook.secret"), secret + "\n");
  });
  afterAll(async () => {
    await hook?.close();
    await rig?.stop();
  });

  it("a receiver down for 30 s, then hanging, gets every event afterwards, in order, signed; /settle never waits on it; judged on chain", async () => {
    const port = await freePort();
    // The facilitator's own receiver verifies with the key derived for it, not the fleet secret.
    const key = facilitatorWebhookKey(secret);
    hook = receiver(port, key);
    const f = await rig.facilitator({
      // The URL carries a token: the sender logs only its origin.
      webhookUrl: `http://127.0.0.1:${port}/x402/events?token=${randomBytes(8).toString("hex")}`,
      webhookSecretFile: join(rig.dir, "webhook.secret"),
      webhookAllowPrivateNetworks: true,
      webhookTimeoutMs: 1000,
      webhookRetryBaseMs: 100,
      webhookRetryMaxMs: 500,
      webhookMaxAttempts: 1000,
      webhookPollMs: 100,
    });
    const url = rig.anvil.rpcUrl;
    const payer = privateKeyToAccount(rig.payerKey).address;
    const signer = f.signers[0] as Address;

    // Down: nothing listens on the receiver's port.
    const downSince = Date.now();
    const a = await rig.payment(1000n);
    const settledA = (await postJson(`${f.url}/settle`, a)).json;
    expect(settledA).toMatchObject({ success: true });

    // B: its transaction is mined and reverts (a transfer ordered before it takes the payer's
    // balance below its amount: settle-reverts.test.ts), leaving 500 for C.
    const b = await rig.payment(800n);
    await rig.test.setAutomine(false);
    const pendingB = postJson(`${f.url}/settle`, b);
    await until(async () => (await nonceOf(url, signer, "pending")) === 2, "B's transaction sent");
    const all = await balanceOf(url, rig.usdc.address, payer);
    await transferToken(url, rig.chainId, rig.payerKey, rig.usdc.address, sink, all - 500n, parseGwei("100"));
    await rig.test.mine({ blocks: 1 });
    await rig.test.setAutomine(true);
    const settledB = (await pendingB).json;
    expect(settledB).toMatchObject({ success: false, errorReason: "invalid_exact_evm_insufficient_balance" });

    // Every attempt so far failed (the receiver is down), and they were retried.
    await until(async () => (await metricSum(f.adminUrl, "x402_webhook_deliveries_total", { result: "failed" })) >= 4, "failed attempts");
    expect(await metricSum(f.adminUrl, "x402_webhook_deliveries_total", { result: "delivered" })).toBe(0);
    await new Promise((r) => setTimeout(r, Math.max(0, DOWN_MS - (Date.now() - downSince))));
    expect(hook.requests).toHaveLength(0);

    // Up, but hanging: deliveries arrive and are never answered. C settles meanwhile.
    await hook.up();
    await until(() => hook.hung.size > 0, "a delivery held by the hanging receiver");
    const c = await rig.payment(500n);
    const settledC = (await postJson(`${f.url}/settle`, c)).json;
    expect(settledC).toMatchObject({ success: true });
    expect(hook.hung.size).toBeGreaterThan(0); // still unanswered while /settle answered
    expect(hook.accepted).toHaveLength(0);

    // Answering: everything arrives.
    hook.answer();
    const ofPayment = (answer: Record<string, unknown>) => {
      const outcome = hook.accepted.find((x) => x.event.sequence === 2 && x.event.transaction === answer.transaction);
      return outcome ? hook.accepted.filter((x) => x.event.paymentId === outcome.event.paymentId) : [];
    };
    await until(() => [settledA, settledB, settledC].every((s) => ofPayment(s).length === 2), "every event delivered", 60_000);

    const receipts = publicClient(url);
    for (const [answer, outcome, amount] of [
      [settledA, "confirmed", 1000n],
      [settledB, "failed", 800n],
      [settledC, "confirmed", 500n],
    ] as const) {
      const events = ofPayment(answer).map((x) => x.event);
      // In order, once each: submitted with the transaction sent, then its outcome.
      expect(events.map((e) => [e.sequence, e.type])).toEqual([
        [1, "submitted"],
        [2, outcome],
      ]);
      expect(events[0]).toMatchObject({ status: "pending", network: rig.network, transaction: answer.transaction, payer, payTo: rig.receiver.toLowerCase(), token: rig.usdc.address.toLowerCase(), amount: String(amount) });
      const receipt = await receipts.getTransactionReceipt({ hash: answer.transaction as Hex });
      const transfers = parseEventLogs({ abi: erc20Abi, logs: receipt.logs, eventName: "Transfer" });
      if (outcome === "confirmed") {
        expect(events[1]).toMatchObject({ status: "settled", transaction: answer.transaction, amount: String(amount) });
        expect(receipt.status).toBe("success");
        expect(transfers.map((t) => [t.address.toLowerCase(), t.args.from, t.args.to, t.args.value])).toContainEqual([rig.usdc.address.toLowerCase(), payer, rig.receiver, amount]);
      } else {
        expect(events[1]).toMatchObject({ status: "failed", transaction: answer.transaction, errorReason: "invalid_exact_evm_insufficient_balance" });
        expect(receipt.status).toBe("reverted");
        expect(transfers).toHaveLength(0);
      }
    }
    // No event of a payment arrived, even once, before the one before it was accepted.
    const ours = new Set([settledA, settledB, settledC].flatMap((s) => ofPayment(s).map((x) => x.event.paymentId)));
    for (const r of hook.requests.filter((x) => ours.has(x.event.paymentId))) expect(r.event.sequence).toBeLessThanOrEqual(r.acceptedBefore + 1);
    expect(hook.requests.filter((r) => r.status === 400)).toHaveLength(0);

    // The documented verification, on a delivery as sent: a replay, a forged key, a tampered body, a stale one.
    const sent = ofPayment(settledA)[1]!;
    const at = Number(sent.headers["x402-webhook-timestamp"]) * 1000;
    const replay = createReplayGuard();
    const handled = verifyWebhook({ body: sent.body, headers: sent.headers, secret: key, now: at, replay });
    expect(handled.ok).toBe(true);
    if (handled.ok) handled.handled();
    expect(verifyWebhook({ body: sent.body, headers: sent.headers, secret: key, now: at, replay })).toEqual({ ok: false, reason: "replayed" });
    expect(verifyWebhook({ body: sent.body, headers: sent.headers, secret, now: at })).toEqual({ ok: false, reason: "bad_signature" }); // the fleet secret
    expect(verifyWebhook({ body: sent.body, headers: sent.headers, secret: randomBytes(32).toString("hex"), now: at })).toEqual({ ok: false, reason: "bad_signature" });
    expect(verifyWebhook({ body: sent.body.replace('"1000"', '"1"'), headers: sent.headers, secret: key, now: at })).toEqual({ ok: false, reason: "bad_signature" });
    expect(verifyWebhook({ body: sent.body, headers: sent.headers, secret: key, now: at + 301_000 })).toEqual({ ok: false, reason: "stale_timestamp" });
    // Any process of a network delivers its events (replicas share them): this one's ends here.
    await f.close();
  }, 180_000);

  it("a tenant's events go to its API key's webhook URL, signed with the key's webhook key from the router's admin API; a key without one gets none", async () => {
    // A chain of its own: the test above spent its payer's balance.
    const rig = await startRig({ engine });
    const dir = rig.dir;
    await writeFile(join(dir, "webhook.secret"), secret + "\n");
    const routerToken = randomBytes(32).toString("hex");
    const adminToken = randomBytes(24).toString("hex");
    await writeFile(join(dir, "router.token"), routerToken + "\n");
    await writeFile(join(dir, "admin.token"), adminToken + "\n");
    const f = await rig.facilitator({
      routerTokenFile: join(dir, "router.token"),
      webhookSecretFile: join(dir, "webhook.secret"), // no webhookUrl: tenants' receivers only
      webhookTenantAllowPrivateNetworks: true, // the tenant's receiver is on loopback (tests only)
      webhookRetryBaseMs: 100,
      webhookRetryMaxMs: 500,
      webhookPollMs: 100,
    });
    const table: RoutingTable = { backends: [{ network: rig.network, url: f.url, kinds: f.facilitator.supported().kinds, signers: f.signers, extensions: [] }] };
    await writeFile(join(dir, "routing.json"), JSON.stringify(table));
    const router = await startRouterService(
      {
        routingTablePath: join(dir, "routing.json"),
        host: "127.0.0.1",
        port: 0,
        adminPort: 0,
        dataDir: join(dir, `router-${engine}`),
        apiKeys: true,
        adminTokenFile: join(dir, "admin.token"),
        routerTokenFile: join(dir, "router.token"),
        webhooks: { secretFile: join(dir, "webhook.secret"), allowPrivateNetworks: true },
      },
      pino({ level: "silent" }),
    );
    try {
      const admin = (path: string, body?: unknown) => postJson(`${router.adminUrl}${path}`, body, { method: body === undefined ? "GET" : "POST", headers: { authorization: `Bearer ${adminToken}` } });
      const port = await freePort();
      // The facilitators' URL rules at the admin API: credentials before the host, or no http(s), are refused.
      expect((await admin("/admin/v1/api-keys", { name: "bad", webhookUrl: `http://user:pw@127.0.0.1:${port}/` })).status).toBe(400);
      expect((await admin("/admin/v1/api-keys", { name: "bad", webhookUrl: "ftp://127.0.0.1/" })).status).toBe(400);
      const withHook = (await admin("/admin/v1/api-keys", { name: "hooked", webhookUrl: `http://127.0.0.1:${port}/events?token=t0ken` })).json as { key: string; apiKey: { id: string } };
      const without = (await admin("/admin/v1/api-keys", { name: "quiet" })).json as { key: string; apiKey: { id: string } };
      const shown = (await admin(`/admin/v1/api-keys/${withHook.apiKey.id}/webhook-key`)).json as { webhookKey: string };
      expect(shown.webhookKey).toBe(tenantWebhookKey(secret, withHook.apiKey.id));
      // The CLI shows the same, through the admin API.
      const cli = await runApiKeyCommand("api-key-webhook-key", { id: withHook.apiKey.id, "admin-url": router.adminUrl, "admin-token-file": join(dir, "admin.token") }, {});
      expect(cli).toContain(`: ${shown.webhookKey}\n`);
      hook = receiver(port, shown.webhookKey);
      await hook.up();
      hook.answer();

      // The quiet key's payment first: had it any tenant delivery, it would be sent before the other's.
      const quiet = (await postJson(`${router.url}/settle`, await rig.payment(100n), { headers: { authorization: `Bearer ${without.key}` } })).json;
      expect(quiet).toMatchObject({ success: true });
      const hooked = (await postJson(`${router.url}/settle`, await rig.payment(200n), { headers: { authorization: `Bearer ${withHook.key}` } })).json;
      expect(hooked).toMatchObject({ success: true });

      await until(() => hook.accepted.length >= 2, "the tenant's events");
      expect(hook.accepted.map((x) => [x.event.sequence, x.event.type, x.event.tenant, x.event.transaction])).toEqual([
        [1, "submitted", withHook.apiKey.id, hooked.transaction],
        [2, "confirmed", withHook.apiKey.id, hooked.transaction],
      ]);
      // Signed with the tenant's key, not the fleet's secret.
      const { body, headers } = hook.accepted[1]!;
      expect(verifyWebhook({ body, headers, secret, now: Number(headers["x402-webhook-timestamp"]) * 1000 })).toEqual({ ok: false, reason: "bad_signature" });
      // Every tenant delivery made on this network: the two above (the quiet key's, due first, would be counted by now).
      const tenantDeliveries = () => metricSum(f.adminUrl, "x402_webhook_deliveries_total", { target: "tenant", result: "delivered" });
      await until(async () => (await tenantDeliveries()) >= 2, "the deliveries counted");
      expect(await tenantDeliveries()).toBe(2);
      const receipt = await publicClient(rig.anvil.rpcUrl).getTransactionReceipt({ hash: hooked.transaction as Hex });
      expect(receipt.status).toBe("success");
    } finally {
      await router.close();
      await rig.stop();
    }
  }, 120_000);
});
