// The settlement webhook delivery worker (services/facilitator/settlement/webhooks.ts) against a
// store of its own, on the embedded engine and on PostgreSQL when DATABASE_URL is set: deliveries
// blocked behind a failing one are never due (a claim's cost does not grow with the backlog); a
// receiver that hangs holds its own slots only; tenants' URLs never reach private addresses while
// the operator's may; the facilitator's receiver verifies with a derived key, not the fleet secret;
// pruning loops until nothing expired is left, and never restarts a payment's sequence.
// Assertions count rows, requests and order; waits are bounded, never the thing asserted.
import { createServer, type IncomingHttpHeaders, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { randomBytes } from "node:crypto";
import { afterEach, describe, expect, it } from "vitest";
import { generatePrivateKey, privateKeyToAccount } from "viem/accounts";
import type { Hex } from "viem";
import { pino } from "pino";
import { SETTLEMENT_MIGRATIONS, createSettlementStore } from "../services/facilitator/settlement/store.ts";
import { acceptTenantWebhook, facilitatorWebhookKey, startWebhookDelivery } from "../services/facilitator/settlement/webhooks.ts";
import { openDatabase, type Database } from "../services/platform/storage.ts";
import { createMetrics } from "../services/platform/metrics.ts";
import { verifyWebhook } from "../services/x402/webhooks.ts";
import type { WebhookConfig } from "../services/facilitator/config.ts";
import { DATABASE_URL, ENGINES } from "./helpers/settlement-rig.ts";
import { until } from "./helpers/cluster.ts";

const secret = randomBytes(32).toString("hex");
const cleanups: (() => Promise<unknown>)[] = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c().catch(() => undefined);
});

interface Received {
  body: string;
  headers: IncomingHttpHeaders;
  event: { paymentId: string; sequence: number };
}

/** A receiver on loopback: answers `status`, or never (`hang`), counting requests, open ones and the most open at once. */
async function receiver(status: number | "hang") {
  const got: Received[] = [];
  const open = new Set<ServerResponse>();
  let closedUnanswered = 0;
  let mostOpen = 0;
  const s = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      const body = Buffer.concat(chunks).toString("utf8");
      got.push({ body, headers: req.headers, event: JSON.parse(body) as Received["event"] });
      if (status !== "hang") return void res.writeHead(status).end();
      open.add(res);
      mostOpen = Math.max(mostOpen, open.size);
      res.on("close", () => {
        if (open.delete(res)) closedUnanswered++;
      });
    });
  });
  await new Promise<void>((r) => s.listen(0, "127.0.0.1", () => r()));
  cleanups.push(() => new Promise<void>((r) => (s.closeAllConnections(), s.close(() => r()))));
  return { url: `http://127.0.0.1:${(s.address() as AddressInfo).port}/hook?token=t`, got, open, closedUnanswered: () => closedUnanswered, mostOpen: () => mostOpen };
}

const config = (over: Partial<WebhookConfig> = {}): WebhookConfig => ({
  secret,
  allowPrivateNetworks: true,
  tenantAllowPrivateNetworks: true,
  timeoutMs: 20_000,
  retryBaseMs: 3_600_000,
  retryMaxMs: 3_600_000,
  maxAttempts: 40,
  giveUpAfterMs: 86_400_000,
  pollMs: 60_000,
  ...over,
});

