// A real Kubernetes node for the cluster suites, beside the control plane of
// test/helpers/control-plane.ts: containerd (its own root, state and socket under a temporary
// directory, runc, a bridge CNI network of its own) and a kubelet (cgroupfs under a cgroup root of
// its own, swap allowed, the locally built pause image as sandbox image) registering one node, plus
// kube-scheduler so pods get bound to it. Pods really run: images, entrypoints, read-only root
// filesystems, probes, Secret and ConfigMap volumes, as on any cluster. Images are imported into
// containerd's k8s.io namespace from OCI archives (`ctr images import`): nothing is pulled.
// Binaries come from scripts/build-node.sh (kubelet, pause image; containerd, runc and the CNI
// plugins from Debian's packages). Needs root, cgroups and overlayfs.
//
// With `services`, Service networking as a cluster has it: kube-proxy in nftables mode (its rules in
// its own nft tables, `ip kube-proxy` and `ip6 kube-proxy`, deleted at stop: the host's iptables are
// untouched) and CoreDNS as the cluster DNS (kube-system/kube-dns at 10.0.0.10, the kubelet's
// clusterDNS), so pods reach Services by name and this host reaches NodePorts at the node IP.
// kube-proxy's table names are fixed: one node with services per host at a time. CoreDNS runs on
// this host (no image for it here), behind a selectorless kube-dns Service whose EndpointSlice is
// the node IP; the control plane must advertise the node IP too (startControlPlane's `address`),
// since pods reach kube-apiserver through the `kubernetes` Service.
// What is not here: the kubelet's API (bound to loopback without credentials for the API server:
// container logs are read from its files, `kubectl logs` and `port-forward` do not work).
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { chownSync, createWriteStream, existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmdirSync, rmSync, writeFileSync } from "node:fs";
import { connect, createServer, type Socket } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { CoreV1Api, DiscoveryV1Api, PatchStrategy, setHeaderOptions } from "@kubernetes/client-node";
import { freePort } from "../../services/devnet/anvil.ts";
import { controlPlaneBinaries, type ControlPlane } from "./control-plane.ts";
import { describe, it } from "vitest";
import { imageAvailability } from "./image.ts";
import { until } from "./wait.ts";

const ROOT = fileURLToPath(new URL("../../", import.meta.url));
const BUILD_SCRIPT = join(ROOT, "scripts", "build-node.sh");
const HOW_TO_ENABLE = "build it with scripts/build-node.sh as root (kubelet from the control plane's pinned module, ~1 min once the control plane is built; containerd, runc and CNI plugins from Debian's packages)";
const CNI_BIN = "/usr/lib/cni";
/** The cluster DNS Service's address, in the control plane's service range (10.0.0.0/24). */
export const CLUSTER_DNS_IP = "10.0.0.10";
const KUBE_PROXY_TABLES = ["ip kube-proxy", "ip6 kube-proxy"];
const CGROUP = "/sys/fs/cgroup";

/** The node's build (kubelet, pause image) and host tools, or why a node cannot run here. */
export function nodeBinaries(): { dir: string; pauseImage: string } | { missing: string } {
  const r = spawnSync("bash", [BUILD_SCRIPT, "--print-dir"], { encoding: "utf8", env: process.env });
  if (r.status !== 0) return { missing: r.stderr.trim().split("\n").pop() || `${BUILD_SCRIPT} failed` };
  const dir = r.stdout.trim().split("\n").pop()!;
  if (!existsSync(join(dir, ".complete"))) return { missing: `${dir} is not built` };
  for (const tool of ["containerd", "ctr", "runc", "nft"]) if (spawnSync("sh", ["-c", `command -v ${tool}`]).status !== 0) return { missing: `${tool} is not installed` };
  if (!existsSync(join(CNI_BIN, "bridge"))) return { missing: `no CNI plugins in ${CNI_BIN}` };
  if (process.getuid?.() !== 0) return { missing: "a node needs root (containerd, cgroups, network namespaces)" };
  if (!readFileSync("/proc/filesystems", "utf8").includes("overlay")) return { missing: "no overlayfs" };
  if (!("dir" in controlPlaneBinaries({ fakeNodes: 1 }))) return { missing: "no kube-scheduler (scripts/build-control-plane.sh)" };
  const pauseImage = /^pause_image=(.+)$/m.exec(readFileSync(join(dir, "VERSIONS"), "utf8"))?.[1];
  return pauseImage ? { dir, pauseImage } : { missing: `${dir}/VERSIONS names no pause image` };
}

