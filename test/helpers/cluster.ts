// The operator suites' view of a real control plane (test/helpers/control-plane.ts): the CRD
// installed from crds/ (the single source) and Established, client-node clients acting as the
// user (kubectl's role), node cordoning to hold new pods back (kwok turns scheduled pods Ready),
// a recorder of watch events in resourceVersion order, and small polling helpers.
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import {
  ApiextensionsV1Api,
  AppsV1Api,
  CoordinationV1Api,
  CoreV1Api,
  CustomObjectsApi,
  EventsV1Api,
  PatchStrategy,
  PolicyV1Api,
  Watch,
  setHeaderOptions,
  type KubeConfig,
  type V1CustomResourceDefinition,
} from "@kubernetes/client-node";
import { parse as parseYaml } from "yaml";
import { GROUP, PLURAL, VERSION, type ConditionType, type FacilitatorNetwork, type FacilitatorNetworkSpec } from "../../operator/api.ts";
import type { ControlPlane } from "./control-plane.ts";

export const CRD_PATH = fileURLToPath(new URL("../../crds/facilitatornetworks.x402fleet.io.yaml", import.meta.url));

export function loadCrd(): Record<string, unknown> {
  return parseYaml(readFileSync(CRD_PATH, "utf8")) as Record<string, unknown>;
}

const ref = { group: GROUP, version: VERSION, plural: PLURAL };
const mergePatch = () => setHeaderOptions("Content-Type", PatchStrategy.MergePatch);
const codeOf = (e: unknown) => (e as { code?: number }).code;

/**
 * Applies the CRD from crds/ (server-side apply of the file's bytes, as `kubectl apply
 * --server-side` does; a no-op when the control plane was started with it in `crds`) and waits
 * until the API server serves it. Not through client-node's typed
 * CRD model: its serializer drops JSONSchemaProps keys such as `default` and `x-kubernetes-*`.
 */
export async function installCrd(cp: ControlPlane): Promise<void> {
  const kc = cp.kc;
  const ext = kc.makeApiClient(ApiextensionsV1Api);
  const crd = loadCrd() as unknown as V1CustomResourceDefinition;
  await cp.applyFile(CRD_PATH);
  await until(async () => {
    const got = await ext.readCustomResourceDefinition({ name: crd.metadata!.name! });
    return got.status?.conditions?.some((c) => c.type === "Established" && c.status === "True");
  }, "the CRD to be Established", 30_000);
  // Established can precede the discovery of the new resource by a moment.
  const custom = kc.makeApiClient(CustomObjectsApi);
  await until(() => custom.listClusterCustomObject(ref).then(() => true), "the FacilitatorNetwork API to answer", 30_000);
}

export interface Cluster {
  cp: ControlPlane;
  kc: KubeConfig;
  custom: CustomObjectsApi;
  core: CoreV1Api;
  apps: AppsV1Api;
  policy: PolicyV1Api;
  events: EventsV1Api;
  coordination: CoordinationV1Api;
  /** Creates the namespace unless it exists. */
  ensureNamespace(namespace: string): Promise<void>;
  createNetwork(namespace: string, name: string, spec: Partial<FacilitatorNetworkSpec> & Pick<FacilitatorNetworkSpec, "network">): Promise<FacilitatorNetwork>;
  getNetwork(namespace: string, name: string): Promise<FacilitatorNetwork | undefined>;
  patchNetwork(namespace: string, name: string, patch: Record<string, unknown>): Promise<FacilitatorNetwork>;
  deleteNetwork(namespace: string, name: string): Promise<void>;
  /** Deletes every FacilitatorNetwork of the namespaces, finalizers stripped (a test's cleanup). */
  purgeNetworks(namespaces: string[]): Promise<void>;
  putSecret(namespace: string, name: string, data: Record<string, string>): Promise<void>;
  /** events.k8s.io/v1 events about one object. */
  eventsFor(namespace: string, name: string): Promise<{ type: string; reason: string; note: string; reportingInstance: string }[]>;
  /** Marks every node unschedulable: new pods stay Pending (not Ready) until uncordon(). */
  cordon(): Promise<void>;
  uncordon(): Promise<void>;
}

