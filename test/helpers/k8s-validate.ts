// Validation of rendered Kubernetes documents by a real kube-apiserver
// (test/helpers/control-plane.ts): each document is sent as a server-side apply with
// dryRun=All and fieldValidation=Strict, so the server's own checks decide: types, enums,
// required fields, unknown fields, names and labels, and for FacilitatorNetworks the CRD's
// openAPIV3Schema and CEL rules (the CRD from crds/ is installed on that server). Nothing is
// stored. The Prometheus Operator kinds have no CRD on the test server; they are checked by the
// @kubernetes-models/prometheus-operator validators, unknown fields found by a proxy that
// records every property the validator reads (a present key it never asked for is unknown).
import { PodMonitor, PrometheusRule, ServiceMonitor } from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1";
import type { ControlPlane } from "./control-plane.ts";

type Validatable = { prototype: { validate(this: unknown): void } };

const MONITORING: Record<string, Validatable> = {
  "monitoring.coreos.com/v1/ServiceMonitor": ServiceMonitor,
  "monitoring.coreos.com/v1/PodMonitor": PodMonitor,
  "monitoring.coreos.com/v1/PrometheusRule": PrometheusRule,
};

export const FACILITATOR_NETWORK = "x402fleet.io/v1alpha1/FacilitatorNetwork";

const isObject = (v: unknown): v is Record<string, unknown> => typeof v === "object" && v !== null;

interface Access {
  /** The validator looked at this object or array at all (read any property, present or not). */
  touched: boolean;
  read: Set<string>;
  children: Map<string, Access>;
}

/** A proxy of `value` that records, per object, which properties were read. */
function tracked(value: unknown, access: Access): unknown {
  if (!isObject(value)) return value;
  return new Proxy(value, {
    get(target, key, receiver) {
      const v = Reflect.get(target, key, receiver);
      if (typeof key !== "string") return v;
      access.touched = true;
      if (!Object.prototype.hasOwnProperty.call(target, key)) return v;
      access.read.add(key);
      if (!isObject(v)) return v;
      let child = access.children.get(key);
      if (!child) access.children.set(key, (child = { touched: false, read: new Set(), children: new Map() }));
      return tracked(v, child);
    },
  });
}

/** Present keys the validator never read, inside objects it did examine (free-form values are skipped). */
function unread(value: unknown, access: Access | undefined, path: string, out: string[]) {
  if (!isObject(value) || !access?.touched) return;
  for (const [k, v] of Object.entries(value)) {
    if (Array.isArray(value) && k === "length") continue;
    if (!access.read.has(k)) out.push(`${path}/${k}`);
    else unread(v, access.children.get(k), `${path}/${k}`, out);
  }
}

function monitoringErrors(model: Validatable, doc: unknown, where: string): string[] {
  const access: Access = { touched: false, read: new Set(), children: new Map() };
  const errors: string[] = [];
  try {
    model.prototype.validate.call(tracked(doc, access));
  } catch (e) {
    errors.push(`${where}: ${(e as Error).message}`);
  }
  const unknown: string[] = [];
  unread(doc, access, "", unknown);
  return [...errors, ...unknown.map((p) => `${where}: unknown field ${p}`)];
}

interface ApiResource {
  name: string;
  namespaced: boolean;
  kind: string;
}

/** A validator bound to one control plane; it learns resource names from the server's discovery. */
export function serverValidator(cp: ControlPlane) {
  const discovery = new Map<string, Promise<ApiResource[]>>();
  const resourcesOf = (apiVersion: string) => {
    let p = discovery.get(apiVersion);
    if (!p) {
      const path = apiVersion.includes("/") ? `/apis/${apiVersion}` : `/api/${apiVersion}`;
      p = cp.request(path).then((r) => (r.status === 200 ? (JSON.parse(r.text) as { resources: ApiResource[] }).resources : []));
      discovery.set(apiVersion, p);
    }
    return p;
  };
  const namespaces = new Set<string>();
  const ensureNamespace = async (name: string) => {
    if (namespaces.has(name)) return;
    const r = await cp.request("/api/v1/namespaces", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ metadata: { name } }) });
    if (r.status !== 201 && r.status !== 409) throw new Error(`creating namespace ${name}: HTTP ${r.status}`);
    namespaces.add(name);
  };

  /** Every problem the server (or the monitoring validator) finds in one document; empty when valid. */
  async function validate(doc: Record<string, unknown>, defaultNamespace = "default"): Promise<string[]> {
    const apiVersion = String(doc.apiVersion);
    const kind = String(doc.kind);
    const meta = (doc.metadata ?? {}) as { name?: string; namespace?: string };
    const where = `${apiVersion}/${kind} ${String(meta.name)}`;
    const monitoring = MONITORING[`${apiVersion}/${kind}`];
    if (monitoring) return monitoringErrors(monitoring, doc, where);
    const resource = (await resourcesOf(apiVersion)).find((r) => r.kind === kind && !r.name.includes("/"));
    if (!resource) return [`${where}: kube-apiserver serves no such kind`];
    const base = apiVersion.includes("/") ? `/apis/${apiVersion}` : `/api/${apiVersion}`;
    let collection = `${base}/${resource.name}`;
    if (resource.namespaced) {
      const ns = meta.namespace ?? defaultNamespace;
      await ensureNamespace(ns);
      collection = `${base}/namespaces/${ns}/${resource.name}`;
    }
    const res = await cp.request(`${collection}/${meta.name}?dryRun=All&fieldValidation=Strict&fieldManager=x402-fleet-validate&force=true`, {
      method: "PATCH",
      headers: { "content-type": "application/apply-patch+yaml" },
      body: JSON.stringify(doc), // JSON is YAML
    });
    if (res.status === 200 || res.status === 201) return [];
    const message = (() => {
      try {
        return (JSON.parse(res.text) as { message: string }).message;
      } catch {
        return res.text;
      }
    })();
    return [`${where}: HTTP ${res.status}: ${message}`];
  }

  return {
    validate,
    /** All documents of a render, in order. */
    validateAll: async (docs: Record<string, unknown>[], defaultNamespace?: string) => (await Promise.all(docs.map((d) => validate(d, defaultNamespace)))).flat(),
  };
}
