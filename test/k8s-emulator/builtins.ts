// EMULATION of the validation the API server applies to the built-in kinds the operator writes:
// the OpenAPI types and enums (kubernetes-models' validators), unknown fields (checked against
// @kubernetes/client-node's model attribute maps: the API server rejects them under
// fieldValidation=Strict), object names and labels, MicroTime precision, and the few semantic
// rules a controller trips over (a Deployment's selector must match its template and cannot change).
import * as k8s from "@kubernetes/client-node";
import { Deployment } from "kubernetes-models/apps/v1";
import { Lease } from "kubernetes-models/coordination.k8s.io/v1";
import { Event } from "kubernetes-models/events.k8s.io/v1";
import { PodDisruptionBudget } from "kubernetes-models/policy/v1";
import { ConfigMap, Secret, Service } from "kubernetes-models/v1";
import type { Obj } from "./managed-fields.ts";

interface Validatable {
  validate(): void;
}

interface BuiltinKind {
  model: new (data: never) => Validatable;
  /** client-node model class name, for the unknown-field check. */
  clientType: string;
  microTimes?: string[][];
}

export const BUILTIN_KINDS: Record<string, BuiltinKind> = {
  Deployment: { model: Deployment as never, clientType: "V1Deployment" },
  Service: { model: Service as never, clientType: "V1Service" },
  ConfigMap: { model: ConfigMap as never, clientType: "V1ConfigMap" },
  Secret: { model: Secret as never, clientType: "V1Secret" },
  PodDisruptionBudget: { model: PodDisruptionBudget as never, clientType: "V1PodDisruptionBudget" },
  Lease: { model: Lease as never, clientType: "V1Lease", microTimes: [["spec", "acquireTime"], ["spec", "renewTime"]] },
  Event: { model: Event as never, clientType: "EventsV1Event", microTimes: [["eventTime"]] },
};

const MICRO_TIME = /^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}(Z|[+-]\d{2}:\d{2})$/;
const LABEL_VALUE = /^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$/;
const LABEL_NAME = /^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$/;
const DNS_SUBDOMAIN = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$/;
const DNS_LABEL = /^[a-z]([-a-z0-9]*[a-z0-9])?$/;

type Attribute = { name: string; baseName: string; type: string };
const models = k8s as unknown as Record<string, { getAttributeTypeMap?: () => Attribute[] } | undefined>;

/** Paths of fields that the client-node model of `type` does not know. */
export function unknownFields(value: unknown, type: string, path = ""): string[] {
  if (value === null || value === undefined) return [];
  const array = /^Array<(.+)>$/.exec(type);
  if (array) return Array.isArray(value) ? value.flatMap((v, i) => unknownFields(v, array[1]!, `${path}[${i}]`)) : [];
  const map = /^\{ \[key: string\]: (.+); \}$/.exec(type);
  if (map) return typeof value === "object" ? Object.entries(value as Obj).flatMap(([k, v]) => unknownFields(v, map[1]!, `${path}[${k}]`)) : [];
  const model = models[type];
  if (!model?.getAttributeTypeMap || typeof value !== "object" || Array.isArray(value)) return [];
  const attributes = new Map(model.getAttributeTypeMap().map((a) => [a.baseName, a.type]));
  const out: string[] = [];
  for (const [k, v] of Object.entries(value as Obj)) {
    const t = attributes.get(k);
    if (t === undefined) out.push(`${path}.${k}`.replace(/^\./, ""));
    else out.push(...unknownFields(v, t, `${path}.${k}`));
  }
  return out;
}

function get(obj: unknown, path: string[]): unknown {
  return path.reduce<unknown>((cur, p) => (cur && typeof cur === "object" ? (cur as Obj)[p] : undefined), obj);
}

/** Field errors of a built-in object (empty when valid). `old` is the stored object on an update. */
export function validateBuiltin(kind: string, obj: Obj, old: Obj | undefined): string[] {
  const def = BUILTIN_KINDS[kind];
  if (!def) return [];
  const errors: string[] = [];
  const meta = (obj.metadata ?? {}) as Obj;
  const { managedFields: _managed, ...plainMeta } = meta;
  const plain = { ...obj, metadata: plainMeta };
  try {
    new def.model(plain as never).validate();
  } catch (e) {
    errors.push(...(e as Error).message.split(", ").map((m) => m.replace(/^data\//, "").replace(/\//g, ".")));
  }
  for (const f of unknownFields(plain, def.clientType)) errors.push(`${f}: unknown field "${f.split(".").pop()}"`);
  const name = String(meta.name ?? "");
  const nameRule = kind === "Service" ? DNS_LABEL : DNS_SUBDOMAIN;
  if (!nameRule.test(name) || name.length > (kind === "Service" ? 63 : 253)) errors.push(`metadata.name: Invalid value: "${name}": a lowercase RFC 1123 ${kind === "Service" ? "label (RFC 1035)" : "subdomain"} is required`);
  for (const [k, v] of Object.entries((meta.labels ?? {}) as Record<string, string>)) {
    const [prefix, n] = k.includes("/") ? k.split("/", 2) : [undefined, k];
    if ((prefix !== undefined && !DNS_SUBDOMAIN.test(prefix)) || !LABEL_NAME.test(n!) || n!.length > 63) errors.push(`metadata.labels: Invalid value: "${k}": name part must be a qualified name`);
    if (typeof v !== "string" || v.length > 63 || !LABEL_VALUE.test(v)) errors.push(`metadata.labels: Invalid value: "${String(v)}": a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.'`);
  }
  for (const path of def.microTimes ?? []) {
    const v = get(obj, path);
    if (v !== undefined && (typeof v !== "string" || !MICRO_TIME.test(v))) {
      errors.push(`${path.join(".")}: Invalid value: "${String(v)}": parsing time as "2006-01-02T15:04:05.000000Z07:00" (MicroTime needs 6 fractional digits)`);
    }
  }
  if (kind === "Deployment") {
    const selector = get(obj, ["spec", "selector", "matchLabels"]) as Record<string, string> | undefined;
    const labels = (get(obj, ["spec", "template", "metadata", "labels"]) ?? {}) as Record<string, string>;
    if (!selector || Object.entries(selector).some(([k, v]) => labels[k] !== v)) errors.push("spec.template.metadata.labels: Invalid value: `selector` does not match template `labels`");
    if (old && JSON.stringify(get(old, ["spec", "selector"])) !== JSON.stringify(get(obj, ["spec", "selector"]))) errors.push("spec.selector: Invalid value: field is immutable");
  }
  if (kind === "Event" && old === undefined) {
    for (const f of ["eventTime", "reportingController", "reportingInstance", "action", "reason", "regarding"]) {
      if (get(obj, [f]) === undefined) errors.push(`${f}: Required value`);
    }
    if (!["Normal", "Warning"].includes(String(obj.type))) errors.push(`type: Unsupported value: "${String(obj.type)}": supported values: "Normal", "Warning"`);
  }
  return errors;
}
