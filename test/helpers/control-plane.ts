// A real Kubernetes control plane for the tests, the way controller-runtime's envtest runs one:
// etcd and kube-apiserver (secure serving with a throwaway CA, static admin token, RBAC, the
// ServiceAccount token signer so TokenRequest works), and, for suites that need objects to
// move, kube-controller-manager (garbage collector, Deployment/ReplicaSet/StatefulSet
// controllers, ServiceAccounts, PersistentVolume binding and the in-tree hostPath provisioner
// behind a default StorageClass, as kind's local-path one), kube-scheduler and kwok with fake nodes (scheduled pods become
// Running and Ready without a kubelet). Binaries come from scripts/build-control-plane.sh (or
// KUBEBUILDER_ASSETS). One control plane per test file; tests isolate themselves by namespace.
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { createWriteStream, existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { request as httpsRequest } from "node:https";
import { CoreV1Api, KubeConfig, StorageV1Api } from "@kubernetes/client-node";
import { afterAll, beforeAll, describe, it } from "vitest";
import { parse as parseYaml } from "yaml";

const ROOT = fileURLToPath(new URL("../../", import.meta.url));
const BUILD_SCRIPT = join(ROOT, "scripts", "build-control-plane.sh");
const HOW_TO_ENABLE = "build it with scripts/build-control-plane.sh (Go 1.26, ~35 min cold) or set KUBEBUILDER_ASSETS";

export interface ControlPlaneOptions {
  /** kube-controller-manager: garbage collection, workload controllers, default ServiceAccounts. */
  controllers?: boolean;
  /** kube-scheduler and kwok with this many fake nodes (pods get scheduled and turn Ready). */
  fakeNodes?: number;
  /**
   * CRD files applied before kube-controller-manager starts, so its garbage collector watches
   * their kinds from the start (it discovers kinds added later only every 30 s).
   */
  crds?: string[];
  /** kube-apiserver's audit log (Metadata level, every request): auditEvents() reads it. */
  audit?: boolean;
  /**
   * The address kube-apiserver binds and advertises (default 127.0.0.1). A real node's pods reach
   * it through the `kubernetes` Service, whose endpoint is this address: give this host's (the node IP).
   */
  address?: string | (() => string);
}

/** One audit.k8s.io/v1 Event, the fields the tests read: the server's own view of a request. */
export interface AuditEvent {
  stage: string;
  verb: string;
  user: { username: string };
  objectRef?: { resource?: string; subresource?: string; namespace?: string; name?: string; apiGroup?: string };
  responseStatus?: { code?: number };
}

export interface ControlPlane {
  /** https://<address>:<port> of kube-apiserver (127.0.0.1 unless `address` says otherwise). */
  url: string;
  /** The etcd client URL (its gRPC gateway answers /v3/* JSON). */
  etcdUrl: string;
  /** The cluster CA (PEM) that signed the serving certificate. */
  caPem: string;
  /** An admin (system:masters) kubeconfig file and the same as a client-node KubeConfig. */
  kubeconfigPath: string;
  kc: KubeConfig;
  /** The Kubernetes version the binaries report (e.g. v1.33.13). */
  version: string;
  /** The admin's bearer token. */
  adminToken: string;
  /** A KubeConfig authenticating with a bearer token (e.g. a ServiceAccount's TokenRequest token), optionally through another address (a proxy). */
  kubeConfigForToken(token: string, server?: string): KubeConfig;
  /** A raw request as the admin (kubectl's bytes, not client-node's typed models). */
  request(path: string, init?: { method?: string; headers?: Record<string, string>; body?: string }): Promise<{ status: number; text: string }>;
  /** Writes a kubeconfig file for a token (for child processes: kubectl, helm, the operator CLI). */
  writeKubeconfig(token: string, file: string): string;
  /** A token for a ServiceAccount, from the real TokenRequest API. */
  serviceAccountToken(namespace: string, name: string, seconds?: number): Promise<string>;
  /** Server-side apply of a YAML file's bytes as the admin (what `kubectl apply --server-side` sends). */
  applyFile(path: string): Promise<void>;
  /** Creates a namespace with a unique name from the prefix and returns the name. */
  namespace(prefix: string): Promise<string>;
  /** Compacts etcd up to its current revision (older resourceVersions become 410 Gone). */
  compactEtcd(): Promise<void>;
  /** The audit log so far (with `audit: true`): completed requests, and watches once started. */
  auditEvents(): AuditEvent[];
  /** The tail of a component's log, for failure messages. */
  logOf(component: "etcd" | "kube-apiserver" | "kube-controller-manager" | "kube-scheduler" | "kwok"): string;
  stop(): Promise<void>;
}

const REQUIRED = ["etcd", "kube-apiserver"];
const binariesFor = (o: ControlPlaneOptions) => [...REQUIRED, ...(o.controllers ? ["kube-controller-manager"] : []), ...(o.fakeNodes ? ["kube-scheduler", "kwok"] : [])];

/** The directory holding the binaries, or why there is none. */
export function controlPlaneBinaries(o: ControlPlaneOptions = {}): { dir: string } | { missing: string } {
  const r = spawnSync("bash", [BUILD_SCRIPT, "--print-dir"], { encoding: "utf8", env: process.env });
  if (r.status !== 0) return { missing: r.stderr.trim().split("\n").pop() || `${BUILD_SCRIPT} failed` };
  const dir = r.stdout.trim().split("\n").pop()!;
  if (!process.env.KUBEBUILDER_ASSETS && !existsSync(join(dir, ".complete"))) return { missing: `${dir} is not built` };
  const absent = binariesFor(o).filter((b) => !existsSync(join(dir, b)));
  if (absent.length) return { missing: `${dir} has no ${absent.join(", ")}` };
  return { dir };
}

/**
 * Whether a control-plane suite runs. With CI=true a missing control plane fails the run (the
 * returned `fail` message is thrown by the suite); otherwise the suite is skipped with one line.
 */
export function controlPlaneAvailability(suite: string, o: ControlPlaneOptions = {}): { run: boolean; fail?: string } {
  const found = controlPlaneBinaries(o);
  if ("dir" in found) return { run: true };
  const why = `${suite}: no Kubernetes control plane (${found.missing}); ${HOW_TO_ENABLE}`;
  if (process.env.CI === "true") return { run: false, fail: why };
  console.warn(`skipped ${why}`);
  return { run: false };
}

async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer();
    s.once("error", reject);
    s.listen(0, "127.0.0.1", () => {
      const a = s.address();
      s.close(() => resolve(typeof a === "object" && a ? a.port : 0));
    });
  });
}