export function clusterOf(cp: ControlPlane, kc: KubeConfig = cp.kc): Cluster {
  const custom = kc.makeApiClient(CustomObjectsApi);
  const core = kc.makeApiClient(CoreV1Api);
  const events = kc.makeApiClient(EventsV1Api);
  const ensureNamespace = async (namespace: string) => {
    try {
      await core.createNamespace({ body: { metadata: { name: namespace } } });
    } catch (e) {
      if (codeOf(e) !== 409) throw e;
    }
  };
  const setUnschedulable = async (unschedulable: boolean) => {
    for (const n of (await core.listNode()).items) await core.patchNode({ name: n.metadata!.name!, body: { spec: { unschedulable } } }, mergePatch());
  };
  return {
    cp,
    kc,
    custom,
    core,
    apps: kc.makeApiClient(AppsV1Api),
    policy: kc.makeApiClient(PolicyV1Api),
    events,
    coordination: kc.makeApiClient(CoordinationV1Api),
    ensureNamespace,
    createNetwork: async (namespace, name, spec) =>
      (await custom.createNamespacedCustomObject({
        ...ref,
        namespace,
        body: { apiVersion: `${GROUP}/${VERSION}`, kind: "FacilitatorNetwork", metadata: { name, namespace }, spec },
      })) as FacilitatorNetwork,
    getNetwork: async (namespace, name) => {
      try {
        return (await custom.getNamespacedCustomObject({ ...ref, namespace, name })) as FacilitatorNetwork;
      } catch (e) {
        if (codeOf(e) === 404) return undefined;
        throw e;
      }
    },
    patchNetwork: async (namespace, name, patch) => (await custom.patchNamespacedCustomObject({ ...ref, namespace, name, body: patch }, mergePatch())) as FacilitatorNetwork,
    deleteNetwork: async (namespace, name) => {
      await custom.deleteNamespacedCustomObject({ ...ref, namespace, name });
    },
    purgeNetworks: async (namespaces) => {
      for (const namespace of namespaces) {
        const list = (await custom.listNamespacedCustomObject({ ...ref, namespace })) as { items: FacilitatorNetwork[] };
        for (const fn of list.items) {
          const name = fn.metadata.name!;
          await custom.patchNamespacedCustomObject({ ...ref, namespace, name, body: { metadata: { finalizers: null } } }, mergePatch()).catch(() => undefined);
          await custom.deleteNamespacedCustomObject({ ...ref, namespace, name }).catch(() => undefined);
        }
        await until(async () => ((await custom.listNamespacedCustomObject({ ...ref, namespace })) as { items: unknown[] }).items.length === 0, `the networks of ${namespace} to go`);
      }
    },
    putSecret: async (namespace, name, data) => {
      const body = { apiVersion: "v1", kind: "Secret", metadata: { name, namespace }, stringData: data };
      try {
        await core.createNamespacedSecret({ namespace, body });
      } catch (e) {
        if (codeOf(e) !== 409) throw e;
        await core.replaceNamespacedSecret({ namespace, name, body });
      }
    },
    eventsFor: async (namespace, name) => {
      const list = await events.listNamespacedEvent({ namespace });
      return list.items
        .filter((e) => e.regarding?.name === name)
        .map((e) => ({ type: e.type ?? "", reason: e.reason ?? "", note: e.note ?? "", reportingInstance: e.reportingInstance ?? "" }));
    },
    cordon: () => setUnschedulable(true),
    uncordon: () => setUnschedulable(false),
  };
}

export interface RecordedEvent {
  kind: string;
  name: string;
  namespace: string;
  type: string;
  /** etcd's revision: one counter across all resources of this (single-etcd) cluster. */
  rv: number;
  object: Record<string, unknown> & { data?: Record<string, string> };
}

/**
 * Watches resources from now on and records every event, for ordering assertions. On this
 * test cluster a resourceVersion is etcd's global revision, so events of different resources
 * compare (a real client must treat resourceVersions as opaque; a test may rely on its server).
 */
export async function recordEvents(kc: KubeConfig, paths: { kind: string; path: string }[]): Promise<{ events: RecordedEvent[]; stop(): void }> {
  const events: RecordedEvent[] = [];
  const watch = new Watch(kc);
  const controllers: AbortController[] = [];
  for (const { kind, path } of paths) {
    controllers.push(
      await watch.watch(
        path,
        { allowWatchBookmarks: false },
        (type: string, obj: { metadata: { name: string; namespace: string; resourceVersion: string } } & Record<string, unknown>) => {
          events.push({ kind, name: obj.metadata.name, namespace: obj.metadata.namespace, type, rv: Number(obj.metadata.resourceVersion), object: obj });
        },
        () => undefined,
      ),
    );
  }
  return { events, stop: () => controllers.forEach((c) => c.abort()) };
}

/** Polls until fn returns a value other than undefined/false, or fails with what it waited for. */
export async function until<T>(fn: () => Promise<T | undefined | false> | T | undefined | false, what: string, ms = 60_000): Promise<T> {
  const deadline = Date.now() + ms;
  let last: unknown;
  for (;;) {
    try {
      const v = await fn();
      if (v !== undefined && v !== false) return v as T;
    } catch (e) {
      last = e;
    }
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}${last ? `: ${(last as Error).message}` : ""}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

export function condition(fn: FacilitatorNetwork | undefined, type: ConditionType) {
  return fn?.status?.conditions?.find((c) => c.type === type);
}
