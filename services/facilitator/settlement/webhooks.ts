// Settlement webhooks, the sending side: every facilitator process runs one delivery worker beside
// its reconciler. The events themselves are written by the database (migration 013's trigger, in
// the transaction that changes a payment's state), so this only carries them out of the store.
//
// Guarantees
// - Settlement never waits on a delivery: the worker claims rows in short statements of its own and
//   POSTs outside any transaction (the embedded engine runs one transaction at a time).
// - At least once: a delivery is `pending` until a receiver answers 2xx, or it is given up (`dead`)
//   after `maxAttempts` attempts or `giveUpAfterMs` after its event; a receiver that is down meanwhile
//   loses nothing, and a process that dies mid-POST leaves a lease that runs out, then another sends it.
// - In order per payment and target: sequence n+1 is not sent before n is delivered or dead.
// - Replicas sharing a PostgreSQL claim with FOR UPDATE SKIP LOCKED and a lease: one sends at a time.
// Caveats
// - A receiver may get an event twice (its 2xx lost, a lease that ran out): it dedupes by event id.
// - The facilitator's own URL is read from this process's configuration when sent; a tenant's is the
//   one its router sent with the payment's settle.
import { randomInt } from "node:crypto";
import { createEgress, DestinationNotAllowed } from "../../platform/egress.ts";
import type { Logger } from "../../platform/logger.ts";
import type { Metrics } from "../../platform/metrics.ts";
import type { Database } from "../../platform/storage.ts";
import { tenantWebhookKey, webhookHeaders, webhookOrigin, webhookUrlProblem } from "../../x402/webhooks.ts";
import type { WebhookConfig } from "../config.ts";

/** How long an event is kept once none of its deliveries is pending (never less than the give-up bound). */
export const EVENT_RETENTION_MS = 7 * 86_400_000;

export interface WebhookDeliveryOptions {
  db: Database;
  network: string;
  config: WebhookConfig;
  logger: Logger;
  metrics: Metrics;
  /** Deliveries claimed per pass (and sent at once). */
  batch?: number;
}

interface DueDelivery {
  event: string;
  target: "facilitator" | "tenant";
  attempts: number;
  event_id: string;
  body: unknown;
  tenant: string | null;
  url: string | null;
  age_ms: number;
}

/** The next delay after `attempts` failed attempts: doubling from the base up to the largest, jittered down by up to a half. */
export function retryDelayMs(attempts: number, config: Pick<WebhookConfig, "retryBaseMs" | "retryMaxMs">): number {
  const full = Math.min(config.retryMaxMs, config.retryBaseMs * 2 ** Math.min(attempts - 1, 30));
  return Math.ceil(full / 2 + randomInt(0, Math.max(1, Math.ceil(full / 2))));
}

/** The URL a tenant's payment keeps, when it may: a secret to sign with, and the URL rules; else none. */
export function acceptTenantWebhook(config: WebhookConfig | undefined, url: string | undefined): string | undefined {
  if (!config || !url) return undefined;
  return webhookUrlProblem(url, { allowPrivateNetworks: config.allowPrivateNetworks }) ? undefined : url;
}

