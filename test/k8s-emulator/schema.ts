// EMULATION of the apiextensions-apiserver's handling of a CRD's structural schema: pruning of
// unknown fields, defaulting, OpenAPI v3 validation (the keywords structural schemas allow,
// plus Kubernetes' x-kubernetes-* extensions) and CEL rules (`x-kubernetes-validations`, with
// `oldSelf` transition rules evaluated only where an old value exists), evaluated by
// @marcbachmann/cel-js. Error texts follow the API server's shape (`path: Invalid value: ...`).
// Not covered: CEL cost budgets, messageExpression, ratcheting, format checks beyond date-time.
import { parse } from "@marcbachmann/cel-js";

export interface Schema {
  type?: "object" | "array" | "string" | "integer" | "number" | "boolean";
  properties?: Record<string, Schema>;
  required?: string[];
  additionalProperties?: Schema | boolean;
  items?: Schema;
  enum?: unknown[];
  pattern?: string;
  format?: string;
  minLength?: number;
  maxLength?: number;
  minimum?: number;
  maximum?: number;
  minItems?: number;
  maxItems?: number;
  default?: unknown;
  nullable?: boolean;
  anyOf?: Schema[];
  description?: string;
  "x-kubernetes-int-or-string"?: boolean;
  "x-kubernetes-preserve-unknown-fields"?: boolean;
  "x-kubernetes-embedded-resource"?: boolean;
  "x-kubernetes-list-type"?: "atomic" | "set" | "map";
  "x-kubernetes-list-map-keys"?: string[];
  "x-kubernetes-validations"?: { rule: string; message?: string; fieldPath?: string; reason?: string }[];
}

export interface FieldError {
  field: string;
  reason: "FieldValueInvalid" | "FieldValueRequired" | "FieldValueNotSupported" | "FieldValueTooLong" | "FieldValueTooMany" | "FieldValueDuplicate" | "FieldValueTypeInvalid";
  message: string;
}

type Json = null | boolean | number | string | Json[] | { [k: string]: Json };
const isObject = (v: unknown): v is Record<string, Json> => typeof v === "object" && v !== null && !Array.isArray(v);
const clone = <T>(v: T): T => (v === undefined ? v : (JSON.parse(JSON.stringify(v)) as T));

function propertySchema(schema: Schema, key: string): Schema | undefined {
  if (schema.properties?.[key]) return schema.properties[key];
  if (isObject(schema.additionalProperties)) return schema.additionalProperties as Schema;
  return undefined;
}

/** Structural pruning: drops fields the schema does not know (metadata is the server's, not pruned). */
export function prune(value: Json, schema: Schema, root = true): Json {
  if (schema["x-kubernetes-preserve-unknown-fields"]) return value;
  if (Array.isArray(value)) return schema.items ? value.map((v) => prune(v, schema.items!, false)) : value;
  if (!isObject(value)) return value;
  const out: Record<string, Json> = {};
  for (const [k, v] of Object.entries(value)) {
    if (root && (k === "apiVersion" || k === "kind" || k === "metadata")) {
      out[k] = v;
      continue;
    }
    const s = propertySchema(schema, k);
    if (s) out[k] = prune(v, s, false);
    else if (schema.additionalProperties === true) out[k] = v;
  }
  return out;
}

/** Structural defaulting: fills absent fields that declare a `default`. */
export function applyDefaults(value: Json, schema: Schema): Json {
  if (Array.isArray(value)) return schema.items ? value.map((v) => applyDefaults(v, schema.items!)) : value;
  if (!isObject(value)) return value;
  const out: Record<string, Json> = { ...value };
  for (const [k, s] of Object.entries(schema.properties ?? {})) {
    if (out[k] === undefined && s.default !== undefined) out[k] = clone(s.default as Json);
  }
  for (const [k, v] of Object.entries(out)) {
    const s = propertySchema(schema, k);
    if (s && k !== "metadata") out[k] = applyDefaults(v, s);
  }
  return out;
}

const compiled = new Map<string, ReturnType<typeof parse>>();
function celProgram(rule: string) {
  let program = compiled.get(rule);
  if (!program) {
    program = parse(rule);
    compiled.set(rule, program);
  }
  return program;
}

/** JSON → CEL values: integers become int (BigInt) where the schema says integer. */
function toCel(value: Json | undefined, schema: Schema | undefined): unknown {
  if (value === undefined || value === null) return value;
  if (typeof value === "number") {
    const integer = schema?.type === "integer" || (schema?.["x-kubernetes-int-or-string"] && Number.isInteger(value));
    return integer ? BigInt(value) : value;
  }
  if (Array.isArray(value)) return value.map((v) => toCel(v, schema?.items));
  if (isObject(value)) {
    const out: Record<string, unknown> = {};
    for (const [k, v] of Object.entries(value)) out[k] = toCel(v, schema ? propertySchema(schema, k) : undefined);
    return out;
  }
  return value;
}

