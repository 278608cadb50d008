// The operator's only door to the Kubernetes API: a thin adapter over @kubernetes/client-node.
// Everything the operator owns is written by server-side apply with one field manager (forced:
// the operator is the authority for these fields); the finalizer is added and removed by an
// update carrying the resourceVersion that was read (a 409 then means "read again").
import {
  AppsV1Api,
  CoordinationV1Api,
  CoreV1Api,
  CustomObjectsApi,
  EventsV1Api,
  NetworkingV1Api,
  PatchStrategy,
  PolicyV1Api,
  setHeaderOptions,
  type KubeConfig,
  type KubernetesListObject,
  type KubernetesObject,
  type V1Deployment,
  type V1Secret,
} from "@kubernetes/client-node";
import { FIELD_MANAGER, GROUP, PLURAL, VERSION, type FacilitatorNetwork, type FacilitatorNetworkStatus } from "./api.ts";

const APPLY = setHeaderOptions("Content-Type", PatchStrategy.ServerSideApply);
// Metadata only (what controller-runtime's metadata informers ask for): the operator learns that a
// Secret was created, changed or deleted without ever receiving the data of Secrets it does not use.
const METADATA_LIST = setHeaderOptions("Accept", "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1");
const METADATA_WATCH = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1";

export interface ApiError {
  code?: number;
  body?: unknown;
}

export function statusCode(e: unknown): number | undefined {
  const err = e as ApiError & { statusCode?: number };
  return typeof err?.code === "number" ? err.code : err?.statusCode;
}

export const isNotFound = (e: unknown) => statusCode(e) === 404;
export const isConflict = (e: unknown) => statusCode(e) === 409;

/**
 * A log-safe description of an error. client-node's ApiException message embeds the response
 * headers and body; only the status code and the API's reason/message are kept.
 */
export function describeError(e: unknown): string {
  const code = statusCode(e);
  if (code !== undefined) {
    let body = (e as ApiError).body;
    if (typeof body === "string") {
      try {
        body = JSON.parse(body);
      } catch {
        body = undefined;
      }
    }
    const b = body as { reason?: string; message?: string } | undefined;
    return `HTTP ${code}${b?.reason ? ` ${b.reason}` : ""}${b?.message ? `: ${b.message}` : ""}`;
  }
  if (e instanceof Error) return e.name === "AbortError" ? "aborted" : e.message.split("\n")[0]!;
  return String(e);
}

export interface Kube {
  kubeConfig: KubeConfig;
  core: CoreV1Api;
  apps: AppsV1Api;
  policy: PolicyV1Api;
  coordination: CoordinationV1Api;
  events: EventsV1Api;
  custom: CustomObjectsApi;
  networking: NetworkingV1Api;
}

export function connect(kubeConfig: KubeConfig): Kube {
  return {
    kubeConfig,
    core: kubeConfig.makeApiClient(CoreV1Api),
    apps: kubeConfig.makeApiClient(AppsV1Api),
    policy: kubeConfig.makeApiClient(PolicyV1Api),
    coordination: kubeConfig.makeApiClient(CoordinationV1Api),
    events: kubeConfig.makeApiClient(EventsV1Api),
    custom: kubeConfig.makeApiClient(CustomObjectsApi),
    networking: kubeConfig.makeApiClient(NetworkingV1Api),
  };
}

type Applied = { metadata: { name: string; namespace?: string } };
const applyArgs = <T extends Applied>(obj: T) => ({ name: obj.metadata.name, namespace: obj.metadata.namespace!, body: obj, fieldManager: FIELD_MANAGER, force: true });

export const apply = {
  deployment: (k: Kube, obj: Applied) => k.apps.patchNamespacedDeployment(applyArgs(obj), APPLY),
  service: (k: Kube, obj: Applied) => k.core.patchNamespacedService(applyArgs(obj), APPLY),
  persistentVolumeClaim: (k: Kube, obj: Applied) => k.core.patchNamespacedPersistentVolumeClaim(applyArgs(obj), APPLY),
  podDisruptionBudget: (k: Kube, obj: Applied) => k.policy.patchNamespacedPodDisruptionBudget(applyArgs(obj), APPLY),
  configMap: (k: Kube, obj: Applied) => k.core.patchNamespacedConfigMap(applyArgs(obj), APPLY),
  networkPolicy: (k: Kube, obj: Applied) => k.networking.patchNamespacedNetworkPolicy(applyArgs(obj), APPLY),
  /** Status through the /status subresource, same field manager. */
  networkStatus: async (k: Kube, fn: FacilitatorNetwork, status: FacilitatorNetworkStatus): Promise<FacilitatorNetwork> =>
    (await k.custom.patchNamespacedCustomObjectStatus(
      {
        group: GROUP,
        version: VERSION,
        plural: PLURAL,
        namespace: fn.metadata.namespace!,
        name: fn.metadata.name,
        body: { apiVersion: fn.apiVersion, kind: fn.kind, metadata: { name: fn.metadata.name, namespace: fn.metadata.namespace }, status },
        fieldManager: FIELD_MANAGER,
        force: true,
      },
      APPLY,
    )) as FacilitatorNetwork,
};

