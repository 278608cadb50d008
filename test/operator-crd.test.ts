// The CRD in crds/ (the single source), installed into a real kube-apiserver, and the API
// semantics the operator relies on, exercised through @kubernetes/client-node as a user
// (kubectl's role) would. kube-apiserver itself enforces the CRD's openAPIV3Schema and CEL rules;
// kube-controller-manager's garbage collector collects dependents.
import { beforeAll, describe, expect, it } from "vitest";
import { CustomResourceDefinition } from "kubernetes-models/apiextensions.k8s.io/v1";
import { ApiextensionsV1Api, PatchStrategy, Watch, setHeaderOptions } from "@kubernetes/client-node";
import { GROUP, PLURAL, VERSION } from "../operator/api.ts";
import { describeWithControlPlane } from "./helpers/control-plane.ts";
import { CRD_PATH, clusterOf, installCrd, loadCrd, type Cluster } from "./helpers/cluster.ts";

const ref = { group: GROUP, version: VERSION, plural: PLURAL };
const spec = { network: "eip155:8453", rpc: [{ url: "https://rpc.example.com" }], signerSecretRef: { name: "base-signer" } };
const APPLY = setHeaderOptions("Content-Type", PatchStrategy.ServerSideApply);

async function rejection(p: Promise<unknown>): Promise<{ code: number; message: string }> {
  try {
    await p;
  } catch (e) {
    const err = e as { code: number; body: string | { message: string } };
    const body = typeof err.body === "string" ? (JSON.parse(err.body) as { message: string }) : err.body;
    return { code: err.code, message: body.message };
  }
  throw new Error("expected the API to refuse the request");
}

