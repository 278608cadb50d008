// The Grafana dashboards of charts/x402-fleet/dashboards/, written from this file:
//   npx tsx scripts/dashboards.ts            (rewrites the JSON files)
// test/chart-observability.test.ts checks that the committed JSON is what this file produces and
// that every metric a query names exists on the /metrics of running services. Metric names and
// labels are the catalogue of services/platform/metrics.ts (docs/metrics.md).
//
// Gauges that every replica of a network exports from the shared store (outbox, pending age,
// signer balances) are reduced with max, never summed.
import { writeFileSync } from "node:fs";
import { fileURLToPath } from "node:url";

export const DASHBOARD_DIR = fileURLToPath(new URL("../charts/x402-fleet/dashboards/", import.meta.url));

type Unit = "reqps" | "ops" | "percentunit" | "s" | "short" | "none";

interface Target {
  expr: string;
  legend?: string;
  instant?: boolean;
}

interface PanelSpec {
  title: string;
  description: string;
  type?: "timeseries" | "stat" | "table" | "bargauge";
  unit?: Unit;
  targets: Target[];
  width?: number;
  height?: number;
  stack?: boolean;
  decimals?: number;
  thresholds?: { color: string; value: number | null }[];
}

interface Row {
  row: string;
  panels: PanelSpec[];
}

const DS = { type: "prometheus", uid: "${datasource}" };
const RATE = "$__rate_interval";

function panel(spec: PanelSpec, id: number, gridPos: { x: number; y: number; w: number; h: number }) {
  const type = spec.type ?? "timeseries";
  const base = {
    id,
    type,
    title: spec.title,
    description: spec.description,
    datasource: DS,
    gridPos,
    targets: spec.targets.map((t, i) => ({
      refId: String.fromCharCode(65 + i),
      datasource: DS,
      expr: t.expr,
      legendFormat: t.legend ?? "__auto",
      range: !t.instant,
      instant: Boolean(t.instant),
      ...(type === "table" ? { format: "table" } : {}),
    })),
    fieldConfig: {
      defaults: {
        unit: spec.unit ?? "short",
        ...(spec.decimals !== undefined ? { decimals: spec.decimals } : {}),
        ...(spec.thresholds ? { thresholds: { mode: "absolute", steps: spec.thresholds } } : {}),
        ...(type === "timeseries" ? { custom: { drawStyle: "line", lineWidth: 1, fillOpacity: spec.stack ? 30 : 10, showPoints: "never", stacking: { mode: spec.stack ? "normal" : "none", group: "A" } } } : {}),
      },
      overrides: [],
    },
    options:
      type === "timeseries"
        ? { legend: { displayMode: "table", placement: "bottom", showLegend: true, calcs: ["lastNotNull", "max"] }, tooltip: { mode: "multi", sort: "desc" } }
        : type === "stat"
          ? { reduceOptions: { calcs: ["lastNotNull"], fields: "", values: false }, colorMode: "background", graphMode: "none", textMode: "auto", justifyMode: "auto", orientation: "auto" }
          : type === "bargauge"
            ? { reduceOptions: { calcs: ["lastNotNull"], fields: "", values: false }, displayMode: "basic", orientation: "horizontal", showUnfilled: true }
            : { showHeader: true, sortBy: [{ displayName: "Value", desc: true }] },
    ...(type === "table" ? { transformations: [{ id: "organize", options: { excludeByName: { Time: true } } }] } : {}),
  };
  return base;
}

function variable(name: string, label: string, query: string) {
  return {
    name,
    label,
    type: "query",
    datasource: DS,
    query: { query, refId: `${name}-query` },
    definition: query,
    refresh: 2,
    includeAll: true,
    multi: true,
    allValue: ".*",
    current: { selected: true, text: ["All"], value: ["$__all"] },
    sort: 1,
    hide: 0,
  };
}

const datasourceVariable = {
  name: "datasource",
  label: "Data source",
  type: "datasource",
  query: "prometheus",
  current: {},
  refresh: 1,
  hide: 0,
};