const join = (path: string, key: string) => (path ? `${path}.${key}` : key);
const typeName = (v: unknown) => (Array.isArray(v) ? "array" : v === null ? "null" : typeof v === "number" ? (Number.isInteger(v) ? "integer" : "number") : typeof v);
const show = (v: unknown) => (typeof v === "string" ? JSON.stringify(v) : isObject(v) ? '"object"' : Array.isArray(v) ? `${v.length}` : String(v));
const RFC3339 = /^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$/;

function canonical(v: unknown): string {
  if (Array.isArray(v)) return `[${v.map(canonical).join(",")}]`;
  if (isObject(v)) return `{${Object.keys(v).sort().map((k) => `${JSON.stringify(k)}:${canonical(v[k])}`).join(",")}}`;
  return JSON.stringify(v);
}

/**
 * Validates `value` against `schema`. `old` is the stored value at the same path on an update
 * (undefined on create or where the field is new): transition rules run only where it exists.
 */
export function validate(value: Json | undefined, schema: Schema, path: string, old: Json | undefined, errors: FieldError[]): void {
  if (value === undefined) return;
  if (value === null) {
    if (!schema.nullable) errors.push({ field: path, reason: "FieldValueTypeInvalid", message: `${path}: Invalid value: "null": ${path} in body must be of type ${schema.type ?? "object"}: "null"` });
    return;
  }
  if (schema.anyOf && !schema.anyOf.some((s) => errorsOf(value, { ...s }, path).length === 0)) {
    errors.push({ field: path, reason: "FieldValueInvalid", message: `${path}: Invalid value: ${show(value)}: ${path} in body must match a schema in anyOf` });
    return;
  }
  const t = typeName(value);
  const intOrString = schema["x-kubernetes-int-or-string"];
  if (intOrString) {
    if (t !== "integer" && t !== "string") errors.push({ field: path, reason: "FieldValueTypeInvalid", message: `${path}: Invalid value: ${show(value)}: ${path} in body must be of type integer or string: "${t}"` });
  } else if (schema.type) {
    const ok = schema.type === t || (schema.type === "number" && t === "integer");
    if (!ok) {
      errors.push({ field: path, reason: "FieldValueTypeInvalid", message: `${path}: Invalid value: ${show(value)}: ${path} in body must be of type ${schema.type}: "${t}"` });
      return;
    }
  }
  if (schema.enum && !schema.enum.some((e) => canonical(e) === canonical(value))) {
    errors.push({
      field: path,
      reason: "FieldValueNotSupported",
      message: `${path}: Unsupported value: ${show(value)}: supported values: ${schema.enum.map((e) => JSON.stringify(e)).join(", ")}`,
    });
  }
  if (typeof value === "string") {
    if (schema.maxLength !== undefined && [...value].length > schema.maxLength) {
      errors.push({ field: path, reason: "FieldValueTooLong", message: `${path}: Too long: may not be longer than ${schema.maxLength}` });
    }
    if (schema.minLength !== undefined && [...value].length < schema.minLength) {
      errors.push({ field: path, reason: "FieldValueInvalid", message: `${path}: Invalid value: ${show(value)}: ${path} in body should be at least ${schema.minLength} chars long` });
    }
    if (schema.pattern !== undefined && !new RegExp(schema.pattern, "u").test(value)) {
      errors.push({ field: path, reason: "FieldValueInvalid", message: `${path}: Invalid value: ${show(value)}: ${path} in body should match '${schema.pattern}'` });
    }
    if (schema.format === "date-time" && !RFC3339.test(value)) {
      errors.push({ field: path, reason: "FieldValueInvalid", message: `${path}: Invalid value: ${show(value)}: ${path} in body must be of type date-time` });
    }
  }
  if (typeof value === "number") {
    if (schema.minimum !== undefined && value < schema.minimum) {
      errors.push({ field: path, reason: "FieldValueInvalid", message: `${path}: Invalid value: ${value}: ${path} in body should be greater than or equal to ${schema.minimum}` });
    }
    if (schema.maximum !== undefined && value > schema.maximum) {
      errors.push({ field: path, reason: "FieldValueInvalid", message: `${path}: Invalid value: ${value}: ${path} in body should be less than or equal to ${schema.maximum}` });
    }
  }
  if (Array.isArray(value)) {
    if (schema.minItems !== undefined && value.length < schema.minItems) {
      errors.push({ field: path, reason: "FieldValueInvalid", message: `${path}: Invalid value: ${value.length}: ${path} in body should have at least ${schema.minItems} items` });
    }
    if (schema.maxItems !== undefined && value.length > schema.maxItems) {
      errors.push({ field: path, reason: "FieldValueTooMany", message: `${path}: Too many: ${value.length}: must have at most ${schema.maxItems} items` });
    }
    const listType = schema["x-kubernetes-list-type"];
    if (listType === "set" || listType === "map") {
      const keys = schema["x-kubernetes-list-map-keys"] ?? [];
      const seen = new Map<string, number>();
      value.forEach((item, i) => {
        const k = listType === "set" ? canonical(item) : canonical(keys.map((key) => (isObject(item) ? item[key] : undefined)));
        if (seen.has(k)) errors.push({ field: `${path}[${i}]`, reason: "FieldValueDuplicate", message: `${path}[${i}]: Duplicate value: ${show(listType === "set" ? item : k)}` });
        seen.set(k, i);
      });
    }
    if (schema.items) {
      const oldByKey = oldItems(old, schema);
      value.forEach((item, i) => validate(item, schema.items!, `${path}[${i}]`, oldByKey(item, i), errors));
    }
  }
  if (isObject(value)) {
    for (const r of schema.required ?? []) {
      if (value[r] === undefined) errors.push({ field: join(path, r), reason: "FieldValueRequired", message: `${join(path, r)}: Required value` });
    }
    for (const [k, v] of Object.entries(value)) {
      if (path === "" && (k === "metadata" || k === "apiVersion" || k === "kind")) continue;
      const s = propertySchema(schema, k);
      if (s) validate(v, s, join(path, k), isObject(old) ? old[k] : undefined, errors);
    }
  }
  for (const rule of schema["x-kubernetes-validations"] ?? []) {
    const transition = /\boldSelf\b/.test(rule.rule);
    if (transition && old === undefined) continue;
    const field = rule.fieldPath ? `${path}${rule.fieldPath}` : path || "<root>";
    let ok: unknown;
    try {
      const vars: Record<string, unknown> = { self: toCel(value, schema) };
      if (transition) vars.oldSelf = toCel(old, schema);
      ok = celProgram(rule.rule)(vars);
    } catch (e) {
      errors.push({ field, reason: "FieldValueInvalid", message: `${field}: Invalid value: "${typeName(value)}": rule evaluation error: ${(e as Error).message.split("\n")[0]}` });
      continue;
    }
    if (ok !== true) {
      errors.push({ field, reason: "FieldValueInvalid", message: `${field}: Invalid value: "${typeName(value) === "array" ? "array" : typeName(value)}": ${rule.message ?? `failed rule: ${rule.rule}`}` });
    }
  }
}

