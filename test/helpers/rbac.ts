// The operator's RBAC against what the operator really does: a recording HTTP proxy between the
// operator (client-node) and the API emulation (test/k8s-emulator) logs every request; each is
// turned into the authorization attributes the kube-apiserver checks (verb, API group, resource
// and subresource, namespace, name) and matched against the chart's rendered Roles/ClusterRoles,
// with RBAC's semantics (resourceNames never match create or collection requests).
import { createServer, request as httpRequest, type IncomingMessage, type Server } from "node:http";
import type { Socket } from "node:net";

export interface RecordedRequest {
  method: string;
  path: string;
  query: URLSearchParams;
  contentType: string;
  status: number;
}

export interface RecordingProxy {
  url: string;
  requests: RecordedRequest[];
  /** The next request matching `when` is answered 500 by the proxy (fault injection). */
  failOnce(when: (method: string, path: string) => boolean): void;
  close(): Promise<void>;
}

export async function startRecordingProxy(upstream: string): Promise<RecordingProxy> {
  const target = new URL(upstream);
  const requests: RecordedRequest[] = [];
  const faults: ((method: string, path: string) => boolean)[] = [];
  const sockets = new Set<Socket>();
  const server: Server = createServer((req, res) => {
    const url = new URL(req.url ?? "/", "http://proxy");
    const entry: RecordedRequest = { method: req.method ?? "GET", path: url.pathname, query: url.searchParams, contentType: String(req.headers["content-type"] ?? ""), status: 0 };
    requests.push(entry);
    const fault = faults.findIndex((f) => f(entry.method, entry.path));
    if (fault >= 0) {
      faults.splice(fault, 1);
      entry.status = 500;
      req.resume();
      res.writeHead(500, { "content-type": "application/json" });
      res.end(JSON.stringify({ kind: "Status", apiVersion: "v1", metadata: {}, status: "Failure", message: "injected by the test's proxy", reason: "InternalError", code: 500 }));
      return;
    }
    const upstreamReq = httpRequest(
      { host: target.hostname, port: target.port, method: req.method, path: req.url, headers: { ...req.headers, host: target.host } },
      (upstreamRes: IncomingMessage) => {
        entry.status = upstreamRes.statusCode ?? 0;
        res.writeHead(upstreamRes.statusCode ?? 502, upstreamRes.headers);
        res.flushHeaders(); // a watch answers headers first and events later
        upstreamRes.pipe(res);
      },
    );
    upstreamReq.on("error", () => {
      if (!res.headersSent) res.writeHead(502);
      res.end();
    });
    req.pipe(upstreamReq);
  });
  server.on("connection", (s) => {
    sockets.add(s);
    s.on("close", () => sockets.delete(s));
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const address = server.address();
  return {
    url: `http://127.0.0.1:${typeof address === "object" && address ? address.port : 0}`,
    requests,
    failOnce: (when) => void faults.push(when),
    close: async () => {
      for (const s of sockets) s.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

export interface Attributes {
  verb: string;
  group: string;
  /** "deployments", or "facilitatornetworks/status" for a subresource. */
  resource: string;
  namespace?: string;
  name?: string;
}

/** The authorization attributes of one request; null for a non-resource URL. */
export function attributesOf(r: RecordedRequest): Attributes[] | null {
  const parts = r.path.split("/").filter(Boolean);
  let group: string;
  let rest: string[];
  if (parts[0] === "api" && parts[1] === "v1") {
    group = "";
    rest = parts.slice(2);
  } else if (parts[0] === "apis" && parts.length >= 4) {
    group = parts[1]!;
    rest = parts.slice(3);
  } else {
    return null;
  }
  let namespace: string | undefined;
  if (rest[0] === "namespaces" && rest.length >= 3) {
    namespace = rest[1];
    rest = rest.slice(2);
  }
  const [plural, name, subresource] = rest;
  if (!plural) return null;
  const resource = subresource ? `${plural}/${subresource}` : plural;
  const watch = r.query.get("watch") === "true" || r.query.get("watch") === "1";
  const verb =
    r.method === "GET" ? (name ? "get" : watch ? "watch" : "list") : r.method === "POST" ? "create" : r.method === "PUT" ? "update" : r.method === "PATCH" ? "patch" : r.method === "DELETE" ? (name ? "delete" : "deletecollection") : r.method.toLowerCase();
  const attrs: Attributes[] = [{ verb, group, resource, namespace, name }];
  // A server-side apply that creates the object is authorized as create as well (api-concepts, "Patch and apply").
  if (verb === "patch" && r.contentType.includes("apply-patch") && r.status === 201) attrs.push({ verb: "create", group, resource, namespace });
  return attrs;
}

export interface PolicyRule {
  apiGroups: string[];
  resources: string[];
  verbs: string[];
  resourceNames?: string[];
}

/** Rules that apply everywhere (ClusterRole via ClusterRoleBinding) or in one namespace (Role via RoleBinding). */
export interface Grants {
  cluster: PolicyRule[];
  namespaced: { namespace: string; rules: PolicyRule[] }[];
}

export interface Match {
  rule: PolicyRule;
  verb: string;
  /** "cluster" or the Role's namespace. */
  scope: string;
}

/** The rule (and verb) that allows a request, or undefined when RBAC would refuse it (403). */
export function authorize(a: Attributes, grants: Grants): Match | undefined {
  const matches = (rule: PolicyRule) =>
    (rule.apiGroups.includes(a.group) || rule.apiGroups.includes("*")) &&
    (rule.resources.includes(a.resource) || rule.resources.includes("*")) &&
    (rule.verbs.includes(a.verb) || rule.verbs.includes("*")) &&
    (!rule.resourceNames?.length || (a.name !== undefined && rule.resourceNames.includes(a.name)));
  for (const rule of grants.cluster) if (matches(rule)) return { rule, verb: a.verb, scope: "cluster" };
  if (a.namespace === undefined) return undefined;
  for (const n of grants.namespaced) if (n.namespace === a.namespace) for (const rule of n.rules) if (matches(rule)) return { rule, verb: a.verb, scope: n.namespace };
  return undefined;
}

/** Every (rule, verb) of the grants, as "scope group/resource:verb[names]" strings. */
export function grantKeys(grants: Grants): string[] {
  const keys = (scope: string, rules: PolicyRule[]) =>
    rules.flatMap((r) => r.apiGroups.flatMap((g) => r.resources.flatMap((res) => r.verbs.map((v) => keyOf(scope, g, res, v, r.resourceNames)))));
  return [...keys("cluster", grants.cluster), ...grants.namespaced.flatMap((n) => keys(n.namespace, n.rules))];
}

export function keyOf(scope: string, group: string, resource: string, verb: string, names?: string[]): string {
  return `${scope} ${group || "core"}/${resource}:${verb}${names?.length ? `[${names.join(",")}]` : ""}`;
}

export function matchKey(m: Match, a: Attributes): string {
  return keyOf(m.scope, a.group, a.resource, m.verb, m.rule.resourceNames);
}
