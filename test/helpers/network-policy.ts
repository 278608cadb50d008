// A NetworkPolicy engine for a real node (test/helpers/node.ts): kube-network-policies
// (sigs.k8s.io/kube-network-policies, built by scripts/build-network-policies.sh), run on this host
// beside kube-proxy as a node's network plugin would run it. Its inet nftables table sends the
// first packet of every new connection to or from a pod that a NetworkPolicy selects to an nfqueue,
// where the engine judges it against the policies (pods and namespaces from the API server, the
// node's pods only) and accepts or drops it: a refused connection times out. What it never judges:
// traffic from a root process of this host (its own rule: kubelet probes, this test process), DNS
// over UDP, and connections already established when a policy appears.
// Its table (`inet kube-network-policies`) and queue number are fixed: one engine per host at a time.
// The table is deleted at stop (the engine deletes it itself on SIGTERM; checked, and deleted here
// if it is left). Needs root, nf_tables and nfnetlink_queue.
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
/** The engine's nftables table (`nft list table inet <TABLE>`), and its set of the policed pods' IPv4 addresses. */
export const NETWORK_POLICY_TABLE = "kube-network-policies";
const POLICED_SET = "podips-v4";
const QUEUE_ID = 100;

/** The built engine, or why it cannot run here. */
export function networkPolicyBinary(): { path: string } | { missing: string } {
  const r = spawnSync("bash", [BUILD_SCRIPT, "--print-dir"], { encoding: "utf8", env: process.env });
  if (r.status !== 0) return { missing: r.stderr.trim().split("\n").pop() || `${BUILD_SCRIPT} failed` };
  const dir = r.stdout.trim().split("\n").pop()!;
  if (!existsSync(join(dir, ".complete"))) return { missing: `${dir} is not built` };
  if (!existsSync(QUEUES)) return { missing: `the kernel has no nfnetlink_queue (${QUEUES})` };
  if (spawnSync("sh", ["-c", "command -v nft"]).status !== 0) return { missing: "nft is not installed" };
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
  /** The IPv4 addresses of the node's pods that some NetworkPolicy selects (the engine's nft set): only their connections are judged. */
  policed(): string[];
  /** The engine's log (with -v=2 every judged packet: `Evaluating packet` with its pods, then its verdict). */
  log(): string;
  stop(): Promise<void>;
}

const tables = () => spawnSync("nft", ["list", "tables"], { encoding: "utf8" }).stdout.split("\n").map((l) => l.trim()).filter(Boolean);
const ourTable = `table inet ${NETWORK_POLICY_TABLE}`;
const deleteTable = () => spawnSync("nft", ["delete", "table", "inet", NETWORK_POLICY_TABLE], { stdio: "ignore" });
/** Whether some process has bound the engine's nfqueue (the file lists bound queues only). */
const queueBound = () => readFileSync(QUEUES, "utf8").split("\n").some((l) => l.trim().split(/\s+/)[0] === String(QUEUE_ID));

let running: ChildProcess | undefined;
// A test worker that dies must not leave the table behind: its queue rules would drop the first
// packets of the node's policed pods with nobody listening.
process.once("exit", () => {
  if (!running) return;
  running.kill("SIGKILL");
  deleteTable();
});

export async function startNetworkPolicies(cp: ControlPlane, node: RealNode): Promise<NetworkPolicyEngine> {
  const found = networkPolicyBinary();
  if (!("path" in found)) throw new Error(`no NetworkPolicy engine: ${found.missing}; ${HOW_TO_ENABLE}`);
  if (running) throw new Error("network policies: an engine already runs in this process");
  if (tables().includes(ourTable)) {
    if (queueBound()) throw new Error(`network policies: another engine runs on this host (table inet ${NETWORK_POLICY_TABLE}, nfqueue ${QUEUE_ID} bound)`);
    deleteTable(); // left by a killed run: nobody reads its queue
  }
  const before = new Set(tables());
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
      `--nftables-table=${NETWORK_POLICY_TABLE}`,
      "--v=2",
    ],
    { cwd: dir, env: { PATH: process.env.PATH ?? "", HOME: dir }, stdio: ["ignore", "pipe", "pipe"] },
  );
  child.stdout!.pipe(out);
  child.stderr!.pipe(out);
  running = child;
  let stopped = false;
  child.once("exit", (code, signal) => {
    if (running === child) running = undefined;
    if (!stopped) out.write(`\n[harness] kube-network-policies exited (${code ?? signal})\n`);
  });
  const log = () => (existsSync(logFile) ? readFileSync(logFile, "utf8") : "");
  const tail = () => log().split("\n").slice(-40).join("\n");
  const policed = () => {
    const r = spawnSync("nft", ["-j", "list", "set", "inet", NETWORK_POLICY_TABLE, POLICED_SET], { encoding: "utf8" });
    if (r.status !== 0) return [];
    const set = (JSON.parse(r.stdout) as { nftables: { set?: { elem?: string[] } }[] }).nftables.find((e) => e.set)?.set;
    return set?.elem ?? [];
  };

  const stop = async () => {
    if (stopped) return;
    stopped = true;
    if (child.exitCode === null && child.signalCode === null) {
      const exited = new Promise((r) => child.once("exit", r));
      child.kill("SIGTERM"); // it deletes its table on the way out
      const timer = setTimeout(() => child.kill("SIGKILL"), 15_000);
      await exited;
      clearTimeout(timer);
    }
    // whatever it created and left (only its own table: other suites' runtimes may add tables meanwhile)
    const left = tables().filter((t) => !before.has(t));
    if (left.includes(ourTable)) {
      deleteTable();
      out.write(`\n[harness] deleted the table it left: ${ourTable}\n`);
    }
    out.end();
    if (tables().includes(ourTable)) throw new Error(`network policies: ${ourTable} is still there after stop\n${tail()}`);
    rmSync(dir, { recursive: true, force: true });
  };

  try {
    // ready once its caches synced, its table is written and it listens on its queue
    await until(
      async () => {
        if (child.exitCode !== null || child.signalCode !== null) throw new Error(`network policies: kube-network-policies exited\n${tail()}`);
        const healthy = await fetch(`http://127.0.0.1:${metricsPort}/healthz`, { signal: AbortSignal.timeout(2000) }).then((r) => r.ok, () => false);
        return (healthy && tables().includes(ourTable) && queueBound()) || undefined;
      },
      "kube-network-policies: its table and its nfqueue",
      60_000,
    );
  } catch (e) {
    await stop().catch(() => undefined);
    throw e;
  }
  return { policed, log, stop };
}