describe.each(ENGINES)("webhook delivery worker on the %s engine", (engine) => {
  async function open() {
    const db = await openDatabase({ url: engine === "postgres" ? DATABASE_URL : undefined, migrations: SETTLEMENT_MIGRATIONS });
    // A network of its own: rows other runs left in a shared PostgreSQL never meet these.
    const network = `eip155:${900_000_000 + Math.floor(Math.random() * 99_999_999)}`;
    cleanups.push(async () => {
      for (const t of ["settlement_events", "settlement_outbox", "settlement_payments", "settlement_nonces"]) await db.query(`DELETE FROM ${t} WHERE network = $1`, [network]);
      await db.close();
    });
    const store = createSettlementStore(db, network);
    const signer = privateKeyToAccount(generatePrivateKey()).address;
    /** A payment taken to submitted (event 1); its transaction for more. */
    const submitted = async (id: string, terms: { tenant?: string; webhookUrl?: string; webhookFacilitator?: boolean }) => {
      await store.claim(id, "d", "exact", "0xpayer", {}, "run", 30_000, { token: "0xt", payTo: "0xp", amount: "5", ...terms });
      return store.allocateAndStore({ paymentId: id, claimOwner: "run", signer, to: signer, data: "0x", gas: 1n, maxFeePerGas: 1n, maxPriorityFeePerGas: 1n, kind: "eip3009_transfer" }, async () => 0, async () => ({ raw: "0x01", hash: `0x${randomBytes(32).toString("hex")}` as Hex }));
    };
    return { db, network, store, submitted };
  }

  function worker(db: Database, network: string, c: WebhookConfig, extra: { batch?: number; perOriginConcurrency?: number } = {}) {
    const w = startWebhookDelivery({ db, network, config: c, logger: pino({ level: "silent" }), metrics: createMetrics(`wh-${randomBytes(4).toString("hex")}`), ...extra });
    cleanups.push(() => w.stop());
    return w;
  }

  const count = async (db: Database, sql: string, params: unknown[]) => (await db.query<{ n: number }>(`SELECT count(*)::int AS n FROM ${sql}`, params))[0]!.n;

  it("events behind a failing delivery are never due: a pass reads only the heads, and each end releases the next, in order", async () => {
    const { db, network, store, submitted } = await open();
    const failing = await receiver(500);
    const P = 60;
    for (let i = 0; i < P; i++) {
      const tx = await submitted(`p-${i}`, { tenant: "0123456789abcdef", webhookUrl: failing.url });
      await store.recordMined(`p-${i}`, tx.id, tx.hash, true, 1n, { blockNumber: 5n, blockHash: "0xb5" });
      await store.reorged(tx.id, "0xb5");
    }
    expect(await count(db, `settlement_webhook_deliveries WHERE network = $1 AND state = 'pending'`, [network])).toBe(3 * P);
    const w = worker(db, network, config());
    // A pass can end with heads still due (about one run in five under load, before this round's
    // changes too): they go to the next pass, as the scheduled one would take them pollMs later.
    for (let i = 0; i < 5 && failing.got.length < P; i++) await w.pass();
    expect(failing.got).toHaveLength(P); // the heads only, each once
    expect(failing.got.every((g) => g.event.sequence === 1)).toBe(true);
    // Nothing is due now: the heads retry in an hour, the 2·P behind them are blocked, not due. What a
    // claim walks (the due index's range) is empty, however many are queued.
    const due = `settlement_webhook_deliveries WHERE network = $1 AND state = 'pending' AND next_attempt_at <= now()`;
    expect(await count(db, due, [network])).toBe(0);
    expect(await count(db, `settlement_webhook_deliveries WHERE network = $1 AND state = 'pending' AND next_attempt_at = 'infinity'`, [network])).toBe(2 * P);
    await w.pass();
    expect(failing.got).toHaveLength(P);

    // The receiver answers now: the heads' retries come due, and each delivered one releases the next.
    const ok = await receiver(204);
    await db.query(`UPDATE settlement_payments SET webhook_url = $2 WHERE network = $1`, [network, ok.url]);
    await db.query(`UPDATE settlement_webhook_deliveries SET next_attempt_at = now() WHERE network = $1 AND state = 'pending' AND next_attempt_at <> 'infinity'`, [network]);
    // Passes until nothing is due (a loaded machine may leave a leased send to the next pass): all delivered, in order.
    const delivered = () => count(db, `settlement_webhook_deliveries WHERE network = $1 AND state = 'delivered'`, [network]);
    await until(async () => (await w.pass(), (await delivered()) === 3 * P), "every event delivered", 90_000);
    expect(await delivered()).toBe(3 * P);
    for (let i = 0; i < P; i++) expect(ok.got.filter((g) => g.event.paymentId === `p-${i}`).map((g) => g.event.sequence)).toEqual([1, 2, 3]);
  }, 120_000);

  it("a receiver that never answers holds at most its origin's slots: another receiver's deliveries all arrive meanwhile", async () => {
    const { db, network, submitted } = await open();
    const hanging = await receiver("hang");
    const honest = await receiver(204);
    for (let i = 0; i < 8; i++) await submitted(`hang-${i}`, { tenant: "aaaaaaaaaaaaaaaa", webhookUrl: hanging.url });
    // The hanging receiver's deliveries are due first.
    await db.query(`UPDATE settlement_webhook_deliveries SET next_attempt_at = now() - interval '1 hour' WHERE network = $1`, [network]);
    for (let i = 0; i < 20; i++) await submitted(`ok-${i}`, { tenant: "bbbbbbbbbbbbbbbb", webhookUrl: honest.url });
    const w = worker(db, network, config({ timeoutMs: 60_000 }), { batch: 16, perOriginConcurrency: 4 });
    const running = w.pass();
    await until(() => honest.got.length === 20, "the honest receiver's deliveries", 55_000);
    // Every honest delivery arrived while the hanging ones were still open: none had timed out.
    expect(hanging.closedUnanswered()).toBe(0);
    expect(hanging.open.size).toBeGreaterThan(0);
    expect(hanging.mostOpen()).toBeLessThanOrEqual(4);
    await until(async () => (await count(db, `settlement_webhook_deliveries WHERE network = $1 AND state = 'delivered'`, [network])) === 20, "recorded");
    await w.stop(); // ends the hanging POSTs
    await running;
    expect(await count(db, `settlement_webhook_deliveries WHERE network = $1 AND state = 'delivered'`, [network])).toBe(20);
    expect(await count(db, `settlement_webhook_deliveries WHERE network = $1 AND state = 'pending'`, [network])).toBe(8);
  }, 120_000);

  it("a tenant's URL on a private address is refused while the operator's own receiver there is allowed", async () => {
    const { db, network, submitted } = await open();
    const operator = await receiver(204);
    const tenant = await receiver(204);
    const hooks = config({ url: operator.url, allowPrivateNetworks: true, tenantAllowPrivateNetworks: false });
    expect(acceptTenantWebhook(hooks, "http://127.0.0.1:9401/admin")).toBeUndefined();
    expect(acceptTenantWebhook(hooks, "http://169.254.169.254/latest/meta-data/")).toBeUndefined();
    expect(acceptTenantWebhook(hooks, "https://hooks.example.com/x")).toBe("https://hooks.example.com/x");
    // A URL the router sent before (or any way around the check): refused at the connection.
    await submitted("both", { tenant: "0123456789abcdef", webhookUrl: tenant.url, webhookFacilitator: true });
    const w = worker(db, network, hooks);
    await w.pass();
    expect(operator.got).toHaveLength(1);
    expect(tenant.got).toHaveLength(0);
    const [row] = await db.query<{ state: string; last_error: string }>(`SELECT state, last_error FROM settlement_webhook_deliveries WHERE network = $1 AND target = 'tenant'`, [network]);
    expect(row).toMatchObject({ last_error: "destination_not_allowed" });
  }, 60_000);

  it("the facilitator's own receiver gets events signed with the key derived for it, never with the fleet secret", async () => {
    const { db, network, submitted } = await open();
    const operator = await receiver(204);
    await submitted("ours", { webhookFacilitator: true });
    const w = worker(db, network, config({ url: operator.url }));
    await w.pass();
    expect(operator.got).toHaveLength(1);
    const { body, headers } = operator.got[0]!;
    const now = Number(headers["x402-webhook-timestamp"]) * 1000;
    expect(verifyWebhook({ body, headers, secret: facilitatorWebhookKey(secret), now }).ok).toBe(true);
    expect(verifyWebhook({ body, headers, secret, now })).toEqual({ ok: false, reason: "bad_signature" });
    expect(facilitatorWebhookKey(secret)).toMatch(/^[0-9a-f]{64}$/);
  }, 60_000);

  it("one pass prunes every expired ended event, in bounded chunks, keeping pending ones", async () => {
    const { db, network } = await open();
    await db.query(
      `WITH e AS (INSERT INTO settlement_events (event_id, network, payment_id, sequence, type, body, created_at)
         SELECT gen_random_uuid()::text, $1, 'old-' || g, 1, 'confirmed', '{}'::jsonb, now() - interval '40 days' FROM generate_series(1, 6500) g RETURNING id, payment_id)
       INSERT INTO settlement_webhook_deliveries (event, target, network, payment_id, sequence, state, next_attempt_at)
         SELECT id, 'tenant', $1, payment_id, 1, CASE WHEN payment_id = 'old-7' THEN 'pending' ELSE 'delivered' END, now() + interval '1 day' FROM e`,
      [network],
    );
    const w = worker(db, network, config());
    await w.pass();
    expect(await count(db, `settlement_events WHERE network = $1`, [network])).toBe(1); // the one still pending
    expect(await count(db, `settlement_webhook_deliveries WHERE network = $1`, [network])).toBe(1);
  }, 120_000);

  it("a payment's sequence goes on after its events were pruned", async () => {
    const { db, network, store, submitted } = await open();
    const tx = await submitted("seq", { tenant: "0123456789abcdef", webhookUrl: "https://t.example.com/h" });
    await store.recordMined("seq", tx.id, tx.hash, true, 1n, { blockNumber: 5n, blockHash: "0xb5" });
    await db.query(`DELETE FROM settlement_events WHERE network = $1`, [network]); // as pruning does
    await store.reorged(tx.id, "0xb5");
    const events = await db.query<{ sequence: number; type: string }>(`SELECT sequence, type FROM settlement_events WHERE network = $1`, [network]);
    expect(events).toEqual([{ sequence: 3, type: "reorged" }]);
  });
});
