// The chart against running services: the router (requiring API keys, so the tenant view has its
// series), the facilitator and the wallet service of a
// real devnet after real payments (a settled one, refused ones), a hub, and the real operator
// (operator/, through its own admin server) reconciling FacilitatorNetworks against a real control
// plane (test/helpers/control-plane.ts; pods Ready through a kwok node).
// - a real Prometheus scrapes them with the labels the chart's monitors attach, and every query of
//   the Grafana dashboards (charts/x402-fleet/dashboards/) returns data;
// - every metric the alerts (the PrometheusRule rendered by helm) select exists on their /metrics
//   with the labels they use (their behaviour: promtool, test/monitoring.test.ts).
// The chart's RBAC is enforced by kube-apiserver itself in test/chart-install.test.ts.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { pino } from "pino";
import { startAdminServer, type RunningAdmin } from "../services/platform/admin.ts";
import { createMetrics } from "../services/platform/metrics.ts";
import { startHubService, type RunningHub } from "../services/hub/service.ts";
import { startOperator, type RunningOperator } from "../operator/operator.ts";
import { startRouterService, type RunningRouter } from "../services/router/service.ts";
import { openDatabase, type Database } from "../services/platform/storage.ts";
import { API_KEY_MIGRATIONS, createApiKeyStore } from "../services/tenants/api-keys.ts";
import { PG_URL } from "./helpers/hub.ts";
import { startTestDevnet } from "./helpers/devnet.ts";
import { devnetRouterTokenFile } from "../services/devnet/devnet.ts";
import { postJson, serviceShape, signEip3009, signPermit2 } from "./helpers/payments.ts";
import { CHART, one, render, type Doc } from "./helpers/helm.ts";
import { checkQuery, parseExposition, type Exposition, type Query } from "./helpers/promql.ts";
import { describeWithPrometheus, startPrometheus, type RunningPrometheus, type ScrapeTarget } from "./helpers/prometheus.ts";
import { startApiProxy, type ApiProxy } from "./helpers/api-proxy.ts";
import { describeWithControlPlane, type ControlPlane } from "./helpers/control-plane.ts";
import { CRD_PATH, clusterOf, condition, until } from "./helpers/cluster.ts";

const NS = "x402-system";
const APPS = "payments";
const silent = pino({ level: "silent" });

let devnet: Awaited<ReturnType<typeof startTestDevnet>> | undefined;
let hub: RunningHub | undefined;
let proxy: ApiProxy | undefined;
let operator: RunningOperator | undefined;
let operatorAdmin: RunningAdmin | undefined;
let keyed: RunningRouter | undefined;
let keysDb: Database | undefined;
let keyId: string | undefined;
let routerPost: ((action: string, body: unknown) => ReturnType<typeof postJson>) | undefined;
let docs: Doc[];
const metrics: Record<string, string> = {};
/** The admin URL (/metrics) of each running service, by the `service` label its series carry. */
const adminUrls: Record<string, string> = {};

const metricsText = async (adminUrl: string) => (await fetch(`${adminUrl}/metrics`)).text();
const has = (text: string, needle: RegExp) => text.split("\n").some((l) => needle.test(l));

/**
 * The devnet, behind a router that requires API keys (the tenant view's series): a settled
 * payment, a refused verify, a refused settle, one whose gas estimate reverts.
 */