function openssl(dir: string, args: string[]) {
  const r = spawnSync("openssl", args, { cwd: dir, encoding: "utf8" });
  if (r.status !== 0) throw new Error(`openssl ${args[0]} failed: ${r.stderr}`);
}

/** A CA, a serving certificate for the address (and 127.0.0.1) signed by it, and the ServiceAccount signing key (all P-256: fast). */
function makeCertificates(dir: string, address: string) {
  const ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
  openssl(dir, ["req", "-x509", ...ec, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=x402-fleet-test-ca"]);
  openssl(dir, ["req", ...ec, "-keyout", "serving.key", "-out", "serving.csr", "-subj", "/CN=kube-apiserver"]);
  writeFileSync(join(dir, "serving.ext"), `subjectAltName=IP:${address},IP:127.0.0.1,DNS:localhost,IP:10.0.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc\n`);
  openssl(dir, ["x509", "-req", "-in", "serving.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-out", "serving.crt", "-days", "2", "-extfile", "serving.ext"]);
  openssl(dir, ["ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", "sa.key"]);
  openssl(dir, ["ec", "-in", "sa.key", "-pubout", "-out", "sa.pub"]);
}

function kubeconfigYaml(server: string, caPem: string, token: string): string {
  const ca = Buffer.from(caPem).toString("base64");
  // A plain-http server is a test's loopback proxy (test/helpers/api-proxy.ts): there is no TLS
  // to verify, and client-node accepts http only with the verification flag set.
  const trust = server.startsWith("http:") ? "insecure-skip-tls-verify: true" : `certificate-authority-data: "${ca}"`;
  return [
    "apiVersion: v1",
    "kind: Config",
    `clusters: [{name: test, cluster: {server: "${server}", ${trust}}}]`,
    `users: [{name: user, user: {token: "${token}"}}]`,
    "contexts: [{name: test, context: {cluster: test, user: user}}]",
    "current-context: test",
    "",
  ].join("\n");
}

/** GET over TLS with the cluster CA: status code, or 0 when the server does not answer yet. */
function httpsStatus(url: string, ca: string, token: string): Promise<number> {
  return new Promise((resolve) => {
    const req = httpsRequest(url, { ca, headers: { authorization: `Bearer ${token}` }, timeout: 2000 }, (res) => {
      res.resume();
      resolve(res.statusCode ?? 0);
    });
    req.on("error", () => resolve(0));
    req.on("timeout", () => req.destroy());
    req.end();
  });
}

function httpsRequestText(url: string, ca: string, token: string, init: { method?: string; headers?: Record<string, string>; body?: string }): Promise<{ status: number; text: string }> {
  return new Promise((resolve, reject) => {
    const req = httpsRequest(url, { ca, method: init.method ?? "GET", headers: { authorization: `Bearer ${token}`, ...init.headers } }, (res) => {
      let text = "";
      res.setEncoding("utf8");
      res.on("data", (d: string) => (text += d));
      res.on("end", () => resolve({ status: res.statusCode ?? 0, text }));
    });
    req.on("error", reject);
    req.end(init.body);
  });
}

async function waitUntil(check: () => Promise<boolean>, what: string, ms: number, log: () => string) {
  const deadline = Date.now() + ms;
  while (!(await check())) {
    if (Date.now() > deadline) throw new Error(`control plane: timed out waiting for ${what}\n${log()}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

const running = new Set<ChildProcess>();
// A test worker that dies must not leave a control plane behind.
process.once("exit", () => {
  for (const c of running) c.kill("SIGKILL");
});

export async function startControlPlane(o: ControlPlaneOptions = {}): Promise<ControlPlane> {
  const found = controlPlaneBinaries(o);
  if (!("dir" in found)) throw new Error(`no Kubernetes control plane: ${found.missing}; ${HOW_TO_ENABLE}`);
  const bin = (name: string) => join(found.dir, name);
  const dir = mkdtempSync(join(tmpdir(), "x402-k8s-"));
  const children: { name: string; child: ChildProcess }[] = [];
  const logs = (name: string) => join(dir, `${name}.log`);
  const tail = (name: string) => (existsSync(logs(name)) ? readFileSync(logs(name), "utf8").split("\n").slice(-30).join("\n") : "");
  let stopped = false;

  const launch = (name: string, args: string[], env: NodeJS.ProcessEnv = {}) => {
    const out = createWriteStream(logs(name));
    const child = spawn(bin(name), args, { cwd: dir, env: { PATH: process.env.PATH ?? "", HOME: dir, ...env }, stdio: ["ignore", "pipe", "pipe"] });
    child.stdout!.pipe(out);
    child.stderr!.pipe(out);
    running.add(child);
    child.once("exit", (code, signal) => {
      running.delete(child);
      if (!stopped) out.write(`\n[harness] ${name} exited (${code ?? signal})\n`);
    });
    children.push({ name, child });
    return child;
  };

  const stop = async () => {
    stopped = true;
    // Clients first, the store last.
    for (const { child } of [...children].reverse()) {
      if (child.exitCode !== null || child.signalCode !== null) continue;
      const exited = new Promise((r) => child.once("exit", r));
      child.kill("SIGTERM");
      const timer = setTimeout(() => child.kill("SIGKILL"), 5000);
      await exited;
      clearTimeout(timer);
    }
    rmSync(dir, { recursive: true, force: true });
  };

  const address = typeof o.address === "function" ? o.address() : (o.address ?? "127.0.0.1");
  try {
    makeCertificates(dir, address);
    const caPem = readFileSync(join(dir, "ca.crt"), "utf8");
    const adminToken = randomBytes(24).toString("hex");
    writeFileSync(join(dir, "audit-policy.yaml"), "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [RequestReceived]\nrules: [{level: Metadata}]\n");
    writeFileSync(join(dir, "tokens.csv"), `${adminToken},admin,admin-uid,"system:masters"\n`);
    const [etcdPort, peerPort, apiPort] = [await freePort(), await freePort(), await freePort()];
    const etcdUrl = `http://127.0.0.1:${etcdPort}`;
    const etcdChild = launch("etcd", [
      "--name=test",
      `--data-dir=${join(dir, "etcd")}`,
      `--listen-client-urls=${etcdUrl}`,
      `--advertise-client-urls=${etcdUrl}`,
      `--listen-peer-urls=http://127.0.0.1:${peerPort}`,
      `--initial-advertise-peer-urls=http://127.0.0.1:${peerPort}`,
      `--initial-cluster=test=http://127.0.0.1:${peerPort}`,
      "--unsafe-no-fsync", // a throwaway store: durability costs seconds on a busy disk
      "--log-level=warn",
    ]);
    const url = `https://${address}:${apiPort}`;
    launch("kube-apiserver", [
      `--etcd-servers=${etcdUrl}`,
      `--secure-port=${apiPort}`,
      `--bind-address=${address}`,
      `--advertise-address=${address}`,
      `--cert-dir=${dir}`,
      `--tls-cert-file=${join(dir, "serving.crt")}`,
      `--tls-private-key-file=${join(dir, "serving.key")}`,
      `--client-ca-file=${join(dir, "ca.crt")}`,
      `--token-auth-file=${join(dir, "tokens.csv")}`,
      "--authorization-mode=Node,RBAC",
      "--service-cluster-ip-range=10.0.0.0/24",
      "--allow-privileged=true",
      "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
      `--service-account-key-file=${join(dir, "sa.pub")}`,
      `--service-account-signing-key-file=${join(dir, "sa.key")}`,
      // Without controller-manager nobody creates the "default" ServiceAccount pods would need.
      ...(o.controllers ? [] : ["--disable-admission-plugins=ServiceAccount"]),
      // Watches go to etcd itself, so a compaction answers an old resourceVersion with 410 Gone
      // (with the watch cache, its own window decides instead).
      "--watch-cache=false",
      ...(o.audit ? [`--audit-policy-file=${join(dir, "audit-policy.yaml")}`, `--audit-log-path=${join(dir, "audit.log")}`, "--audit-log-maxsize=0"] : []),
      "--enable-priority-and-fairness=false",
      "--profiling=false",
      "--v=0",
    ]);
    const log = () => `--- etcd ---\n${tail("etcd")}\n--- kube-apiserver ---\n${tail("kube-apiserver")}`;
    await waitUntil(async () => {
      if (etcdChild.exitCode !== null) throw new Error(`etcd exited\n${log()}`);
      return (await httpsStatus(`${url}/readyz`, caPem, adminToken)) === 200;
    }, "kube-apiserver /readyz", 120_000, log);

    const kubeconfigPath = join(dir, "admin.kubeconfig");
    writeFileSync(kubeconfigPath, kubeconfigYaml(url, caPem, adminToken), { mode: 0o600 });
    const kcFor = (token: string, server = url) => {
      const kc = new KubeConfig();
      kc.loadFromString(kubeconfigYaml(server, caPem, token));
      return kc;
    };
    const kc = kcFor(adminToken);
    const core = kc.makeApiClient(CoreV1Api);
    const version = readVersion(found.dir);
    const applyFile = async (path: string) => {
      const text = readFileSync(path, "utf8");
      const doc = parseYaml(text) as { apiVersion: string; kind: string; metadata: { name: string } };
      const plural = `${doc.kind.toLowerCase()}s`; // enough for the cluster-scoped kinds applied here
      const base = doc.apiVersion.includes("/") ? `/apis/${doc.apiVersion}` : `/api/${doc.apiVersion}`;
      const res = await httpsRequestText(`${url}${base}/${plural}/${doc.metadata.name}?fieldManager=x402-fleet-tests&force=true`, caPem, adminToken, {
        method: "PATCH",
        headers: { "content-type": "application/apply-patch+yaml" },
        body: text,
      });
      if (res.status !== 200 && res.status !== 201) throw new Error(`applying ${path} failed: HTTP ${res.status} ${res.text}`);
    };
    for (const crd of o.crds ?? []) await applyFile(crd);

    if (o.controllers) {
      launch("kube-controller-manager", [
        `--kubeconfig=${kubeconfigPath}`,
        "--leader-elect=false",
        "--secure-port=0",
        `--service-account-private-key-file=${join(dir, "sa.key")}`,
        `--root-ca-file=${join(dir, "ca.crt")}`,
        "--controllers=*",
        "--concurrent-gc-syncs=5",
        // claims get volumes (directories under /tmp/hostpath_pv), so pods with a claim schedule
        "--enable-hostpath-provisioner=true",
        "--v=0",
      ]);
      await kc.makeApiClient(StorageV1Api).createStorageClass({
        body: {
          metadata: { name: "standard", annotations: { "storageclass.kubernetes.io/is-default-class": "true" } },
          provisioner: "kubernetes.io/host-path",
          reclaimPolicy: "Delete",
          volumeBindingMode: "Immediate",
        },
      });
    }
    if (o.fakeNodes) {
      launch("kube-scheduler", [`--kubeconfig=${kubeconfigPath}`, "--leader-elect=false", "--secure-port=0", "--v=0"]);
      launch("kwok", [`--kubeconfig=${kubeconfigPath}`, "--manage-all-nodes=true", "--cidr=10.0.0.1/24", "--node-ip=10.0.0.1", "--node-lease-duration-seconds=40", `--server-address=127.0.0.1:${await freePort()}`]);
      for (let i = 0; i < o.fakeNodes; i++) {
        const name = `kwok-node-${i}`;
        await core.createNode({
          body: {
            metadata: { name, annotations: { "kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0" }, labels: { "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64", type: "kwok" } },
            status: { allocatable: { cpu: "32", memory: "256Gi", pods: "110" }, capacity: { cpu: "32", memory: "256Gi", pods: "110" } },
          },
        });
      }
      await waitUntil(
        async () => {
          const nodes = await core.listNode();
          return nodes.items.filter((n) => n.status?.conditions?.some((c) => c.type === "Ready" && c.status === "True")).length === o.fakeNodes;
        },
        "the kwok nodes to turn Ready",
        60_000,
        () => `--- kwok ---\n${tail("kwok")}`,
      );
    }
    if (o.controllers) {
      // The ServiceAccount controller runs: "default" exists in a namespace once it is up.
      await waitUntil(async () => (await core.readNamespacedServiceAccount({ namespace: "default", name: "default" }).then(() => true, () => false)), "kube-controller-manager", 60_000, () => tail("kube-controller-manager"));
    }

    let seq = 0;
    return {
      url,
      etcdUrl,
      caPem,
      kubeconfigPath,
      kc,
      version,
      adminToken,
      applyFile,
      kubeConfigForToken: kcFor,
      request: (path, init = {}) => httpsRequestText(`${url}${path}`, caPem, adminToken, init),
      writeKubeconfig: (token, file) => {
        writeFileSync(file, kubeconfigYaml(url, caPem, token), { mode: 0o600 });
        return file;
      },
      serviceAccountToken: async (namespace, name, seconds = 3600) => {
        const r = await core.createNamespacedServiceAccountToken({ namespace, name, body: { spec: { audiences: [], expirationSeconds: seconds } } });
        return r.status!.token;
      },
      namespace: async (prefix) => {
        const name = `${prefix}-${process.pid}-${seq++}`.slice(0, 63);
        await core.createNamespace({ body: { metadata: { name } } });
        return name;
      },
      compactEtcd: async () => {
        const range = (await etcdPost(etcdUrl, "/v3/kv/range", { key: Buffer.from("\0").toString("base64") })) as { header: { revision: string } };
        await etcdPost(etcdUrl, "/v3/kv/compaction", { revision: range.header.revision, physical: true });
      },
      auditEvents: () => {
        const file = join(dir, "audit.log");
        if (!existsSync(file)) return [];
        return readFileSync(file, "utf8")
          .split("\n")
          .filter(Boolean)
          .map((l) => JSON.parse(l) as AuditEvent)
          .filter((e) => e.stage === "ResponseComplete" || (e.stage === "ResponseStarted" && e.verb === "watch"));
      },
      logOf: tail,
      stop,
    };
  } catch (e) {
    await stop();
    throw e;
  }
}

async function etcdPost(etcdUrl: string, path: string, body: unknown): Promise<unknown> {
  const res = await fetch(`${etcdUrl}${path}`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
  if (!res.ok) throw new Error(`etcd ${path}: HTTP ${res.status} ${await res.text()}`);
  return res.json();
}

function readVersion(dir: string): string {
  const file = join(dir, "VERSIONS");
  if (existsSync(file)) return /kubernetes=(\S+)/.exec(readFileSync(file, "utf8"))?.[1] ?? "unknown";
  return "unknown";
}

/**
 * A describe block with one control plane for all its tests (started in beforeAll, stopped in
 * afterAll). Without a control plane: skipped with one line, or with CI=true one failing test.
 */
export function describeWithControlPlane(name: string, o: ControlPlaneOptions, body: (cp: () => ControlPlane) => void): void {
  const availability = controlPlaneAvailability(name, o);
  if (availability.fail) {
    const why = availability.fail;
    describe(name, () => {
      it("has a Kubernetes control plane (CI=true)", () => {
        throw new Error(why);
      });
    });
    return;
  }
  if (!availability.run) {
    describe.skip(name, () => body(() => undefined as never));
    return;
  }
  describe(name, () => {
    let cp: ControlPlane | undefined;
    beforeAll(async () => {
      cp = await startControlPlane(o);
    }, 180_000);
    afterAll(async () => {
      await cp?.stop();
    });
    body(() => {
      if (!cp) throw new Error("the control plane did not start");
      return cp;
    });
  });
}