function dashboard(opts: { uid: string; title: string; description: string; variables: object[]; rows: Row[] }) {
  const panels: object[] = [];
  let id = 1;
  let y = 0;
  for (const row of opts.rows) {
    panels.push({ id: id++, type: "row", title: row.row, collapsed: false, gridPos: { x: 0, y, w: 24, h: 1 }, panels: [] });
    y += 1;
    let x = 0;
    let rowHeight = 0;
    for (const spec of row.panels) {
      const w = spec.width ?? 12;
      const h = spec.height ?? 8;
      if (x + w > 24) {
        x = 0;
        y += rowHeight;
        rowHeight = 0;
      }
      panels.push(panel(spec, id++, { x, y, w, h }));
      x += w;
      rowHeight = Math.max(rowHeight, h);
    }
    y += rowHeight;
  }
  return {
    uid: opts.uid,
    title: opts.title,
    description: opts.description,
    tags: ["x402-fleet"],
    editable: true,
    graphTooltip: 1,
    timezone: "browser",
    refresh: "30s",
    schemaVersion: 39,
    version: 1,
    time: { from: "now-6h", to: "now" },
    annotations: { list: [] },
    links: [{ title: "x402-fleet", type: "dashboards", tags: ["x402-fleet"], asDropdown: true, includeVars: true, keepTime: true }],
    templating: { list: [datasourceVariable, ...opts.variables] },
    panels,
  };
}

const N = `network=~"$network"`;
const quantiles = (metric: string, by: string, filter: string) => [
  { expr: `histogram_quantile(0.5, sum by (le, ${by}) (rate(${metric}_bucket{${filter}}[${RATE}])))`, legend: `p50 ${by.split(", ").map((l) => `{{${l}}}`).join(" ")}` },
  { expr: `histogram_quantile(0.99, sum by (le, ${by}) (rate(${metric}_bucket{${filter}}[${RATE}])))`, legend: `p99 ${by.split(", ").map((l) => `{{${l}}}`).join(" ")}` },
];

export function overview() {
  return dashboard({
    uid: "x402-fleet-overview",
    title: "x402-fleet / Fleet overview",
    description: "Verify and settle rates, success ratios and latency by network and scheme; top failure reasons; the router and the hub.",
    variables: [variable("network", "Network", "label_values(x402_verify_total, network)")],
    rows: [
      {
        row: "Payments",
        panels: [
          {
            title: "Verify rate",
            description: "POST /v2/verify handled by the facilitators, per second.",
            unit: "reqps",
            targets: [{ expr: `sum by (network, scheme) (rate(x402_verify_total{${N}}[${RATE}]))`, legend: "{{network}} {{scheme}}" }],
          },
          {
            title: "Settle rate",
            description: "POST /v2/settle handled by the facilitators, per second.",
            unit: "reqps",
            targets: [{ expr: `sum by (network, scheme) (rate(x402_settle_total{${N}}[${RATE}]))`, legend: "{{network}} {{scheme}}" }],
          },
          {
            title: "Verify success ratio",
            description: "Share of verifications answered isValid=true. Invalid payments are mostly the payer's doing: see the reasons below.",
            unit: "percentunit",
            targets: [
              {
                expr: `sum by (network, scheme) (rate(x402_verify_total{${N}, result="valid"}[${RATE}])) / sum by (network, scheme) (rate(x402_verify_total{${N}}[${RATE}]))`,
                legend: "{{network}} {{scheme}}",
              },
            ],
          },
          {
            title: "Settle success ratio",
            description: "Share of settlements answered success=true (pending ones count as not yet successful).",
            unit: "percentunit",
            targets: [
              {
                expr: `sum by (network, scheme) (rate(x402_settle_total{${N}, result="success"}[${RATE}])) / sum by (network, scheme) (rate(x402_settle_total{${N}}[${RATE}]))`,
                legend: "{{network}} {{scheme}}",
              },
            ],
          },
          { title: "Verify latency p50 / p99", description: "Facilitator verification latency.", unit: "s", targets: quantiles("x402_verify_duration_seconds", "network, scheme", N) },
          { title: "Settle latency p50 / p99", description: "Facilitator settlement latency, bounded receipt wait included.", unit: "s", targets: quantiles("x402_settle_duration_seconds", "network, scheme", N) },
        ],
      },
      {
        row: "Failures",
        panels: [
          {
            title: "Top verify failure reasons",
            description: "Invalid verifications over the dashboard's range, by reason code (as in @x402/evm).",
            type: "table",
            targets: [{ expr: `topk(10, sum by (network, scheme, reason) (increase(x402_verify_total{${N}, result="invalid"}[$__range])))`, instant: true }],
          },
          {
            title: "Top settle failure reasons",
            description: "Failed and pending settlements over the dashboard's range, by result and reason code.",
            type: "table",
            targets: [{ expr: `topk(10, sum by (network, scheme, result, reason) (increase(x402_settle_total{${N}, result!="success"}[$__range])))`, instant: true }],
          },
        ],
      },
      {
        row: "Router and hub",
        panels: [
          {
            title: "Router requests",
            description: "Requests at the public edge by route and HTTP status.",
            unit: "reqps",
            stack: true,
            targets: [{ expr: `sum by (route, status) (rate(x402_http_requests_total{service="router"}[${RATE}]))`, legend: "{{route}} {{status}}" }],
          },
          {
            title: "Router backends up",
            description: "1 when every router replica reaches the network's facilitator (probed every 5 s); 0 means /verify and /settle for it answer 503.",
            type: "stat",
            width: 12,
            thresholds: [
              { color: "red", value: null },
              { color: "green", value: 1 },
            ],
            targets: [{ expr: `min by (network) (x402_router_backend_up{${N}})`, legend: "{{network}}", instant: true }],
          },
          { title: "Router latency p50 / p99", description: "Latency at the edge, forwarding included.", unit: "s", targets: quantiles("x402_http_request_duration_seconds", "route", `service="router"`) },
          {
            title: "Hub requests",
            description: "Requests to the hub by route and HTTP status.",
            unit: "reqps",
            stack: true,
            targets: [{ expr: `sum by (route, status) (rate(x402_http_requests_total{service="hub"}[${RATE}]))`, legend: "{{route}} {{status}}" }],
          },
        ],
      },
      {
        row: "Wallets",
        panels: [
          {
            title: "Wallet service requests",
            description: "Requests to the custodial wallet service (wallets.enabled) by route and HTTP status; 5xx feed X402WalletsServerErrors.",
            unit: "reqps",
            stack: true,
            targets: [{ expr: `sum by (route, status) (rate(x402_http_requests_total{service="wallets"}[${RATE}]))`, legend: "{{route}} {{status}}" }],
          },
          {
            title: "Wallet data keys by master key",
            description: "Data keys wrapped by each master key; after a rotation the old key's count falls to 0 as keys are rewrapped (\"unloaded\": a key no longer in the Secret).",
            targets: [{ expr: `max by (master_key) (x402_wallet_data_keys)`, legend: "{{master_key}}" }],
          },
        ],
      },
    ],
  });
}