async function payOnDevnet() {
  const d = (devnet = await startTestDevnet(["eip155:8453"]));
  keysDb = await openDatabase({ url: PG_URL, migrations: API_KEY_MIGRATIONS });
  const tenant = await createApiKeyStore(keysDb).create("chart-runtime", { gasBudgets: { "eip155:8453": "1000000000000000000" } });
  keyId = tenant.info.id;
  keyed = await startRouterService({ routingTablePath: join(d.dir, "routing.json"), host: "127.0.0.1", port: 0, databaseUrl: PG_URL, apiKeys: true, routerTokenFile: devnetRouterTokenFile(d.dir) }, silent);
  const post = (action: string, body: unknown) => postJson(`${keyed!.url}/${action}`, body, { headers: { authorization: `Bearer ${tenant.key}` } });
  routerPost = post;
  const net = d.info.networks[0]!;
  const asset = net.assets.find((a) => a.transferMethods.includes("eip3009"))!;
  const spec = { network: net.network, chainId: net.chainId, asset, payerKey: d.info.payers[0]!.privateKey, payTo: d.info.receivers[0]!.address, amount: 4242n };
  const ok = serviceShape(spec, await signEip3009(spec));
  expect((await post("verify", ok)).json.isValid).toBe(true);
  expect((await post("settle", ok)).json.success).toBe(true);
  const expired = serviceShape(spec, await signEip3009({ ...spec, auth: { validBefore: 1n } }));
  expect((await post("verify", expired)).json.isValid).toBe(false);
  expect((await post("settle", expired)).json.success).toBe(false);
  // Permit2 from the payer that never approved it: the settlement's gas estimate reverts (a JSON-RPC error answer)
  const permit2 = net.assets.find((a) => a.transferMethods.includes("permit2"))!;
  const unapproved = { ...spec, asset: permit2, payerKey: d.info.payers[1]!.privateKey };
  expect((await post("settle", serviceShape(unapproved, await signPermit2(unapproved)))).json.success).toBe(false);
  // the settlement engine's reconciler exports the outbox gauges: open states every pass (a second), settled ones every 10 s
  metrics.facilitator = await until(async () => {
    const t = await metricsText(net.adminUrl);
    return has(t, /^x402_settlement_outbox\{.*state="confirmed".*\} 1$/) ? t : undefined;
  }, "the outbox gauges", 30_000);
  metrics.router = await metricsText(keyed.adminUrl);
  Object.assign(adminUrls, { facilitator: net.adminUrl, router: keyed.adminUrl, wallets: d.info.walletsAdminUrl! });
  // the devnet's wallet service: a wallet created (a data key wrapped by the master key)
  const created = await fetch(`${d.info.walletsUrl}/v1/wallets`, {
    method: "POST",
    headers: { authorization: `Bearer ${d.info.walletsApiKey}`, "content-type": "application/json" },
    body: JSON.stringify({ label: "chart-runtime" }),
  });
  expect(created.status).toBe(201);
  metrics.wallets = await metricsText(d.info.walletsAdminUrl!);
}

async function runHub() {
  hub = await startHubService({ host: "127.0.0.1", port: 0, logger: silent });
  expect((await fetch(`${hub.url}/api/info`)).status).toBe(200);
  metrics.hub = await metricsText(hub.adminUrl);
  adminUrls.hub = hub.adminUrl;
}

/**
 * The operator, configured as the chart's Deployment configures it (its env), against the real
 * control plane through a proxy: one network becomes Ready, one is Degraded (its Secret is
 * missing), one reconcile fails (a 500 injected by the proxy), a PodDisruptionBudget comes and
 * goes with the replicas, a resource is deleted (finalizer released), and the Lease is released.
 */
