// A real Prometheus and promtool for the monitoring suites, built by scripts/build-prometheus.sh
// (or found in PROMETHEUS_BIN_DIR). Like the control plane: with CI=true a missing build fails the
// suite; elsewhere the suite is skipped with one line saying how to enable it.
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { describe, it } from "vitest";
import { stringify as toYaml } from "yaml";

const BUILD_SCRIPT = fileURLToPath(new URL("../../scripts/build-prometheus.sh", import.meta.url));
const HOW_TO_ENABLE = "build it with scripts/build-prometheus.sh (Go 1.26, ~10 min cold) or set PROMETHEUS_BIN_DIR";

/** The directory holding prometheus and promtool, or why there is none. */
export function prometheusBinaries(): { dir: string } | { missing: string } {
  const r = spawnSync("bash", [BUILD_SCRIPT, "--print-dir"], { encoding: "utf8", env: process.env });
  if (r.status !== 0) return { missing: r.stderr.trim().split("\n").pop() || `${BUILD_SCRIPT} failed` };
  const dir = r.stdout.trim().split("\n").pop()!;
  if (!existsSync(join(dir, "prometheus")) || !existsSync(join(dir, "promtool"))) return { missing: `${dir} is not built` };
  return { dir };
}

/** describe() when Prometheus is there; a failing test on CI without it; a skip with a hint elsewhere. */
export function describeWithPrometheus(name: string, body: (bin: string) => void): void {
  const found = prometheusBinaries();
  if ("dir" in found) {
    describe(name, () => body(found.dir));
    return;
  }
  const why = `${name}: no Prometheus (${found.missing}); ${HOW_TO_ENABLE}`;
  if (process.env.CI === "true") {
    describe(name, () => it("has Prometheus (CI=true)", () => void assertNever(why)));
    return;
  }
  console.warn(`skipped ${why}`);
  describe.skip(name, () => body(""));
}

function assertNever(why: string): never {
  throw new Error(why);
}

/** `promtool <args>` in `cwd`: its exit status and everything it printed. */
export function promtool(bin: string, args: string[], cwd: string): { status: number | null; output: string } {
  const r = spawnSync(join(bin, "promtool"), args, { cwd, encoding: "utf8" });
  return { status: r.status, output: `${r.stdout}${r.stderr}` };
}

export interface ScrapeTarget {
  /** host:port of an admin server (its /metrics). */
  address: string;
  /** Target labels, as the chart's ServiceMonitors and PodMonitors attach them. */
  labels: Record<string, string>;
}

export interface RunningPrometheus {
  url: string;
  /** An instant query: the result vector (empty when nothing matches). */
  query(expr: string): Promise<{ metric: Record<string, string>; value: [number, string] }[]>;
  stop(): Promise<void>;
}

async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const port = (s.address() as { port: number }).port;
      s.close(() => resolve(port));
    });
  });
}

/**
 * Prometheus scraping the targets every second with honor_labels (as the chart's monitors do: the
 * `service` label of every x402-fleet series survives), on a throwaway TSDB.
 */
export async function startPrometheus(bin: string, targets: ScrapeTarget[]): Promise<RunningPrometheus> {
  const dir = mkdtempSync(join(tmpdir(), "x402-prometheus-"));
  const config = {
    global: { scrape_interval: "1s", evaluation_interval: "1s" },
    scrape_configs: [{ job_name: "x402-fleet", honor_labels: true, scrape_timeout: "1s", static_configs: targets.map((t) => ({ targets: [t.address], labels: t.labels })) }],
  };
  writeFileSync(join(dir, "prometheus.yml"), toYaml(config));
  const port = await freePort();
  const child: ChildProcess = spawn(
    join(bin, "prometheus"),
    [`--config.file=${join(dir, "prometheus.yml")}`, `--storage.tsdb.path=${join(dir, "data")}`, `--web.listen-address=127.0.0.1:${port}`, "--log.level=warn"],
    { stdio: ["ignore", "ignore", "pipe"] },
  );
  let log = "";
  child.stderr!.on("data", (d: Buffer) => (log = (log + d.toString()).slice(-4000)));
  const url = `http://127.0.0.1:${port}`;
  const deadline = Date.now() + 30_000;
  for (;;) {
    if (child.exitCode !== null) throw new Error(`prometheus exited (${child.exitCode}): ${log}`);
    const ready = await fetch(`${url}/-/ready`).then((r) => r.ok, () => false);
    if (ready) break;
    if (Date.now() > deadline) throw new Error(`prometheus did not become ready: ${log}`);
    await new Promise((r) => setTimeout(r, 200));
  }
  return {
    url,
    async query(expr) {
      const res = await fetch(`${url}/api/v1/query?${new URLSearchParams({ query: expr })}`);
      const body = (await res.json()) as { status: string; error?: string; data?: { resultType: string; result: { metric: Record<string, string>; value: [number, string] }[] } };
      if (body.status !== "success") throw new Error(`query failed: ${body.error} — ${expr}`);
      return body.data!.resultType === "vector" ? body.data!.result : [];
    },
    async stop() {
      if (child.exitCode === null) {
        const exited = new Promise((r) => child.once("exit", r));
        child.kill("SIGTERM");
        await exited;
      }
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