describeWithControlPlane("the CRD on kube-apiserver", { controllers: true, crds: [CRD_PATH] }, (cp) => {
let c: Cluster;
beforeAll(async () => {
  c = clusterOf(cp());
  await installCrd(c.cp);
  for (const ns of ["ns", "sem", "other"]) await c.ensureNamespace(ns);
});

describe("the CRD file", () => {
  it("is accepted by kube-apiserver as a structural apiextensions.k8s.io/v1 CRD with a status subresource and the printer columns", async () => {
    const crd = loadCrd();
    new CustomResourceDefinition(crd as never).validate();
    const v = (crd as { spec: { versions: { name: string; subresources: object; additionalPrinterColumns: { name: string }[] }[] } }).spec.versions;
    expect(v.map((x) => x.name)).toEqual(["v1alpha1"]);
    expect(v[0]!.subresources).toEqual({ status: {} });
    expect(v[0]!.additionalPrinterColumns.map((col) => col.name)).toEqual(["Network", "Schemes", "Ready", "Replicas", "Reason", "Chain-Checked", "Age"]);
    // The server refuses a non-structural schema, CEL that does not compile or exceeds its cost
    // budget, and invalid defaults at creation; it accepted this one and reports no problem.
    const served = await c.kc.makeApiClient(ApiextensionsV1Api).readCustomResourceDefinition({ name: (crd as { metadata: { name: string } }).metadata.name });
    const conditions = Object.fromEntries(served.status!.conditions!.map((x) => [x.type, x.status]));
    expect(conditions).toMatchObject({ NamesAccepted: "True", Established: "True" });
    expect(conditions.NonStructuralSchema).toBeUndefined();
  });
});

describe("FacilitatorNetwork validation (the CRD's schema and CEL rules, enforced by kube-apiserver)", () => {
  it("refuses an invalid network", async () => {
    const r = await rejection(c.createNetwork("ns", "bad-network", { ...spec, network: "eip155:0x2105" }));
    expect(r.code).toBe(422);
    expect(r.message).toContain(`spec.network: Invalid value: "eip155:0x2105": spec.network in body should match '^eip155:[1-9][0-9]{0,18}$'`);
    expect((await rejection(c.createNetwork("ns", "solana", { ...spec, network: "solana:5eykt4UsFv8P8NJdTREpY1vzqKqZKvdp" }))).code).toBe(422);
  });

  it("refuses an empty scheme list and an unknown scheme", async () => {
    const empty = await rejection(c.createNetwork("ns", "no-schemes", { ...spec, schemes: [] }));
    expect(empty.code).toBe(422);
    expect(empty.message).toContain("spec.schemes in body should have at least 1 items");
    const unknown = await rejection(c.createNetwork("ns", "bad-scheme", { ...spec, schemes: ["exact", "stream" as never] }));
    expect(unknown.message).toContain('spec.schemes[1]: Unsupported value: "stream": supported values: "exact", "upto", "batch-settlement"');
    const dup = await rejection(c.createNetwork("ns", "dup-scheme", { ...spec, schemes: ["exact", "exact"] }));
    expect(dup.message).toContain('spec.schemes[1]: Duplicate value: "exact"');
  });

  it("refuses a change of network (CEL: self == oldSelf) but accepts other changes", async () => {
    await c.createNetwork("ns", "immutable", spec);
    const changed = await rejection(c.patchNetwork("ns", "immutable", { spec: { network: "eip155:84532" } }));
    expect(changed.code).toBe(422);
    expect(changed.message).toContain("spec.network: Invalid value: \"string\": network is immutable");
    const ok = await c.patchNetwork("ns", "immutable", { spec: { schemes: ["exact", "upto"] } });
    expect(ok.spec.schemes).toEqual(["exact", "upto"]);
    expect(ok.spec.network).toBe("eip155:8453");
  });

  it("refuses an RPC entry with both or neither of url and secretKeyRef, and a name too long for a Service", async () => {
    const both = await rejection(c.createNetwork("ns", "both", { ...spec, rpc: [{ url: "https://a.example.com", secretKeyRef: { name: "s", key: "k" } } as never] }));
    expect(both.message).toContain("spec.rpc[0]: Invalid value: \"object\": each rpc entry sets exactly one of url and secretKeyRef");
    expect((await rejection(c.createNetwork("ns", "neither", { ...spec, rpc: [{} as never] }))).code).toBe(422);
    expect((await rejection(c.createNetwork("ns", "no-rpc", { ...spec, rpc: [] }))).code).toBe(422);
    expect((await rejection(c.createNetwork("ns", "x".repeat(52), spec))).message).toContain("metadata.name must be a DNS-1035 label");
    expect((await rejection(c.createNetwork("ns", "commas", { ...spec, rpc: [{ url: "https://a.example.com,https://b" }] }))).code).toBe(422);
    expect((await rejection(c.createNetwork("ns", "zero", { ...spec, replicas: 0 }))).message).toContain("spec.replicas in body should be greater than or equal to 1");
    expect((await rejection(c.createNetwork("ns", "replicas-no-db", { ...spec, replicas: 2 }))).message).toContain("replicas > 1 needs spec.database");
    const db = { urlSecretRef: { name: "db", key: "url" } };
    expect((await c.createNetwork("ns", "replicas-db", { ...spec, replicas: 2, database: db })).spec.replicas).toBe(2);
  });

  it("fills defaults and prunes unknown fields, as a structural schema does", async () => {
    const fn = await c.createNetwork("ns", "defaults", { ...spec, surprise: true } as never);
    expect(fn.spec).toEqual({ ...spec, signerSecretRef: { name: "base-signer", key: "signer-keys" }, schemes: ["exact"], replicas: 1 });
  });

  it("shows the printer columns through the Table API (what kubectl get prints)", async () => {
    await c.createNetwork("ns", "table", spec);
    const res = await c.cp.request(`/apis/${GROUP}/${VERSION}/namespaces/ns/${PLURAL}/table`, { headers: { accept: "application/json;as=Table;v=v1;g=meta.k8s.io" } });
    const t = JSON.parse(res.text) as { columnDefinitions: { name: string }[]; rows: { cells: unknown[] }[] };
    expect(t.columnDefinitions.map((x) => x.name)).toEqual(["Name", "Network", "Schemes", "Ready", "Replicas", "Reason", "Chain-Checked", "Age"]);
    expect(t.rows[0]!.cells.slice(0, 3)).toEqual(["table", "eip155:8453", '["exact"]']); // a string column renders the array as JSON
  });
});

describe("API semantics the operator relies on", () => {
  it("refuses an update with a stale resourceVersion (409) and bumps generation on spec changes only", async () => {
    const fn = await c.createNetwork("sem", "rv", spec);
    expect(fn.metadata.generation).toBe(1);
    const updated = (await c.custom.replaceNamespacedCustomObject({ ...ref, namespace: "sem", name: "rv", body: { ...fn, metadata: { ...fn.metadata, labels: { a: "b" } } } })) as typeof fn;
    expect(updated.metadata.generation).toBe(1); // metadata only
    expect(Number(updated.metadata.resourceVersion)).toBeGreaterThan(Number(fn.metadata.resourceVersion));
    const stale = await rejection(c.custom.replaceNamespacedCustomObject({ ...ref, namespace: "sem", name: "rv", body: { ...fn, spec: { ...fn.spec, schemes: ["upto"] } } }));
    expect(stale.code).toBe(409);
    expect(stale.message).toContain("the object has been modified");
    const spec2 = await c.patchNetwork("sem", "rv", { spec: { settlement: { confirmations: 3 } } });
    expect(spec2.metadata.generation).toBe(2);
  });

  it("keeps status and spec apart through the status subresource", async () => {
    const fn = await c.createNetwork("sem", "status", spec);
    const viaMain = (await c.custom.replaceNamespacedCustomObject({ ...ref, namespace: "sem", name: "status", body: { ...fn, status: { chainId: 1 } } })) as typeof fn;
    expect(viaMain.status).toBeUndefined();
    const viaStatus = (await c.custom.patchNamespacedCustomObjectStatus(
      { ...ref, namespace: "sem", name: "status", body: { apiVersion: fn.apiVersion, kind: fn.kind, metadata: { name: "status", namespace: "sem" }, spec: { replicas: 9 }, status: { chainId: 8453 } }, fieldManager: "test", force: true },
      APPLY,
    )) as typeof fn;
    expect(viaStatus.status).toEqual({ chainId: 8453 });
    expect(viaStatus.spec.replicas).toBe(1);
    expect(viaStatus.metadata.generation).toBe(1);
  });

  it("tracks server-side apply ownership: conflicts between managers unless forced, removal of fields no longer applied", async () => {
    const cm = (data: Record<string, string>) => ({ apiVersion: "v1", kind: "ConfigMap", metadata: { name: "owned", namespace: "sem" }, data });
    await c.core.patchNamespacedConfigMap({ name: "owned", namespace: "sem", body: cm({ a: "1", b: "2" }), fieldManager: "first" }, APPLY);
    const conflict = await rejection(c.core.patchNamespacedConfigMap({ name: "owned", namespace: "sem", body: cm({ a: "changed" }), fieldManager: "second" }, APPLY));
    expect(conflict.code).toBe(409);
    expect(conflict.message).toBe('Apply failed with 1 conflict: conflict with "first": .data.a');
    const forced = await c.core.patchNamespacedConfigMap({ name: "owned", namespace: "sem", body: cm({ a: "changed" }), fieldManager: "second", force: true }, APPLY);
    expect(forced.data).toEqual({ a: "changed", b: "2" });
    const shrunk = await c.core.patchNamespacedConfigMap({ name: "owned", namespace: "sem", body: cm({}), fieldManager: "first" }, APPLY);
    expect(shrunk.data).toEqual({ a: "changed" }); // b removed (first no longer applies it); a is second's now
    const owners = Object.fromEntries(shrunk.metadata!.managedFields!.map((m) => [m.manager, m.fieldsV1]));
    expect(owners).toEqual({ first: { "f:data": {} }, second: { "f:data": { "f:a": {} } } });
  });

  it("holds deletion while finalizers remain, refuses new ones, then deletes and collects dependents", async () => {
    const fn = await c.createNetwork("sem", "final", spec);
    const withFinalizer = (await c.custom.replaceNamespacedCustomObject({ ...ref, namespace: "sem", name: "final", body: { ...fn, metadata: { ...fn.metadata, finalizers: ["example.com/hold"] } } })) as typeof fn;
    const owner = { apiVersion: `${GROUP}/${VERSION}`, kind: "FacilitatorNetwork", name: "final", uid: fn.metadata.uid!, controller: true };
    await c.core.createNamespacedConfigMap({ namespace: "sem", body: { metadata: { name: "child", namespace: "sem", ownerReferences: [owner] } } });
    await c.core.createNamespacedConfigMap({ namespace: "other", body: { metadata: { name: "cross-ns-child", namespace: "other", ownerReferences: [owner] } } });
    await c.deleteNetwork("sem", "final");
    const deleting = (await c.getNetwork("sem", "final"))!;
    expect(deleting.metadata.deletionTimestamp).toBeDefined();
    expect(deleting.metadata.generation).toBe(2);
    const more = await rejection(c.custom.replaceNamespacedCustomObject({ ...ref, namespace: "sem", name: "final", body: { ...deleting, metadata: { ...deleting.metadata, finalizers: ["example.com/hold", "example.com/more"] } } }));
    expect(more.message).toContain("no new finalizers can be added");
    expect(await c.core.readNamespacedConfigMap({ namespace: "sem", name: "child" })).toBeDefined();
    await c.custom.replaceNamespacedCustomObject({ ...ref, namespace: "sem", name: "final", body: { ...deleting, metadata: { ...deleting.metadata, finalizers: [] } } });
    expect(await c.getNetwork("sem", "final")).toBeUndefined();
    expect(withFinalizer.metadata.finalizers).toEqual(["example.com/hold"]);
    const gone = async (ns: string, name: string) => (await rejection(c.core.readNamespacedConfigMap({ namespace: ns, name }))).code === 404;
    // the CRD was applied before kube-controller-manager started (its garbage collector
    // discovers kinds added later only every 30 s)
    const deadline = Date.now() + 30_000;
    while (!(await gone("sem", "child").catch(() => false)) && Date.now() < deadline) await new Promise((r) => setTimeout(r, 100));
    expect(await gone("sem", "child")).toBe(true);
    expect(await gone("other", "cross-ns-child")).toBe(true); // an owner in another namespace counts as absent
  });

  it("answers a watch from a compacted resourceVersion with 410 Gone", async () => {
    const list = await c.core.listNamespacedConfigMap({ namespace: "sem" });
    // two writes: a watch from revision R starts at R+1, which a compaction at R+1 keeps
    await c.core.createNamespacedConfigMap({ namespace: "sem", body: { metadata: { name: "after-list" } } });
    await c.core.createNamespacedConfigMap({ namespace: "sem", body: { metadata: { name: "after-list-2" } } });
    await c.cp.compactEtcd();
    const line = await new Promise<{ type: string; object: { code: number; reason: string } }>((resolve, reject) => {
      void new Watch(c.kc).watch(`/api/v1/namespaces/sem/configmaps`, { resourceVersion: list.metadata!.resourceVersion }, (type: string, object: { code: number; reason: string }) => resolve({ type, object }), (e: unknown) => reject(e ?? new Error("the watch ended without an event")));
    });
    expect(line).toMatchObject({ type: "ERROR", object: { code: 410, reason: "Expired" } });
  });

  it("validates built-in objects: an invalid Lease time and an unknown Deployment field are refused", async () => {
    const lease = await rejection(
      c.coordination.createNamespacedLease({ namespace: "sem", body: { metadata: { name: "l" }, spec: { holderIdentity: "a", renewTime: new Date().toISOString() as never } } }),
    );
    expect(lease.message).toContain('as "2006-01-02T15:04:05.000000Z07:00"'); // MicroTime: 6 fractional digits
    const deployment = {
      metadata: { name: "d" },
      spec: { selector: { matchLabels: { a: "b" } }, template: { metadata: { labels: { a: "b" } }, spec: { containers: [{ name: "c", image: "i", imagePullPolicyy: "Always" }] } } },
    };
    // client-node's typed serializer would drop the typo; send the JSON as kubectl does
    const res = await c.cp.request(`/apis/apps/v1/namespaces/sem/deployments?fieldValidation=Strict`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(deployment) });
    expect(res.status).toBe(400); // strict field validation answers BadRequest, not Invalid
    expect((JSON.parse(res.text) as { message: string }).message).toContain('strict decoding error: unknown field "spec.template.spec.containers[0].imagePullPolicyy"');
  });
});
});
