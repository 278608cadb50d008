// charts/x402-fleet installed for real: `helm install --wait` into a real control plane
// (kube-apiserver, kube-controller-manager, kube-scheduler, a kwok node that turns pods Ready),
// then the operator run as a local process with a TokenRequest token of the chart's own
// operator ServiceAccount, so kube-apiserver enforces exactly the chart's RBAC: the operator
// reaches Ready with it, and requests outside its role are refused (403): by default it serves the
// release's namespace only (no Deployment in kube-system). Then `helm upgrade` with changed values
// and `helm uninstall` in the documented order: its pre-delete hook stops the operator and releases
// its finalizers, so that afterwards the FacilitatorNetworks and the (kept) CRD delete and nothing the
// operator made is left behind.
import { spawnSync } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, expect, it } from "vitest";
import { ApiextensionsV1Api, AppsV1Api, CoordinationV1Api, CoreV1Api, NetworkingV1Api, PatchStrategy, RbacAuthorizationV1Api, setHeaderOptions, type KubeConfig, type V1Job } from "@kubernetes/client-node";
import { parseAllDocuments } from "yaml";
import { pino } from "pino";
import { generatePrivateKey, privateKeyToAccount } from "viem/accounts";
import { startAnvil, type AnvilNode } from "../services/devnet/anvil.ts";
import { startOperator, type RunningOperator } from "../operator/operator.ts";
import { connect } from "../operator/kube.ts";
import { prepareUninstall } from "../operator/uninstall.ts";
import { FINALIZER, ROUTING_TABLE_KEY } from "../operator/api.ts";
import { parseRoutingTable } from "../services/router/routing-table.ts";
import { describeWithControlPlane, type AuditEvent } from "./helpers/control-plane.ts";
import { clusterOf, condition, until, type Cluster } from "./helpers/cluster.ts";
import { CHART, helm } from "./helpers/helm.ts";

const NS = "x402-system";
const APPS = NS; // by default the operator serves the release's namespace only
const RELEASE = "fleet";
const SA = "fleet-x402-fleet-operator";
const ROUTING = "fleet-x402-fleet-routing";
const mergePatch = setHeaderOptions("Content-Type", PatchStrategy.MergePatch);
const codeOf = async (p: Promise<unknown>) => p.then(() => 200, (e: { code?: number }) => e.code);

interface PolicyRule {
  apiGroups: string[];
  resources: string[];
  verbs: string[];
  resourceNames?: string[];
}