async function runOperator(cp: ControlPlane, env: Record<string, string>) {
  const c = clusterOf(cp);
  for (const ns of [NS, APPS]) await c.ensureNamespace(ns);
  const p = (proxy = await startApiProxy(cp.url, cp.caPem));
  const kubeConfig = cp.kubeConfigForToken(cp.adminToken, p.url);
  const registry = createMetrics("operator");
  p.failOnce((method, path) => method === "PATCH" && path.endsWith("/deployments/base-facilitator"));
  operator = await startOperator({
    kubeConfig,
    namespace: NS,
    facilitatorImage: env.X402_FACILITATOR_IMAGE!,
    routingConfigMap: env.X402_ROUTING_CONFIGMAP,
    clusterDomain: env.X402_CLUSTER_DOMAIN,
    leaderElection: { leaseName: env.X402_LEASE_NAME },
    allowPrivateRpc: env.X402_OPERATOR_ALLOW_PRIVATE_RPC === "true", // the devnet's anvil is on loopback
    identity: "fleet-x402-fleet-operator-0",
    metrics: registry,
    logger: silent,
  });
  operatorAdmin = await startAdminServer({ host: "127.0.0.1", port: 0, registry: registry.registry, checks: [], logger: silent });
  adminUrls.operator = operatorAdmin.url;

  const d = devnet!;
  const net = d.info.networks[0]!;
  await c.putSecret(APPS, "base-signer", { "signer-keys": readFileSync(join(d.dir, "keys", `${net.chainId}.key`), "utf8") });
  await c.createNetwork(APPS, "base", { network: net.network, rpc: [{ url: net.rpcUrl }], signerSecretRef: { name: "base-signer" } });
  await c.createNetwork(APPS, "broken", { network: "eip155:84532", rpc: [{ url: "http://127.0.0.1:9/" }], signerSecretRef: { name: "missing-signer" } });
  await until(async () => condition(await c.getNetwork(APPS, "base"), "Ready")?.status === "True", "base Ready", 20_000);
  await until(async () => condition(await c.getNetwork(APPS, "broken"), "Degraded")?.reason === "SignerSecretNotFound", "broken Degraded", 20_000);

  // two replicas (with the shared database they need): a PodDisruptionBudget
  await c.putSecret(APPS, "fleet-db", { url: "postgres://fleet:pw@postgres:5432/fleet" });
  await c.patchNetwork(APPS, "base", { spec: { replicas: 2, database: { urlSecretRef: { name: "fleet-db", key: "url" } } } });
  await until(() => c.policy.readNamespacedPodDisruptionBudget({ namespace: APPS, name: "base-facilitator" }).catch(() => undefined), "the PodDisruptionBudget", 20_000);
  await until(async () => condition(await c.getNetwork(APPS, "base"), "Ready")?.status === "True", "base Ready again", 20_000);
  metrics.operator = await until(async () => {
    const t = await metricsText(operatorAdmin!.url);
    const ready = has(t, /^x402_operator_networks\{.*condition="Ready".*status="True".*\} 1$/) || has(t, /^x402_operator_networks\{condition="Ready",status="True".*\} 1$/);
    return ready && has(t, /^x402_operator_reconcile_total\{result="error"/) && has(t, /^x402_operator_networks\{condition="Degraded",status="True".*\} [1-9]/) ? t : undefined;
  }, "the operator's metrics", 20_000);

  // back to one replica: the PodDisruptionBudget goes; a deleted resource releases its finalizer
  await c.patchNetwork(APPS, "base", { spec: { replicas: 1, database: null } });
  await until(async () => (await c.policy.readNamespacedPodDisruptionBudget({ namespace: APPS, name: "base-facilitator" }).then(() => false, () => true)) || undefined, "the PodDisruptionBudget to go", 20_000);
  await c.deleteNetwork(APPS, "broken");
  await until(async () => (await c.getNetwork(APPS, "broken")) === undefined, "broken to go", 20_000);
  await operator.stop(); // releases the Lease
}

describeWithControlPlane("the chart against running services", { controllers: true, fakeNodes: 1, crds: [CRD_PATH] }, (cp) => {
let chartDocs: Doc[];
beforeAll(async () => {
  chartDocs = render({ namespace: NS, values: { monitoring: { enabled: true }, operator: { allowPrivateRpc: true }, wallets: { enabled: true, masterKeys: { existingSecret: "wallets-master" } } }, apiVersions: ["monitoring.coreos.com/v1/ServiceMonitor"] });
  docs = chartDocs;
  const deployment = one(docs, "Deployment", "fleet-x402-fleet-operator") as Doc & { spec: { template: { spec: { containers: { env: { name: string; value?: string }[] }[] } } } };
  const env = Object.fromEntries(deployment.spec.template.spec.containers[0]!.env.filter((e) => e.value !== undefined).map((e) => [e.name, e.value!]));
  await Promise.all([payOnDevnet(), runHub()]);
  await runOperator(cp(), env);
}, 180_000);

afterAll(async () => {
  await operator?.stop();
  await operatorAdmin?.close();
  await proxy?.close();
  await hub?.close();
  await keyed?.close();
  if (keyId) for (const table of ["tenant_api_keys", "tenant_usage", "tenant_quota_usage", "tenant_gas_budget_usage"]) await keysDb?.query(`DELETE FROM ${table} WHERE ${table === "tenant_api_keys" ? "id" : "key_id"} = $1`, [keyId]);
  await keysDb?.close();
  await devnet?.stop();
});

/** Every PromQL query of the dashboards (panels and template variables) and of the alerts. */
function queries(): Query[] {
  const out: Query[] = [];
  for (const name of ["overview", "settlement", "rpc", "operator", "tenants"]) {
    const dashboard = JSON.parse(readFileSync(join(CHART, "dashboards", `${name}.json`), "utf8")) as {
      panels: { title: string; targets?: { expr: string }[]; panels?: unknown[] }[];
      templating: { list: { name: string; query?: string | { query: string } }[] };
    };
    for (const p of dashboard.panels) for (const t of p.targets ?? []) out.push({ origin: `${name}.json "${p.title}"`, expr: t.expr });
    for (const v of dashboard.templating.list) {
      const q = typeof v.query === "string" ? v.query : v.query?.query;
      if (v.name !== "datasource" && q) out.push({ origin: `${name}.json variable $${v.name}`, expr: q });
    }
  }
  const rule = one(docs, "PrometheusRule", "fleet-x402-fleet") as Doc & { spec: { groups: { rules: { alert: string; expr: string }[] }[] } };
  for (const r of rule.spec.groups.flatMap((g) => g.rules)) out.push({ origin: `alert ${r.alert}`, expr: r.expr });
  return out;
}

const GAS_SPENT = "x402_settlement_gas_spent_wei";

describe("the metrics of the dashboards and alerts, on running services", () => {
  let expositions: Record<string, Exposition>;
  beforeAll(() => {
    expositions = Object.fromEntries(Object.entries(metrics).map(([k, v]) => [k, parseExposition(v)]));
  });

  it("were gathered from the router, the facilitator, the hub, the wallet service and the operator", () => {
    expect(Object.keys(expositions).sort()).toEqual(["facilitator", "hub", "operator", "router", "wallets"]);
    expect(expositions.router!.get("x402_router_backend_up")).toEqual([{ network: "eip155:8453", service: "router" }]);
    expect(expositions.facilitator!.get("x402_settle_total")!.map((s) => s.result).sort()).toEqual(["failure", "failure", "success"]);
    expect(queries().length).toBeGreaterThan(40);
  });

  it("every alert expression selects series that exist, with the labels and label values it uses", () => {
    // Dashboards run on a real Prometheus below; alerts match error series a healthy fleet lacks,
    // so their selectors are read here and their behaviour is unit-tested by promtool.
    const problems = queries().filter((q) => q.origin.startsWith("alert ")).flatMap((q) => checkQuery(q, expositions));
    expect(problems).toEqual([]);
  });

  it(`${GAS_SPENT} is counted for a settlement whose receipt arrives inside /settle`, () => {
    const series = expositions.facilitator!.get(GAS_SPENT) ?? [];
    expect(series.length).toBeGreaterThan(0);
  });

  it("the check itself refuses a misspelt metric, a missing label, a wrong label value and an unknown service", () => {
    const check = (expr: string) => checkQuery({ origin: "test", expr }, expositions);
    expect(check(`sum(rate(x402_settle_totl[5m]))`)).toEqual([expect.stringContaining("x402_settle_totl is not on the /metrics")]);
    expect(check(`sum by (chain) (rate(x402_settle_total[5m]))`)).toEqual([expect.stringContaining(`x402_settle_total has no label "chain"`)]);
    expect(check(`x402_settle_total{result="succeeded"}`)).toEqual([expect.stringContaining(`no x402_settle_total series with result="succeeded"`)]);
    expect(check(`x402_operator_reconcile_duration_seconds_count{service="facilitatr"}`)).toEqual([expect.stringContaining(`service="facilitatr"`)]);
    expect(check(`histogram_quantile(0.5, sum by (le) (rate(x402_verify_duration_seconds_bucket[5m])))`)).toEqual([]);
  });
});

/** A dashboard expression as Grafana would send it: its variables at "all", its intervals fixed. */
function asSent(expr: string): string {
  return expr
    .replace(/\$__rate_interval/g, "1m")
    .replace(/\$__range/g, "1h")
    .replace(/\$\{?[a-zA-Z_]+\}?/g, ".*")
    .replace(/^label_values\(([^,]+),\s*([a-zA-Z_]+)\)$/, "count by ($2) ($1)");
}

describeWithPrometheus("the dashboards and alerts on a real Prometheus scraping those services", (bin) => {
  let prom: RunningPrometheus | undefined;
  let targets: ScrapeTarget[];
  beforeAll(async () => {
    // the target labels the chart's ServiceMonitors (router, hub, wallets), the facilitators'
    // PodMonitor and the operator's PodMonitor attach; honor_labels keeps each series' `service`
    targets = Object.entries(adminUrls).map(([service, url]) => ({
      address: new URL(url).host,
      labels: { namespace: service === "facilitator" ? APPS : NS, pod: `${service}-0`, endpoint: "admin", container: service },
    }));
    prom = await startPrometheus(bin, targets);
    await until(async () => ((await prom!.query("up == 1")).length === targets.length ? true : undefined), "every target scraped", 30_000);
    // traffic while Prometheus watches: rates and latency quantiles then have samples to work on
    const d = devnet!;
    const net = d.info.networks[0]!;
    const asset = net.assets.find((a) => a.transferMethods.includes("eip3009"))!;
    const spec = { network: net.network, chainId: net.chainId, asset, payerKey: d.info.payers[0]!.privateKey, payTo: d.info.receivers[0]!.address, amount: 777n };
    const body = serviceShape(spec, await signEip3009(spec));
    expect((await routerPost!("verify", body)).json.isValid).toBe(true);
    expect((await routerPost!("settle", body)).json.success).toBe(true);
    const expired = serviceShape(spec, await signEip3009({ ...spec, auth: { validBefore: 1n } }));
    expect((await routerPost!("settle", expired)).json.success).toBe(false);
    expect((await fetch(`${hub!.url}/api/info`)).status).toBe(200);
    expect((await fetch(`${d.info.walletsUrl}/v1/info`)).status).toBe(200);
    // every target scraped again after the traffic (each has its own offset in the interval)
    const after = Date.now() / 1000 + 0.5;
    await until(async () => ((await prom!.query(`min(timestamp(up)) > ${after}`)).length > 0 ? true : undefined), "a scrape of every target after the traffic", 30_000);
  }, 90_000);
  afterAll(async () => {
    await prom?.stop();
  });

  it("scrapes every service; the series keep their own `service` label beside the target labels", async () => {
    const up = await prom!.query("up");
    expect(up.map((s) => s.value[1])).toEqual(targets.map(() => "1"));
    const services = await prom!.query("count by (service) ({__name__=~\"x402_.+\"})");
    expect(services.map((s) => s.metric.service).sort()).toEqual(["facilitator", "hub", "operator", "router", "wallets"]);
  });

  it("every dashboard panel and variable query returns data", async () => {
    const empty: string[] = [];
    // (alerts select error series a healthy fleet does not have: promtool unit-tests them, test/monitoring.test.ts)
    for (const q of queries().filter((x) => !x.origin.startsWith("alert "))) {
      const expr = asSent(q.expr);
      const result = await prom!.query(expr);
      if (result.length === 0) empty.push(`${q.origin}: ${expr}`);
    }
    expect(empty).toEqual([]);
  });

  it("the RPC transport error ratio of a healthy endpoint is 0, not No data", async () => {
    const rpc = JSON.parse(readFileSync(join(CHART, "dashboards", "rpc.json"), "utf8")) as { panels: { title: string; targets?: { expr: string }[] }[] };
    const panel = rpc.panels.find((p) => p.title === "Transport error ratio")!;
    const result = await prom!.query(asSent(panel.targets![0]!.expr));
    expect(result.length).toBeGreaterThan(0);
    for (const s of result) expect(Number(s.value[1])).toBe(0);
  });

  it("the check itself: a misspelt metric or label value returns nothing", async () => {
    expect(await prom!.query(asSent("sum(rate(x402_settle_totl[$__rate_interval]))"))).toEqual([]);
    expect(await prom!.query('x402_settle_total{result="succeeded"}')).toEqual([]);
  });
});
});
