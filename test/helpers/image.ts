// The project's container image, built here by scripts/build-image.sh (no registry), and its
// containers run as the chart runs its pods: podman with host networking (no pod network here),
// a read-only root filesystem, a tmpfs /tmp (the chart's emptyDir), uid/gid 65532, no capabilities,
// no privilege escalation, Secrets mounted read-only.
import { spawn, spawnSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

const ROOT = fileURLToPath(new URL("../../", import.meta.url));
const BUILD_SCRIPT = join(ROOT, "scripts", "build-image.sh");
const HOW_TO_ENABLE = "build it with scripts/build-image.sh (as root: debootstrap, buildah and podman from Debian's packages, ~10 min cold)";

/** The image built from the current sources (its cache directory, tag and OCI archive), or why there is none. */
export function imageBuild(): { dir: string; image: string; archive: string } | { missing: string } {
  const r = spawnSync("bash", [BUILD_SCRIPT, "--print-dir"], { encoding: "utf8", env: process.env });
  if (r.status !== 0) return { missing: r.stderr.trim().split("\n").pop() || `${BUILD_SCRIPT} failed` };
  const dir = r.stdout.trim().split("\n").pop()!;
  if (!existsSync(join(dir, ".complete"))) return { missing: `${dir} is not built (none for these sources)` };
  if (spawnSync("podman", ["--version"]).status !== 0) return { missing: "podman is not installed" };
  const image = /^image=(.+)$/m.exec(readFileSync(join(dir, "BUILD"), "utf8"))?.[1];
  const archive = readdirSync(dir).find((f) => f.endsWith(".oci.tar"));
  if (!image) return { missing: `${dir}/BUILD names no image` };
  return archive ? { dir, image, archive: join(dir, archive) } : { missing: `${dir} holds no OCI archive` };
}

/**
 * Whether an image suite runs. With CI=true a missing image fails the run (the returned `fail`
 * message is thrown by the suite); otherwise the suite is skipped with one line.
 */
export function imageAvailability(suite: string): { run: boolean; fail?: string } {
  const found = imageBuild();
  if ("image" in found) return { run: true };
  const why = `${suite}: no x402-fleet image (${found.missing}); ${HOW_TO_ENABLE}`;
  if (process.env.CI === "true") return { run: false, fail: why };
  console.warn(`skipped ${why}`);
  return { run: false };
}

/** Puts the built image back into the builder's storage if it was lost (a stat otherwise). */
export function loadImage(): string {
  const found = imageBuild();
  if (!("image" in found)) throw new Error(found.missing);
  const r = spawnSync("bash", [BUILD_SCRIPT], { encoding: "utf8", env: process.env });
  if (r.status !== 0) throw new Error(`${BUILD_SCRIPT}: ${r.stderr.trim().split("\n").slice(-5).join("\n")}`);
  return found.image;
}

export interface ContainerOptions {
  image: string;
  /** The entrypoint's arguments: the subcommand and its flags, as the chart's `args`. */
  args: string[];
  env?: Record<string, string>;
  /** host path -> container path, mounted read-only (a Secret or ConfigMap volume). */
  files?: Record<string, string>;
}

export interface Container {
  name: string;
  /** Runs a command in the container as its user; status and output. */
  exec(command: string[]): { status: number | null; output: string };
  /** Its output so far (stdout and stderr). */
  logs(): string;
  /** Whether its process still runs. */
  running(): boolean;
  remove(): Promise<void>;
}

const started = new Set<string>();
// A test worker that dies must not leave containers behind.
process.once("exit", () => {
  if (started.size) spawnSync("podman", ["rm", "--force", "--time", "0", ...started], { stdio: "ignore" });
});

const podman = (args: string[]) => spawnSync("podman", args, { encoding: "utf8" });
// The OCI runtime and resource limits this machine needs (runc on a hybrid cgroup host, limits no higher than ours).
let runtimeFlags: string[] | undefined;
const runFlags = () => (runtimeFlags ??= spawnSync("bash", [BUILD_SCRIPT, "--print-run-flags"], { encoding: "utf8" }).stdout.trim().split(/\s+/).filter(Boolean));

/** Starts a container the way the chart's pod security settings run it. */
export function runContainer(o: ContainerOptions): Container {
  const name = `x402-test-${o.args[0]}-${randomBytes(4).toString("hex")}`;
  const args = [
    "run", "--detach", "--name", name,
    "--network", "host",
    "--read-only", "--read-only-tmpfs=false", "--tmpfs", "/tmp:rw,nosuid,nodev,mode=1777,size=256m",
    "--user", "65532:65532", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
    "--pull", "never",
    ...runFlags(),
  ];
  for (const [k, v] of Object.entries(o.env ?? {})) args.push("--env", `${k}=${v}`);
  for (const [host, path] of Object.entries(o.files ?? {})) args.push("--volume", `${host}:${path}:ro`);
  const r = podman([...args, o.image, ...o.args]);
  if (r.status !== 0) throw new Error(`podman run ${o.args[0]} failed: ${r.stderr.trim()}`);
  started.add(name);
  return {
    name,
    exec: (command) => {
      const e = podman(["exec", name, ...command]);
      return { status: e.status, output: `${e.stdout}${e.stderr}` };
    },
    logs: () => {
      const l = podman(["logs", name]);
      return `${l.stdout}${l.stderr}`;
    },
    running: () => podman(["inspect", "--format", "{{.State.Running}}", name]).stdout.trim() === "true",
    remove: () =>
      new Promise<void>((resolve) => {
        started.delete(name);
        // SIGTERM first (the services drain), then gone
        spawn("podman", ["rm", "--force", "--time", "10", name], { stdio: "ignore" }).once("exit", () => resolve());
      }),
  };
}