export function startWebhookDelivery(opts: WebhookDeliveryOptions) {
  const { db, network, config, metrics } = opts;
  const log = opts.logger.child({ component: "webhooks" });
  const batch = opts.batch ?? 16;
  // The POST's own bound, and the lease a claim holds meanwhile (longer: a slow claim is never sent twice by design).
  const leaseMs = config.timeoutMs + 10_000;
  const egress = createEgress({ allowPrivateNetworks: config.allowPrivateNetworks, headersTimeoutMs: config.timeoutMs, bodyTimeoutMs: config.timeoutMs });
  let stopped = false;
  let timer: NodeJS.Timeout | undefined;
  let running: Promise<void> | undefined;
  let gaugesAt = 0;
  let prunedAt = 0;

  /**
   * Claims due deliveries: pending, their time come, no lease held, and no earlier event of the same
   * payment still pending for that target (in order). SKIP LOCKED: replicas never wait on each other.
   * A process without the facilitator's URL leaves that receiver's deliveries to the processes that
   * have it (a rollout changing it), and gives them up only past the age bound.
   */
  async function claim(): Promise<DueDelivery[]> {
    return db.query<DueDelivery>(
      `UPDATE settlement_webhook_deliveries d SET attempts = d.attempts + 1, lease_until = now() + ($3 || ' milliseconds')::interval, updated_at = now()
       FROM (
         SELECT event, target FROM settlement_webhook_deliveries x
         WHERE x.network = $1 AND x.state = 'pending' AND x.next_attempt_at <= now() AND (x.lease_until IS NULL OR x.lease_until < now())
           AND ($4 OR x.target <> 'facilitator' OR x.created_at < now() - ($5 || ' milliseconds')::interval)
           AND NOT EXISTS (SELECT 1 FROM settlement_webhook_deliveries y WHERE y.network = x.network AND y.payment_id = x.payment_id AND y.target = x.target AND y.state = 'pending' AND y.sequence < x.sequence)
         ORDER BY x.next_attempt_at LIMIT $2 FOR UPDATE SKIP LOCKED
       ) due, settlement_events e, settlement_payments p
       WHERE d.event = due.event AND d.target = due.target AND e.id = d.event AND p.network = d.network AND p.payment_id = d.payment_id
       RETURNING d.event::text AS event, d.target, d.attempts, e.event_id, e.body, e.tenant, p.webhook_url AS url, (EXTRACT(EPOCH FROM (now() - e.created_at)) * 1000)::float8 AS age_ms`,
      [network, batch, String(leaseMs), !!config.url, String(config.giveUpAfterMs)],
    );
  }

  /** Where a delivery goes and the key it is signed with; a reason when it cannot go anywhere. */
  function destination(d: DueDelivery): { url: string; key: string } | { problem: string } {
    if (d.target === "facilitator") return config.url ? { url: config.url, key: config.secret } : { problem: "no facilitator webhook URL is configured" };
    if (!d.url || !d.tenant) return { problem: "the payment has no tenant webhook" };
    return { url: d.url, key: tenantWebhookKey(config.secret, d.tenant) };
  }

  async function send(d: DueDelivery): Promise<void> {
    const to = destination(d);
    let status: number | undefined;
    let error: string | undefined;
    if ("problem" in to) error = to.problem;
    else {
      const body = JSON.stringify(d.body);
      try {
        const res = await egress.fetch(to.url, {
          method: "POST",
          headers: { "content-type": "application/json", "user-agent": "x402-fleet-webhooks", ...webhookHeaders(to.key, d.event_id, body) },
          body,
          signal: AbortSignal.timeout(config.timeoutMs),
        });
        status = res.status;
        await res.body?.cancel().catch(() => undefined); // the answer's body is not read
      } catch (e) {
        // A code, never the message: undici's may name the URL, which may carry a token.
        error = e instanceof DestinationNotAllowed ? "destination_not_allowed" : ((e as { cause?: { code?: string } }).cause?.code ?? (e as Error).name ?? "error");
      }
    }
    const delivered = status !== undefined && status >= 200 && status < 300;
    if (delivered) {
      await db.query(`UPDATE settlement_webhook_deliveries SET state = 'delivered', lease_until = NULL, last_status = $3, last_error = NULL, updated_at = now() WHERE event = $1 AND target = $2 AND state = 'pending'`, [
        d.event,
        d.target,
        status,
      ]);
      metrics.webhookDeliveries.inc({ network, target: d.target, result: "delivered" });
      return;
    }
    const why = error ?? `HTTP ${status}`;
    const dead = "problem" in to || d.attempts >= config.maxAttempts || d.age_ms >= config.giveUpAfterMs;
    await db.query(
      `UPDATE settlement_webhook_deliveries SET state = $3, lease_until = NULL, next_attempt_at = now() + ($4 || ' milliseconds')::interval, last_status = $5, last_error = $6, updated_at = now()
       WHERE event = $1 AND target = $2 AND state = 'pending'`,
      [d.event, d.target, dead ? "dead" : "pending", String(dead ? 0 : retryDelayMs(d.attempts, config)), status ?? null, why.slice(0, 200)],
    );
    metrics.webhookDeliveries.inc({ network, target: d.target, result: dead ? "dead" : "failed" });
    const fields = { target: d.target, event: d.event_id, attempts: d.attempts, origin: "url" in to ? webhookOrigin(to.url) : undefined, why };
    if (dead) log.warn(fields, "webhook delivery given up");
    else log.debug(fields, "webhook delivery failed; retrying later");
  }

  async function refreshGauges(): Promise<void> {
    if (Date.now() - gaugesAt < 5000) return;
    gaugesAt = Date.now();
    const [row] = await db.query<{ n: number; due: number }>(
      `SELECT count(*)::int AS n, COALESCE(EXTRACT(EPOCH FROM (now() - min(next_attempt_at) FILTER (WHERE next_attempt_at <= now()))), 0)::float8 AS due
       FROM settlement_webhook_deliveries WHERE network = $1 AND state = 'pending'`,
      [network],
    );
    metrics.webhookQueue.set({ network }, row?.n ?? 0);
    metrics.webhookOldestDue.set({ network }, row?.due ?? 0);
  }

  /**
   * Drops events older than the retention whose deliveries all ended (their deliveries with them),
   * at most hourly and a bounded number at a time: the tables do not grow with history.
   */
  async function prune(): Promise<void> {
    if (Date.now() - prunedAt < 3_600_000) return;
    prunedAt = Date.now();
    await db.query(
      `DELETE FROM settlement_events e WHERE e.id IN (SELECT id FROM settlement_events WHERE network = $1 AND created_at < now() - ($2 || ' milliseconds')::interval ORDER BY created_at LIMIT 5000)
         AND NOT EXISTS (SELECT 1 FROM settlement_webhook_deliveries d WHERE d.event = e.id AND d.state = 'pending')`,
      [network, String(Math.max(EVENT_RETENTION_MS, 2 * config.giveUpAfterMs))],
    );
  }

  /** One pass: claims what is due and sends it, until nothing is due (a full batch may hide more). */
  async function pass(): Promise<void> {
    for (;;) {
      const due = await claim();
      await Promise.all(due.map((d) => send(d).catch((e: unknown) => log.warn({ err: { name: (e as Error).name }, target: d.target }, "webhook delivery not recorded; its lease runs out and it is sent again"))));
      if (due.length < batch || stopped) break;
    }
    await refreshGauges();
    await prune();
  }

  const schedule = () => {
    if (stopped) return;
    timer = setTimeout(() => {
      running = pass()
        .catch((e: unknown) => log.warn({ err: { name: (e as Error).name } }, "webhook pass failed; trying again"))
        .finally(() => {
          running = undefined;
          schedule();
        });
    }, config.pollMs);
    timer.unref();
  };
  schedule();
  log.info({ facilitatorReceiver: config.url ? webhookOrigin(config.url) : undefined }, "webhook delivery started");

  return {
    /** One pass now (tests). */
    pass,
    async stop(): Promise<void> {
      stopped = true;
      clearTimeout(timer);
      await egress.close().catch(() => undefined); // ends a POST in flight: its lease runs out, another process sends it
      await running;
    },
  };
}
