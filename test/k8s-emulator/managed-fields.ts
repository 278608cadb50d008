// EMULATION of server-side apply's field ownership. Each manager owns a set of leaf paths per
// subresource. An apply sets the fields of its configuration, takes their ownership, conflicts
// (409) with other managers that own a field it would change (unless forced, which moves
// ownership), and removes fields it applied before and no longer applies when nobody else
// owns them. An update (PUT, merge patch) makes its manager the owner of the leaves it changed.
// Simplification, stated plainly: every list is atomic (the API server merges associative
// lists such as containers and env by key; here a list is one value owned as a whole).

export type Json = null | boolean | number | string | Json[] | { [k: string]: Json };
export type Obj = Record<string, Json>;

export interface ManagerEntry {
  manager: string;
  operation: "Apply" | "Update";
  subresource: string;
  apiVersion: string;
  time: string;
  fields: Set<string>;
}

export interface Conflict {
  manager: string;
  field: string;
}

const isObject = (v: unknown): v is Obj => typeof v === "object" && v !== null && !Array.isArray(v);
const isEmptyObject = (v: unknown) => isObject(v) && Object.keys(v).length === 0;
const key = (path: string[]) => JSON.stringify(path);
const unkey = (k: string) => JSON.parse(k) as string[];

const IDENTITY_META = new Set(["name", "namespace", "uid", "resourceVersion", "generation", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds", "managedFields", "generateName", "selfLink"]);

/** The part of an object whose fields can be owned, for one subresource. */
export function ownable(obj: Obj, subresource: string, hasStatus: boolean): Obj {
  const out: Obj = {};
  for (const [k, v] of Object.entries(obj)) {
    if (k === "apiVersion" || k === "kind") continue;
    if (subresource === "status") {
      if (k === "status") out[k] = v;
      continue;
    }
    if (k === "status" && hasStatus) continue;
    if (k === "metadata" && isObject(v)) {
      const meta: Obj = {};
      for (const [mk, mv] of Object.entries(v)) if (!IDENTITY_META.has(mk)) meta[mk] = mv;
      if (Object.keys(meta).length) out.metadata = meta;
      continue;
    }
    out[k] = v;
  }
  return out;
}

export function leafPaths(v: Json, prefix: string[] = []): string[][] {
  if (isObject(v) && Object.keys(v).length > 0) {
    return Object.entries(v).flatMap(([k, x]) => (x === undefined ? [] : leafPaths(x, [...prefix, k])));
  }
  return prefix.length ? [prefix] : [];
}

export function getAt(obj: Json, path: string[]): Json | undefined {
  let cur: Json | undefined = obj;
  for (const p of path) {
    if (!isObject(cur)) return undefined;
    cur = cur[p];
  }
  return cur;
}

function setAt(obj: Obj, path: string[], value: Json): void {
  let cur: Obj = obj;
  for (const p of path.slice(0, -1)) {
    if (!isObject(cur[p])) cur[p] = {};
    cur = cur[p] as Obj;
  }
  cur[path[path.length - 1]!] = JSON.parse(JSON.stringify(value)) as Json;
}

function deleteAt(obj: Obj, path: string[]): void {
  const parents: Obj[] = [obj];
  let cur: Obj = obj;
  for (const p of path.slice(0, -1)) {
    if (!isObject(cur[p])) return;
    cur = cur[p] as Obj;
    parents.push(cur);
  }
  delete cur[path[path.length - 1]!];
  // drop parents left empty by the removal (never the top-level sections)
  for (let i = parents.length - 1; i >= 2; i--) {
    if (Object.keys(parents[i]!).length === 0) delete parents[i - 1]![path[i - 1]!];
    else break;
  }
}

const same = (a: Json | undefined, b: Json | undefined) => JSON.stringify(a) === JSON.stringify(b);
const related = (a: string[], b: string[]) => {
  const n = Math.min(a.length, b.length);
  for (let i = 0; i < n; i++) if (a[i] !== b[i]) return false;
  return true;
};

export interface ApplyInput {
  live: Obj | undefined;
  config: Obj;
  manager: string;
  subresource: string;
  force: boolean;
  hasStatus: boolean;
  managed: ManagerEntry[];
  apiVersion: string;
  now: string;
}

export function serverSideApply(input: ApplyInput): { object: Obj; managed: ManagerEntry[] } | { conflicts: Conflict[] } {
  const { live, config, manager, subresource, force, hasStatus } = input;
  const object: Obj = live ? (JSON.parse(JSON.stringify(live)) as Obj) : {};
  const applied = leafPaths(ownable(config, subresource, hasStatus));
  const managed = input.managed.map((m) => ({ ...m, fields: new Set(m.fields) }));

  const conflicts: Conflict[] = [];
  for (const path of applied) {
    const container = isEmptyObject(getAt(config, path));
    for (const m of managed) {
      if (m.manager === manager) continue; // a manager never conflicts with itself
      for (const f of [...m.fields]) {
        const owned = unkey(f);
        if (!related(owned, path)) continue;
        if (container && owned.length > path.length) continue; // `{}` owns the map, not the entries others set
        if (same(getAt(object, path), getAt(config, path))) continue; // same value: shared ownership
        if (force) m.fields.delete(f);
        else conflicts.push({ manager: m.manager, field: `.${owned.join(".")}` });
      }
    }
  }
  if (conflicts.length) return { conflicts };

  let mine = managed.find((m) => m.manager === manager && m.subresource === subresource && m.operation === "Apply");
  const previously = mine ? [...mine.fields].map(unkey) : [];
  const next = new Set(applied.map(key));
  for (const path of previously) {
    if (next.has(key(path))) continue;
    const ownedElsewhere = managed.some((m) => m !== mine && [...m.fields].some((f) => related(unkey(f), path)));
    if (!ownedElsewhere) deleteAt(object, path);
  }
  for (const path of applied) {
    const value = getAt(config, path)!;
    if (isEmptyObject(value) && isObject(getAt(object, path))) continue; // merging an empty map changes nothing
    setAt(object, path, value);
  }
  if (!mine) {
    mine = { manager, operation: "Apply", subresource, apiVersion: input.apiVersion, time: input.now, fields: next };
    managed.push(mine);
  } else {
    mine.fields = next;
    mine.time = input.now;
  }
  return { object, managed: managed.filter((m) => m.fields.size > 0) };
}

/** Ownership after an update (PUT or non-apply patch) by `manager`. */
export function recordUpdate(input: { old: Obj; next: Obj; manager: string; subresource: string; hasStatus: boolean; managed: ManagerEntry[]; apiVersion: string; now: string }): ManagerEntry[] {
  const before = ownable(input.old, input.subresource, input.hasStatus);
  const after = ownable(input.next, input.subresource, input.hasStatus);
  const changed = leafPaths(after).filter((p) => !same(getAt(before, p), getAt(after, p)));
  const removed = leafPaths(before).filter((p) => getAt(after, p) === undefined);
  if (!changed.length && !removed.length) return input.managed;
  const managed = input.managed.map((m) => ({ ...m, fields: new Set(m.fields) }));
  for (const m of managed) {
    for (const f of [...m.fields]) {
      const owned = unkey(f);
      if ([...changed, ...removed].some((p) => related(owned, p))) m.fields.delete(f);
    }
  }
  if (changed.length) {
    let mine = managed.find((m) => m.manager === input.manager && m.subresource === input.subresource && m.operation === "Update");
    if (!mine) {
      mine = { manager: input.manager, operation: "Update", subresource: input.subresource, apiVersion: input.apiVersion, time: input.now, fields: new Set() };
      managed.push(mine);
    }
    for (const p of changed) mine.fields.add(key(p));
    mine.time = input.now;
  }
  return managed.filter((m) => m.fields.size > 0);
}

/** metadata.managedFields as the API server shows it (FieldsV1: `f:` keys; lists appear whole). */
export function renderManagedFields(managed: ManagerEntry[]) {
  return managed.map((m) => {
    const tree: Obj = {};
    for (const f of m.fields) {
      let cur = tree;
      for (const p of unkey(f)) {
        const k = `f:${p}`;
        if (!isObject(cur[k])) cur[k] = {};
        cur = cur[k] as Obj;
      }
    }
    return {
      manager: m.manager,
      operation: m.operation,
      apiVersion: m.apiVersion,
      time: m.time,
      fieldsType: "FieldsV1",
      fieldsV1: tree,
      ...(m.subresource ? { subresource: m.subresource } : {}),
    };
  });
}