export function settlement() {
  return dashboard({
    uid: "x402-fleet-settlement",
    title: "x402-fleet / Settlement",
    description: "The settlement engine (docs/settlement.md): outcomes, outbox states, pending age, signer balances and pending transactions per key, gas spent.",
    variables: [variable("network", "Network", "label_values(x402_signer_balance_wei, network)")],
    rows: [
      {
        row: "Outcomes",
        panels: [
          {
            title: "Settlements by result",
            description: "success, failure, and pending (the receipt wait ran out; the reconciler drives the transaction on).",
            unit: "ops",
            stack: true,
            targets: [{ expr: `sum by (network, result) (rate(x402_settle_total{${N}}[${RATE}]))`, legend: "{{network}} {{result}}" }],
          },
          {
            title: "Oldest settlement not yet final",
            description: "Age of the oldest outbox transaction without a final receipt. Alert X402SettlementPendingTooLong.",
            unit: "s",
            targets: [{ expr: `max by (network) (x402_settlement_pending_age_seconds{${N}})`, legend: "{{network}}" }],
          },
          {
            title: "Outbox by state",
            description: "signed (stored, not yet broadcast), broadcast (awaiting a receipt), confirmed, reverted, dropped.",
            stack: true,
            targets: [{ expr: `max by (network, state) (x402_settlement_outbox{${N}})`, legend: "{{network}} {{state}}" }],
          },
          {
            title: "Pending transactions per key",
            description: "Transactions being sent or awaiting a receipt, per signer key. One stuck transaction holds every later one of its key.",
            targets: [{ expr: `max by (network, signer) (x402_signer_pending_transactions{${N}})`, legend: "{{network}} {{signer}}" }],
          },
        ],
      },
      {
        row: "Signers and gas",
        panels: [
          {
            title: "Signer balances",
            description: "Native balance of each signer key, in whole coins (wei / 1e18), refreshed every 15 s. Alert X402SignerBalanceLow.",
            unit: "none",
            decimals: 4,
            targets: [{ expr: `max by (network, signer) (x402_signer_balance_wei{${N}}) / 1e18`, legend: "{{network}} {{signer}}" }],
          },
          {
            title: "Gas spent",
            description: "Fees paid by each signer key over the dashboard's range, in whole coins (wei / 1e18).",
            type: "table",
            targets: [{ expr: `sum by (network, signer) (increase(x402_settlement_gas_spent_wei{${N}}[$__range])) / 1e18`, instant: true }],
          },
          {
            title: "Gas spend rate",
            description: "Fees paid per second by network, in whole coins (wei / 1e18).",
            unit: "none",
            targets: [{ expr: `sum by (network) (rate(x402_settlement_gas_spent_wei{${N}}[${RATE}])) / 1e18`, legend: "{{network}}" }],
          },
          { title: "Settle latency p50 / p99", description: "Until the answer, bounded receipt wait included.", unit: "s", targets: quantiles("x402_settle_duration_seconds", "network", N) },
        ],
      },
    ],
  });
}

