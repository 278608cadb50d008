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
// - In order per payment and target: sequence n+1 is not sent before n is delivered or dead. It is
//   written blocked (next_attempt_at infinity, migration 016) and released when n ends, in the same
//   transaction, under the payment's row lock (the trigger writing n+1 holds it): a claim reads only
//   what is due, however many deliveries a failing receiver has queued.
// - A pool of `batch` sends, each slot refilled as its send ends, at most `perOriginConcurrency` of
//   them to one receiver origin: a receiver that hangs holds its own slots, never everyone's.
// - Tenants' URLs go through the egress guard: never loopback or private addresses (only
//   `tenantAllowPrivateNetworks`, for tests and devnets); `allowPrivateNetworks` is the operator's own
//   receiver's alone (in-cluster).
// - The facilitator's receiver verifies with a key derived from the fleet secret (facilitatorWebhookKey),
//   like each tenant's: whoever holds it cannot sign a tenant's events.
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
/** Events dropped per statement when pruning (it loops until none is left). */
const PRUNE_CHUNK = 1000;
/** The pending gauge counts up to this many (it is a bound, not a scan of the backlog). */
const PENDING_GAUGE_BOUND = 10_000;

export interface WebhookDeliveryOptions {
  db: Database;
  network: string;
  config: WebhookConfig;
  logger: Logger;
  metrics: Metrics;
  /** Sends in flight at most (a slot is refilled as each ends). */
  batch?: number;
  /** Sends in flight to one receiver origin at most (the facilitator's own receiver counts as one). */
  perOriginConcurrency?: number;
}

