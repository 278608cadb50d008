// `x402-fleet pre-uninstall`: what the chart's pre-delete hook runs before `helm uninstall`
// removes the operator. Only the operator releases its finalizer (x402fleet.io/routing-table); with
// the operator gone, deleting a FacilitatorNetwork, or the CRD, would hang forever. So, in order:
//   1. stop the operator: its Deployment scaled to 0, and wait until none of its pods is left
//      (a running replica would put the finalizer back on its next pass);
//   2. release the finalizer from every FacilitatorNetwork it served: its guarantee (no routing
//      table lists a deleted resource) is kept, as the routing table goes with the release;
//   3. delete what the operator made in its own namespace: the routing ConfigMap and the Lease.
// FacilitatorNetworks and their facilitators stay (the CRD is kept): deleting one afterwards, or the
// CRD, collects its Deployment, Service, PodDisruptionBudget, NetworkPolicy, router-token ConfigMap
// and claim through their ownerReferences. Every step is idempotent: a failed hook can run again.
import type { KubernetesObject } from "@kubernetes/client-node";
import type { Logger } from "../services/platform/logger.ts";
import { FINALIZER, type FacilitatorNetwork } from "./api.ts";
import { getNetwork, isConflict, isNotFound, listNetworks, updateNetwork, type Kube } from "./kube.ts";

export interface UninstallOptions {
  kube: Kube;
  /** The operator's namespace: its Deployment, routing ConfigMap and Lease. */
  namespace: string;
  /** Where it served FacilitatorNetworks; undefined: every namespace. */
  watchNamespace?: string;
  operatorDeployment: string;
  routingConfigMap: string;
  leaseName: string;
  logger: Logger;
  /** How long the operator's pods may take to stop (its grace period is 45 s). */
  timeoutMs?: number;
  pollMs?: number;
}

export interface UninstallReport {
  operatorPodsStopped: number;
  finalizersReleased: string[];
  deleted: string[];
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

export async function prepareUninstall(o: UninstallOptions): Promise<UninstallReport> {
  const { kube, namespace, logger } = o;
  const report: UninstallReport = { operatorPodsStopped: 0, finalizersReleased: [], deleted: [] };

  // 1. No operator left to put a finalizer back.
  const deployment = await kube.apps.readNamespacedDeployment({ namespace, name: o.operatorDeployment }).catch((e: unknown) => {
    if (isNotFound(e)) return undefined;
    throw e;
  });
  if (deployment) {
    await kube.apps.patchNamespacedDeploymentScale({ namespace, name: o.operatorDeployment, body: [{ op: "replace", path: "/spec/replicas", value: 0 }] });
    const selector = Object.entries(deployment.spec?.selector.matchLabels ?? {})
      .map(([k, v]) => `${k}=${v}`)
      .join(",");
    if (!selector) throw new Error(`the Deployment ${namespace}/${o.operatorDeployment} has no matchLabels selector`);
    const deadline = Date.now() + (o.timeoutMs ?? 120_000);
    for (;;) {
      const pods = (await kube.core.listNamespacedPod({ namespace, labelSelector: selector })).items;
      if (pods.length === 0) break;
      report.operatorPodsStopped = Math.max(report.operatorPodsStopped, pods.length);
      if (Date.now() > deadline) throw new Error(`the operator's pods did not stop: ${pods.map((p) => p.metadata?.name).join(", ")}`);
      await sleep(o.pollMs ?? 1000);
    }
    logger.info({ deployment: o.operatorDeployment }, "operator stopped");
  }

  // 2. Every FacilitatorNetwork it served can be deleted without it.
  const networks = (await listNetworks(kube, o.watchNamespace)).items as KubernetesObject[] as FacilitatorNetwork[];
  for (const listed of networks) {
    const key = `${listed.metadata.namespace}/${listed.metadata.name}`;
    for (let fn: FacilitatorNetwork | undefined = listed; fn?.metadata.finalizers?.includes(FINALIZER); ) {
      try {
        await updateNetwork(kube, { ...fn, metadata: { ...fn.metadata, finalizers: fn.metadata.finalizers.filter((f) => f !== FINALIZER) } });
        report.finalizersReleased.push(key);
        break;
      } catch (e) {
        if (!isConflict(e) && !isNotFound(e)) throw e;
        fn = await getNetwork(kube, listed.metadata.namespace!, listed.metadata.name); // changed meanwhile: read again
      }
    }
  }
  logger.info({ released: report.finalizersReleased }, "finalizers released");

  // 3. What the operator made at home, which Helm does not know of.
  const gone = (e: unknown) => {
    if (!isNotFound(e)) throw e;
  };
  await kube.core.deleteNamespacedConfigMap({ namespace, name: o.routingConfigMap }).then(() => report.deleted.push(`ConfigMap/${o.routingConfigMap}`), gone);
  await kube.coordination.deleteNamespacedLease({ namespace, name: o.leaseName }).then(() => report.deleted.push(`Lease/${o.leaseName}`), gone);
  logger.info({ deleted: report.deleted }, "operator's own objects deleted");
  return report;
}