export function rpc() {
  const E = `${N}, endpoint=~"$endpoint"`;
  return dashboard({
    uid: "x402-fleet-rpc",
    title: "x402-fleet / RPC health",
    description: "JSON-RPC round trips per endpoint (named by host and port, never by URL): rate, errors, latency.",
    variables: [
      variable("network", "Network", "label_values(x402_rpc_requests_total, network)"),
      variable("endpoint", "Endpoint", `label_values(x402_rpc_requests_total{network=~"$network"}, endpoint)`),
    ],
    rows: [
      {
        row: "Per endpoint",
        panels: [
          {
            title: "Requests",
            description: "JSON-RPC round trips per endpoint (a batch counts once).",
            unit: "reqps",
            targets: [{ expr: `sum by (network, endpoint) (rate(x402_rpc_requests_total{${E}}[${RATE}]))`, legend: "{{network}} {{endpoint}}" }],
          },
          {
            title: "Transport error ratio",
            description: "Timeouts, connection errors and HTTP errors over all requests. Alert X402RpcErrorRatioHigh.",
            unit: "percentunit",
            targets: [
              {
                // "or 0 * total": an endpoint without a single transport error shows 0, not "No data"
                expr: `(sum by (network, endpoint) (rate(x402_rpc_requests_total{${E}, result!~"ok|rpc_error"}[${RATE}])) or 0 * sum by (network, endpoint) (rate(x402_rpc_requests_total{${E}}[${RATE}]))) / sum by (network, endpoint) (rate(x402_rpc_requests_total{${E}}[${RATE}]))`,
                legend: "{{network}} {{endpoint}}",
              },
            ],
          },
          { title: "Latency p50 / p99", description: "One HTTP round trip to the endpoint.", unit: "s", targets: quantiles("x402_rpc_request_duration_seconds", "network, endpoint", E) },
          {
            title: "Results",
            description: "ok; rpc_error (the node answered with a JSON-RPC error, e.g. a revert in a simulation); http_<status>; error (no answer).",
            unit: "reqps",
            stack: true,
            targets: [{ expr: `sum by (endpoint, result) (rate(x402_rpc_requests_total{${E}}[${RATE}]))`, legend: "{{endpoint}} {{result}}" }],
          },
        ],
      },
      {
        row: "Per method",
        panels: [
          {
            title: "Calls by method",
            description: "Which JSON-RPC methods the facilitators call: every call, alone or inside a batch (the requests panels count round trips, a batch once).",
            unit: "reqps",
            stack: true,
            targets: [{ expr: `sum by (method) (rate(x402_rpc_calls_total{${E}}[${RATE}]))`, legend: "{{method}}" }],
          },
          {
            title: "JSON-RPC error answers by method",
            description: "Requests the node answered with a JSON-RPC error.",
            unit: "reqps",
            targets: [{ expr: `sum by (endpoint, method) (rate(x402_rpc_requests_total{${E}, result="rpc_error"}[${RATE}]))`, legend: "{{endpoint}} {{method}}" }],
          },
        ],
      },
    ],
  });
}

