// A NetworkPolicy engine for a real node (test/helpers/node.ts): kube-network-policies
// (sigs.k8s.io/kube-network-policies, built by scripts/build-network-policies.sh), run on this host
// beside kube-proxy as a node's network plugin would run it. The first packet of every new
// connection to or from one of the node's pods goes to an nfqueue, where the engine judges it
// against the NetworkPolicies (pods and namespaces from the API server) and accepts or drops it: a
// refused connection times out. Never judged, as upstream does it: traffic from a root process of
// this host (kubelet probes, this test process), connections established before a policy appears.
//
// Upstream sends packets to its queue from an nftables table of its own, with nft's queue
// expression; a kernel without it (CONFIG_NFT_QUEUE unset, as on this project's machine: nft
// answers "No such file or directory") refuses that table. Then the packets go to the same queue
// through an xtables NFQUEUE rule (iptables, nf_tables backend: chain X402-NETPOL in `ip mangle`,
// at postrouting, before kube-proxy's masquerade, after its DNAT), for the pod subnet's new
// connections except root's, and the verdicts are still the engine's. Whichever it is, it is
// removed at stop (with `ip mangle` itself when this helper created it), checked with `nft list
// tables`. The queue number is fixed: one engine per host at a time. Needs root, nf_tables,
// nfnetlink_queue and, without nft's queue, iptables with the NFQUEUE target.
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { createWriteStream, existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { freePort } from "../../services/devnet/anvil.ts";
import type { ControlPlane } from "./control-plane.ts";
import type { RealNode } from "./node.ts";
import { until } from "./wait.ts";

const BUILD_SCRIPT = fileURLToPath(new URL("../../scripts/build-network-policies.sh", import.meta.url));
const HOW_TO_ENABLE = "build it with scripts/build-network-policies.sh (kube-network-policies from its Go module, ~7 min cold)";
const QUEUES = "/proc/net/netfilter/nfnetlink_queue";
/** Upstream's own nftables table (kept only where the kernel takes it). */
const UPSTREAM_TABLE = "kube-network-policies";
const QUEUE_ID = 100;
const CHAIN = "X402-NETPOL";

/** The built engine, or why it cannot run here. */
export function networkPolicyBinary(): { path: string } | { missing: string } {
  const r = spawnSync("bash", [BUILD_SCRIPT, "--print-dir"], { encoding: "utf8", env: process.env });
  if (r.status !== 0) return { missing: r.stderr.trim().split("\n").pop() || `${BUILD_SCRIPT} failed` };
  const dir = r.stdout.trim().split("\n").pop()!;
  if (!existsSync(join(dir, ".complete"))) return { missing: `${dir} is not built` };
  if (!existsSync(QUEUES)) return { missing: `the kernel has no nfnetlink_queue (${QUEUES})` };
  if (spawnSync("sh", ["-c", "command -v nft"]).status !== 0) return { missing: "nft is not installed" };
  if (!nftQueue() && spawnSync("sh", ["-c", "command -v iptables"]).status !== 0) return { missing: "the kernel has no nft queue expression and iptables is not installed" };
  return { path: join(dir, "kube-network-policies") };
}

/**
 * Whether the tests that need the engine run. With CI=true a missing engine is a failure (`fail`,
 * thrown by the test); otherwise they are skipped with one line.
 */
export function networkPolicyAvailability(suite: string): { run: boolean; fail?: string } {
  const found = networkPolicyBinary();
  if ("path" in found) return { run: true };
  const why = `${suite}: no NetworkPolicy engine (${found.missing}); ${HOW_TO_ENABLE}`;
  if (process.env.CI === "true") return { run: false, fail: why };
  console.warn(`skipped the NetworkPolicy tests of ${why}`);
  return { run: false };
}

export interface NetworkPolicyEngine {
  /** What the engine's informer caches hold now: NetworkPolicies (namespace/name) and pods by address. */
  known(): Promise<{ policies: string[]; pods: Record<string, string> }>;
  /** The engine's log (with -v=2 every judged packet: `"Evaluating packet" srcPod=… dstPod=…`, then its verdict). */
  log(): string;
  stop(): Promise<void>;
}

const tables = () => spawnSync("nft", ["list", "tables"], { encoding: "utf8" }).stdout.split("\n").map((l) => l.trim()).filter(Boolean);
const sh = (cmd: string, args: string[]) => {
  const r = spawnSync(cmd, args, { encoding: "utf8" });
  return { ok: r.status === 0, output: `${r.stdout}${r.stderr}` };
};
/** Whether this kernel takes nft's queue expression (upstream's table), tried in a table of its own. */
function nftQueue(): boolean {
  const probe = `x402-nfq-probe-${process.pid}`;
  const ok = spawnSync("nft", ["-f", "-"], { input: `table inet ${probe} { chain c { queue num ${QUEUE_ID}; }; }\n`, stdio: ["pipe", "ignore", "ignore"] }).status === 0;
  sh("nft", ["delete", "table", "inet", probe]);
  return ok;
}
/** Whether some process has bound the engine's nfqueue (the file lists bound queues only). */
const queueBound = () => readFileSync(QUEUES, "utf8").split("\n").some((l) => l.trim().split(/\s+/)[0] === String(QUEUE_ID));

/** The xtables diversion: the pod subnet's new connections, but root's, to the queue (no bypass: dropped while nobody judges). */
function divert(podSubnet: string) {
  const rules = [
    ["-m", "owner", "--uid-owner", "0", "-j", "RETURN"],
    ["-m", "conntrack", "!", "--ctstate", "NEW", "-j", "RETURN"],
    ["-s", podSubnet, "-j", "NFQUEUE", "--queue-num", String(QUEUE_ID)],
    ["-d", podSubnet, "-j", "NFQUEUE", "--queue-num", String(QUEUE_ID)],
  ];
  for (const args of [["-N", CHAIN], ...rules.map((r) => ["-A", CHAIN, ...r]), ["-I", "POSTROUTING", "-j", CHAIN]]) {
    const r = sh("iptables", ["-w", "-t", "mangle", ...args]);
    if (!r.ok) throw new Error(`network policies: iptables -t mangle ${args.join(" ")}: ${r.output}`);
  }
}
function undivert() {
  while (sh("iptables", ["-w", "-t", "mangle", "-D", "POSTROUTING", "-j", CHAIN]).ok);
  sh("iptables", ["-w", "-t", "mangle", "-F", CHAIN]);
  sh("iptables", ["-w", "-t", "mangle", "-X", CHAIN]);
}
const diverted = () => sh("iptables", ["-w", "-t", "mangle", "-S", CHAIN]).ok;

let running: { child: ChildProcess; cleanup: () => void } | undefined;
// A test worker that dies must not leave the diversion behind: packets queued with nobody judging are dropped.
process.once("exit", () => {
  if (!running) return;
  running.child.kill("SIGKILL");
  running.cleanup();
});

export async function startNetworkPolicies(cp: ControlPlane, node: RealNode): Promise<NetworkPolicyEngine> {
  const found = networkPolicyBinary();
  if (!("path" in found)) throw new Error(`no NetworkPolicy engine: ${found.missing}; ${HOW_TO_ENABLE}`);
  if (running) throw new Error("network policies: an engine already runs in this process");
  if (queueBound()) throw new Error(`network policies: nfqueue ${QUEUE_ID} is bound: another engine runs on this host`);
  // left by a killed run: nobody reads its queue
  if (tables().includes(`table inet ${UPSTREAM_TABLE}`)) sh("nft", ["delete", "table", "inet", UPSTREAM_TABLE]);
  if (diverted()) undivert();
  const before = new Set(tables());
  const viaXtables = !nftQueue();
  const dir = mkdtempSync(join(tmpdir(), "x402-netpol-"));
  const logFile = join(dir, "kube-network-policies.log");
  const out = createWriteStream(logFile);
  const metricsPort = await freePort();
  const child = spawn(
    found.path,
    [
      `--kubeconfig=${cp.kubeconfigPath}`,
      `--hostname-override=${node.name}`,
      `--metrics-bind-address=127.0.0.1:${metricsPort}`,
      `--nfqueue-id=${QUEUE_ID}`,
      `--nftables-table=${UPSTREAM_TABLE}`,
      "--v=2",
    ],
    { cwd: dir, env: { PATH: process.env.PATH ?? "", HOME: dir }, stdio: ["ignore", "pipe", "pipe"] },
  );
  child.stdout!.pipe(out);
  child.stderr!.pipe(out);
  /** Whatever it or this helper created: the diversion, upstream's table, `ip mangle` when it was not there before. */
  const cleanup = () => {
    if (viaXtables) undivert();
    if (tables().includes(`table inet ${UPSTREAM_TABLE}`)) sh("nft", ["delete", "table", "inet", UPSTREAM_TABLE]);
    // iptables leaves `ip mangle` with its empty base chains: deleted when it holds nothing else
    if (!before.has("table ip mangle") && tables().includes("table ip mangle") && !/\n\s*-A /.test(`\n${sh("iptables", ["-w", "-t", "mangle", "-S"]).output}`)) sh("nft", ["delete", "table", "ip", "mangle"]);
  };
  running = { child, cleanup };
  let stopped = false;
  child.once("exit", (code, signal) => {
    if (!stopped) out.write(`\n[harness] kube-network-policies exited (${code ?? signal})\n`);
  });
  const log = () => (existsSync(logFile) ? readFileSync(logFile, "utf8") : "");
  const tail = () => log().split("\n").slice(-40).join("\n");
  const metrics = `http://127.0.0.1:${metricsPort}`;

  const stop = async () => {
    if (stopped) return;
    stopped = true;
    if (viaXtables) undivert(); // first: nothing queued while the engine goes
    if (child.exitCode === null && child.signalCode === null) {
      const exited = new Promise((r) => child.once("exit", r));
      child.kill("SIGTERM"); // it deletes its own table on the way out
      const timer = setTimeout(() => child.kill("SIGKILL"), 15_000);
      await exited;
      clearTimeout(timer);
    }
    cleanup();
    running = undefined;
    out.end();
    // Only the tables it or this helper make: others appear meanwhile on a fresh host (the bridge
    // plugin's masquerade makes `ip nat` at the first pod, kube-proxy its own) and are not ours to judge.
    const ours = new Set([`table inet ${UPSTREAM_TABLE}`, "table ip mangle"]);
    const left = tables().filter((t) => ours.has(t) && !before.has(t));
    if (left.length || diverted()) throw new Error(`network policies: left after stop: ${[...left, ...(diverted() ? [`iptables chain ${CHAIN}`] : [])].join(", ")}\n${tail()}`);
    rmSync(dir, { recursive: true, force: true });
  };

  try {
    // ready once its caches synced and it listens on its queue (it opens the queue after the sync)
    await until(
      async () => {
        if (child.exitCode !== null || child.signalCode !== null) throw new Error(`network policies: kube-network-policies exited\n${tail()}`);
        const healthy = await fetch(`${metrics}/healthz`, { signal: AbortSignal.timeout(2000) }).then((r) => r.ok, () => false);
        return (healthy && queueBound()) || undefined;
      },
      "kube-network-policies listening on its nfqueue",
      60_000,
    );
    if (viaXtables) divert(node.podSubnet);
    else await until(() => tables().includes(`table inet ${UPSTREAM_TABLE}`) || undefined, "kube-network-policies' table", 30_000);
  } catch (e) {
    await stop().catch(() => undefined);
    throw new Error(`${(e as Error).message}\n${tail()}`);
  }
  const known = async () => (await (await fetch(`${metrics}/known`, { signal: AbortSignal.timeout(5000) })).json()) as { policies: string[]; pods: Record<string, string> };
  return { known, log, stop };
}