/**
 * Whether a node suite runs. With CI=true a missing node fails the run (the returned `fail`
 * message is thrown by the suite); otherwise the suite is skipped with one line.
 */
export function nodeAvailability(suite: string): { run: boolean; fail?: string } {
  const found = nodeBinaries();
  if ("dir" in found) return { run: true };
  const why = `${suite}: no real Kubernetes node (${found.missing}); ${HOW_TO_ENABLE}`;
  if (process.env.CI === "true") return { run: false, fail: why };
  console.warn(`skipped ${why}`);
  return { run: false };
}

/**
 * Declares a suite that needs a real node and the x402-fleet image: `define` runs where both are
 * there; with CI=true a missing one fails the run, elsewhere the suite is skipped with one line.
 */
export function describeOnNode(suite: string, define: () => void): void {
  const nodeCheck = nodeAvailability(suite);
  const imageCheck = nodeCheck.run ? imageAvailability(suite) : { run: false };
  const fail = nodeCheck.fail ?? imageCheck.fail;
  if (fail) {
    describe(suite, () => {
      it("has a node and the x402-fleet image (CI=true)", () => {
        throw new Error(fail);
      });
    });
  } else if (nodeCheck.run && imageCheck.run) define();
  else describe.skip(suite, () => undefined);
}

export interface NodeOptions {
  /** OCI image archives imported into the node's containerd (e.g. the x402-fleet image's). */
  images?: string[];
  /** kube-proxy (nftables) and CoreDNS: Services by ClusterIP, DNS name and NodePort. */
  services?: boolean;
}

export interface HostPort {
  /** <node IP>:<port>, where pods (and this host) reach the host service. */
  host: string;
  port: number;
  close(): Promise<void>;
}

export interface RealNode {
  name: string;
  /** The node's InternalIP: this host's address on its default route. */
  ip: string;
  /** The pods' addresses (the bridge network's subnet). */
  podSubnet: string;
  /**
   * Offers a service listening on this host's loopback to pods, at <node IP>:<port>. Only pods of
   * this node and this host may connect (the node IP is on the host's outward interface). `port`
   * reopens a closed one at the same address.
   */
  expose(loopbackPort: number, port?: number): Promise<HostPort>;
  /** A hostPath PersistentVolume of this storage class on the node, a directory the pods' uid 65532 owns (as local-path provisioners make). */
  localVolume(name: string, storageClassName: string, size?: string): Promise<void>;
  /** A container's log as the kubelet wrote it (there is no kubelet API for `kubectl logs` here). */
  containerLog(namespace: string, pod: string, container: string): string;
  /** `ctr` against this node's containerd, k8s.io namespace. */
  ctr(args: string[]): { status: number | null; output: string };
  /** Kills a container's process by the runtime (SIGKILL through containerd, as the OOM killer or a crash would): the kubelet sees it die and restarts it. */
  killContainer(containerId: string): void;
  /**
   * Stops the kubelet (SIGTERM) with the node's containers left running, as when the kubelet
   * crashes or is upgraded; `startKubelet` starts it again with the same configuration and state.
   */
  stopKubelet(): Promise<void>;
  startKubelet(): void;
  /**
   * Samples, every 200 ms in a process of its own (the test's event loop cannot delay it), how many
   * containers of this name have a running task in the node's runtime; `stop` returns the most seen at once.
   */
  watchRunning(container: string): { stop(): Promise<{ max: number; samples: number }> };
  logOf(component: "containerd" | "kubelet" | "kube-scheduler" | "kube-proxy" | "coredns"): string;
  stop(): Promise<void>;
}

