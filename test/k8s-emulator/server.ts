// An in-process HTTP EMULATION of the Kubernetes API semantics the operator relies on. It is
// not a kube-apiserver and not envtest: there is no etcd, no admission chain, no RBAC, no
// controllers (Deployments never get pods; tests play the Deployment controller explicitly),
// namespaces exist implicitly, and lists are atomic under server-side apply. What it does
// emulate, because the operator's correctness depends on it:
//  - JSON over HTTP at the real paths (/api/v1/..., /apis/<group>/<version>/...), Status errors
//  - one global resourceVersion; list returns it; watch from a resourceVersion replays history,
//    label/field selectors (an object leaving a selector arrives as DELETED), and a watch from a
//    compacted resourceVersion answers 410 Gone (as the API server: an ERROR event in the stream)
//  - create (409 AlreadyExists, generateName), get, update with 409 on a stale resourceVersion,
//    merge patch, server-side apply with field managers, conflicts and force (managed-fields.ts)
//  - the status subresource (main writes ignore status, /status writes touch only status) and
//    metadata.generation (bumped by spec changes and by deletion of an object with finalizers)
//  - finalizers and deletionTimestamp (no finalizer may be added while deleting; the object goes
//    once the last one is removed), delete preconditions, ownerReference garbage collection
//    (background; an owner in another namespace counts as absent, as the real collector treats it)
//  - CRDs installed from their YAML: pruning, defaulting, the openAPIV3Schema and its CEL rules
//    (schema.ts), printer columns through `Accept: application/json;as=Table;...`
//  - built-in kinds validated by kubernetes-models, for unknown fields, names, labels, MicroTimes
// Tests can drop watch connections, hold new ones, and compact the history.
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import { randomBytes, randomUUID } from "node:crypto";
import type { Socket } from "node:net";
import { KubeConfig } from "@kubernetes/client-node";
import { parse as parseYaml } from "yaml";
import { BUILTIN_KINDS, validateBuiltin } from "./builtins.ts";
import { recordUpdate, renderManagedFields, serverSideApply, type Json, type ManagerEntry, type Obj } from "./managed-fields.ts";
import { applyDefaults, assertStructural, prune, validate, type FieldError, type Schema } from "./schema.ts";

export interface ResourceType {
  group: string;
  version: string;
  plural: string;
  kind: string;
  namespaced: boolean;
  statusSubresource: boolean;
  /** metadata.generation tracks spec changes. */
  generation: boolean;
  schema?: Schema;
  printerColumns?: { name: string; type: string; jsonPath: string; priority?: number }[];
}

const BUILTIN_RESOURCES: ResourceType[] = [
  { group: "", version: "v1", plural: "configmaps", kind: "ConfigMap", namespaced: true, statusSubresource: false, generation: false },
  { group: "", version: "v1", plural: "secrets", kind: "Secret", namespaced: true, statusSubresource: false, generation: false },
  { group: "", version: "v1", plural: "services", kind: "Service", namespaced: true, statusSubresource: true, generation: false },
  { group: "apps", version: "v1", plural: "deployments", kind: "Deployment", namespaced: true, statusSubresource: true, generation: true },
  { group: "policy", version: "v1", plural: "poddisruptionbudgets", kind: "PodDisruptionBudget", namespaced: true, statusSubresource: true, generation: true },
  { group: "coordination.k8s.io", version: "v1", plural: "leases", kind: "Lease", namespaced: true, statusSubresource: false, generation: false },
  { group: "events.k8s.io", version: "v1", plural: "events", kind: "Event", namespaced: true, statusSubresource: false, generation: false },
];

interface Stored {
  obj: Obj;
  managed: ManagerEntry[];
}

interface HistoryEntry {
  rv: number;
  resource: string;
  type: "ADDED" | "MODIFIED" | "DELETED";
  object: Obj;
  prev?: Obj;
}

interface Watcher {
  resource: string;
  namespace?: string;
  matches(obj: Obj): boolean;
  res: ServerResponse;
}

class ApiError extends Error {
  constructor(
    readonly code: number,
    readonly reason: string,
    message: string,
    readonly details?: Record<string, unknown>,
  ) {
    super(message);
  }
}

