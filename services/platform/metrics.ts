// The metric catalogue: every Prometheus series the fleet exports, in one place (docs/metrics.md).
// Label values are bounded: reason codes are normalised to a closed shape, endpoints are named by
// host, payer addresses never appear. Each service owns a Registry (several share one process on
// the devnet), so series are created per registry, not as module singletons.
import { Counter, Gauge, Histogram, Registry, collectDefaultMetrics } from "prom-client";
import { unhandledErrorCounts } from "./process-guard.ts";

// "bundle" when this runs from dist/ (scripts/build.mjs), "sources" through tsx: the image and the
// bench must run the bundle, and a dashboard can tell which.
const RUNTIME = import.meta.url.endsWith(".ts") ? "sources" : "bundle";

const LATENCY_BUCKETS = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30];

export function createMetrics(service: string) {
  const registry = new Registry();
  registry.setDefaultLabels({ service });
  collectDefaultMetrics({ register: registry });
  const r = { registers: [registry] };
  new Gauge({ name: "x402_build_info", help: "1, labelled with how this process runs its code (runtime: bundle or sources) and Node's version", labelNames: ["runtime", "node"], ...r }).set({ runtime: RUNTIME, node: process.version }, 1);
  return {
    registry,
    verifyTotal: new Counter({ name: "x402_verify_total", help: "Payment verifications by outcome", labelNames: ["network", "scheme", "result", "reason"], ...r }),
    settleTotal: new Counter({ name: "x402_settle_total", help: "Payment settlements by outcome", labelNames: ["network", "scheme", "result", "reason"], ...r }),
    verifyDuration: new Histogram({ name: "x402_verify_duration_seconds", help: "Verification latency", labelNames: ["network", "scheme"], buckets: LATENCY_BUCKETS, ...r }),
    settleDuration: new Histogram({ name: "x402_settle_duration_seconds", help: "Settlement latency (until the answer, bounded receipt wait included)", labelNames: ["network", "scheme"], buckets: LATENCY_BUCKETS, ...r }),
    // Per API key (bounded: keys are created by an operator, never by callers), network and outcome.
    tenantRequests: new Counter({ name: "x402_tenant_requests_total", help: "Keyed /verify and /settle calls at the router by key id, network, action and outcome (ok: valid / settled)", labelNames: ["key", "network", "action", "result"], ...r }),
    tenantGasSpent: new Counter({ name: "x402_tenant_gas_spent_wei_total", help: "Wei of gas charged to keys' gas budgets at the router (what the chain says a settlement cost; its whole reservation while unknown), by key id and network", labelNames: ["key", "network"], ...r }),
    discoveryVerifications: new Counter({ name: "x402_discovery_verifications_total", help: "Bazaar declarations the router checked against the resource's own 402 answer, by result (verified, not_listed, not_402, no_payment_required, unreachable, not_allowed, rejected, skipped, error)", labelNames: ["result"], ...r }),
    screeningChecks: new Counter({ name: "x402_screening_checks_total", help: "Screening verdicts at /verify and /settle by source (deny_list, hook) and result (allowed, denied, unavailable_open, unavailable_closed)", labelNames: ["network", "source", "result"], ...r }),
    // The erc20ApprovalGasSponsoring extension: what payers were funded with, and how sponsored settlements ended.
    gasFunded: new Counter({ name: "x402_settlement_gas_funded_wei_total", help: "Wei of native currency sent to payers to pay for their Permit2 approval (erc20ApprovalGasSponsoring)", labelNames: ["network"], ...r }),
    approvalSponsorings: new Counter({ name: "x402_settlement_approval_sponsorings_total", help: "Sponsored approvals at /settle by result (settled, or the refusal's reason code)", labelNames: ["network", "result"], ...r }),
    httpRequests: new Counter({ name: "x402_http_requests_total", help: "HTTP requests by route and status", labelNames: ["service", "route", "status"], ...r }),
    httpInFlight: new Gauge({ name: "x402_http_requests_in_flight", help: "POST /v2/verify and /v2/settle requests being handled", labelNames: ["service", "route"], ...r }),
    httpShed: new Counter({ name: "x402_http_requests_shed_total", help: "Requests refused with 503 and Retry-After because the process already held its cap of that action (X402_MAX_*_IN_FLIGHT)", labelNames: ["service", "route"], ...r }),
    httpDuration: new Histogram({ name: "x402_http_request_duration_seconds", help: "HTTP request latency", labelNames: ["service", "route"], buckets: LATENCY_BUCKETS, ...r }),
    rpcRequests: new Counter({ name: "x402_rpc_requests_total", help: "JSON-RPC requests by endpoint (host), method and result", labelNames: ["network", "endpoint", "method", "result"], ...r }),
    // Round trips above; calls here, every JSON-RPC call put on the wire, alone or inside a batch, by its own method (what a provider bills per call).
    rpcCalls: new Counter({ name: "x402_rpc_calls_total", help: "JSON-RPC calls sent by endpoint (host) and method, each call of a batch counted by its own method", labelNames: ["network", "endpoint", "method"], ...r }),
    rpcDuration: new Histogram({ name: "x402_rpc_request_duration_seconds", help: "JSON-RPC latency (one HTTP round trip, batches counted once)", labelNames: ["network", "endpoint"], buckets: LATENCY_BUCKETS, ...r }),
    signerBalance: new Gauge({ name: "x402_signer_balance_wei", help: "Native balance of each facilitator signer", labelNames: ["network", "signer"], ...r }),
    signerPending: new Gauge({ name: "x402_signer_pending_transactions", help: "Transactions being sent or awaiting a receipt, per signer", labelNames: ["network", "signer"], ...r }),
    outbox: new Gauge({ name: "x402_settlement_outbox", help: "Settlement outbox entries by state", labelNames: ["network", "state"], ...r }),
    pendingAge: new Gauge({ name: "x402_settlement_pending_age_seconds", help: "Age of the oldest settlement not yet final", labelNames: ["network"], ...r }),
    gasSpent: new Counter({ name: "x402_settlement_gas_spent_wei", help: "Gas fees paid by facilitator signers", labelNames: ["network", "signer"], ...r }),
    reorged: new Counter({ name: "x402_settlement_reorged_total", help: "Mined settlement transactions that left the canonical chain and were sent again", labelNames: ["network"], ...r }),
    reversed: new Counter({ name: "x402_settlement_reversed_total", help: "Recorded successes whose transaction, mined again after a reorg, reverted: the record now says failed", labelNames: ["network"], ...r }),
    // Settlement webhooks (facilitator/settlement/webhooks.ts): target is "facilitator" or "tenant", never a URL.
    webhookDeliveries: new Counter({ name: "x402_webhook_deliveries_total", help: "Webhook delivery attempts by target and result (delivered, failed: retried later, dead: given up after the attempt or age bound)", labelNames: ["network", "target", "result"], ...r }),
    webhookQueue: new Gauge({ name: "x402_webhook_queue", help: "Webhook deliveries not yet delivered or given up", labelNames: ["network"], ...r }),
    webhookOldestDue: new Gauge({ name: "x402_webhook_oldest_due_seconds", help: "How long the longest-waiting due webhook delivery has been due (0: none)", labelNames: ["network"], ...r }),
    broadcastRejected: new Counter({ name: "x402_settlement_broadcast_rejected_total", help: "Broadcasts the node refused, by classified reason", labelNames: ["network", "reason"], ...r }),
    gasCeilingRefused: new Counter({ name: "x402_settlement_gas_ceiling_refused_total", help: "Transactions never signed because their gas was above their kind's ceiling", labelNames: ["network", "kind"], ...r }),
    replacementCapped: new Counter({ name: "x402_settlement_replacement_capped_total", help: "Fee replacements not made because the bump limit or fee cap was reached (the transaction waits)", labelNames: ["network", "limit"], ...r }),
    backendUp: new Gauge({ name: "x402_router_backend_up", help: "1 when the router reaches the network's facilitator", labelNames: ["network"], ...r }),
    reconcileTotal: new Counter({ name: "x402_operator_reconcile_total", help: "Operator reconciles by result", labelNames: ["result"], ...r }),
    reconcileDuration: new Histogram({ name: "x402_operator_reconcile_duration_seconds", help: "Operator reconcile latency", buckets: LATENCY_BUCKETS, ...r }),
    operatorNetworks: new Gauge({ name: "x402_operator_networks", help: "FacilitatorNetworks by condition and status", labelNames: ["condition", "status"], ...r }),
    walletPayments: new Counter({ name: "x402_wallet_payments_total", help: "Wallet service payments by outcome (signed, refused) and refusal code", labelNames: ["network", "scheme", "result", "reason"], ...r }),
    walletDataKeys: new Gauge({ name: "x402_wallet_data_keys", help: "Wallet data keys by the master key that wraps them", labelNames: ["master_key"], ...r }),
    // Read from the process guard at scrape time: the count is per process, every service shows it.
    unhandledErrors: new Counter({
      name: "x402_unhandled_errors_total",
      help: "Unhandled promise rejections and uncaught exceptions caught by the process guard",
      labelNames: ["kind"],
      ...r,
      collect() {
        this.reset();
        for (const [kind, n] of Object.entries(unhandledErrorCounts())) this.inc({ kind }, n);
      },
    }),
  };
}

export type Metrics = ReturnType<typeof createMetrics>;

/**
 * Reason codes as label values: the code before any ":" detail, lower-case snake case, at most
 * 64 characters; anything else (free text from a node, a revert string) becomes "other".
 */
export function reasonLabel(reason: string | undefined): string {
  if (!reason) return "none";
  const code = reason.split(":")[0]!.trim();
  return /^[a-z0-9_]{1,64}$/.test(code) ? code : "other";
}
