// The chart's alerts, unit-tested by promtool (Prometheus's own rule evaluator): every alert of the
// PrometheusRule, rendered by helm with the defaults and the wallet service on, fires on the series
// of test/monitoring/alerts.promtool.yaml with exactly the labels and annotations written there,
// and stays silent where it must. The dashboards' queries run on a real Prometheus in
// test/chart-runtime.test.ts.
import { copyFileSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { afterAll, expect, it } from "vitest";
import { parse as parseYaml, stringify as toYaml } from "yaml";
import { one, render, type RenderOptions } from "./helpers/helm.ts";
import { describeWithPrometheus, promtool } from "./helpers/prometheus.ts";

const UNIT_TESTS = fileURLToPath(new URL("./monitoring/alerts.promtool.yaml", import.meta.url));
const MONITORING_API = "monitoring.coreos.com/v1/ServiceMonitor";
const dirs: string[] = [];
afterAll(() => dirs.forEach((d) => rmSync(d, { recursive: true, force: true })));

/** A directory with the rendered rules as a Prometheus rule file and the unit tests beside it. */
function workspace(values: RenderOptions["values"]): string {
  const rule = one(render({ values, apiVersions: [MONITORING_API] }), "PrometheusRule", "fleet-x402-fleet") as unknown as { spec: { groups: unknown[] } };
  const dir = mkdtempSync(join(tmpdir(), "x402-rules-"));
  dirs.push(dir);
  writeFileSync(join(dir, "rules.yaml"), toYaml({ groups: rule.spec.groups }));
  copyFileSync(UNIT_TESTS, join(dir, "alerts.promtool.yaml"));
  return dir;
}

const withWallets = { monitoring: { enabled: true }, wallets: { enabled: true, masterKeys: { existingSecret: "wallets-master" } } };

describeWithPrometheus("the chart's alerts under promtool", (bin) => {
  it("are valid rules", () => {
    const r = promtool(bin, ["check", "rules", "rules.yaml"], workspace(withWallets));
    expect(r.output).toContain("SUCCESS: 9 rules found");
    expect(r.status).toBe(0);
  });

  it("fire and stay silent exactly as the unit tests say, every alert covered", () => {
    const dir = workspace(withWallets);
    const rules = (parseYaml(readFileSync(join(dir, "rules.yaml"), "utf8")) as { groups: { rules: { alert: string }[] }[] }).groups.flatMap((g) => g.rules.map((r) => r.alert));
    const cases = (parseYaml(readFileSync(UNIT_TESTS, "utf8")) as { tests: { alert_rule_test: { alertname: string; exp_alerts: unknown[] }[] }[] }).tests.flatMap((t) => t.alert_rule_test);
    expect(new Set(cases.filter((c) => c.exp_alerts.length > 0).map((c) => c.alertname))).toEqual(new Set(rules)); // each fires somewhere
    const r = promtool(bin, ["test", "rules", "alerts.promtool.yaml"], dir);
    expect(r.output).toContain("SUCCESS");
    expect(r.status).toBe(0);
  });

  it("the check itself: a changed threshold or a broken annotation fails the unit tests", () => {
    const threshold = promtool(bin, ["test", "rules", "alerts.promtool.yaml"], workspace({ ...withWallets, monitoring: { enabled: true, rules: { settlementFailureRatio: 0.6 } } }));
    expect(threshold.status).not.toBe(0);
    expect(threshold.output).toContain("X402SettlementFailureRatioHigh");
    const pending = promtool(bin, ["test", "rules", "alerts.promtool.yaml"], workspace({ ...withWallets, monitoring: { enabled: true, rules: { settlementPendingSeconds: 900 } } }));
    expect(pending.status).not.toBe(0);
    expect(pending.output).toContain("X402SettlementPendingTooLong");
  });
});