describeWithControlPlane("the chart installed with helm", { controllers: true, fakeNodes: 1, audit: true }, (cp) => {
  let c: Cluster;
  let home: string;
  let anvil: AnvilNode;
  let operator: RunningOperator | undefined;
  const logs: string[] = [];

  const runHelm = (args: string[]) => {
    const r = spawnSync(helm(), args, {
      encoding: "utf8",
      env: { PATH: process.env.PATH, HOME: home, KUBECONFIG: cp().kubeconfigPath, HELM_CACHE_HOME: join(home, "cache"), HELM_CONFIG_HOME: join(home, "config"), HELM_DATA_HOME: join(home, "data") },
    });
    if (r.status !== 0) throw new Error(`helm ${args[0]} failed (${r.status}): ${r.stderr}`);
    return r.stdout;
  };

  beforeAll(async () => {
    c = clusterOf(cp());
    home = mkdtempSync(join(tmpdir(), "x402-helm-install-"));
    anvil = await startAnvil({ chainId: 8453 });
  });
  afterAll(async () => {
    await operator?.stop();
    await anvil?.stop();
    if (home) rmSync(home, { recursive: true, force: true });
  });

  it("helm install --wait: the CRD, the operator's ServiceAccount and RBAC, and every Deployment available (pods Ready on the kwok node)", async () => {
    const out = runHelm(["install", RELEASE, CHART, "--namespace", NS, "--create-namespace", "--set", "operator.allowPrivateRpc=true", "--set", "wallets.enabled=true", "--set", "wallets.masterKeys.existingSecret=wallets-master", "--set", "wallets.database.url=postgres://wallets:pw@db:5432/wallets", "--wait", "--timeout", "120s"]);
    expect(out).toContain("STATUS: deployed");
    const crd = await c.kc.makeApiClient(ApiextensionsV1Api).readCustomResourceDefinition({ name: "facilitatornetworks.x402fleet.io" });
    expect(crd.status!.conditions!.find((x) => x.type === "Established")?.status).toBe("True");
    const deployments = (await c.apps.listNamespacedDeployment({ namespace: NS })).items;
    expect(deployments.map((d) => d.metadata!.name).sort()).toEqual(["fleet-x402-fleet-hub", "fleet-x402-fleet-operator", "fleet-x402-fleet-router", "fleet-x402-fleet-wallets"]);
    for (const d of deployments) expect(d.status!.availableReplicas).toBe(d.spec!.replicas);
    const pods = (await c.core.listNamespacedPod({ namespace: NS })).items;
    expect(pods.every((p) => p.spec!.nodeName === "kwok-node-0" && p.status!.conditions!.some((x) => x.type === "Ready" && x.status === "True"))).toBe(true);
    expect(await c.core.readNamespacedServiceAccount({ namespace: NS, name: SA })).toBeDefined();
  });

  let asOperator: KubeConfig;
  it("the operator, with a TokenRequest token of the chart's ServiceAccount, reaches Ready on a FacilitatorNetwork", async () => {
    asOperator = cp().kubeConfigForToken(await cp().serviceAccountToken(NS, SA));
    // configured as the chart's Deployment configures it
    const deployment = await c.apps.readNamespacedDeployment({ namespace: NS, name: "fleet-x402-fleet-operator" });
    const env = Object.fromEntries(deployment.spec!.template.spec!.containers[0]!.env!.filter((e) => e.value !== undefined).map((e) => [e.name, e.value!]));
    expect(env.X402_WATCH_NAMESPACE).toBe(NS);
    const signer = generatePrivateKey();
    await c.putSecret(APPS, "base-signer", { "signer-keys": signer });
    operator = await startOperator({
      kubeConfig: asOperator,
      namespace: NS,
      facilitatorImage: env.X402_FACILITATOR_IMAGE!,
      routingConfigMap: env.X402_ROUTING_CONFIGMAP,
      clusterDomain: env.X402_CLUSTER_DOMAIN,
      watchNamespace: env.X402_WATCH_NAMESPACE,
      leaderElection: { leaseName: env.X402_LEASE_NAME },
      routerTokenSecret: { name: env.X402_ROUTER_TOKEN_SECRET!, key: env.X402_ROUTER_TOKEN_SECRET_KEY! },
      routerPodLabels: Object.fromEntries(env.X402_ROUTER_POD_LABELS!.split(",").map((p) => p.split("=") as [string, string])),
      allowPrivateRpc: env.X402_OPERATOR_ALLOW_PRIVATE_RPC === "true", // anvil is on loopback
      identity: "fleet-x402-fleet-operator-local",
      logger: pino({ level: "debug" }, { write: (l: string) => void logs.push(l) }),
    });
    await c.createNetwork(APPS, "base", { network: "eip155:8453", rpc: [{ url: anvil.rpcUrl }], signerSecretRef: { name: "base-signer" } });
    const fn = await until(async () => {
      const f = await c.getNetwork(APPS, "base");
      return condition(f, "Ready")?.status === "True" ? f : undefined;
    }, "the network Ready");
    expect(fn.metadata.finalizers).toEqual([FINALIZER]);
    expect(fn.status!.signers).toEqual([privateKeyToAccount(signer).address]);
    const table = await until(async () => {
      const t = parseRoutingTable((await c.core.readNamespacedConfigMap({ namespace: NS, name: ROUTING })).data![ROUTING_TABLE_KEY]!);
      return t.backends.length > 0 ? t : undefined;
    }, "the routing entry");
    expect(table.backends.map((b) => b.network)).toEqual(["eip155:8453"]);
    const lease = await c.coordination.readNamespacedLease({ namespace: NS, name: env.X402_LEASE_NAME! });
    expect(lease.spec!.holderIdentity).toBe("fleet-x402-fleet-operator-local");
    // and kube-apiserver never had to refuse it anything
    expect(logs.join("\n")).not.toMatch(/HTTP 403/);
  });

  it("kube-apiserver refuses (403) what the chart's role does not grant that ServiceAccount", async () => {
    const core = asOperator.makeApiClient(CoreV1Api);
    const apps = asOperator.makeApiClient(AppsV1Api);
    const coordination = asOperator.makeApiClient(CoordinationV1Api);
    const patchCm = (namespace: string, name: string) => core.patchNamespacedConfigMap({ namespace, name, body: { metadata: { labels: { probe: "x" } } } }, mergePatch);
    expect(await codeOf(core.replaceNamespacedSecret({ namespace: APPS, name: "base-signer", body: { metadata: { name: "base-signer" }, stringData: { "signer-keys": "x" } } }))).toBe(403); // read-only
    expect(await codeOf(core.createNamespacedConfigMap({ namespace: "default", body: { metadata: { name: ROUTING } } }))).toBe(403); // only where it serves
    expect(await codeOf(coordination.patchNamespacedLease({ namespace: NS, name: "someone-elses", body: { spec: {} } }, mergePatch))).toBe(403);
    // the namespaced default: nothing of another namespace, kube-system's least of all
    const dryRun = { dryRun: "All" };
    const deploymentIn = (namespace: string) => ({ metadata: { name: "probe", namespace }, spec: { selector: { matchLabels: { a: "b" } }, template: { metadata: { labels: { a: "b" } }, spec: { containers: [{ name: "c", image: "x" }] } } } });
    expect(await codeOf(apps.createNamespacedDeployment({ namespace: "kube-system", body: deploymentIn("kube-system"), ...dryRun }))).toBe(403);
    expect(await codeOf(apps.createNamespacedDeployment({ namespace: APPS, body: deploymentIn(APPS), ...dryRun }))).toBe(200); // where it serves: the same request goes through
    expect(await codeOf(core.listSecretForAllNamespaces())).toBe(403);
    expect(await codeOf(core.readNamespacedSecret({ namespace: "kube-system", name: "any" }))).toBe(403);
    expect(await codeOf(apps.deleteNamespacedDeployment({ namespace: APPS, name: "base-facilitator" }))).toBe(403);
    expect(await codeOf(core.readNamespacedPod({ namespace: APPS, name: "x" }))).toBe(403);
    expect(await codeOf(core.deleteNamespace({ name: APPS }))).toBe(403);
    // what it is granted goes through
    expect(await codeOf(patchCm(NS, ROUTING))).toBe(200);
    expect(await c.apps.readNamespacedDeployment({ namespace: APPS, name: "base-facilitator" })).toBeDefined(); // not deleted
  });

  it("every rule of the chart's roles is used by the operator, as kube-apiserver's audit log records its requests", async () => {
    // exercise the rest of the operator's job: a PodDisruptionBudget comes and goes, a resource is deleted (finalizer released)
    await c.putSecret(APPS, "fleet-db", { url: "postgres://fleet:pw@postgres:5432/fleet" });
    await c.patchNetwork(APPS, "base", { spec: { replicas: 2, database: { urlSecretRef: { name: "fleet-db", key: "url" } } } });
    await until(() => c.policy.readNamespacedPodDisruptionBudget({ namespace: APPS, name: "base-facilitator" }).catch(() => undefined), "the PodDisruptionBudget");
    await c.patchNetwork(APPS, "base", { spec: { replicas: 1, database: null } });
    await until(async () => (await codeOf(c.policy.readNamespacedPodDisruptionBudget({ namespace: APPS, name: "base-facilitator" }))) === 404, "the PodDisruptionBudget to go");
    await c.createNetwork(APPS, "broken", { network: "eip155:84532", rpc: [{ url: "http://127.0.0.1:9/" }], signerSecretRef: { name: "missing-signer" } });
    await until(async () => (await c.getNetwork(APPS, "broken"))?.metadata.finalizers?.length, "the finalizer on broken");
    await c.deleteNetwork(APPS, "broken");
    await until(async () => (await c.getNetwork(APPS, "broken")) === undefined, "broken to go");

    const rbac = c.kc.makeApiClient(RbacAuthorizationV1Api);
    const servedRules = (await rbac.readNamespacedRole({ namespace: NS, name: SA })).rules as PolicyRule[];
    const selfRules = (await rbac.readNamespacedRole({ namespace: NS, name: `${SA}-self` })).rules as PolicyRule[];
    const grants = [...servedRules.map((rule) => ({ rule, scope: NS })), ...selfRules.map((rule) => ({ rule, scope: NS }))];
    const key = (scope: string, rule: PolicyRule, resource: string, verb: string) => `${scope} ${rule.apiGroups[0] || "core"}/${resource}:${verb}${rule.resourceNames ? `[${rule.resourceNames.join(",")}]` : ""}`;
    const all = grants.flatMap(({ rule, scope }) => rule.resources.flatMap((r) => rule.verbs.map((v) => key(scope, rule, r, v))));

    // the server's own record of each request: verb, API group, resource/subresource, namespace, name
    const asOperatorSa = (e: AuditEvent) => e.user.username === `system:serviceaccount:${NS}:${SA}`;
    // the leader renews its Lease every retry period (2 s): wait for one renewal
    await until(() => cp().auditEvents().some((e) => asOperatorSa(e) && e.verb === "update" && e.objectRef?.resource === "leases"), "a Lease renewal");
    // authorized requests (a 404 was authorized too; 403 is the refusal)
    const events = cp().auditEvents().filter((e) => asOperatorSa(e) && e.responseStatus?.code !== 403 && e.objectRef?.resource);
    expect(events.length).toBeGreaterThan(20);
    const used = new Set<string>();
    for (const e of events) {
      const ref = e.objectRef!;
      const resource = ref.subresource ? `${ref.resource}/${ref.subresource}` : ref.resource!;
      // a server-side apply that creates the object is also authorized as create
      const verbs = e.verb === "patch" && e.responseStatus?.code === 201 ? ["patch", "create"] : [e.verb];
      for (const verb of verbs) {
        for (const { rule, scope } of grants) {
          const applies =
            rule.apiGroups.includes(ref.apiGroup ?? "") &&
            rule.resources.includes(resource) &&
            rule.verbs.includes(verb) &&
            scope === ref.namespace &&
            (!rule.resourceNames || (ref.name !== undefined && rule.resourceNames.includes(ref.name)));
          if (applies) used.add(key(scope, rule, resource, verb));
        }
      }
    }
    // finalizers/update is checked by admission on children with blockOwnerDeletion, never requested
    expect(all.filter((k) => !used.has(k))).toEqual([`${NS} x402fleet.io/facilitatornetworks/finalizers:update`]);
  });

  it("helm upgrade with changed values rolls out the change (--wait)", async () => {
    const out = runHelm(["upgrade", RELEASE, CHART, "--namespace", NS, "--set", "router.replicas=3", "--set", "operator.replicas=1", "--wait", "--timeout", "120s"]);
    expect(out).toContain("REVISION: 2");
    const router = await c.apps.readNamespacedDeployment({ namespace: NS, name: "fleet-x402-fleet-router" });
    expect(router.spec!.replicas).toBe(3);
    expect(router.status!.availableReplicas).toBe(3);
    expect((await c.apps.readNamespacedDeployment({ namespace: NS, name: "fleet-x402-fleet-operator" })).spec!.replicas).toBe(1);
  });

  it("helm uninstall: its pre-delete hook stops the operator and releases its finalizers; then the FacilitatorNetworks and the kept CRD delete, and nothing the operator made is left", async () => {
    await operator!.stop();
    operator = undefined;
    const children = { deployment: "base-facilitator", service: "base-facilitator", networkPolicy: "base-facilitator", tokens: "base-facilitator-router-tokens" };
    expect(await c.core.readNamespacedConfigMap({ namespace: APPS, name: children.tokens })).toBeDefined();
    expect(await c.kc.makeApiClient(NetworkingV1Api).readNamespacedNetworkPolicy({ namespace: APPS, name: children.networkPolicy })).toBeDefined();
    expect((await c.getNetwork(APPS, "base"))!.metadata.finalizers).toEqual([FINALIZER]);

    // The hook as the release holds it: a pre-delete Job running `x402-fleet pre-uninstall` under its own ServiceAccount.
    const hooks = parseAllDocuments(runHelm(["get", "hooks", RELEASE, "--namespace", NS])).map((d) => d.toJSON() as V1Job).filter(Boolean);
    const job = hooks.find((h) => h.kind === "Job")!;
    expect(job.metadata!.annotations!["helm.sh/hook"]).toBe("pre-delete");
    const pod = job.spec!.template.spec!;
    expect(pod.containers[0]!.args).toEqual(["pre-uninstall"]);
    const env = Object.fromEntries(pod.containers[0]!.env!.filter((e) => e.value !== undefined).map((e) => [e.name, e.value!]));
    // kwok's node runs no process (it marks a Job's pod Succeeded): the Job's command runs here, with a
    // TokenRequest token of the hook's ServiceAccount (kube-apiserver enforces its RBAC) and the Job's environment.
    const asHook = connect(cp().kubeConfigForToken(await cp().serviceAccountToken(NS, pod.serviceAccountName!)));
    const report = await prepareUninstall({
      kube: asHook,
      namespace: NS,
      watchNamespace: env.X402_WATCH_NAMESPACE,
      operatorDeployment: env.X402_OPERATOR_DEPLOYMENT!,
      routingConfigMap: env.X402_ROUTING_CONFIGMAP!,
      leaseName: env.X402_LEASE_NAME!,
      logger: pino({ level: "silent" }),
      pollMs: 200,
    });
    expect(report.finalizersReleased).toEqual([`${APPS}/base`]);
    expect(report.deleted).toEqual([`ConfigMap/${ROUTING}`, `Lease/${env.X402_LEASE_NAME}`]);
    // no operator pod is left to put a finalizer back
    expect((await c.core.listNamespacedPod({ namespace: NS, labelSelector: "app.kubernetes.io/component=operator" })).items).toEqual([]);

    runHelm(["uninstall", RELEASE, "--namespace", NS, "--wait", "--timeout", "120s"]);
    const released = `app.kubernetes.io/instance=${RELEASE}`;
    await until(async () => (await c.apps.listNamespacedDeployment({ namespace: NS, labelSelector: released })).items.length === 0, "the release's Deployments to go");
    expect(await codeOf(c.core.readNamespacedServiceAccount({ namespace: NS, name: SA }))).toBe(404);
    const crds = c.kc.makeApiClient(ApiextensionsV1Api);
    const crd = await crds.readCustomResourceDefinition({ name: "facilitatornetworks.x402fleet.io" });
    expect(crd.metadata!.annotations!["helm.sh/resource-policy"]).toBe("keep");
    // kept with the CRD, its facilitator still running; the operator's own objects are gone
    expect((await c.getNetwork(APPS, "base"))!.metadata.finalizers ?? []).toEqual([]);
    expect(await codeOf(c.core.readNamespacedConfigMap({ namespace: NS, name: ROUTING }))).toBe(404);
    expect(await codeOf(c.coordination.readNamespacedLease({ namespace: NS, name: env.X402_LEASE_NAME! }))).toBe(404);

    // The documented order's last step: the chain, then the CRD, each deleted with no operator left.
    await c.deleteNetwork(APPS, "base");
    await until(async () => (await c.getNetwork(APPS, "base")) === undefined, "the FacilitatorNetwork to delete");
    const networking = c.kc.makeApiClient(NetworkingV1Api);
    await until(
      async () =>
        (await codeOf(c.apps.readNamespacedDeployment({ namespace: APPS, name: children.deployment }))) === 404 &&
        (await codeOf(c.core.readNamespacedService({ namespace: APPS, name: children.service }))) === 404 &&
        (await codeOf(networking.readNamespacedNetworkPolicy({ namespace: APPS, name: children.networkPolicy }))) === 404 &&
        (await codeOf(c.core.readNamespacedConfigMap({ namespace: APPS, name: children.tokens }))) === 404,
      "the garbage collector to delete its children",
      120_000, // the collector notices a custom resource's deletion on its own schedule (about 30 s here)
    );
    await crds.deleteCustomResourceDefinition({ name: "facilitatornetworks.x402fleet.io" });
    await until(async () => (await codeOf(crds.readCustomResourceDefinition({ name: "facilitatornetworks.x402fleet.io" }))) === 404, "the CRD to delete");
    // nothing the operator made remains anywhere
    const managed = "app.kubernetes.io/managed-by=x402-fleet-operator";
    expect((await c.core.listConfigMapForAllNamespaces({ labelSelector: managed })).items.map((m) => m.metadata!.name)).toEqual([]);
    expect((await networking.listNetworkPolicyForAllNamespaces({ labelSelector: managed })).items.map((m) => m.metadata!.name)).toEqual([]);
    expect((await c.coordination.listNamespacedLease({ namespace: NS })).items.map((l) => l.metadata!.name)).toEqual([]);
  });
});