export function operator() {
  const OP = `service="operator"`;
  return dashboard({
    uid: "x402-fleet-operator",
    title: "x402-fleet / Operator",
    description: "The FacilitatorNetwork controller: reconciles, their latency, and the networks by condition. Only the leader reconciles.",
    variables: [],
    rows: [
      {
        row: "Networks",
        panels: [
          {
            title: "Networks Ready",
            description: "FacilitatorNetworks whose Ready condition is True: they are in the routing table.",
            type: "stat",
            width: 8,
            thresholds: [{ color: "blue", value: null }],
            targets: [{ expr: `max(x402_operator_networks{condition="Ready", status="True"})`, instant: true }],
          },
          {
            title: "Networks not Ready",
            description: "Ready=False or Unknown: not routed. kubectl get fnet -A shows the reason. Alert X402NetworkNotReady.",
            type: "stat",
            width: 8,
            thresholds: [
              { color: "green", value: null },
              { color: "red", value: 1 },
            ],
            targets: [{ expr: `sum(max by (status) (x402_operator_networks{condition="Ready", status!="True"}))`, instant: true }],
          },
          {
            title: "Networks Degraded",
            description: "Degraded=True: something needs a human (a missing Secret, a wrong chain id, ...).",
            type: "stat",
            width: 8,
            thresholds: [
              { color: "green", value: null },
              { color: "orange", value: 1 },
            ],
            targets: [{ expr: `max(x402_operator_networks{condition="Degraded", status="True"})`, instant: true }],
          },
          {
            title: "Networks by condition",
            description: "How many FacilitatorNetworks are in each condition state.",
            width: 24,
            targets: [{ expr: `max by (condition, status) (x402_operator_networks)`, legend: "{{condition}}={{status}}" }],
          },
        ],
      },
      {
        row: "Reconciles",
        panels: [
          {
            title: "Reconciles by result",
            description: "done, requeue, backoff (blocked inputs, retried with backoff), conflict (409, retried), error. Alert X402OperatorReconcileErrors.",
            unit: "ops",
            stack: true,
            targets: [{ expr: `sum by (result) (rate(x402_operator_reconcile_total[${RATE}]))`, legend: "{{result}}" }],
          },
          { title: "Reconcile latency p50 / p99", description: "One reconcile pass.", unit: "s", targets: quantiles("x402_operator_reconcile_duration_seconds", "service", OP) },
        ],
      },
    ],
  });
}

export function tenants() {
  const K = `network=~"$network", key=~"$key"`;
  return dashboard({
    uid: "x402-fleet-tenants",
    title: "x402-fleet / Tenants",
    description: "Resource servers calling the router with API keys (docs/tenants.md): their requests, refusals and the gas their settlements cost, per key id.",
    variables: [variable("network", "Network", "label_values(x402_tenant_requests_total, network)"), variable("key", "API key", "label_values(x402_tenant_requests_total, key)")],
    rows: [
      {
        row: "Requests per key",
        panels: [
          {
            title: "Keyed requests",
            description: "/verify and /settle calls a facilitator answered, per key id and action.",
            unit: "reqps",
            stack: true,
            targets: [{ expr: `sum by (key, action) (rate(x402_tenant_requests_total{${K}}[${RATE}]))`, legend: "{{key}} {{action}}" }],
          },
          {
            title: "Refusals per key",
            description: "Calls refused: invalid or failed payments (refused) and settlements refused before forwarding because the key's gas budget was spent (gas_budget_exhausted).",
            unit: "reqps",
            stack: true,
            targets: [{ expr: `sum by (key, result) (rate(x402_tenant_requests_total{${K}, result!="ok"}[${RATE}]))`, legend: "{{key}} {{result}}" }],
          },
          {
            title: "Settled per key",
            description: "Successful settlements per key over the dashboard's range (for billing, `x402-fleet api-key-usage` has the volume per asset).",
            type: "table",
            targets: [{ expr: `sum by (key, network) (increase(x402_tenant_requests_total{${K}, action="settle", result="ok"}[$__range]))`, instant: true }],
          },
        ],
      },
      {
        row: "Gas per key",
        panels: [
          {
            title: "Gas charged per key",
            description: "Gas charged to each key's budget over the dashboard's range, in whole coins (wei / 1e18): the receipts' cost, a settlement's whole reservation while its cost is unknown.",
            type: "table",
            targets: [{ expr: `sum by (key, network) (increase(x402_tenant_gas_spent_wei_total{${K}}[$__range])) / 1e18`, instant: true }],
          },
          {
            title: "Gas spend rate per key",
            description: "Gas charged per second, in whole coins (wei / 1e18), per key and network.",
            unit: "none",
            targets: [{ expr: `sum by (key, network) (rate(x402_tenant_gas_spent_wei_total{${K}}[${RATE}])) / 1e18`, legend: "{{key}} {{network}}" }],
          },
        ],
      },
    ],
  });
}

export const DASHBOARDS: Record<string, () => object> = { overview, settlement, rpc, operator, tenants };

export function renderDashboard(name: string): string {
  return `${JSON.stringify(DASHBOARDS[name]!(), null, 2)}\n`;
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  for (const name of Object.keys(DASHBOARDS)) {
    writeFileSync(`${DASHBOARD_DIR}${name}.json`, renderDashboard(name));
    process.stdout.write(`wrote ${DASHBOARD_DIR}${name}.json\n`);
  }
}