const running = new Set<ChildProcess>();
// A test worker that dies must not leave a node's processes behind (its mounts and cgroups stay).
process.once("exit", () => {
  for (const c of running) c.kill("SIGKILL");
});

/** This host's address on its default route (what the kubelet would pick): the node IP. */
export function hostAddress(): string {
  const r = spawnSync("ip", ["-j", "-4", "route", "get", "1.1.1.1"], { encoding: "utf8" });
  const src = r.status === 0 ? (JSON.parse(r.stdout) as { prefsrc?: string }[])[0]?.prefsrc : undefined;
  if (src) return src;
  const addrs = JSON.parse(spawnSync("ip", ["-j", "-4", "addr"], { encoding: "utf8" }).stdout) as { addr_info: { local: string; scope: string }[] }[];
  const global = addrs.flatMap((a) => a.addr_info).find((a) => a.scope === "global");
  if (!global) throw new Error("node: this host has no global IPv4 address for the node");
  return global.local;
}

/** A /24 under 10.244.0.0/16 that no route of this host uses yet. */
function freePodSubnet(): { subnet: string; prefix: string } {
  const routes = spawnSync("ip", ["-4", "route"], { encoding: "utf8" }).stdout;
  for (let tries = 0; tries < 64; tries++) {
    const prefix = `10.244.${Math.floor(Math.random() * 256)}`;
    if (!routes.includes(`${prefix}.`)) return { subnet: `${prefix}.0/24`, prefix };
  }
  throw new Error("node: no free /24 under 10.244.0.0/16");
}

/** The cgroup v1 hierarchies (hybrid or legacy host), or undefined on a unified (v2) host. */
function cgroupV1Hierarchies(): string[] | undefined {
  if (existsSync(join(CGROUP, "cgroup.controllers"))) return undefined;
  return readdirSync(CGROUP).filter((h) => h !== "unified" && existsSync(join(CGROUP, h, "cgroup.procs")));
}

/** The kubelet's cgroup root must exist: created in every hierarchy (cpuset seeded from its parent). */
function makeCgroupRoot(name: string): string[] {
  const v1 = cgroupV1Hierarchies();
  if (!v1) {
    const dir = join(CGROUP, name);
    mkdirSync(dir, { recursive: true });
    const controllers = readFileSync(join(CGROUP, "cgroup.controllers"), "utf8").trim().split(/\s+/).filter(Boolean);
    writeFileSync(join(CGROUP, "cgroup.subtree_control"), controllers.map((c) => `+${c}`).join(" "));
    return [dir];
  }
  return v1.map((h) => {
    const dir = join(CGROUP, h, name);
    mkdirSync(dir, { recursive: true });
    if (h === "cpuset") for (const f of ["cpuset.cpus", "cpuset.mems"]) writeFileSync(join(dir, f), readFileSync(join(CGROUP, h, f)));
    return dir;
  });
}

/** Removes a cgroup tree, deepest first (empty cgroups only; a leftover stays). */
function removeCgroupTree(dir: string) {
  if (!existsSync(dir)) return;
  for (const e of readdirSync(dir, { withFileTypes: true })) if (e.isDirectory()) removeCgroupTree(join(dir, e.name));
  try {
    rmdirSync(dir);
  } catch {
    // a process still in it: left for the host
  }
}

/** Unmounts everything mounted below a directory (the kubelet's bind mounts, containerd's rootfs and shm mounts). */
function unmountBelow(dir: string) {
  const points = readFileSync("/proc/self/mountinfo", "utf8")
    .split("\n")
    .map((l) => l.split(" ")[4])
    .filter((p): p is string => !!p && (p === dir || p.startsWith(`${dir}/`)))
    .sort((a, b) => b.length - a.length);
  for (const p of points) spawnSync("umount", ["-l", p]);
}

const inSubnet = (address: string, prefix: string) => address.replace(/^::ffff:/, "").startsWith(`${prefix}.`);

