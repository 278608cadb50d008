// The real operator (client-node informers, watches, server-side apply, Lease election) against
// a real control plane (test/helpers/control-plane.ts): kube-apiserver over etcd, the
// Deployment/ReplicaSet controllers and the garbage collector of kube-controller-manager,
// kube-scheduler and a kwok fake node that turns scheduled pods Ready; real anvil nodes answer
// the RPC chain-id check. Pods are held back (not Ready) by cordoning the node. One control plane
// for the file; each test has its own namespaces and operator namespace.
import { afterAll, beforeAll, expect, it } from "vitest";
import { spawn } from "node:child_process";
import { createServer, type Socket } from "node:net";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { pino } from "pino";
import { Watch, type V1Pod } from "@kubernetes/client-node";
import { generatePrivateKey, privateKeyToAccount } from "viem/accounts";
import { startAnvil, stopChild, type AnvilNode } from "../services/devnet/anvil.ts";
import { parseRoutingTable, type RoutingTable } from "../services/router/routing-table.ts";
import { ANNOTATION_SECRETS_HASH, FIELD_MANAGER, FINALIZER, ROUTING_TABLE_KEY, type FacilitatorNetwork, type FacilitatorNetworkSpec } from "../operator/api.ts";
import { startOperator, type OperatorOptions, type RunningOperator } from "../operator/operator.ts";
import { createReconciler } from "../operator/reconcile.ts";
import { connect } from "../operator/kube.ts";
import { fetchChainId } from "../operator/checks.ts";
import { describeWithControlPlane, type ControlPlane } from "./helpers/control-plane.ts";
import { CRD_PATH, clusterOf, condition, recordEvents, until, type Cluster } from "./helpers/cluster.ts";
import { startApiProxy, type ApiProxy } from "./helpers/api-proxy.ts";
const RPC_KEY = "SECRET-RPC-API-KEY-7f3a";

let base: AnvilNode; // eip155:8453
let polygon: AnvilNode; // eip155:137
beforeAll(async () => {
  [base, polygon] = await Promise.all([startAnvil({ chainId: 8453 }), startAnvil({ chainId: 137 })]);
});
afterAll(async () => {
  await Promise.all([base?.stop(), polygon?.stop()]);
});

interface World {
  c: Cluster;
  /** The test's namespaces: the networks' ("payments"), another one, the operator's. */
  ns: string;
  other: string;
  opNs: string;
  logs: string[];
  operators: RunningOperator[];
  /** With `proxy`, the operators talk to the API server through it. */
  start(identity?: string, proxy?: ApiProxy, extra?: Partial<OperatorOptions>): Promise<RunningOperator>;
  stop(): Promise<void>;
}

let seq = 0;
async function world(cp: ControlPlane): Promise<World> {
  const c = clusterOf(cp);
  const id = `${process.pid}-${seq++}`;
  const [ns, other, opNs] = [`payments-${id}`, `other-${id}`, `x402-system-${id}`];
  for (const n of [ns, other, opNs]) await c.ensureNamespace(n);
  const logs: string[] = [];
  const logger = pino({ level: "debug" }, { write: (line: string) => void logs.push(line) });
  const operators: RunningOperator[] = [];
  return {
    c,
    ns,
    other,
    opNs,
    logs,
    operators,
    async start(identity = "op-0", proxy, extra = {}) {
      const op = await startOperator({
        kubeConfig: proxy ? cp.kubeConfigForToken(cp.adminToken, proxy.url) : c.kc,
        namespace: opNs,
        facilitatorImage: "x402-fleet:test",
        identity,
        leaderElection: { leaseDurationMs: 1000, renewDeadlineMs: 600, retryPeriodMs: 100 },
        allowPrivateRpc: true, // the anvils are on loopback
        rateLimits: { baseDelayMs: 20, maxDelayMs: 400, qps: 100, burst: 100 },
        rpcTimeoutMs: 2000,
        logger,
        ...extra,
      });
      operators.push(op);
      return op;
    },
    async stop() {
      await Promise.all(operators.map((o) => o.stop()));
      await c.uncordon();
      // leave nothing another test's operator would see: networks (finalizers stripped), then the namespaces
      await c.purgeNetworks([ns, other]);
      for (const n of [ns, other, opNs]) await c.core.deleteNamespace({ name: n }).catch(() => undefined);
    },
  };
}

/** With the shared database every multi-replica network needs (its Secret: putDatabaseSecret). */
function baseSpec(extra: Partial<FacilitatorNetworkSpec> = {}): FacilitatorNetworkSpec {
  return { network: "eip155:8453", rpc: [{ url: base.rpcUrl }], signerSecretRef: { name: "base-signer" }, database: { urlSecretRef: { name: "fleet-db", key: "url" } }, ...extra };
}
const DB_PASSWORD = "db-password-5be1";
const putDatabaseSecret = (c: Cluster, ns: string) => c.putSecret(ns, "fleet-db", { url: `postgres://x402:${DB_PASSWORD}@postgres.${ns}.svc:5432/x402` });

async function waitFor(c: Cluster, ns: string, name: string, test: (fn: FacilitatorNetwork) => boolean, what: string): Promise<FacilitatorNetwork> {
  return until(async () => {
    const fn = await c.getNetwork(ns, name);
    return fn && test(fn) ? fn : undefined;
  }, what);
}
const ready = (fn: FacilitatorNetwork) => condition(fn, "Ready")?.status === "True" && fn.status?.observedGeneration === fn.metadata.generation;

async function routingTable(w: World): Promise<RoutingTable> {
  const cm = await w.c.core.readNamespacedConfigMap({ namespace: w.opNs, name: "x402-fleet-routing" });
  return parseRoutingTable(cm.data![ROUTING_TABLE_KEY]!);
}

async function exists(read: () => Promise<unknown>): Promise<boolean> {
  try {
    await read();
    return true;
  } catch (e) {
    if ((e as { code?: number }).code === 404) return false;
    throw e;
  }
}

