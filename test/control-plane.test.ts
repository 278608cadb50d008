// The test harness's own control plane (test/helpers/control-plane.ts): a real kube-apiserver
// over real etcd, with RBAC enforced, TokenRequest working, and etcd compaction visible as 410.
import { expect, it } from "vitest";
import { AuthorizationV1Api, CoreV1Api, RbacAuthorizationV1Api, VersionApi, Watch } from "@kubernetes/client-node";
import { describeWithControlPlane } from "./helpers/control-plane.ts";

describeWithControlPlane("the test control plane (etcd + kube-apiserver)", {}, (cp) => {
  it("serves the pinned Kubernetes version over TLS with the generated CA", async () => {
    const v = await cp().kc.makeApiClient(VersionApi).getCode();
    expect(v.gitVersion).toMatch(/^v1\.33\.\d+$/);
  });

  it("authenticates ServiceAccount tokens from TokenRequest and enforces RBAC (403 outside the role)", async () => {
    const c = cp();
    const ns = await c.namespace("rbac");
    const core = c.kc.makeApiClient(CoreV1Api);
    await core.createNamespacedServiceAccount({ namespace: ns, body: { metadata: { name: "reader" } } });
    const token = await c.serviceAccountToken(ns, "reader");
    const asReader = c.kubeConfigForToken(token).makeApiClient(CoreV1Api);
    const refused = await asReader.listNamespacedConfigMap({ namespace: ns }).then(() => undefined, (e: { code?: number }) => e.code);
    expect(refused).toBe(403);
    const rbac = c.kc.makeApiClient(RbacAuthorizationV1Api);
    await rbac.createNamespacedRole({ namespace: ns, body: { metadata: { name: "cm-read" }, rules: [{ apiGroups: [""], resources: ["configmaps"], verbs: ["list"] }] } });
    await rbac.createNamespacedRoleBinding({ namespace: ns, body: { metadata: { name: "cm-read" }, roleRef: { apiGroup: "rbac.authorization.k8s.io", kind: "Role", name: "cm-read" }, subjects: [{ kind: "ServiceAccount", name: "reader", namespace: ns }] } });
    const review = await c.kubeConfigForToken(token).makeApiClient(AuthorizationV1Api).createSelfSubjectAccessReview({ body: { spec: { resourceAttributes: { namespace: ns, verb: "list", resource: "configmaps" } } } });
    expect(review.status?.allowed).toBe(true);
    expect((await asReader.listNamespacedConfigMap({ namespace: ns })).items).toBeDefined();
    expect(await asReader.listNamespacedSecret({ namespace: ns }).then(() => 200, (e: { code?: number }) => e.code)).toBe(403);
  });

  it("answers a watch from a resourceVersion older than an etcd compaction with 410 Gone", async () => {
    const c = cp();
    const ns = await c.namespace("compact");
    const core = c.kc.makeApiClient(CoreV1Api);
    const list = await core.listNamespacedConfigMap({ namespace: ns });
    await core.createNamespacedConfigMap({ namespace: ns, body: { metadata: { name: "after-list" } } });
    await core.createNamespacedConfigMap({ namespace: ns, body: { metadata: { name: "after-list-2" } } });
    await c.compactEtcd();
    const status = await new Promise<string>((resolve, reject) => {
      const w = new Watch(c.kc);
      void w.watch(`/api/v1/namespaces/${ns}/configmaps`, { resourceVersion: list.metadata!.resourceVersion }, (type: string, obj: { code?: number }) => resolve(`${type} ${obj.code}`), (err: unknown) => (err ? reject(err) : resolve("closed")));
    });
    expect(status).toBe("ERROR 410");
  });
});