interface DueDelivery {
  event: string;
  payment_id: string;
  /** Where it goes, for the concurrency cap: "facilitator", or the tenant URL's scheme and authority. */
  origin: string;
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

/** The API key id-like label the facilitator's own key is derived under (API key ids are hex: never this). */
export const FACILITATOR_KEY_ID = "facilitator";

/**
 * The key the facilitator's own receiver verifies with: hex HMAC-SHA256(fleet secret,
 * "x402-fleet webhook key:facilitator"), derived as a tenant's is, never the fleet secret itself.
 */
export const facilitatorWebhookKey = (fleetSecret: string): string => tenantWebhookKey(fleetSecret, FACILITATOR_KEY_ID);

/** The URL a tenant's payment keeps, when it may: a secret to sign with, and the URL rules (no private networks but in tests); else none. */
export function acceptTenantWebhook(config: WebhookConfig | undefined, url: string | undefined): string | undefined {
  if (!config || !url) return undefined;
  return webhookUrlProblem(url, { allowPrivateNetworks: config.tenantAllowPrivateNetworks ?? false }) ? undefined : url;
}

/** SQL: the concurrency key of a delivery row `x`: "facilitator", or its tenant URL's scheme and authority, lower-cased. */
const ORIGIN_KEY = `CASE WHEN x.target = 'facilitator' THEN 'facilitator' ELSE lower(substring((SELECT px.webhook_url FROM settlement_payments px WHERE px.network = x.network AND px.payment_id = x.payment_id LIMIT 1) from '^[A-Za-z][A-Za-z0-9+.-]*://[^/?#]*')) END`;

export function startWebhookDelivery(opts: WebhookDeliveryOptions) {
  const { db, network, config, metrics } = opts;
  const log = opts.logger.child({ component: "webhooks" });
  const batch = opts.batch ?? 16;
  const perOrigin = Math.max(1, Math.min(batch, opts.perOriginConcurrency ?? Math.ceil(batch / 4)));
  // The POST's own bound, and the lease a claim holds meanwhile (longer: a slow claim is never sent twice by design).
  const leaseMs = config.timeoutMs + 10_000;
  const bounds = { headersTimeoutMs: config.timeoutMs, bodyTimeoutMs: config.timeoutMs };
  // The operator's own receiver may be in-cluster; tenants' URLs never reach private addresses (but in tests).
  const operatorEgress = createEgress({ allowPrivateNetworks: config.allowPrivateNetworks, ...bounds });
  const tenantEgress = createEgress({ allowPrivateNetworks: config.tenantAllowPrivateNetworks ?? false, ...bounds });
  const facilitatorKey = facilitatorWebhookKey(config.secret);
  let stopped = false;
  let timer: NodeJS.Timeout | undefined;
  let running: Promise<void> | undefined;
  let gaugesAt = 0;
  let prunedAt = 0;

  /**
   * Claims due deliveries: pending, their time come, no lease held, and no earlier event of the same
   * payment still pending for that target (in order). SKIP LOCKED: replicas never wait on each other.
   * A process without the facilitator's URL leaves that receiver's deliveries to the processes that
   * have it (a rollout changing it), and gives them up only past the age bound. Blocked deliveries
   * wait at infinity (migration 016): the due index's range holds only what may be sent, and the
   * NOT EXISTS stays as a guard, read only for those. Origins at their cap (`busy`) are skipped.
   */
  async function claim(limit: number, busy: string[]): Promise<DueDelivery[]> {
    return db.query<DueDelivery>(
      `UPDATE settlement_webhook_deliveries d SET attempts = d.attempts + 1, lease_until = now() + ($3 || ' milliseconds')::interval, updated_at = now()
       FROM (
         SELECT event, target, ${ORIGIN_KEY} AS origin FROM settlement_webhook_deliveries x
         WHERE x.network = $1 AND x.state = 'pending' AND x.next_attempt_at <= now() AND (x.lease_until IS NULL OR x.lease_until < now())
           AND ($4 OR x.target <> 'facilitator' OR x.created_at < now() - ($5 || ' milliseconds')::interval)
           AND NOT jsonb_exists($6::jsonb, COALESCE(${ORIGIN_KEY}, ''))
           AND NOT EXISTS (SELECT 1 FROM settlement_webhook_deliveries y WHERE y.network = x.network AND y.payment_id = x.payment_id AND y.target = x.target AND y.state = 'pending' AND y.sequence < x.sequence)
         ORDER BY x.next_attempt_at LIMIT $2 FOR UPDATE OF x SKIP LOCKED
       ) due, settlement_events e
       WHERE d.event = due.event AND d.target = due.target AND e.id = d.event
       RETURNING d.event::text AS event, d.payment_id, COALESCE(due.origin, '') AS origin, d.target, d.attempts, e.event_id, e.body, e.tenant,
         (SELECT p.webhook_url FROM settlement_payments p WHERE p.network = d.network AND p.payment_id = d.payment_id LIMIT 1) AS url,
         (EXTRACT(EPOCH FROM (now() - e.created_at)) * 1000)::float8 AS age_ms`,
      [network, limit, String(leaseMs), !!config.url, String(config.giveUpAfterMs), JSON.stringify(busy)],
    );
  }

  /** Gives back a claim not sent (its origin at its cap): as if never claimed. */
  async function unclaim(d: DueDelivery): Promise<void> {
    await db.query(`UPDATE settlement_webhook_deliveries SET attempts = attempts - 1, lease_until = NULL WHERE event = $1 AND target = $2 AND state = 'pending'`, [d.event, d.target]);
  }

  /**
   * Records a delivery's attempt; one that ended (delivered, dead) releases the next of its payment
   * and receiver. Under the payment's row lock, which the trigger writing an event holds: an event
   * written meanwhile is either seen here (and released) or sees this one ended (and is due at once).
   */
  async function record(d: DueDelivery, state: "delivered" | "pending" | "dead", delayMs: number, status: number | null, error: string | null): Promise<void> {
    await db.transaction(async (tx) => {
      await tx.query(`SELECT 1 FROM settlement_payments WHERE network = $1 AND payment_id = $2 FOR SHARE`, [network, d.payment_id]);
      await tx.query(
        `UPDATE settlement_webhook_deliveries SET state = $3, lease_until = NULL, next_attempt_at = CASE WHEN $3 = 'pending' THEN now() + ($4 || ' milliseconds')::interval ELSE next_attempt_at END,
           last_status = $5, last_error = $6, updated_at = now()
         WHERE event = $1 AND target = $2 AND state = 'pending'`,
        [d.event, d.target, state, String(delayMs), status, error],
      );
      if (state === "pending") return;
      await tx.query(
        `UPDATE settlement_webhook_deliveries SET next_attempt_at = now(), updated_at = now()
         WHERE network = $1 AND payment_id = $2 AND target = $3 AND state = 'pending' AND next_attempt_at = 'infinity'
           AND sequence = (SELECT min(sequence) FROM settlement_webhook_deliveries WHERE network = $1 AND payment_id = $2 AND target = $3 AND state = 'pending')`,
        [network, d.payment_id, d.target],
      );
    });
  }

  /** Where a delivery goes and the key it is signed with; a reason when it cannot go anywhere. */
  function destination(d: DueDelivery): { url: string; key: string } | { problem: string } {
    if (d.target === "facilitator") return config.url ? { url: config.url, key: facilitatorKey } : { problem: "no facilitator webhook URL is configured" };
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
        const res = await (d.target === "facilitator" ? operatorEgress : tenantEgress).fetch(to.url, {
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
      await record(d, "delivered", 0, status ?? null, null);
      metrics.webhookDeliveries.inc({ network, target: d.target, result: "delivered" });
      return;
    }
    const why = error ?? `HTTP ${status}`;
    const dead = "problem" in to || d.attempts >= config.maxAttempts || d.age_ms >= config.giveUpAfterMs;
    await record(d, dead ? "dead" : "pending", dead ? 0 : retryDelayMs(d.attempts, config), status ?? null, why.slice(0, 200));
    metrics.webhookDeliveries.inc({ network, target: d.target, result: dead ? "dead" : "failed" });
    const fields = { target: d.target, event: d.event_id, attempts: d.attempts, origin: "url" in to ? webhookOrigin(to.url) : undefined, why };
    if (dead) log.warn(fields, "webhook delivery given up");
    else log.debug(fields, "webhook delivery failed; retrying later");
  }

  async function refreshGauges(): Promise<void> {
    if (Date.now() - gaugesAt < 5000) return;
    gaugesAt = Date.now();
    // A bounded count (the gauge saturates at it) and the due index's front: never a scan of the backlog.
    const [row] = await db.query<{ n: number; due: number }>(
      `SELECT (SELECT count(*) FROM (SELECT 1 FROM settlement_webhook_deliveries WHERE network = $1 AND state = 'pending' LIMIT $2) c)::int AS n,
         COALESCE(EXTRACT(EPOCH FROM (now() - (SELECT min(next_attempt_at) FROM settlement_webhook_deliveries WHERE network = $1 AND state = 'pending' AND next_attempt_at <= now()))), 0)::float8 AS due`,
      [network, PENDING_GAUGE_BOUND],
    );
    metrics.webhookQueue.set({ network }, row?.n ?? 0);
    metrics.webhookOldestDue.set({ network }, row?.due ?? 0);
  }

  /**
   * Drops events older than the retention whose deliveries all ended (their deliveries with them),
   * at most hourly, in bounded chunks (yielding between them) until none is left: the tables do
   * not grow with history, and no statement holds the embedded engine long.
   */
  async function prune(force = false): Promise<number> {
    if (!force && Date.now() - prunedAt < 3_600_000) return 0;
    prunedAt = Date.now();
    let total = 0;
    while (!stopped) {
      const [row] = await db.query<{ n: number }>(
        `WITH gone AS (DELETE FROM settlement_events WHERE id IN (
           SELECT e.id FROM settlement_events e WHERE e.network = $1 AND e.created_at < now() - ($2 || ' milliseconds')::interval
             AND NOT EXISTS (SELECT 1 FROM settlement_webhook_deliveries d WHERE d.event = e.id AND d.state = 'pending')
           ORDER BY e.created_at LIMIT $3) RETURNING 1)
         SELECT count(*)::int AS n FROM gone`,
        [network, String(Math.max(EVENT_RETENTION_MS, 2 * config.giveUpAfterMs)), PRUNE_CHUNK],
      );
      total += row?.n ?? 0;
      if ((row?.n ?? 0) < PRUNE_CHUNK) break;
      await new Promise((r) => setImmediate(r));
    }
    return total;
  }

  /**
   * One pass: a pool of `batch` sends, each slot refilled as a send ends, at most `perOrigin` to one
   * origin; until nothing is due nor in flight. While slots are held (a slow receiver), it still
   * looks for new due deliveries every poll interval.
   */
  async function pass(): Promise<void> {
    const inflight = new Set<Promise<void>>();
    const perKey = new Map<string, number>();
    let look = true;
    for (;;) {
      if (!stopped && look && inflight.size < batch) {
        const busy = [...perKey].filter(([, n]) => n >= perOrigin).map(([k]) => k);
        const due = await claim(batch - inflight.size, busy);
        let started = 0;
        for (const d of due) {
          const n = perKey.get(d.origin) ?? 0;
          if (n >= perOrigin) {
            await unclaim(d).catch(() => undefined); // else its lease runs out
            continue;
          }
          perKey.set(d.origin, n + 1);
          started++;
          const p: Promise<void> = send(d)
            .catch((e: unknown) => log.warn({ err: { name: (e as Error).name }, target: d.target }, "webhook delivery not recorded; its lease runs out and it is sent again"))
            .finally(() => {
              inflight.delete(p);
              const left = (perKey.get(d.origin) ?? 1) - 1;
              if (left > 0) perKey.set(d.origin, left);
              else perKey.delete(d.origin);
            });
          inflight.add(p);
        }
        look = started > 0;
        continue;
      }
      if (inflight.size === 0) break;
      // A send ending frees a slot (and may release its payment's next event); new events become due meanwhile.
      let timer: NodeJS.Timeout | undefined;
      const tick = new Promise<void>((r) => {
        timer = setTimeout(r, config.pollMs);
        timer.unref();
      });
      await Promise.race([...inflight, tick]);
      clearTimeout(timer);
      look = true;
    }
    await refreshGauges();
    await prune();
  }

  // Passes run one at a time: a pass asked for (tests) never overlaps the scheduled one, so what it
  // sent is all known when it returns.
  let last: Promise<unknown> = Promise.resolve();
  const serialPass = (): Promise<void> => {
    const next = last.then(pass, pass);
    last = next.catch(() => undefined);
    return next;
  };

  const schedule = () => {
    if (stopped) return;
    timer = setTimeout(() => {
      running = serialPass()
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
    /** One pass now (tests), after any pass in flight. */
    pass: serialPass,
    /** Prunes now, whenever it last did (tests); the events dropped. */
    prune: () => prune(true),
    async stop(): Promise<void> {
      stopped = true;
      clearTimeout(timer);
      // Ends a POST in flight: its lease runs out, another process sends it.
      await Promise.all([operatorEgress.close().catch(() => undefined), tenantEgress.close().catch(() => undefined)]);
      await running;
    },
  };
}
