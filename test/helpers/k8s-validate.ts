// Validation of rendered Kubernetes documents, offline (there is no API server here):
// - types, enums, required fields: the kubernetes-models and @kubernetes-models/prometheus-operator
//   validators (generated from the Kubernetes OpenAPI and the Prometheus Operator CRDs);
// - unknown fields, which those validators accept: for the built-in kinds, a round trip through
//   @kubernetes/client-node's ObjectSerializer (generated from the Kubernetes OpenAPI) must give the
//   document back unchanged; for the Prometheus Operator kinds, the validator runs on a proxy that
//   records every property it reads, and a present key the schema never asked for is unknown;
// - FacilitatorNetwork: the CRD's own openAPIV3Schema and CEL rules (test/k8s-emulator/schema.ts,
//   the operator tests' emulation of the apiextensions-apiserver), unknown fields by pruning.
import { ObjectSerializer } from "@kubernetes/client-node/dist/gen/models/ObjectSerializer.js";
import { CustomResourceDefinition } from "kubernetes-models/apiextensions.k8s.io/v1";
import { Deployment } from "kubernetes-models/apps/v1";
import { HorizontalPodAutoscaler } from "kubernetes-models/autoscaling/v2";
import { Ingress, NetworkPolicy } from "kubernetes-models/networking.k8s.io/v1";
import { PodDisruptionBudget } from "kubernetes-models/policy/v1";
import { ClusterRole, ClusterRoleBinding, Role, RoleBinding } from "kubernetes-models/rbac.authorization.k8s.io/v1";
import { ConfigMap, Secret, Service, ServiceAccount } from "kubernetes-models/v1";
import { PodMonitor, PrometheusRule, ServiceMonitor } from "@kubernetes-models/prometheus-operator/monitoring.coreos.com/v1";
import { applyDefaults, prune, validate as validateCustom, type FieldError, type Schema } from "../k8s-emulator/schema.ts";
import type { Json } from "../k8s-emulator/managed-fields.ts";

type Validatable = { prototype: { validate(this: unknown): void } };

interface Kind {
  model: Validatable;
  /** The client-node model name, for the ObjectSerializer round trip (built-in kinds only). */
  clientType?: string;
}

const KINDS: Record<string, Kind> = {
  "v1/ServiceAccount": { model: ServiceAccount, clientType: "V1ServiceAccount" },
  "v1/Service": { model: Service, clientType: "V1Service" },
  "v1/ConfigMap": { model: ConfigMap, clientType: "V1ConfigMap" },
  "v1/Secret": { model: Secret, clientType: "V1Secret" },
  "apps/v1/Deployment": { model: Deployment, clientType: "V1Deployment" },
  "policy/v1/PodDisruptionBudget": { model: PodDisruptionBudget, clientType: "V1PodDisruptionBudget" },
  "autoscaling/v2/HorizontalPodAutoscaler": { model: HorizontalPodAutoscaler, clientType: "V2HorizontalPodAutoscaler" },
  "networking.k8s.io/v1/Ingress": { model: Ingress, clientType: "V1Ingress" },
  "networking.k8s.io/v1/NetworkPolicy": { model: NetworkPolicy, clientType: "V1NetworkPolicy" },
  "rbac.authorization.k8s.io/v1/ClusterRole": { model: ClusterRole, clientType: "V1ClusterRole" },
  "rbac.authorization.k8s.io/v1/ClusterRoleBinding": { model: ClusterRoleBinding, clientType: "V1ClusterRoleBinding" },
  "rbac.authorization.k8s.io/v1/Role": { model: Role, clientType: "V1Role" },
  "rbac.authorization.k8s.io/v1/RoleBinding": { model: RoleBinding, clientType: "V1RoleBinding" },
  "apiextensions.k8s.io/v1/CustomResourceDefinition": { model: CustomResourceDefinition, clientType: "V1CustomResourceDefinition" },
  "monitoring.coreos.com/v1/ServiceMonitor": { model: ServiceMonitor },
  "monitoring.coreos.com/v1/PodMonitor": { model: PodMonitor },
  "monitoring.coreos.com/v1/PrometheusRule": { model: PrometheusRule },
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

/** Paths where `b` lacks or changes something `a` has. */
export function lost(a: unknown, b: unknown, path = ""): string[] {
  if (isObject(a) && isObject(b)) return Object.keys(a).flatMap((k) => (k in b ? lost(a[k], b[k], `${path}/${k}`) : [`${path}/${k}`]));
  return JSON.stringify(a) === JSON.stringify(b) ? [] : [`${path} (${JSON.stringify(a)} became ${JSON.stringify(b)})`];
}

function modelErrors(model: Validatable, doc: unknown): { errors: string[]; unknown: string[] } {
  const access: Access = { touched: false, read: new Set(), children: new Map() };
  const errors: string[] = [];
  try {
    model.prototype.validate.call(tracked(doc, access));
  } catch (e) {
    errors.push((e as Error).message);
  }
  const unknown: string[] = [];
  unread(doc, access, "", unknown);
  return { errors, unknown };
}

/** Every problem found in one rendered document (empty when it is valid). */
export function validateDocument(doc: Record<string, unknown>, crdSchema?: Schema): string[] {
  const key = `${String(doc.apiVersion)}/${String(doc.kind)}`;
  const where = `${key} ${String((doc.metadata as { name?: string } | undefined)?.name)}`;
  if (key === FACILITATOR_NETWORK) {
    if (!crdSchema) return [`${where}: no CRD schema to validate against`];
    const errors: FieldError[] = [];
    const pruned = prune(doc as Json, crdSchema);
    validateCustom(applyDefaults(pruned, crdSchema), crdSchema, "", undefined, errors);
    return [...errors.map((e) => `${where}: ${e.message}`), ...lost(doc, pruned).map((p) => `${where}: unknown field ${p}`)];
  }
  const kind = KINDS[key];
  if (!kind) return [`${where}: no validator for this kind (add it to test/helpers/k8s-validate.ts)`];
  const { errors, unknown } = modelErrors(kind.model, doc);
  const out = errors.map((e) => `${where}: ${e}`);
  if (kind.clientType) {
    // Built-in kinds: client-node's models are complete (kubernetes-models' generated schemas
    // leave out a few properties, e.g. JSONSchemaProps' description and x-kubernetes-*).
    const roundTrip = ObjectSerializer.serialize(ObjectSerializer.deserialize(doc, kind.clientType, ""), kind.clientType, "") as unknown;
    out.push(...lost(doc, roundTrip).map((p) => `${where}: unknown field (not in the ${kind.clientType} model) ${p}`));
  } else {
    out.push(...unknown.map((p) => `${where}: unknown field ${p}`));
  }
  return out;
}