describeWithControlPlane("the operator on kube-apiserver", { controllers: true, fakeNodes: 1, crds: [CRD_PATH] }, (cp) => {
  it("create → a Deployment and a Service, Ready once a pod serves, and the network in the routing table; no secret anywhere", async () => {
    const w = await world(cp());
    try {
      const { c, ns: NS, opNs: OPERATOR_NS } = w;
      const signerKey = generatePrivateKey();
      await c.putSecret(NS, "base-signer", { "signer-keys": `${signerKey}\n` });
      await c.putSecret(NS, "base-rpc", { url: `${base.rpcUrl}/?apikey=${RPC_KEY}` });
      await putDatabaseSecret(c, NS);
      await c.cordon(); // no pod can start
      await w.start();
      await c.createNetwork(NS, "base", baseSpec({ rpc: [{ secretKeyRef: { name: "base-rpc", key: "url" } }] }));

      // the pods are not available yet: not Ready, not routed
      const waiting = await waitFor(c, NS, "base", (fn) => condition(fn, "Ready")?.reason === "DeploymentUnavailable", "Ready=False DeploymentUnavailable");
      expect(condition(waiting, "Progressing")).toMatchObject({ status: "True", reason: "RollingOut" });
      expect((await routingTable(w)).backends).toEqual([]);

      await c.uncordon();
      const fn = await waitFor(c, NS, "base", ready, "Ready");
      expect(fn.metadata.finalizers).toEqual([FINALIZER]);
      expect(fn.status).toMatchObject({
        observedGeneration: 1,
        chainId: 8453,
        signers: [privateKeyToAccount(signerKey).address],
        kinds: [{ x402Version: 2, scheme: "exact", network: "eip155:8453" }],
        url: `http://base-facilitator.${NS}.svc.cluster.local:4021/v2`,
        readyReplicas: 1,
      });
      expect(condition(fn, "Progressing")).toMatchObject({ status: "False", reason: "RolloutComplete" });
      expect(condition(fn, "Degraded")).toMatchObject({ status: "False", reason: "AsExpected" });

      const d = await c.apps.readNamespacedDeployment({ namespace: NS, name: "base-facilitator" });
      expect(d.metadata!.ownerReferences).toEqual([expect.objectContaining({ kind: "FacilitatorNetwork", name: "base", uid: fn.metadata.uid, controller: true, blockOwnerDeletion: true })]);
      expect(d.metadata!.managedFields!.map((m) => `${m.manager}/${m.operation}`)).toContain(`${FIELD_MANAGER}/Apply`);
      const container = d.spec!.template.spec!.containers[0]!;
      expect(container.env).toContainEqual({ name: "X402_RPC_URL_0", valueFrom: { secretKeyRef: { name: "base-rpc", key: "url" } } });
      expect(d.spec!.template.spec!.volumes![0]!.secret!.secretName).toBe("base-signer");
      const svc = await c.core.readNamespacedService({ namespace: NS, name: "base-facilitator" });
      expect(svc.spec!.ports![0]!.port).toBe(4021);
      expect(svc.metadata!.ownerReferences![0]!.uid).toBe(fn.metadata.uid);
      expect(await exists(() => c.policy.readNamespacedPodDisruptionBudget({ namespace: NS, name: "base-facilitator" }))).toBe(false);
      const statusOwner = (await c.custom.getNamespacedCustomObject({ group: "x402fleet.io", version: "v1alpha1", plural: "facilitatornetworks", namespace: NS, name: "base" })) as {
        metadata: { managedFields: { manager: string; subresource?: string }[] };
      };
      expect(statusOwner.metadata.managedFields).toContainEqual(expect.objectContaining({ manager: FIELD_MANAGER, subresource: "status" }));

      // the doctor's chain checks as a condition, judged on this anvil: it has none of the x402
      // contracts, and the new signer key holds no gas; informational, so the network stays Ready and routed
      const checked = await waitFor(c, NS, "base", (f) => condition(f, "ChainChecked") !== undefined, "ChainChecked");
      const chainChecked = condition(checked, "ChainChecked")!;
      expect(chainChecked).toMatchObject({ status: "False", reason: "ChecksFailed", observedGeneration: 1 });
      expect(chainChecked.message).toContain("Permit2 has no code at 0x000000000022D473030F116dDEE9F6B43aC78BA3");
      expect(chainChecked.message).toContain(`signer ${privateKeyToAccount(signerKey).address} holds 0 (native)`);
      expect(condition(checked, "Ready")).toMatchObject({ status: "True" });
      await until(async () => (await c.eventsFor(NS, "base")).find((e) => e.type === "Warning" && e.reason === "ChainChecksFailed"), "the ChainChecksFailed event");

      const table = await routingTable(w);
      expect(table.backends).toEqual([{ network: "eip155:8453", url: fn.status!.url, kinds: fn.status!.kinds, signers: fn.status!.signers, extensions: ["eip2612GasSponsoring", "payment-identifier"] }]);
      const events = await c.eventsFor(NS, "base");
      expect(events).toContainEqual(expect.objectContaining({ type: "Normal", reason: "Ready", reportingInstance: "op-0" }));

      // the routing ConfigMap is level-triggered too: deleted by hand, it comes back
      await c.core.deleteNamespacedConfigMap({ namespace: OPERATOR_NS, name: "x402-fleet-routing" });
      await until(async () => (await routingTable(w).catch(() => undefined))?.backends.length === 1, "the routing ConfigMap to be restored");

      // secrets: the RPC key and the signer key appear in no log line, event, status, child or table
      const everything = JSON.stringify({ logs: w.logs, events, status: fn.status, checked: checked.status, d, svc, table });
      expect(w.logs.length).toBeGreaterThan(0);
      expect(everything).not.toContain(RPC_KEY);
      expect(everything).not.toContain(DB_PASSWORD);
      expect(everything).not.toContain(signerKey.slice(2));
    } finally {
      await w.stop();
    }
  });

  it("a missing signer Secret → Degraded with a Warning event, healed when the Secret appears", async () => {
    const w = await world(cp());
    try {
      const { c, ns: NS } = w;
      await putDatabaseSecret(c, NS);
      await w.start();
      await c.createNetwork(NS, "base", baseSpec());
      const degraded = await waitFor(c, NS, "base", (fn) => condition(fn, "Degraded")?.status === "True", "Degraded");
      expect(condition(degraded, "Degraded")).toMatchObject({ reason: "SignerSecretNotFound", message: `signer Secret "base-signer" not found in namespace ${NS}` });
      expect(condition(degraded, "Ready")).toMatchObject({ status: "False", reason: "SignerSecretNotFound" });
      expect(condition(degraded, "Progressing")).toMatchObject({ status: "False", reason: "Blocked" });
      await until(async () => (await c.eventsFor(NS, "base")).find((e) => e.type === "Warning" && e.reason === "SignerSecretNotFound"), "the Warning event");
      expect(await exists(() => c.apps.readNamespacedDeployment({ namespace: NS, name: "base-facilitator" }))).toBe(false);
      expect((await routingTable(w)).backends).toEqual([]);

      await c.putSecret(NS, "base-signer", { "signer-keys": generatePrivateKey() });
      const healed = await waitFor(c, NS, "base", ready, "Ready after the Secret appeared");
      expect(condition(healed, "Degraded")).toMatchObject({ status: "False", reason: "AsExpected" });
      expect(await c.apps.readNamespacedDeployment({ namespace: NS, name: "base-facilitator" })).toBeDefined();
      await until(async () => (await c.eventsFor(NS, "base")).find((e) => e.reason === "Recovered"), "the Recovered event");
      expect((await routingTable(w)).backends.map((b) => b.network)).toEqual(["eip155:8453"]);
      // one Warning for the one state change, not one per retry
      expect((await c.eventsFor(NS, "base")).filter((e) => e.reason === "SignerSecretNotFound")).toHaveLength(1);
    } finally {
      await w.stop();
    }
  });

  it("an RPC on another chain → ChainIdMismatch (asked of the real RPC); fixed by pointing it at the right chain", async () => {
    const w = await world(cp());
    try {
      const { c, ns: NS } = w;
      await c.putSecret(NS, "base-signer", { "signer-keys": generatePrivateKey() });
      await putDatabaseSecret(c, NS);
      await w.start();
      await c.createNetwork(NS, "base", baseSpec({ rpc: [{ url: polygon.rpcUrl }] }));
      const wrong = await waitFor(c, NS, "base", (fn) => condition(fn, "Degraded")?.reason === "ChainIdMismatch", "ChainIdMismatch");
      expect(wrong.status!.chainId).toBe(137);
      expect(condition(wrong, "Degraded")!.message).toBe(`RPC 127.0.0.1:${polygon.port} reports chain id 137, but eip155:8453 needs 8453`);
      expect(condition(wrong, "Ready")).toMatchObject({ status: "False", reason: "ChainIdMismatch" });
      await until(async () => (await c.eventsFor(NS, "base")).find((e) => e.type === "Warning" && e.reason === "ChainIdMismatch"), "the Warning event");
      expect(await exists(() => c.apps.readNamespacedDeployment({ namespace: NS, name: "base-facilitator" }))).toBe(false);

      await c.patchNetwork(NS, "base", { spec: { rpc: [{ url: base.rpcUrl }] } });
      const fixed = await waitFor(c, NS, "base", ready, "Ready with the right RPC");
      expect(fixed.status!.chainId).toBe(8453);
      expect(fixed.status!.observedGeneration).toBe(2);
    } finally {
      await w.stop();
    }
  });

  it("without allowPrivateRpc, an RPC on a loopback, private, metadata or cluster-internal address → Degraded (RpcEndpointNotAllowed) and never contacted", async () => {
    const w = await world(cp());
    // A listener that counts every connection: the operator must open none.
    const sockets: Socket[] = [];
    const listener = createServer((s) => void sockets.push(s.destroy()));
    await new Promise<void>((r) => listener.listen(0, "127.0.0.1", r));
    const port = (listener.address() as { port: number }).port;
    try {
      const { c, ns: NS } = w;
      await c.putSecret(NS, "base-signer", { "signer-keys": generatePrivateKey() });
      await c.putSecret(NS, "base-rpc", { url: `http://169.254.169.254/latest/${RPC_KEY}` });
      await putDatabaseSecret(c, NS);
      await w.start("op-0", undefined, { allowPrivateRpc: false });
      // one chain each: resources naming the same network would wait behind the first (NetworkConflict)
      const cases: { name: string; network: string; rpc: FacilitatorNetworkSpec["rpc"]; label: string }[] = [
        { name: "loopback", network: "eip155:8453", rpc: [{ url: `http://127.0.0.1:${port}/${RPC_KEY}` }], label: `127.0.0.1:${port}` },
        { name: "mapped", network: "eip155:84532", rpc: [{ url: `http://[::ffff:127.0.0.1]:${port}/` }], label: `[::ffff:7f00:1]:${port}` },
        { name: "in-cluster", network: "eip155:137", rpc: [{ url: "http://kubernetes.default.svc/" }], label: "kubernetes.default.svc" },
        { name: "metadata", network: "eip155:42161", rpc: [{ secretKeyRef: { name: "base-rpc", key: "url" } }], label: "Secret base-rpc/url" },
      ];
      for (const k of cases) await c.createNetwork(NS, k.name, baseSpec({ rpc: k.rpc, network: k.network }));
      for (const k of cases) {
        const fn = await waitFor(c, NS, k.name, (x) => condition(x, "Degraded")?.reason === "RpcEndpointNotAllowed", `${k.name}: RpcEndpointNotAllowed`);
        expect(condition(fn, "Ready")).toMatchObject({ status: "False", reason: "RpcEndpointNotAllowed" });
        const message = condition(fn, "Degraded")!.message;
        expect(message).toContain(`RPC ${k.label} is a loopback, private or cluster-internal address`);
        expect(message).not.toContain(RPC_KEY);
        expect(await exists(() => c.apps.readNamespacedDeployment({ namespace: NS, name: `${k.name}-facilitator` }))).toBe(false);
      }
      await until(async () => (await c.eventsFor(NS, "loopback")).find((e) => e.type === "Warning" && e.reason === "RpcEndpointNotAllowed"), "the Warning event");
      expect(sockets).toHaveLength(0);
      expect(JSON.stringify(w.logs)).not.toContain(RPC_KEY);
    } finally {
      listener.close();
      await w.stop();
    }
  });

  it("an RPC outage → Degraded (RpcUnreachable) while the network stays Ready and routed; recovered by the retries", async () => {
    const w = await world(cp());
    const own = await startAnvil({ chainId: 8453 });
    try {
      const { c, ns: NS } = w;
      await c.putSecret(NS, "base-signer", { "signer-keys": generatePrivateKey() });
      await putDatabaseSecret(c, NS);
      await w.start();
      await c.createNetwork(NS, "base", baseSpec({ rpc: [{ url: own.rpcUrl }] }));
      await waitFor(c, NS, "base", ready, "Ready");
      await own.stop();
      await c.patchNetwork(NS, "base", { metadata: { labels: { touched: "yes" } } }); // any event triggers a pass
      const outage = await waitFor(c, NS, "base", (fn) => condition(fn, "Degraded")?.reason === "RpcUnreachable", "RpcUnreachable");
      expect(condition(outage, "Ready")!.status).toBe("True");
      expect((await routingTable(w)).backends.map((b) => b.network)).toEqual(["eip155:8453"]);
      const restarted = await startAnvil({ chainId: 8453, port: own.port });
      try {
        await waitFor(c, NS, "base", (fn) => condition(fn, "Degraded")?.status === "False", "recovery without any event");
      } finally {
        await restarted.stop();
      }
    } finally {
      await own.stop();
      await w.stop();
    }
  });

  it("a spec change → a rollout and the new observedGeneration; a Secret change rolls the pods (Secrets watched as metadata only); a PodDisruptionBudget while replicas > 1", async () => {
    const w = await world(cp());
    const proxy = await startApiProxy(cp().url, cp().caPem); // sees every byte the server sends the operator
    const UNRELATED = "UNRELATED-SECRET-VALUE-9c1e";
    try {
      const { c, ns: NS } = w;
      const key1 = generatePrivateKey();
      await c.putSecret(NS, "base-signer", { "signer-keys": key1 });
      await putDatabaseSecret(c, NS);
      for (const n of [NS, w.other]) await c.putSecret(n, "unrelated-app-secret", { token: UNRELATED });
      await w.start("op-0", proxy);
      await c.createNetwork(NS, "base", baseSpec());
      await waitFor(c, NS, "base", ready, "Ready");
      const before = await c.apps.readNamespacedDeployment({ namespace: NS, name: "base-facilitator" });

      await c.cordon(); // the new pods do not come up yet
      await c.patchNetwork(NS, "base", { spec: { replicas: 2, settlement: { receiptTimeoutSeconds: 12 } } });
      const rolling = await waitFor(c, NS, "base", (fn) => fn.status?.observedGeneration === 2 && condition(fn, "Progressing")?.status === "True", "rollout in progress");
      expect(condition(rolling, "Ready")!.status).toBe("True"); // the old pods still serve
      expect(condition(rolling, "Progressing")!.reason).toBe("RollingOut");
      const d = await c.apps.readNamespacedDeployment({ namespace: NS, name: "base-facilitator" });
      expect(d.metadata!.generation).toBe(before.metadata!.generation! + 1);
      expect(d.spec!.replicas).toBe(2);
      expect(d.spec!.template.spec!.containers[0]!.env).toContainEqual({ name: "X402_RECEIPT_TIMEOUT_MS", value: "12000" });
      expect(await exists(() => c.policy.readNamespacedPodDisruptionBudget({ namespace: NS, name: "base-facilitator" }))).toBe(true);
      await until(async () => (await c.eventsFor(NS, "base")).filter((e) => e.reason === "RollingOut").length >= 2, "a RollingOut event for the change");

      await c.uncordon();
      const rolled = await waitFor(c, NS, "base", (fn) => condition(fn, "Progressing")?.reason === "RolloutComplete" && fn.status?.readyReplicas === 2, "rollout complete");
      expect(rolled.status!.observedGeneration).toBe(2);

      // rotating the signer key rolls the pods (pod template annotation) and updates the signers
      const key2 = generatePrivateKey();
      await c.putSecret(NS, "base-signer", { "signer-keys": key2 });
      const rotated = await until(async () => {
        const dep = await c.apps.readNamespacedDeployment({ namespace: NS, name: "base-facilitator" });
        return dep.spec!.template.metadata!.annotations![ANNOTATION_SECRETS_HASH] !== d.spec!.template.metadata!.annotations![ANNOTATION_SECRETS_HASH] && dep;
      }, "the pod template to change with the Secret");
      expect(rotated.metadata!.generation).toBe(d.metadata!.generation! + 1);
      await waitFor(c, NS, "base", (fn) => fn.status?.signers?.[0] === privateKeyToAccount(key2).address, "the new signer in status");
      await until(async () => (await routingTable(w)).backends[0]?.signers[0] === privateKeyToAccount(key2).address, "the new signer in the routing table");

      // so does a new database password (the database Secret is watched too); with the Deployment
      // settled and its controller paused, only the Secret's event can trigger this pass
      await waitFor(c, NS, "base", (fn) => condition(fn, "Progressing")?.reason === "RolloutComplete" && fn.status?.signers?.[0] === privateKeyToAccount(key2).address, "the rotation rolled out");
      await c.cordon();
      await c.putSecret(NS, "fleet-db", { url: `postgres://x402:rotated-password@postgres.${NS}.svc:5432/x402` });
      await until(async () => {
        const dep = await c.apps.readNamespacedDeployment({ namespace: NS, name: "base-facilitator" });
        return dep.spec!.template.metadata!.annotations![ANNOTATION_SECRETS_HASH] !== rotated.spec!.template.metadata!.annotations![ANNOTATION_SECRETS_HASH];
      }, "the pod template to change with the database Secret");
      await c.uncordon();

      await c.patchNetwork(NS, "base", { spec: { replicas: 1 } });
      await until(async () => !(await exists(() => c.policy.readNamespacedPodDisruptionBudget({ namespace: NS, name: "base-facilitator" }))), "the PodDisruptionBudget to go");

      // The Secret list and watch carried metadata only: the operator saw the unrelated Secrets'
      // names, never their data; it read the referenced Secrets one by one.
      const collection = proxy.received(/^\/api\/v1(\/namespaces\/[^/]+)?\/secrets$/);
      expect(collection).toContain('"kind":"PartialObjectMetadataList"');
      expect(collection).toContain('"name":"unrelated-app-secret"');
      expect(collection).toContain('"kind":"PartialObjectMetadata"'); // watch events (the rotations)
      const everything = proxy.received(/./);
      expect(everything).not.toContain(Buffer.from(UNRELATED).toString("base64"));
      expect(proxy.received(/\/secrets\/base-signer$/)).toContain(Buffer.from(key2).toString("base64"));
    } finally {
      await w.stop();
      await proxy.close();
    }
  });

  it("without a database: the store on a claim that outlives the pods, and no rollout ever has two pods holding the keys (pods watched throughout)", async () => {
    const w = await world(cp());
    let watching: { abort(): void } | undefined;
    try {
      const { c, ns: NS } = w;
      await c.putSecret(NS, "polygon-signer", { "signer-keys": generatePrivateKey() });
      await w.start();
      // every pod of the namespace from creation to deletion (or a terminal phase): who holds the keys
      const live = new Set<string>();
      const seen = new Set<string>();
      let most = 0;
      const list = await c.core.listNamespacedPod({ namespace: NS });
      expect(list.items).toEqual([]);
      watching = await new Watch(c.kc).watch(
        `/api/v1/namespaces/${NS}/pods`,
        { resourceVersion: list.metadata!.resourceVersion },
        (type: string, pod: V1Pod) => {
          const uid = pod.metadata!.uid!;
          seen.add(uid);
          const ended = type === "DELETED" || pod.status?.phase === "Succeeded" || pod.status?.phase === "Failed";
          if (ended) live.delete(uid);
          else live.add(uid);
          most = Math.max(most, live.size);
        },
        () => undefined,
      );
      await c.createNetwork(NS, "polygon", { network: "eip155:137", rpc: [{ url: polygon.rpcUrl }], signerSecretRef: { name: "polygon-signer" } });
      const first = await waitFor(c, NS, "polygon", ready, "Ready");
      const claim = await c.core.readNamespacedPersistentVolumeClaim({ namespace: NS, name: "polygon-facilitator-store" });
      expect(claim.status!.phase).toBe("Bound"); // a real volume from the provisioner; the pod scheduled with it
      expect(claim.metadata!.ownerReferences![0]).toMatchObject({ kind: "FacilitatorNetwork", uid: first.metadata.uid });
      const dep = await c.apps.readNamespacedDeployment({ namespace: NS, name: "polygon-facilitator" });
      expect(dep.spec!.strategy).toEqual({ type: "Recreate" });

      const rolledOut = (generation: number) => (fn: FacilitatorNetwork) =>
        ready(fn) && fn.status?.observedGeneration === generation && condition(fn, "Progressing")?.reason === "RolloutComplete";
      // a spec change and a signer rotation: two rollouts, each replacing the pod
      await c.patchNetwork(NS, "polygon", { spec: { schemes: ["exact", "upto"] } });
      await waitFor(c, NS, "polygon", rolledOut(2), "the schemes rolled out");
      await c.putSecret(NS, "polygon-signer", { "signer-keys": generatePrivateKey() });
      await until(async () => {
        const pods = (await c.core.listNamespacedPod({ namespace: NS })).items;
        return seen.size >= 3 && pods.length === 1 && pods[0]!.status?.conditions?.some((x) => x.type === "Ready" && x.status === "True");
      }, "the rotation's pod Ready");
      expect(seen.size).toBeGreaterThanOrEqual(3);
      expect(most).toBe(1);
      const after = await c.core.readNamespacedPersistentVolumeClaim({ namespace: NS, name: "polygon-facilitator-store" });
      expect(after.metadata!.uid).toBe(claim.metadata!.uid); // the same store across every pod
      const pod = (await c.core.listNamespacedPod({ namespace: NS })).items[0]!;
      expect(pod.spec!.volumes).toContainEqual(expect.objectContaining({ name: "data", persistentVolumeClaim: { claimName: "polygon-facilitator-store" } }));
    } finally {
      watching?.abort();
      await w.stop();
    }
  });

  it("delete → the finalizer removes the routing entry first, then the resource goes and its children are collected", async () => {
    const w = await world(cp());
    try {
      const { c, ns: NS, opNs: OPERATOR_NS } = w;
      await c.putSecret(NS, "base-signer", { "signer-keys": generatePrivateKey() });
      await c.putSecret(NS, "polygon-signer", { "signer-keys": generatePrivateKey() });
      await putDatabaseSecret(c, NS);
      await w.start();
      await c.createNetwork(NS, "base", baseSpec({ replicas: 2 }));
      await c.createNetwork(NS, "polygon", { network: "eip155:137", rpc: [{ url: polygon.rpcUrl }], signerSecretRef: { name: "polygon-signer" } });
      await waitFor(c, NS, "base", ready, "base Ready");
      await waitFor(c, NS, "polygon", ready, "polygon Ready");
      await until(async () => (await routingTable(w)).backends.length === 2, "both networks routed");
      expect(await exists(() => c.policy.readNamespacedPodDisruptionBudget({ namespace: NS, name: "base-facilitator" }))).toBe(true);

      const recorder = await recordEvents(c.kc, [
        { kind: "FacilitatorNetwork", path: `/apis/x402fleet.io/v1alpha1/namespaces/${NS}/facilitatornetworks` },
        { kind: "ConfigMap", path: `/api/v1/namespaces/${OPERATOR_NS}/configmaps` },
      ]);
      await c.deleteNetwork(NS, "base");
      await until(async () => (await c.getNetwork(NS, "base")) === undefined, "the resource to go");
      expect((await routingTable(w)).backends.map((b) => b.network)).toEqual(["eip155:137"]);
      // ordering: the last routing table written before the resource disappeared had no entry for it
      await until(() => recorder.events.some((e) => e.kind === "FacilitatorNetwork" && e.type === "DELETED"), "the DELETED event");
      recorder.stop();
      const history = recorder.events;
      const gone = history.find((e) => e.kind === "FacilitatorNetwork" && e.name === "base" && e.type === "DELETED")!;
      const lastTable = history.filter((e) => e.kind === "ConfigMap" && e.name === "x402-fleet-routing" && e.rv < gone.rv).pop()!;
      expect(JSON.parse((lastTable.object.data as Record<string, string>)[ROUTING_TABLE_KEY]!).backends.map((b: { network: string }) => b.network)).toEqual(["eip155:137"]);
      await until(
        async () =>
          !(await exists(() => c.apps.readNamespacedDeployment({ namespace: NS, name: "base-facilitator" }))) &&
          !(await exists(() => c.core.readNamespacedService({ namespace: NS, name: "base-facilitator" }))) &&
          !(await exists(() => c.policy.readNamespacedPodDisruptionBudget({ namespace: NS, name: "base-facilitator" }))),
        "garbage collection of the Deployment, Service and PodDisruptionBudget",
      );
      expect(await c.apps.readNamespacedDeployment({ namespace: NS, name: "polygon-facilitator" })).toBeDefined();
    } finally {
      await w.stop();
    }
  });

  it("the finalizer releases a resource only after its routing entry is written away, even when the cache still lists it as Ready", async () => {
    const w = await world(cp());
    try {
      const { c, ns: NS, opNs: OPERATOR_NS } = w;
      await c.putSecret(NS, "base-signer", { "signer-keys": generatePrivateKey() });
      await putDatabaseSecret(c, NS);
      const op = await w.start();
      await c.createNetwork(NS, "base", baseSpec());
      const readyFn = await waitFor(c, NS, "base", ready, "Ready");
      await until(async () => (await routingTable(w)).backends.length === 1, "the entry");
      await op.stop(); // from here on, one reconcile pass driven by hand, with a stale cache
      const reconciler = createReconciler({
        kube: connect(c.kc),
        cachedNetworks: () => [readyFn], // stale: Ready, not deleting
        cachedDeployment: () => undefined,
        chainIdOf: (url) => fetchChainId(url),
        config: { image: "x402-fleet:test", clusterDomain: "cluster.local", routingConfigMap: { name: "x402-fleet-routing", namespace: OPERATOR_NS }, identity: "by-hand" },
        logger: pino({ level: "silent" }),
      });
      const recorder = await recordEvents(c.kc, [
        { kind: "FacilitatorNetwork", path: `/apis/x402fleet.io/v1alpha1/namespaces/${NS}/facilitatornetworks` },
        { kind: "ConfigMap", path: `/api/v1/namespaces/${OPERATOR_NS}/configmaps` },
      ]);
      await c.deleteNetwork(NS, "base");
      expect((await c.getNetwork(NS, "base"))!.metadata.deletionTimestamp).toBeDefined(); // held by the finalizer
      expect((await routingTable(w)).backends).toHaveLength(1);
      expect(await reconciler.reconcileNetwork(`${NS}/base`)).toEqual({ action: "done" });
      expect(await c.getNetwork(NS, "base")).toBeUndefined();
      await until(() => recorder.events.some((e) => e.kind === "FacilitatorNetwork" && e.type === "DELETED"), "the DELETED event");
      recorder.stop();
      const history = recorder.events;
      const gone = history.find((e) => e.kind === "FacilitatorNetwork" && e.type === "DELETED")!;
      const tables = history.filter((e) => e.kind === "ConfigMap" && e.name === "x402-fleet-routing");
      const before = tables.filter((e) => e.rv < gone.rv).pop()!;
      expect(JSON.parse((before.object.data as Record<string, string>)[ROUTING_TABLE_KEY]!).backends).toEqual([]);
      await reconciler.syncRoutingTable(); // a later sync from the same stale cache does not bring it back
      expect((await routingTable(w)).backends).toEqual([]);
    } finally {
      await w.stop();
    }
  });

  it("two operator replicas → one leader; it crashes → the other takes over the Lease and reconciles", async () => {
    const w = await world(cp());
    try {
      const { c, ns: NS, opNs: OPERATOR_NS } = w;
      await c.putSecret(NS, "base-signer", { "signer-keys": generatePrivateKey() });
      await putDatabaseSecret(c, NS);
      const a = await w.start("op-a");
      const b = await w.start("op-b");
      const leader = await until(() => (a.isLeader() ? a : b.isLeader() ? b : undefined), "a leader");
      const follower = leader === a ? b : a;
      expect(follower.isLeader()).toBe(false);
      const lease = await c.coordination.readNamespacedLease({ namespace: OPERATOR_NS, name: "x402-fleet-operator" });
      expect(lease.spec!.holderIdentity).toBe(leader.identity);

      await c.createNetwork(NS, "base", baseSpec());
      await waitFor(c, NS, "base", ready, "Ready");
      expect(Object.values(follower.stats().reconciles).reduce((x, y) => x + y, 0)).toBe(0);
      expect(new Set((await c.eventsFor(NS, "base")).map((e) => e.reportingInstance))).toEqual(new Set([leader.identity]));

      await leader.halt(); // a crash: the Lease is not released, the follower waits for it to expire
      await until(() => follower.isLeader(), "the follower to take over", 10_000);
      const taken = await c.coordination.readNamespacedLease({ namespace: OPERATOR_NS, name: "x402-fleet-operator" });
      expect(taken.spec!.holderIdentity).toBe(follower.identity);
      expect(taken.spec!.leaseTransitions).toBe(1);

      await c.patchNetwork(NS, "base", { spec: { replicas: 2 } });
      await waitFor(c, NS, "base", (fn) => ready(fn) && fn.status?.readyReplicas === 2, "the new leader to roll out generation 2");
      expect(follower.stats().reconciles.done).toBeGreaterThan(0);

      await follower.stop(); // graceful: releases the Lease at once
      const released = await c.coordination.readNamespacedLease({ namespace: OPERATOR_NS, name: "x402-fleet-operator" });
      expect(released.spec!.holderIdentity).toBe("");
      expect(await follower.ended).toBe("stopped");
    } finally {
      await w.stop();
    }
  });

  it("a dropped watch with the history compacted meanwhile → 410 Gone, the informers relist and converge", async () => {
    const w = await world(cp());
    const proxy = await startApiProxy(cp().url, cp().caPem);
    try {
      const { c, ns: NS } = w;
      await c.putSecret(NS, "base-signer", { "signer-keys": generatePrivateKey() });
      await putDatabaseSecret(c, NS);
      const op = await w.start("op-0", proxy);
      await c.createNetwork(NS, "base", baseSpec());
      await waitFor(c, NS, "base", ready, "Ready");

      // the watches end (as a server's request timeout ends them) and their re-watches are held back
      proxy.hold();
      expect(proxy.endWatches()).toBeGreaterThanOrEqual(4); // networks, deployments, secrets, routing ConfigMap
      // changes the operator cannot see while its watches are down, then etcd compacted past them
      await c.putSecret(NS, "polygon-signer", { "signer-keys": generatePrivateKey() });
      await c.createNetwork(NS, "polygon", { network: "eip155:137", rpc: [{ url: polygon.rpcUrl }], signerSecretRef: { name: "polygon-signer" } });
      await c.patchNetwork(NS, "base", { spec: { replicas: 2 } });
      await c.cp.compactEtcd();
      const before = proxy.stats();
      const informersBefore = op.stats().informers.networks!.connects;
      proxy.release();

      await waitFor(c, NS, "polygon", ready, "polygon Ready after the relist");
      await waitFor(c, NS, "base", (fn) => ready(fn) && fn.status?.observedGeneration === 2, "base at generation 2");
      await until(async () => (await routingTable(w)).backends.length === 2, "both networks routed");
      const after = proxy.stats();
      expect(after.gone).toBeGreaterThanOrEqual(before.gone + 4); // kube-apiserver answered every informer's re-watch with 410
      expect(after.lists).toBeGreaterThanOrEqual(before.lists + 4); // and every informer listed again
      expect(op.stats().informers.networks!.connects).toBeGreaterThan(informersBefore);
    } finally {
      await w.stop();
      await proxy.close();
    }
  });

  it("two resources for one network → the younger is Degraded (NetworkConflict) until the older goes", async () => {
    const w = await world(cp());
    try {
      const { c, ns: NS } = w;
      await c.putSecret(NS, "base-signer", { "signer-keys": generatePrivateKey() });
      const OTHER = w.other;
      await c.putSecret(OTHER, "base-signer", { "signer-keys": generatePrivateKey() });
      await putDatabaseSecret(c, NS);
      await putDatabaseSecret(c, w.other);
      await w.start();
      await c.createNetwork(NS, "base", baseSpec());
      await waitFor(c, NS, "base", ready, "the first Ready");
      await c.createNetwork(OTHER, "base-too", baseSpec());
      const second = await waitFor(c, OTHER, "base-too", (fn) => condition(fn, "Degraded")?.reason === "NetworkConflict", "NetworkConflict");
      expect(condition(second, "Degraded")!.message).toBe(`eip155:8453 is already served by FacilitatorNetwork ${NS}/base`);
      expect((await routingTable(w)).backends.map((b) => b.url)).toEqual([`http://base-facilitator.${NS}.svc.cluster.local:4021/v2`]);

      await c.deleteNetwork(NS, "base");
      await waitFor(c, OTHER, "base-too", ready, "the second Ready once the first is gone");
      await until(async () => (await routingTable(w)).backends[0]?.url === `http://base-too-facilitator.${OTHER}.svc.cluster.local:4021/v2`, "the table to follow");
    } finally {
      await w.stop();
    }
  });

  it("three operator processes: the leader killed mid-reconcile → another takes the Lease within its duration; no child or routing entry lost or duplicated", async () => {
    const w = await world(cp());
    const optimism = await startAnvil({ chainId: 10 });
    const dir = await mkdtemp(join(tmpdir(), "x402-operator-ha-"));
    const kubeconfig = cp().writeKubeconfig(cp().adminToken, join(dir, "kubeconfig"));
    const bin = fileURLToPath(new URL("../bin/x402-fleet.js", import.meta.url));
    const LEASE_MS = 15_000; // the CLI's (controller-runtime's) default lease duration
    const procs = new Map<string, ReturnType<typeof spawn>>();
    try {
      const { c, ns: NS, opNs: OPERATOR_NS } = w;
      const chains = [
        { name: "base", network: "eip155:8453", rpc: base.rpcUrl },
        { name: "polygon", network: "eip155:137", rpc: polygon.rpcUrl },
        { name: "optimism", network: "eip155:10", rpc: optimism.rpcUrl },
      ];
      for (const ch of chains) await c.putSecret(NS, `${ch.name}-signer`, { "signer-keys": generatePrivateKey() });
      await putDatabaseSecret(c, NS);
      for (const id of ["op-1", "op-2", "op-3"]) {
        const child = spawn(process.execPath, [bin, "operator", "--facilitator-image", "x402-fleet:ha", "--namespace", OPERATOR_NS, "--admin-port", "0", "--host", "127.0.0.1"], {
          env: { PATH: process.env.PATH ?? "", HOME: dir, KUBECONFIG: kubeconfig, POD_NAME: id, LOG_LEVEL: "warn", X402_WATCH_NAMESPACE: NS, X402_OPERATOR_ALLOW_PRIVATE_RPC: "true" },
          stdio: ["ignore", "ignore", "ignore"],
        });
        procs.set(id, child);
      }
      const lease = () => c.coordination.readNamespacedLease({ namespace: OPERATOR_NS, name: "x402-fleet-operator" });
      const first = (await until(async () => (await lease()).spec?.holderIdentity || undefined, "a leader", 60_000)) as string;

      for (const ch of chains) await c.createNetwork(NS, ch.name, baseSpec({ network: ch.network, rpc: [{ url: ch.rpc }], signerSecretRef: { name: `${ch.name}-signer` } }));
      // mid-reconcile: the leader has written some children, not all networks are Ready yet
      await until(async () => (await c.apps.listNamespacedDeployment({ namespace: NS })).items.length >= 1, "the leader's first Deployment", 60_000);
      const killedAt = Date.now();
      procs.get(first)!.kill("SIGKILL"); // a crash: the Lease is not released
      const taken = await until(async () => {
        const l = await lease();
        return l.spec?.holderIdentity && l.spec.holderIdentity !== first ? l : undefined;
      }, "another operator to take the Lease", 60_000);
      expect(["op-1", "op-2", "op-3"].filter((id) => id !== first)).toContain(taken.spec!.holderIdentity);
      expect(taken.spec!.leaseTransitions).toBe(1);
      // within the lease duration after the last renewal (plus one retry period of 2 s and slack for a busy machine)
      expect(new Date(taken.spec!.acquireTime as unknown as string).getTime() - killedAt).toBeLessThan(LEASE_MS + 2_000 + 3_000);

      for (const ch of chains) await waitFor(c, NS, ch.name, ready, `${ch.name} Ready under the new leader`);
      const table = await until(async () => {
        const t = await routingTable(w);
        return t.backends.length === chains.length ? t : undefined;
      }, "every network routed");
      expect(table.backends.map((b) => b.network).sort()).toEqual(chains.map((ch) => ch.network).sort());
      const managed = { namespace: NS, labelSelector: "app.kubernetes.io/managed-by=x402-fleet-operator" };
      expect((await c.apps.listNamespacedDeployment(managed)).items.map((d) => d.metadata!.name).sort()).toEqual(chains.map((ch) => `${ch.name}-facilitator`).sort());
      expect((await c.core.listNamespacedService(managed)).items.map((d) => d.metadata!.name).sort()).toEqual(chains.map((ch) => `${ch.name}-facilitator`).sort());
      // exactly one ReplicaSet per Deployment: no second writer changed a pod template
      const replicaSets = (await c.apps.listNamespacedReplicaSet({ namespace: NS })).items;
      expect(replicaSets.map((r) => r.metadata!.ownerReferences![0]!.name).sort()).toEqual(chains.map((ch) => `${ch.name}-facilitator`).sort());
    } finally {
      for (const child of procs.values()) await stopChild(child);
      await optimism.stop();
      await w.stop();
      await rm(dir, { recursive: true, force: true });
    }
  }, 120_000);

  it("the `x402-fleet operator` command runs from a kubeconfig, serves /readyz and /metrics on its admin port, and on SIGTERM releases the Lease and exits 0", async () => {
    const w = await world(cp());
    const { c, opNs: OPERATOR_NS } = w;
    const dir = await mkdtemp(join(tmpdir(), "x402-operator-cli-"));
    const kubeconfig = cp().writeKubeconfig(cp().adminToken, join(dir, "kubeconfig"));
    const bin = fileURLToPath(new URL("../bin/x402-fleet.js", import.meta.url));
    const child = spawn(process.execPath, [bin, "operator", "--facilitator-image", "x402-fleet:cli", "--namespace", OPERATOR_NS, "--admin-port", "0", "--host", "127.0.0.1"], {
      env: { PATH: process.env.PATH ?? "", HOME: dir, KUBECONFIG: kubeconfig, POD_NAME: "op-cli", LOG_LEVEL: "info" },
      stdio: ["ignore", "pipe", "pipe"],
    });
    let out = "";
    child.stdout!.on("data", (d: Buffer) => (out += d.toString()));
    child.stderr!.on("data", (d: Buffer) => (out += d.toString()));
    try {
      const admin = await until(() => /"admin":"(http:[^"]+)"/.exec(out)?.[1], "the operator to start", 30_000);
      await until(async () => (await fetch(`${admin}/readyz`)).status === 200, "/readyz");
      const lease = await until(() => c.coordination.readNamespacedLease({ namespace: OPERATOR_NS, name: "x402-fleet-operator" }).catch(() => undefined), "the Lease");
      expect(lease.spec!.holderIdentity).toBe("op-cli");
      await until(async () => c.core.readNamespacedConfigMap({ namespace: OPERATOR_NS, name: "x402-fleet-routing" }).catch(() => undefined), "the routing ConfigMap");
      expect(await (await fetch(`${admin}/metrics`)).text()).toContain("x402_operator_reconcile_total");
      const exited = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)));
      child.kill("SIGTERM");
      expect(await exited).toBe(0);
      const released = await c.coordination.readNamespacedLease({ namespace: OPERATOR_NS, name: "x402-fleet-operator" });
      expect(released.spec!.holderIdentity).toBe("");
    } finally {
      await stopChild(child);
      await w.stop();
      await rm(dir, { recursive: true, force: true });
    }
  });
});