/** Old list items are paired with new ones by map keys (list-type map) or by value (set); atomic lists have none. */
function oldItems(old: Json | undefined, schema: Schema): (item: Json, i: number) => Json | undefined {
  if (!Array.isArray(old)) return () => undefined;
  const listType = schema["x-kubernetes-list-type"];
  if (listType === "map") {
    const keys = schema["x-kubernetes-list-map-keys"] ?? [];
    const id = (v: Json) => canonical(keys.map((k) => (isObject(v) ? v[k] : undefined)));
    return (item) => old.find((o) => id(o) === id(item));
  }
  if (listType === "set") return (item) => old.find((o) => canonical(o) === canonical(item));
  return () => undefined;
}

function errorsOf(value: Json, schema: Schema, path: string): FieldError[] {
  const errors: FieldError[] = [];
  validate(value, schema, path, undefined, errors);
  return errors;
}

/**
 * Checks that a CRD's schema is one the emulation can honour (and that a real API server would
 * accept as structural): every node has a type, except under int-or-string / preserve-unknown-fields.
 */
export function assertStructural(schema: Schema, path = "openAPIV3Schema"): void {
  if (!schema.type && !schema["x-kubernetes-int-or-string"] && !schema["x-kubernetes-preserve-unknown-fields"]) {
    throw new Error(`${path}: type is required in a structural schema`);
  }
  for (const [k, s] of Object.entries(schema.properties ?? {})) assertStructural(s, `${path}.properties[${k}]`);
  if (schema.items) assertStructural(schema.items, `${path}.items`);
  if (isObject(schema.additionalProperties)) assertStructural(schema.additionalProperties as Schema, `${path}.additionalProperties`);
  for (const rule of schema["x-kubernetes-validations"] ?? []) celProgram(rule.rule); // compiles, or throws
  if (schema.default !== undefined) {
    const errors = errorsOf(schema.default as Json, schema, path);
    if (errors.length) throw new Error(`${path}: default is invalid: ${errors[0]!.message}`);
  }
}
