// What the dashboards and alerts ask Prometheus for, and what a service's /metrics offers: enough
// of PromQL to find every metric selector (name, label matchers) and every grouping label in an
// expression, and a parser of the Prometheus text exposition.

export interface Matcher {
  label: string;
  op: "=" | "!=" | "=~" | "!~";
  value: string;
}

export interface Selector {
  /** The sample name as queried (histograms: ..._bucket, ..._sum, ..._count). */
  name: string;
  matchers: Matcher[];
}

export interface Query {
  /** Where it comes from, for messages: "overview.json: Verify rate". */
  origin: string;
  expr: string;
}

/** Metric selectors of x402-fleet series (x402_*) in a PromQL expression or a Grafana label_values() query. */
export function selectors(expr: string): Selector[] {
  const out: Selector[] = [];
  for (const m of expr.matchAll(/\b(x402_[a-z0-9_]+)\s*(\{[^}]*\})?/g)) {
    const matchers = [...(m[2] ?? "").matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"/g)].map((x) => ({ label: x[1]!, op: x[2] as Matcher["op"], value: x[3]! }));
    out.push({ name: m[1]!, matchers });
  }
  return out;
}

/** Labels an expression groups or keeps by: `by (…)`, `without (…)`, and label_values(…, label). */
export function groupingLabels(expr: string): string[] {
  const labels = new Set<string>();
  for (const m of expr.matchAll(/\b(?:by|without)\s*\(([^)]*)\)/g)) for (const l of m[1]!.split(",")) if (l.trim()) labels.add(l.trim());
  for (const m of expr.matchAll(/label_values\([^,]*,\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\)/g)) labels.add(m[1]!);
  return [...labels];
}

export type Exposition = Map<string, Record<string, string>[]>;

/** Samples of a text exposition by sample name (`x402_settle_duration_seconds_bucket`, ...). */
export function parseExposition(text: string): Exposition {
  const out: Exposition = new Map();
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+\S+/.exec(line);
    if (!m) continue;
    const labels: Record<string, string> = {};
    for (const l of (m[2] ?? "").matchAll(/([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"/g)) labels[l[1]!] = l[2]!;
    if (!out.has(m[1]!)) out.set(m[1]!, []);
    out.get(m[1]!)!.push(labels);
  }
  return out;
}

/** Grafana template variables and built-ins: their values are not known before a user picks them. */
const isTemplated = (value: string) => value.includes("$");

/**
 * Problems with one query against the expositions of running services (by `service` label
 * value): every selected series must exist, carry the labels the query matches and groups on,
 * and equality matchers must name values those services really produced.
 */
export function checkQuery(q: Query, services: Record<string, Exposition>): string[] {
  const problems: string[] = [];
  const grouping = groupingLabels(q.expr);
  for (const s of selectors(q.expr)) {
    const service = s.matchers.find((m) => m.label === "service" && m.op === "=")?.value;
    const sources = service ? (services[service] ? [services[service]!] : []) : Object.values(services);
    if (service && !services[service]) {
      problems.push(`${q.origin}: ${s.name} selects service="${service}", which is not a running service here`);
      continue;
    }
    const samples = sources.flatMap((e) => e.get(s.name) ?? []);
    if (samples.length === 0) {
      problems.push(`${q.origin}: ${s.name} is not on the /metrics of ${service ?? Object.keys(services).join(", ")}`);
      continue;
    }
    for (const label of [...s.matchers.map((m) => m.label), ...grouping.filter((l) => l !== "le" || s.name.endsWith("_bucket"))]) {
      if (!samples.some((x) => label in x)) problems.push(`${q.origin}: ${s.name} has no label "${label}"`);
    }
    for (const m of s.matchers.filter((x) => x.op === "=" && !isTemplated(x.value))) {
      if (!samples.some((x) => x[m.label] === m.value)) problems.push(`${q.origin}: no ${s.name} series with ${m.label}="${m.value}"`);
    }
  }
  return problems;
}
