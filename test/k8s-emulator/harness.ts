// Test harness around the API emulation: the CRD installed from crds/ (the single source),
// client-node clients acting as the user (kubectl's role), and small polling helpers.
import { readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { AppsV1Api, CoordinationV1Api, CoreV1Api, CustomObjectsApi, EventsV1Api, PatchStrategy, PolicyV1Api, setHeaderOptions, type KubeConfig } from "@kubernetes/client-node";
import { parse as parseYaml } from "yaml";
import { GROUP, PLURAL, VERSION, type FacilitatorNetwork, type FacilitatorNetworkSpec } from "../../operator/api.ts";
import { startKubeApiEmulation, type KubeApiEmulation } from "./server.ts";
import { startDeploymentControllerStandIn, type DeploymentControllerStandIn } from "./stand-ins.ts";

export const CRD_PATH = fileURLToPath(new URL("../../crds/facilitatornetworks.x402fleet.io.yaml", import.meta.url));

export function loadCrd(): Record<string, unknown> {
  return parseYaml(readFileSync(CRD_PATH, "utf8")) as Record<string, unknown>;
}

export interface EmulatedCluster {
  api: KubeApiEmulation;
  kc: KubeConfig;
  custom: CustomObjectsApi;
  core: CoreV1Api;
  apps: AppsV1Api;
  policy: PolicyV1Api;
  events: EventsV1Api;
  coordination: CoordinationV1Api;
  deployments: DeploymentControllerStandIn;
  createNetwork(namespace: string, name: string, spec: Partial<FacilitatorNetworkSpec> & Pick<FacilitatorNetworkSpec, "network">): Promise<FacilitatorNetwork>;
  getNetwork(namespace: string, name: string): Promise<FacilitatorNetwork | undefined>;
  patchNetwork(namespace: string, name: string, patch: Record<string, unknown>): Promise<FacilitatorNetwork>;
  deleteNetwork(namespace: string, name: string): Promise<void>;
  putSecret(namespace: string, name: string, data: Record<string, string>): Promise<void>;
  /** events.k8s.io/v1 events about one object. */
  eventsFor(namespace: string, name: string): Promise<{ type: string; reason: string; note: string; reportingInstance: string }[]>;
  stop(): Promise<void>;
}

export async function startEmulatedCluster(opts: { deploymentController?: boolean } = {}): Promise<EmulatedCluster> {
  const api = await startKubeApiEmulation();
  api.installCrd(loadCrd());
  const kc = api.kubeConfig();
  const custom = kc.makeApiClient(CustomObjectsApi);
  const core = kc.makeApiClient(CoreV1Api);
  const events = kc.makeApiClient(EventsV1Api);
  const deployments = opts.deploymentController === false ? { pause() {}, resume() {}, setUnavailable() {}, stop: async () => {} } : startDeploymentControllerStandIn(kc);
  const ref = { group: GROUP, version: VERSION, plural: PLURAL };
  return {
    api,
    kc,
    custom,
    core,
    apps: kc.makeApiClient(AppsV1Api),
    policy: kc.makeApiClient(PolicyV1Api),
    events,
    coordination: kc.makeApiClient(CoordinationV1Api),
    deployments,
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
        if ((e as { code?: number }).code === 404) return undefined;
        throw e;
      }
    },
    patchNetwork: async (namespace, name, patch) =>
      (await custom.patchNamespacedCustomObject({ ...ref, namespace, name, body: patch }, mergePatch())) as FacilitatorNetwork,
    deleteNetwork: async (namespace, name) => {
      await custom.deleteNamespacedCustomObject({ ...ref, namespace, name });
    },
    putSecret: async (namespace, name, data) => {
      const body = { apiVersion: "v1", kind: "Secret", metadata: { name, namespace }, stringData: data };
      try {
        await core.createNamespacedSecret({ namespace, body });
      } catch (e) {
        if ((e as { code?: number }).code !== 409) throw e;
        await core.replaceNamespacedSecret({ namespace, name, body });
      }
    },
    eventsFor: async (namespace, name) => {
      const list = await events.listNamespacedEvent({ namespace });
      return list.items
        .filter((e) => e.regarding?.name === name)
        .map((e) => ({ type: e.type ?? "", reason: e.reason ?? "", note: e.note ?? "", reportingInstance: e.reportingInstance ?? "" }));
    },
    stop: async () => {
      await deployments.stop();
      await api.close();
    },
  };
}

const mergePatch = () => setHeaderOptions("Content-Type", PatchStrategy.MergePatch);

/** Polls until fn returns a value other than undefined/false, or fails with what it waited for. */
export async function until<T>(fn: () => Promise<T | undefined | false> | T | undefined | false, what: string, ms = 10_000): Promise<T> {
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
    await new Promise((r) => setTimeout(r, 25));
  }
}

export function condition(fn: FacilitatorNetwork | undefined, type: "Ready" | "Progressing" | "Degraded") {
  return fn?.status?.conditions?.find((c) => c.type === type);
}