export async function getNetwork(k: Kube, namespace: string, name: string): Promise<FacilitatorNetwork | undefined> {
  try {
    return (await k.custom.getNamespacedCustomObject({ group: GROUP, version: VERSION, plural: PLURAL, namespace, name })) as FacilitatorNetwork;
  } catch (e) {
    if (isNotFound(e)) return undefined;
    throw e;
  }
}

/** Replaces the resource (metadata.resourceVersion included: a stale read fails with 409). */
export async function updateNetwork(k: Kube, fn: FacilitatorNetwork): Promise<FacilitatorNetwork> {
  return (await k.custom.replaceNamespacedCustomObject({
    group: GROUP,
    version: VERSION,
    plural: PLURAL,
    namespace: fn.metadata.namespace!,
    name: fn.metadata.name,
    body: fn,
    fieldManager: FIELD_MANAGER,
  })) as FacilitatorNetwork;
}

/** Custom objects arrive as plain JSON (timestamps stay strings); typed for the informer. */
export function listNetworks(k: Kube, namespace?: string): Promise<KubernetesListObject<KubernetesObject>> {
  const args = { group: GROUP, version: VERSION, plural: PLURAL };
  return (namespace ? k.custom.listNamespacedCustomObject({ ...args, namespace }) : k.custom.listClusterCustomObject(args)) as Promise<
    KubernetesListObject<KubernetesObject>
  >;
}

export function networksPath(namespace?: string): string {
  return namespace ? `/apis/${GROUP}/${VERSION}/namespaces/${namespace}/${PLURAL}` : `/apis/${GROUP}/${VERSION}/${PLURAL}`;
}

/** Secrets as PartialObjectMetadata: names, namespaces, resourceVersions; no data. */
export function listSecretMetadata(k: Kube, namespace?: string): Promise<KubernetesListObject<KubernetesObject>> {
  return namespace ? k.core.listNamespacedSecret({ namespace }, METADATA_LIST) : k.core.listSecretForAllNamespaces({}, METADATA_LIST);
}

/** A KubeConfig whose watches ask for PartialObjectMetadata (client-node's Watch takes its headers from here). */
export function metadataWatchConfig(kubeConfig: KubeConfig): KubeConfig {
  const wrapped = Object.create(kubeConfig) as KubeConfig;
  wrapped.applyToFetchOptions = async (opts) => {
    const init = await kubeConfig.applyToFetchOptions(opts);
    (init.headers as { set(k: string, v: string): void }).set("Accept", METADATA_WATCH);
    return init;
  };
  return wrapped;
}

/** Reads a Secret and decodes its values. Never logged, never returned beyond the checks. */
export async function readSecret(k: Kube, namespace: string, name: string): Promise<{ data: Record<string, string> } | undefined> {
  let secret: V1Secret;
  try {
    secret = await k.core.readNamespacedSecret({ namespace, name });
  } catch (e) {
    if (isNotFound(e)) return undefined;
    throw e;
  }
  const data: Record<string, string> = {};
  for (const [key, value] of Object.entries(secret.data ?? {})) data[key] = Buffer.from(value, "base64").toString("utf8");
  return { data };
}

/** Deletes an object only if it is still the one we own (uid precondition). */
export async function deleteOwnedPdb(k: Kube, namespace: string, name: string, ownerUid: string): Promise<boolean> {
  let uid: string | undefined;
  try {
    const pdb = await k.policy.readNamespacedPodDisruptionBudget({ namespace, name });
    if (!pdb.metadata?.ownerReferences?.some((r) => r.uid === ownerUid && r.controller)) return false;
    uid = pdb.metadata.uid;
  } catch (e) {
    if (isNotFound(e)) return false;
    throw e;
  }
  try {
    await k.policy.deleteNamespacedPodDisruptionBudget({ namespace, name, body: { preconditions: { uid } } });
  } catch (e) {
    if (isNotFound(e)) return false;
    throw e;
  }
  return true;
}

export type { V1Deployment };