const isObject = (v: unknown): v is Obj => typeof v === "object" && v !== null && !Array.isArray(v);
const clone = <T>(v: T): T => JSON.parse(JSON.stringify(v)) as T;
const apiVersionOf = (r: ResourceType) => (r.group ? `${r.group}/${r.version}` : r.version);
const idOf = (r: ResourceType) => `${r.group}/${r.version}/${r.plural}`;
const qualified = (r: ResourceType) => (r.group ? `${r.plural}.${r.group}` : r.plural);
const now = () => new Date().toISOString().replace(/\.\d{3}Z$/, "Z");
const meta = (o: Obj) => o.metadata as Obj & { name: string; namespace?: string; uid: string; resourceVersion: string; finalizers?: string[]; ownerReferences?: { uid: string }[] };

function mergePatch(target: Json, patch: Json): Json {
  if (!isObject(patch)) return clone(patch);
  const out: Obj = isObject(target) ? { ...target } : {};
  for (const [k, v] of Object.entries(patch)) {
    if (v === null) delete out[k];
    else out[k] = mergePatch(out[k] as Json, v);
  }
  return out;
}

// ---- selectors -------------------------------------------------------------------------------

type Requirement = (labels: Record<string, string>) => boolean;

export function parseLabelSelector(text: string | null): Requirement {
  if (!text) return () => true;
  const parts: string[] = [];
  let depth = 0;
  let cur = "";
  for (const ch of text) {
    if (ch === "(") depth++;
    if (ch === ")") depth--;
    if (ch === "," && depth === 0) {
      parts.push(cur.trim());
      cur = "";
    } else cur += ch;
  }
  if (cur.trim()) parts.push(cur.trim());
  const reqs: Requirement[] = parts.map((p) => {
    let m: RegExpExecArray | null;
    if ((m = /^(\S+)\s+(in|notin)\s+\((.*)\)$/.exec(p))) {
      const [, key, op, values] = m;
      const set = new Set(values!.split(",").map((v) => v.trim()));
      return op === "in" ? (l) => l[key!] !== undefined && set.has(l[key!]!) : (l) => l[key!] === undefined || !set.has(l[key!]!);
    }
    if ((m = /^([^=!]+)!=(.*)$/.exec(p))) return (l) => l[m![1]!.trim()] !== m![2]!.trim();
    if ((m = /^([^=!]+)==?(.*)$/.exec(p))) return (l) => l[m![1]!.trim()] === m![2]!.trim();
    if (p.startsWith("!")) return (l) => l[p.slice(1)] === undefined;
    return (l) => l[p] !== undefined;
  });
  return (labels) => reqs.every((r) => r(labels));
}

function parseFieldSelector(text: string | null): (o: Obj) => boolean {
  if (!text) return () => true;
  const reqs = text.split(",").map((p) => {
    const neg = p.includes("!=");
    const [field, value] = p.split(neg ? "!=" : /==?/) as [string, string];
    const path = field.trim().split(".");
    return (o: Obj) => {
      const v = path.reduce<unknown>((c, k) => (isObject(c) ? c[k] : undefined), o);
      return neg ? v !== value.trim() : v === value.trim();
    };
  });
  return (o) => reqs.every((r) => r(o));
}

// ---- JSONPath subset for printer columns ----------------------------------------------------------

export function jsonPath(obj: unknown, path: string): unknown {
  let cur: unknown = obj;
  const re = /\.([A-Za-z0-9_-]+)|\[\?\(@\.([A-Za-z0-9_]+)==("?)([^")]*)\3\)\]|\[(\d+)\]/g;
  let m: RegExpExecArray | null;
  while ((m = re.exec(path))) {
    if (cur === undefined || cur === null) return undefined;
    if (m[1] !== undefined) cur = (cur as Obj)[m[1]];
    else if (m[2] !== undefined) cur = Array.isArray(cur) ? cur.find((x) => isObject(x) && String(x[m![2]!]) === m![4]) : undefined;
    else cur = Array.isArray(cur) ? cur[Number(m[5])] : undefined;
  }
  return cur;
}

// ---- the emulation -------------------------------------------------------------------------------

export interface KubeApiEmulation {
  url: string;
  /** A KubeConfig pointing at the emulation, as a user or the operator would load it. */
  kubeConfig(): KubeConfig;
  /** Registers a CustomResourceDefinition (its storage version) from its parsed YAML. */
  installCrd(crd: Record<string, unknown>): void;
  /** Reads the stored object directly (test assertions; the operator only uses HTTP). */
  peek(apiVersion: string, plural: string, namespace: string, name: string): Obj | undefined;
  /** The write log: every committed change, in resourceVersion order. */
  history(): { rv: number; type: string; kind: string; namespace?: string; name: string; object: Obj }[];
  /** Forgets the change history: a watch from an older resourceVersion now gets 410 Gone. */
  compact(): void;
  /** Ends every open watch stream (clients see the connection close). */
  disconnectWatches(): number;
  /** New watch requests wait, unanswered, until releaseWatches(). */
  holdWatches(): void;
  releaseWatches(): void;
  stats(): { lists: number; watches: number; gone: number; garbageCollected: number };
  close(): Promise<void>;
}