export async function startNode(cp: ControlPlane, o: NodeOptions = {}): Promise<RealNode> {
  const found = nodeBinaries();
  if (!("dir" in found)) throw new Error(`no real node: ${found.missing}; ${HOW_TO_ENABLE}`);
  const cpDir = (controlPlaneBinaries({ fakeNodes: 1 }) as { dir: string }).dir;
  const id = randomBytes(3).toString("hex");
  const name = `x402-node-${id}`;
  const dir = mkdtempSync(join(tmpdir(), "x402-node-"));
  const ip = hostAddress();
  const { subnet, prefix } = freePodSubnet();
  const bridge = `x402n${id}`;
  const cgroupRoot = `/${name}`;
  const socket = join(dir, "containerd.sock");
  const children: { name: string; child: ChildProcess }[] = [];
  const proxies = new Set<HostPort>();
  const logs = (component: string) => join(dir, `${component}.log`);
  const tail = (component: string) => (existsSync(logs(component)) ? readFileSync(logs(component), "utf8").split("\n").slice(-40).join("\n") : "");
  const core = cp.kc.makeApiClient(CoreV1Api);
  let cgroupDirs: string[] = [];
  let stopped = false;

  const launch = (component: string, binary: string, args: string[]) => {
    const out = createWriteStream(logs(component), { flags: "a" });
    const child = spawn(binary, args, { cwd: dir, env: { PATH: process.env.PATH ?? "", HOME: dir }, stdio: ["ignore", "pipe", "pipe"] });
    child.stdout!.pipe(out);
    child.stderr!.pipe(out);
    running.add(child);
    child.once("exit", (code, signal) => {
      running.delete(child);
      if (!stopped) out.write(`\n[harness] ${component} exited (${code ?? signal})\n`);
    });
    children.push({ name: component, child });
    return child;
  };
  /** A component's latest process (the kubelet may have been restarted). */
  const latest = (component: string) => [...children].reverse().find((c) => c.name === component)?.child;
  const ctr = (args: string[]) => {
    const r = spawnSync("ctr", ["--address", socket, "--namespace", "k8s.io", ...args], { encoding: "utf8" });
    return { status: r.status, output: `${r.stdout}${r.stderr}` };
  };
  const end = async (child: ChildProcess) => {
    if (child.exitCode !== null || child.signalCode !== null) return;
    const exited = new Promise((r) => child.once("exit", r));
    child.kill("SIGTERM");
    const timer = setTimeout(() => child.kill("SIGKILL"), 10_000);
    await exited;
    clearTimeout(timer);
  };

  const stop = async () => {
    if (stopped) return;
    // The node's pods first, by the kubelet (which tears down their sandboxes and CNI rules): the
    // node cordoned so no replacement lands, then every pod bound to it deleted at once.
    const kubelet = latest("kubelet");
    if (kubelet && kubelet.exitCode === null) {
      await core.patchNode({ name, body: { spec: { unschedulable: true } } }, setHeaderOptions("Content-Type", PatchStrategy.MergePatch)).catch(() => undefined);
      const pods = await core.listPodForAllNamespaces({ fieldSelector: `spec.nodeName=${name}` }).catch(() => ({ items: [] }));
      for (const p of pods.items) await core.deleteNamespacedPod({ namespace: p.metadata!.namespace!, name: p.metadata!.name!, gracePeriodSeconds: 0 }).catch(() => undefined);
      await until(() => ctr(["tasks", "ls", "-q"]).output.trim() === "" || undefined, "the node's containers to stop", 60_000).catch(() => undefined);
    }
    stopped = true;
    // the network namespaces of sandboxes still known to containerd: CRI leaves them behind when
    // their tasks are killed below rather than torn down by the kubelet
    const netnsPaths = new Set<string>();
    for (const id of ctr(["containers", "ls", "-q"]).output.trim().split("\n").filter(Boolean)) {
      try {
        const info = JSON.parse(ctr(["containers", "info", id]).output) as { Spec?: { linux?: { namespaces?: { type: string; path?: string }[] } } };
        for (const ns of info.Spec?.linux?.namespaces ?? []) if (ns.type === "network" && ns.path?.startsWith("/var/run/netns/")) netnsPaths.add(ns.path);
      } catch {
        // not JSON: a container removed meanwhile
      }
    }
    for (const p of proxies) await p.close();
    for (const { name: component, child } of [...children].reverse()) if (component !== "containerd") await end(child);
    // what the kubelet left is killed by the runtime, then the runtime stops
    for (const task of ctr(["tasks", "ls", "-q"]).output.trim().split("\n").filter(Boolean)) ctr(["tasks", "rm", "--force", task]);
    for (const { child } of children) await end(child);
    if (o.services) for (const table of KUBE_PROXY_TABLES) spawnSync("nft", ["delete", "table", ...table.split(" ")], { stdio: "ignore" });
    for (const path of netnsPaths) if (existsSync(path)) spawnSync("ip", ["netns", "delete", path.slice("/var/run/netns/".length)]);
    unmountBelow(dir);
    spawnSync("ip", ["link", "del", bridge]);
    // the hierarchies it was created in, and the unified one of a hybrid host, where the kubelet adds its own
    for (const d of new Set([...cgroupDirs, join(CGROUP, "unified", name)])) removeCgroupTree(d);
    rmSync(dir, { recursive: true, force: true });
  };

  /** CoreDNS behind kube-system/kube-dns, then kube-proxy; ready once both answer and the DNS Service has its rules. */
  const startServiceNetworking = async () => {
    const [dnsPort, dnsHealthPort, dnsReadyPort, proxyHealthPort, proxyMetricsPort] = [await freePort(), await freePort(), await freePort(), await freePort(), await freePort()];
    await core.createNamespacedService({
      namespace: "kube-system",
      body: {
        metadata: { name: "kube-dns", labels: { "k8s-app": "kube-dns" } },
        spec: {
          clusterIP: CLUSTER_DNS_IP,
          ports: [
            { name: "dns", port: 53, protocol: "UDP", targetPort: dnsPort },
            { name: "dns-tcp", port: 53, protocol: "TCP", targetPort: dnsPort },
          ],
        },
      },
    });
    // selectorless: its endpoint is CoreDNS on this host, written as a controller would
    await cp.kc.makeApiClient(DiscoveryV1Api).createNamespacedEndpointSlice({
      namespace: "kube-system",
      body: {
        metadata: { name: "kube-dns-host", labels: { "kubernetes.io/service-name": "kube-dns", "endpointslice.kubernetes.io/managed-by": "x402-fleet-tests" } },
        addressType: "IPv4",
        endpoints: [{ addresses: [ip], conditions: { ready: true } }],
        ports: [
          { name: "dns", port: dnsPort, protocol: "UDP" },
          { name: "dns-tcp", port: dnsPort, protocol: "TCP" },
        ],
      },
    });
    // bound to the node IP only (where pods' DNS traffic lands after kube-proxy's DNAT)
    writeFileSync(
      join(dir, "Corefile"),
      [
        `.:${dnsPort} {`,
        `  bind ${ip}`,
        "  errors",
        `  health 127.0.0.1:${dnsHealthPort}`,
        `  ready 127.0.0.1:${dnsReadyPort}`,
        "  kubernetes cluster.local in-addr.arpa ip6.arpa {",
        `    kubeconfig ${cp.kubeconfigPath}`,
        "    pods insecure",
        "    fallthrough in-addr.arpa ip6.arpa",
        "  }",
        "  forward . /etc/resolv.conf",
        "  cache 30",
        "  loadbalance",
        "}",
        "",
      ].join("\n"),
    );
    const coredns = launch("coredns", join(found.dir, "coredns"), ["-conf", join(dir, "Corefile")]);
    writeFileSync(
      join(dir, "kube-proxy.yaml"),
      JSON.stringify({
        apiVersion: "kubeproxy.config.k8s.io/v1alpha1",
        kind: "KubeProxyConfiguration",
        mode: "nftables",
        clientConnection: { kubeconfig: cp.kubeconfigPath },
        hostnameOverride: name,
        clusterCIDR: subnet,
        nodePortAddresses: [`${ip}/32`],
        healthzBindAddress: `127.0.0.1:${proxyHealthPort}`,
        metricsBindAddress: `127.0.0.1:${proxyMetricsPort}`,
        // 0: the host's conntrack sysctls stay as they are
        conntrack: { maxPerCore: 0, min: 0, tcpEstablishedTimeout: "0s", tcpCloseWaitTimeout: "0s" },
      }),
    );
    const proxy = launch("kube-proxy", join(found.dir, "kube-proxy"), [`--config=${join(dir, "kube-proxy.yaml")}`, "--v=1"]);
    const answers = (url: string) => fetch(url, { signal: AbortSignal.timeout(2000) }).then((r) => r.ok, () => false);
    await until(async () => {
      if (coredns.exitCode !== null) throw new Error(`node: coredns exited\n${tail("coredns")}`);
      if (proxy.exitCode !== null) throw new Error(`node: kube-proxy exited\n${tail("kube-proxy")}`);
      if (!(await answers(`http://127.0.0.1:${dnsReadyPort}/ready`)) || !(await answers(`http://127.0.0.1:${proxyHealthPort}/healthz`))) return undefined;
      return spawnSync("nft", ["list", "table", "ip", "kube-proxy"], { encoding: "utf8" }).stdout.includes(CLUSTER_DNS_IP) || undefined;
    }, "CoreDNS ready and kube-proxy's rules for the DNS Service", 120_000).catch((e: Error) => {
      throw new Error(`${e.message}\n--- coredns ---\n${tail("coredns")}\n--- kube-proxy ---\n${tail("kube-proxy")}`);
    });
  };

  try {
    if (o.services && new URL(cp.url).hostname !== ip) throw new Error(`node: services need a control plane advertising the node IP ${ip} (startControlPlane's address), not ${new URL(cp.url).hostname}`);
    cgroupDirs = makeCgroupRoot(name);
    mkdirSync(join(dir, "cni"));
    writeFileSync(
      join(dir, "cni", "10-x402-node.conflist"),
      JSON.stringify({
        cniVersion: "0.4.0",
        name: `x402-node-${id}`,
        plugins: [
          { type: "bridge", bridge, isGateway: true, ipMasq: true, hairpinMode: true, ipam: { type: "host-local", ranges: [[{ subnet }]], routes: [{ dst: "0.0.0.0/0" }], dataDir: join(dir, "ipam") } },
          { type: "portmap", capabilities: { portMappings: true } },
        ],
      }),
    );
    // restrict_oom_score_adj: the CRI lowers a sandbox's oom_score_adj, which needs CAP_SYS_RESOURCE;
    // sandboxes and CI runners often lack it (runc then fails with "can't get final child's PID").
    writeFileSync(
      join(dir, "containerd.toml"),
      [
        "version = 2",
        `root = "${join(dir, "root")}"`,
        `state = "${join(dir, "state")}"`,
        'disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.aufs", "io.containerd.internal.v1.tracing"]',
        "[grpc]",
        `  address = "${socket}"`,
        "[ttrpc]",
        `  address = "${join(dir, "containerd.ttrpc.sock")}"`,
        "[debug]",
        '  address = ""',
        "[metrics]",
        '  address = ""',
        '[plugins."io.containerd.internal.v1.opt"]',
        `  path = "${join(dir, "opt")}"`,
        '[plugins."io.containerd.grpc.v1.cri"]',
        `  sandbox_image = "${found.pauseImage}"`,
        "  restrict_oom_score_adj = true",
        '  [plugins."io.containerd.grpc.v1.cri".containerd]',
        '    snapshotter = "overlayfs"',
        '    default_runtime_name = "runc"',
        '    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]',
        '      runtime_type = "io.containerd.runc.v2"',
        '      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]',
        "        SystemdCgroup = false",
        '  [plugins."io.containerd.grpc.v1.cri".cni]',
        `    bin_dir = "${CNI_BIN}"`,
        `    conf_dir = "${join(dir, "cni")}"`,
        "",
      ].join("\n"),
    );
    const containerd = launch("containerd", "containerd", ["--config", join(dir, "containerd.toml")]);
    await until(() => {
      if (containerd.exitCode !== null) throw new Error(`node: containerd exited\n${tail("containerd")}`);
      return ctr(["version"]).status === 0 || undefined;
    }, "containerd", 30_000);
    for (const archive of [join(found.dir, "pause.oci.tar"), ...(o.images ?? [])]) {
      const r = ctr(["images", "import", archive]);
      if (r.status !== 0) throw new Error(`node: importing ${archive} failed: ${r.output}`);
    }

    const [kubeletPort, healthzPort] = [await freePort(), await freePort()];
    writeFileSync(
      join(dir, "kubelet.yaml"),
      JSON.stringify({
        apiVersion: "kubelet.config.k8s.io/v1beta1",
        kind: "KubeletConfiguration",
        cgroupDriver: "cgroupfs",
        cgroupRoot,
        failSwapOn: false,
        containerRuntimeEndpoint: `unix://${socket}`,
        // the kubelet's API on loopback only, open to nobody but this host
        address: "127.0.0.1",
        port: kubeletPort,
        readOnlyPort: 0,
        healthzBindAddress: "127.0.0.1",
        healthzPort,
        authentication: { anonymous: { enabled: false }, webhook: { enabled: false } },
        authorization: { mode: "AlwaysAllow" },
        podLogsDir: join(dir, "pods"),
        serializeImagePulls: false,
        // a shared test machine: no image garbage collection, no eviction for its disk or memory
        imageGCHighThresholdPercent: 100,
        imageGCLowThresholdPercent: 99,
        evictionHard: { "memory.available": "1Mi", "nodefs.available": "1%", "imagefs.available": "1%", "nodefs.inodesFree": "1%" },
        localStorageCapacityIsolation: false,
        makeIPTablesUtilChains: false,
        resolvConf: "/etc/resolv.conf",
        ...(o.services ? { clusterDNS: [CLUSTER_DNS_IP], clusterDomain: "cluster.local" } : {}),
        nodeStatusUpdateFrequency: "5s",
        syncFrequency: "10s",
      }),
    );
    const launchKubelet = () =>
      launch("kubelet", join(found.dir, "kubelet"), [
        `--config=${join(dir, "kubelet.yaml")}`,
        `--kubeconfig=${cp.kubeconfigPath}`,
        `--root-dir=${join(dir, "kubelet")}`,
        `--cert-dir=${join(dir, "kubelet-pki")}`,
        `--hostname-override=${name}`,
        `--node-ip=${ip}`,
        "--v=1",
      ]);
    launchKubelet();
    launch("kube-scheduler", join(cpDir, "kube-scheduler"), [`--kubeconfig=${cp.kubeconfigPath}`, "--leader-elect=false", "--secure-port=0", "--v=0"]);
    await until(async () => {
      for (const { name: component, child } of children) if (child.exitCode !== null) throw new Error(`node: ${component} exited\n${tail(component)}`);
      const node = await core.readNode({ name }).catch(() => undefined);
      return node?.status?.conditions?.some((c) => c.type === "Ready" && c.status === "True") || undefined;
    }, `node ${name} Ready`, 120_000).catch((e: Error) => {
      throw new Error(`${e.message}\n--- kubelet ---\n${tail("kubelet")}`);
    });
    if (o.services) await startServiceNetworking();

    return {
      name,
      ip,
      podSubnet: subnet,
      expose: async (loopbackPort, listenPort = 0) => {
        const sockets = new Set<Socket>();
        const server = createServer((client) => {
          const from = client.remoteAddress ?? "";
          if (!inSubnet(from, prefix) && from.replace(/^::ffff:/, "") !== ip) return client.destroy();
          const upstream = connect(loopbackPort, "127.0.0.1");
          for (const s of [client, upstream]) {
            sockets.add(s);
            s.on("close", () => sockets.delete(s));
            s.on("error", () => undefined);
          }
          client.pipe(upstream).pipe(client);
        });
        await new Promise<void>((resolve, reject) => {
          server.once("error", reject);
          server.listen(listenPort, ip, () => resolve());
        });
        const port = (server.address() as { port: number }).port;
        const hostPort: HostPort = {
          host: `${ip}:${port}`,
          port,
          close: () =>
            new Promise<void>((resolve) => {
              proxies.delete(hostPort);
              for (const s of sockets) s.destroy();
              server.close(() => resolve());
            }),
        };
        proxies.add(hostPort);
        return hostPort;
      },
      localVolume: async (volume, storageClassName, size = "1Gi") => {
        const path = join(dir, "volumes", volume);
        mkdirSync(path, { recursive: true, mode: 0o770 });
        chownSync(path, 65532, 65532);
        await core.createPersistentVolume({
          body: {
            metadata: { name: volume },
            spec: {
              storageClassName,
              capacity: { storage: size },
              accessModes: ["ReadWriteOnce"],
              persistentVolumeReclaimPolicy: "Retain",
              hostPath: { path, type: "Directory" },
              nodeAffinity: { required: { nodeSelectorTerms: [{ matchExpressions: [{ key: "kubernetes.io/hostname", operator: "In", values: [name] }] }] } },
            },
          },
        });
      },
      containerLog: (namespace, pod, container) => {
        // <podLogsDir>/<namespace>_<pod>_<uid>/<container>/<restart>.log
        const base = join(dir, "pods");
        const podDir = existsSync(base) ? readdirSync(base).find((d) => d.startsWith(`${namespace}_${pod}_`)) : undefined;
        if (!podDir || !existsSync(join(base, podDir, container))) return "";
        const files = readdirSync(join(base, podDir, container)).sort();
        return files.map((f) => readFileSync(join(base, podDir, container, f), "utf8")).join("");
      },
      ctr,
      killContainer: (containerId) => {
        const r = ctr(["tasks", "kill", "--signal", "SIGKILL", containerId.replace(/^containerd:\/\//, "")]);
        if (r.status !== 0) throw new Error(`node: killing container ${containerId} failed: ${r.output}`);
      },
      stopKubelet: async () => {
        const kubelet = latest("kubelet")!;
        await end(kubelet);
      },
      startKubelet: () => {
        if (latest("kubelet")!.exitCode === null) throw new Error("node: the kubelet is running");
        launchKubelet();
      },
      watchRunning: (container) => {
        const ctrCmd = `ctr --address ${socket} --namespace k8s.io`;
        const script = `while :; do ids=$(${ctrCmd} containers ls -q 'labels."io.kubernetes.container.name"==${container}'); n=0; for id in $(${ctrCmd} tasks ls | awk '$3 == "RUNNING" { print $1 }'); do case " $(echo $ids) " in *" $id "*) n=$((n + 1));; esac; done; echo "$n"; sleep 0.2; done`;
        const sampler = spawn("bash", ["-c", script], { stdio: ["ignore", "pipe", "ignore"] });
        running.add(sampler);
        let max = 0;
        let samples = 0;
        let rest = "";
        sampler.stdout!.on("data", (chunk: Buffer) => {
          const lines = (rest + chunk.toString()).split("\n");
          rest = lines.pop()!;
          for (const l of lines) {
            samples++;
            max = Math.max(max, Number(l));
          }
        });
        return {
          stop: async () => {
            const exited = new Promise((r) => sampler.once("exit", r));
            sampler.kill("SIGKILL");
            await exited;
            running.delete(sampler);
            return { max, samples };
          },
        };
      },
      logOf: tail,
      stop,
    };
  } catch (e) {
    await stop();
    throw e;
  }
}