export async function startKubeApiEmulation(): Promise<KubeApiEmulation> {
  const resources = new Map<string, ResourceType>();
  for (const r of BUILTIN_RESOURCES) resources.set(idOf(r), r);
  const store = new Map<string, Map<string, Stored>>();
  const byUid = new Map<string, { resource: string; key: string }>();
  let history: HistoryEntry[] = [];
  let rv = 100;
  let compactedRv = 0;
  const watchers = new Set<Watcher>();
  let holding = false;
  let held: (() => void)[] = [];
  const stats = { lists: 0, watches: 0, gone: 0, garbageCollected: 0 };
  let gcScheduled = false;

  const objects = (resource: string) => {
    let m = store.get(resource);
    if (!m) store.set(resource, (m = new Map()));
    return m;
  };
  const render = (s: Stored): Obj => {
    const o = clone(s.obj);
    (o.metadata as Obj).managedFields = renderManagedFields(s.managed) as unknown as Json;
    return o;
  };

  function notify(entry: HistoryEntry) {
    history.push(entry);
    for (const w of watchers) deliver(w, entry);
  }

  function deliver(w: Watcher, e: HistoryEntry) {
    if (w.resource !== e.resource) return;
    if (w.namespace && meta(e.object).namespace !== w.namespace) return;
    const now = w.matches(e.object);
    const was = e.prev ? w.matches(e.prev) : false;
    let type: string | undefined;
    if (e.type === "ADDED") type = now ? "ADDED" : undefined;
    else if (e.type === "DELETED") type = now || was ? "DELETED" : undefined;
    else type = was && now ? "MODIFIED" : now ? "ADDED" : was ? "DELETED" : undefined;
    if (type) w.res.write(`${JSON.stringify({ type, object: e.object })}\n`);
  }

  function commit(r: ResourceType, key: string, next: Stored | undefined, prev: Stored | undefined, type: HistoryEntry["type"]) {
    rv++;
    const id = idOf(r);
    if (next) {
      meta(next.obj).resourceVersion = String(rv);
      objects(id).set(key, next);
      byUid.set(meta(next.obj).uid, { resource: id, key });
      notify({ rv, resource: id, type, object: render(next), prev: prev ? render(prev) : undefined });
    } else if (prev) {
      objects(id).delete(key);
      byUid.delete(meta(prev.obj).uid);
      const gone = render(prev);
      meta(gone).resourceVersion = String(rv);
      notify({ rv, resource: id, type: "DELETED", object: gone });
      scheduleGc();
    }
  }

  function prepare(r: ResourceType, obj: Obj, old: Obj | undefined): Obj {
    let out = obj;
    if (r.schema) {
      out = applyDefaults(prune(out, r.schema) as Obj, r.schema) as Obj;
      const errors: FieldError[] = [];
      validate(out, r.schema, "", old, errors);
      if (errors.length) invalid(r, meta(out).name, errors.map((e) => ({ field: e.field, reason: e.reason, message: e.message })));
    } else {
      if (r.kind === "Secret" && isObject(out.stringData)) {
        const data: Obj = isObject(out.data) ? { ...out.data } : {};
        for (const [k, v] of Object.entries(out.stringData)) data[k] = Buffer.from(String(v)).toString("base64");
        out = { ...out, data };
        delete out.stringData;
      }
      const errors = validateBuiltin(r.kind, out, old);
      if (errors.length) invalid(r, meta(out).name, errors.map((message) => ({ field: message.split(":")[0]!, reason: "FieldValueInvalid", message })));
    }
    const finalizers = meta(out).finalizers;
    if (finalizers !== undefined && (!Array.isArray(finalizers) || finalizers.some((f) => typeof f !== "string" || !/^[a-z0-9.-]+\/[A-Za-z0-9._-]+$|^[a-z0-9-]+$/.test(f)))) {
      invalid(r, meta(out).name, [{ field: "metadata.finalizers", reason: "FieldValueInvalid", message: "metadata.finalizers: Invalid value: must be qualified names" }]);
    }
    return out;
  }

  function invalid(r: ResourceType, name: string, causes: { field: string; reason: string; message: string }[]): never {
    throw new ApiError(422, "Invalid", `${r.kind}.${r.group || "core"} "${name}" is invalid: ${causes.map((c) => c.message).join(", ")}`, {
      name,
      group: r.group,
      kind: r.kind,
      causes,
    });
  }

  function find(r: ResourceType, namespace: string | undefined, name: string): Stored {
    const s = objects(idOf(r)).get(`${namespace ?? ""}/${name}`);
    if (!s) throw new ApiError(404, "NotFound", `${qualified(r)} "${name}" not found`, { name, group: r.group, kind: r.plural });
    return s;
  }

  function checkIdentity(r: ResourceType, body: Obj, namespace: string | undefined) {
    if (body.apiVersion !== undefined && body.apiVersion !== apiVersionOf(r)) throw new ApiError(400, "BadRequest", `apiVersion ${String(body.apiVersion)} does not match ${apiVersionOf(r)}`);
    if (body.kind !== undefined && body.kind !== r.kind) throw new ApiError(400, "BadRequest", `kind ${String(body.kind)} does not match ${r.kind}`);
    const ns = isObject(body.metadata) ? body.metadata.namespace : undefined;
    if (namespace && ns !== undefined && ns !== namespace) {
      throw new ApiError(400, "BadRequest", "the namespace of the provided object does not match the namespace sent on the request");
    }
  }

  function specPart(o: Obj) {
    const { metadata: _m, status: _s, apiVersion: _a, kind: _k, ...rest } = o;
    return JSON.stringify(rest);
  }

  function sameManaged(a: ManagerEntry[], b: ManagerEntry[]) {
    const f = (m: ManagerEntry[]) => JSON.stringify(m.map((e) => [e.manager, e.operation, e.subresource, [...e.fields].sort()]));
    return f(a) === f(b);
  }

  function createObject(r: ResourceType, namespace: string | undefined, body: Obj, manager: string, viaApply?: ManagerEntry[]): Obj {
    checkIdentity(r, body, namespace);
    const m: Obj = isObject(body.metadata) ? { ...body.metadata } : {};
    if (m.resourceVersion) throw new ApiError(422, "Invalid", "resourceVersion may not be set on objects to be created");
    let name = m.name as string | undefined;
    if (!name && typeof m.generateName === "string") name = `${m.generateName}${randomBytes(3).toString("hex").slice(0, 5)}`;
    if (!name) invalid(r, "", [{ field: "metadata.name", reason: "FieldValueRequired", message: "metadata.name: Required value: name or generateName is required" }]);
    const key = `${namespace ?? ""}/${name}`;
    if (objects(idOf(r)).has(key)) throw new ApiError(409, "AlreadyExists", `${qualified(r)} "${name}" already exists`, { name, group: r.group, kind: r.plural });
    let obj: Obj = { ...clone(body), apiVersion: apiVersionOf(r), kind: r.kind };
    if (r.statusSubresource) delete obj.status;
    delete m.deletionTimestamp;
    obj.metadata = { ...m, name, ...(namespace ? { namespace } : {}), uid: randomUUID(), creationTimestamp: now(), ...(r.generation ? { generation: 1 } : {}) };
    delete (obj.metadata as Obj).managedFields;
    obj = prepare(r, obj, undefined);
    const t = now();
    const managed = viaApply ?? recordUpdate({ old: {}, next: obj, manager, subresource: "", hasStatus: r.statusSubresource, managed: [], apiVersion: apiVersionOf(r), now: t });
    const stored = { obj, managed };
    commit(r, key, stored, undefined, "ADDED");
    return render(stored);
  }

  /** The common tail of update, patch and apply: validation, generation, no-op detection, finalization. */
  function finishUpdate(r: ResourceType, stored: Stored, candidate: Obj, managed: ManagerEntry[]): Obj {
    const old = stored.obj;
    const m = meta(old);
    // identity and server-owned metadata are never taken from the request
    const next: Obj = { ...candidate, apiVersion: apiVersionOf(r), kind: r.kind };
    const nm: Obj = { ...(isObject(candidate.metadata) ? candidate.metadata : {}) };
    for (const k of ["name", "namespace", "uid", "creationTimestamp", "generation", "deletionTimestamp", "deletionGracePeriodSeconds", "resourceVersion"]) {
      if ((old.metadata as Obj)[k] === undefined) delete nm[k];
      else nm[k] = (old.metadata as Obj)[k]!;
    }
    delete nm.managedFields;
    next.metadata = nm;
    if (m.deletionTimestamp) {
      const added = ((nm.finalizers as string[] | undefined) ?? []).filter((f) => !(m.finalizers ?? []).includes(f));
      if (added.length) throw new ApiError(422, "Forbidden", `${qualified(r)} "${m.name}" is forbidden: no new finalizers can be added if the object is being deleted, found new finalizers ${JSON.stringify(added)}`);
    }
    const prepared = prepare(r, next, old);
    if (JSON.stringify(prepared) === JSON.stringify(old) && sameManaged(managed, stored.managed)) return render(stored); // no-op: nothing written
    if (r.generation && specPart(prepared) !== specPart(old)) (prepared.metadata as Obj).generation = Number(m.generation ?? 1) + 1;
    const key = `${m.namespace ?? ""}/${m.name}`;
    const updated = { obj: prepared, managed };
    if (m.deletionTimestamp && !((prepared.metadata as Obj).finalizers as string[] | undefined)?.length) {
      commit(r, key, undefined, updated, "DELETED");
      return render(updated);
    }
    commit(r, key, updated, stored, "MODIFIED");
    return render(updated);
  }

  function updateObject(r: ResourceType, namespace: string | undefined, name: string, body: Obj, sub: string, manager: string): Obj {
    checkIdentity(r, body, namespace);
    const stored = find(r, namespace, name);
    const bm = isObject(body.metadata) ? body.metadata : {};
    if (bm.name !== undefined && bm.name !== name) throw new ApiError(400, "BadRequest", "the name of the object does not match the name on the URL");
    if (bm.resourceVersion !== undefined && bm.resourceVersion !== meta(stored.obj).resourceVersion) conflict(r, name);
    return finishUpdate(r, stored, split(r, stored.obj, body, sub), track(r, stored, body, sub, manager));
  }

  function conflict(r: ResourceType, name: string): never {
    throw new ApiError(409, "Conflict", `Operation cannot be fulfilled on ${qualified(r)} "${name}": the object has been modified; please apply your changes to the latest version and try again`, {
      name,
      group: r.group,
      kind: r.plural,
    });
  }

  /** What a write may change: /status changes only status; the main resource never changes status. */
  function split(r: ResourceType, old: Obj, body: Obj, sub: string): Obj {
    if (sub === "status") return { ...old, status: clone(body.status ?? {}) as Json };
    const next: Obj = clone(body);
    if (r.statusSubresource) {
      if (old.status !== undefined) next.status = clone(old.status);
      else delete next.status;
    }
    return next;
  }

  function track(r: ResourceType, stored: Stored, body: Obj, sub: string, manager: string): ManagerEntry[] {
    return recordUpdate({ old: stored.obj, next: split(r, stored.obj, body, sub), manager, subresource: sub, hasStatus: r.statusSubresource, managed: stored.managed, apiVersion: apiVersionOf(r), now: now() });
  }

  function applyObject(r: ResourceType, namespace: string | undefined, name: string, config: Obj, sub: string, manager: string, force: boolean): { status: number; body: Obj } {
    checkIdentity(r, config, namespace);
    if (config.apiVersion === undefined || config.kind === undefined) throw new ApiError(400, "BadRequest", "apiVersion and kind are required in an apply configuration");
    const cm = isObject(config.metadata) ? config.metadata : {};
    if (cm.name !== name) throw new ApiError(400, "BadRequest", "the name of the object does not match the name on the URL");
    const stored = objects(idOf(r)).get(`${namespace ?? ""}/${name}`);
    if (stored && cm.resourceVersion !== undefined && cm.resourceVersion !== meta(stored.obj).resourceVersion) conflict(r, name);
    if (!stored && sub) find(r, namespace, name);
    const result = serverSideApply({
      live: stored?.obj,
      config,
      manager,
      subresource: sub,
      force,
      hasStatus: r.statusSubresource,
      managed: stored?.managed ?? [],
      apiVersion: apiVersionOf(r),
      now: now(),
    });
    if ("conflicts" in result) {
      const list = result.conflicts.map((c) => `conflict with "${c.manager}": ${c.field}`);
      throw new ApiError(409, "Conflict", `Apply failed with ${list.length} conflict${list.length > 1 ? "s" : ""}: ${list.join(", ")}`, {
        name,
        group: r.group,
        kind: r.plural,
        causes: result.conflicts.map((c) => ({ type: "FieldManagerConflict", message: `conflict with "${c.manager}"`, field: c.field })),
      });
    }
    if (!stored) {
      const obj = { ...result.object, apiVersion: config.apiVersion, kind: config.kind, metadata: { ...(result.object.metadata as Obj), name } };
      return { status: 201, body: createObject(r, namespace, obj, manager, result.managed) };
    }
    return { status: 200, body: finishUpdate(r, stored, result.object, result.managed) };
  }

  function deleteObject(r: ResourceType, namespace: string | undefined, name: string, options: Obj, policy?: string): Obj {
    const stored = find(r, namespace, name);
    const m = meta(stored.obj);
    const pre = isObject(options.preconditions) ? options.preconditions : {};
    if ((pre.uid !== undefined && pre.uid !== m.uid) || (pre.resourceVersion !== undefined && pre.resourceVersion !== m.resourceVersion)) {
      throw new ApiError(409, "Conflict", `Precondition failed for ${qualified(r)} "${name}"`);
    }
    const key = `${namespace ?? ""}/${name}`;
    if (m.finalizers?.length) {
      if (m.deletionTimestamp) return render(stored);
      const obj = clone(stored.obj);
      const om = meta(obj);
      om.deletionTimestamp = now();
      om.deletionGracePeriodSeconds = 0;
      if (r.generation) om.generation = Number(m.generation ?? 1) + 1;
      const next = { obj, managed: stored.managed };
      commit(r, key, next, stored, "MODIFIED");
      return render(next);
    }
    if (policy === "Orphan") orphanDependents(m.uid);
    commit(r, key, undefined, stored, "DELETED");
    return render(stored);
  }

  function orphanDependents(uid: string) {
    for (const [id, objs] of store) {
      const r = resources.get(id)!;
      for (const [key, s] of objs) {
        const refs = meta(s.obj).ownerReferences;
        if (!refs?.some((o) => o.uid === uid)) continue;
        const obj = clone(s.obj);
        meta(obj).ownerReferences = refs.filter((o) => o.uid !== uid);
        commit(r, key, { obj, managed: s.managed }, s, "MODIFIED");
      }
    }
  }

  function scheduleGc() {
    if (gcScheduled) return;
    gcScheduled = true;
    setImmediate(() => {
      gcScheduled = false;
      collectGarbage();
    });
  }

  /** The garbage collector: a dependent none of whose owners exists (in its namespace) is deleted. */
  function collectGarbage() {
    for (const [id, objs] of store) {
      const r = resources.get(id)!;
      for (const s of [...objs.values()]) {
        const m = meta(s.obj);
        if (!m.ownerReferences?.length || m.deletionTimestamp) continue;
        const alive = m.ownerReferences.some((o) => {
          const owner = byUid.get(o.uid);
          if (!owner) return false;
          const ownerObj = objects(owner.resource).get(owner.key);
          return ownerObj !== undefined && meta(ownerObj.obj).namespace === m.namespace;
        });
        if (!alive) {
          stats.garbageCollected++;
          deleteObject(r, m.namespace, m.name, {});
        }
      }
    }
  }

  function list(r: ResourceType, namespace: string | undefined, q: URLSearchParams): Obj {
    const labels = parseLabelSelector(q.get("labelSelector"));
    const fields = parseFieldSelector(q.get("fieldSelector"));
    const items = [...objects(idOf(r)).values()]
      .filter((s) => (!namespace || meta(s.obj).namespace === namespace) && labels((meta(s.obj).labels ?? {}) as Record<string, string>) && fields(s.obj))
      .map(render);
    return { apiVersion: apiVersionOf(r), kind: `${r.kind}List`, metadata: { resourceVersion: String(rv) }, items: items as Json[] };
  }

  function table(r: ResourceType, items: Obj[]): Obj {
    const columns = [{ name: "Name", type: "string", jsonPath: ".metadata.name" }, ...(r.printerColumns ?? [])];
    return {
      apiVersion: "meta.k8s.io/v1",
      kind: "Table",
      columnDefinitions: columns.map((c) => ({ name: c.name, type: c.type, priority: (c as { priority?: number }).priority ?? 0 })),
      rows: items.map((o) => ({ cells: columns.map((c) => (jsonPath(o, c.jsonPath) ?? null) as Json), object: { metadata: o.metadata } })) as Json[],
    };
  }

  function watch(r: ResourceType, namespace: string | undefined, q: URLSearchParams, req: IncomingMessage, res: ServerResponse) {
    if (holding) {
      held.push(() => watch(r, namespace, q, req, res));
      return;
    }
    stats.watches++;
    const from = q.get("resourceVersion") ?? "";
    const labels = parseLabelSelector(q.get("labelSelector"));
    const fields = parseFieldSelector(q.get("fieldSelector"));
    res.writeHead(200, { "content-type": "application/json", "transfer-encoding": "chunked" });
    res.flushHeaders();
    if (from && from !== "0" && Number(from) < compactedRv) {
      stats.gone++;
      const status = { kind: "Status", apiVersion: "v1", metadata: {}, status: "Failure", message: `too old resource version: ${from} (${compactedRv})`, reason: "Expired", code: 410 };
      res.end(`${JSON.stringify({ type: "ERROR", object: status })}\n`);
      return;
    }
    const w: Watcher = { resource: idOf(r), namespace, matches: (o) => labels((meta(o).labels ?? {}) as Record<string, string>) && fields(o), res };
    if (!from || from === "0") {
      for (const s of objects(idOf(r)).values()) {
        const o = render(s);
        if ((!namespace || meta(o).namespace === namespace) && w.matches(o)) res.write(`${JSON.stringify({ type: "ADDED", object: o })}\n`);
      }
    } else {
      for (const e of history) if (e.rv > Number(from)) deliver(w, e);
    }
    watchers.add(w);
    req.on("close", () => watchers.delete(w));
  }

  function route(pathname: string): { r: ResourceType; namespace?: string; name?: string; sub: string } | undefined {
    const parts = pathname.split("/").filter(Boolean);
    let group = "";
    let version: string;
    let rest: string[];
    if (parts[0] === "api" && parts.length >= 2) {
      version = parts[1]!;
      rest = parts.slice(2);
    } else if (parts[0] === "apis" && parts.length >= 3) {
      group = parts[1]!;
      version = parts[2]!;
      rest = parts.slice(3);
    } else return undefined;
    let namespace: string | undefined;
    if (rest[0] === "namespaces" && rest.length >= 3) {
      namespace = rest[1];
      rest = rest.slice(2);
    }
    const r = resources.get(`${group}/${version}/${rest[0]}`);
    if (!r || rest.length > 3) return undefined;
    if (r.namespaced !== (namespace !== undefined) && rest.length > 1) return undefined;
    return { r, namespace, name: rest[1], sub: rest[2] ?? "" };
  }

  async function readBody(req: IncomingMessage): Promise<string> {
    const chunks: Buffer[] = [];
    for await (const c of req) chunks.push(c as Buffer);
    return Buffer.concat(chunks).toString("utf8");
  }

  function send(res: ServerResponse, status: number, body: unknown) {
    const text = JSON.stringify(body);
    res.writeHead(status, { "content-type": "application/json", "content-length": Buffer.byteLength(text) });
    res.end(text);
  }

  async function handle(req: IncomingMessage, res: ServerResponse) {
    const url = new URL(req.url ?? "/", "http://emulation");
    const q = url.searchParams;
    const target = route(url.pathname);
    if (!target) throw new ApiError(404, "NotFound", "the server could not find the requested resource");
    const { r, namespace, name, sub } = target;
    if (sub && sub !== "status") throw new ApiError(404, "NotFound", `subresource ${sub} is not served by this emulation`);
    if (sub === "status" && !r.statusSubresource) throw new ApiError(404, "NotFound", `${qualified(r)} has no status subresource`);
    const manager = q.get("fieldManager") ?? "emulation-client";
    const text = req.method === "GET" ? "" : await readBody(req);
    const contentType = (req.headers["content-type"] ?? "").split(";")[0]!.trim();
    const json = (): Obj => {
      try {
        const v = contentType === "application/apply-patch+yaml" ? (parseYaml(text) as unknown) : (JSON.parse(text || "{}") as unknown);
        if (!isObject(v)) throw new Error("not an object");
        return v;
      } catch (e) {
        throw new ApiError(400, "BadRequest", `the body of the request could not be decoded: ${(e as Error).message}`);
      }
    };
    switch (req.method) {
      case "GET": {
        if (q.get("watch") === "true" || q.get("watch") === "1") return watch(r, namespace, q, req, res);
        const asTable = /as=Table/.test(String(req.headers.accept ?? ""));
        if (name) {
          const o = render(find(r, namespace, name));
          return send(res, 200, asTable ? table(r, [o]) : o);
        }
        stats.lists++;
        const l = list(r, namespace, q);
        return send(res, 200, asTable ? table(r, l.items as Obj[]) : l);
      }
      case "POST":
        if (name) throw new ApiError(405, "MethodNotAllowed", "POST is for collections");
        return send(res, 201, createObject(r, namespace, json(), manager));
      case "PUT":
        if (!name) throw new ApiError(405, "MethodNotAllowed", "PUT needs a name");
        return send(res, 200, updateObject(r, namespace, name, json(), sub, manager));
      case "PATCH": {
        if (!name) throw new ApiError(405, "MethodNotAllowed", "PATCH needs a name");
        if (contentType === "application/apply-patch+yaml") {
          if (!q.get("fieldManager")) invalid(r, name, [{ field: "fieldManager", reason: "FieldValueRequired", message: "fieldManager: Required value: is required for apply patch" }]);
          const { status, body } = applyObject(r, namespace, name, json(), sub, manager, q.get("force") === "true");
          return send(res, status, body);
        }
        if (contentType === "application/merge-patch+json") {
          const stored = find(r, namespace, name);
          const patch = json();
          const prm = isObject(patch.metadata) ? patch.metadata.resourceVersion : undefined;
          if (prm !== undefined && prm !== meta(stored.obj).resourceVersion) conflict(r, name);
          const patched = mergePatch(stored.obj, patch) as Obj;
          return send(res, 200, finishUpdate(r, stored, split(r, stored.obj, patched, sub), track(r, stored, patched, sub, manager)));
        }
        throw new ApiError(415, "UnsupportedMediaType", `the emulation does not support patch type ${contentType}`);
      }
      case "DELETE": {
        if (!name) throw new ApiError(405, "MethodNotAllowed", "collection delete is not emulated");
        const options = text ? json() : {};
        return send(res, 200, deleteObject(r, namespace, name, options, q.get("propagationPolicy") ?? (options.propagationPolicy as string | undefined)));
      }
      default:
        throw new ApiError(405, "MethodNotAllowed", `${req.method} is not allowed`);
    }
  }

  const sockets = new Set<Socket>();
  const server: Server = createServer((req, res) => {
    handle(req, res).catch((e: unknown) => {
      if (res.headersSent) return void res.end();
      if (e instanceof ApiError) {
        return send(res, e.code, { kind: "Status", apiVersion: "v1", metadata: {}, status: "Failure", message: e.message, reason: e.reason, details: e.details, code: e.code });
      }
      send(res, 500, { kind: "Status", apiVersion: "v1", metadata: {}, status: "Failure", message: (e as Error).message, reason: "InternalError", code: 500 });
    });
  });
  server.on("connection", (s) => {
    sockets.add(s);
    s.on("close", () => sockets.delete(s));
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const address = server.address();
  const url = `http://127.0.0.1:${typeof address === "object" && address ? address.port : 0}`;

  return {
    url,
    kubeConfig() {
      const kc = new KubeConfig();
      kc.loadFromOptions({
        clusters: [{ name: "emulation", server: url, skipTLSVerify: true }],
        users: [{ name: "tester", token: "emulation-token" }],
        contexts: [{ name: "emulation", cluster: "emulation", user: "tester", namespace: "default" }],
        currentContext: "emulation",
      });
      return kc;
    },
    installCrd(crd) {
      const spec = (crd as Obj).spec as Obj & { group: string; scope: string; names: { plural: string; kind: string }; versions: Obj[] };
      const version = spec.versions.find((v) => v.storage === true) ?? spec.versions[0]!;
      const schema = (version.schema as unknown as { openAPIV3Schema: Schema }).openAPIV3Schema;
      assertStructural(schema);
      const r: ResourceType = {
        group: spec.group,
        version: String(version.name),
        plural: spec.names.plural,
        kind: spec.names.kind,
        namespaced: spec.scope === "Namespaced",
        statusSubresource: isObject(version.subresources) && version.subresources.status !== undefined,
        generation: true,
        schema,
        printerColumns: version.additionalPrinterColumns as ResourceType["printerColumns"],
      };
      resources.set(idOf(r), r);
    },
    peek(apiVersion, plural, namespace, name) {
      const [group, version] = apiVersion.includes("/") ? apiVersion.split("/") : ["", apiVersion];
      const s = store.get(`${group}/${version}/${plural}`)?.get(`${namespace}/${name}`);
      return s ? render(s) : undefined;
    },
    history: () => history.map((e) => ({ rv: e.rv, type: e.type, kind: String(e.object.kind), namespace: meta(e.object).namespace, name: meta(e.object).name, object: e.object })),
    compact() {
      compactedRv = rv;
      history = [];
    },
    disconnectWatches() {
      const n = watchers.size;
      for (const w of watchers) w.res.end();
      watchers.clear();
      return n;
    },
    holdWatches() {
      holding = true;
    },
    releaseWatches() {
      holding = false;
      const pending = held;
      held = [];
      pending.forEach((p) => p());
    },
    stats: () => ({ ...stats }),
    async close() {
      for (const w of watchers) w.res.end();
      watchers.clear();
      for (const s of sockets) s.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

export { BUILTIN_KINDS };
