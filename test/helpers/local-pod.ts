// The kubelet's part for a pod kwok only pretends to run: the first container of a pod template
// run as a local `x402-fleet` process, with the environment resolved exactly as the kubelet would
// (values, secretKeyRef, $(VAR) expansion, `$$` escapes), each volume a temporary directory in
// place of its mount (Secret items written there), and HOST, PORT and ADMIN_PORT moved to free
// loopback ports (there is no pod network here).
import { spawn, type ChildProcess } from "node:child_process";
import { mkdtemp, mkdir, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { CoreV1Api, type KubeConfig, type V1Deployment } from "@kubernetes/client-node";
import { freePort, stopChild } from "../../services/devnet/anvil.ts";

/** Kubernetes' env var expansion: $(NAME) of an earlier variable, `$$` for a literal `$`. */
export function expandEnv(value: string, defined: Record<string, string>): string {
  return value.replace(/\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)/g, (m, name: string | undefined) => (m === "$$" ? "$" : name !== undefined && name in defined ? defined[name]! : m));
}

export interface RunningPod {
  url: string;
  env: Record<string, string>;
  process: ChildProcess;
  stop(): Promise<void>;
}

/**
 * Runs the first container of a Deployment's pod template as a local `x402-fleet` process.
 * HOST and PORT are overridden (there is no pod network here); everything else is the template's.
 */
export async function runPodLocally(kc: KubeConfig, deployment: V1Deployment, opts: { binary: string; logTo?: (line: string) => void }): Promise<RunningPod> {
  const core = kc.makeApiClient(CoreV1Api);
  const namespace = deployment.metadata!.namespace!;
  const pod = deployment.spec!.template.spec!;
  const container = pod.containers[0]!;
  const dir = await mkdtemp(join(tmpdir(), "x402-pod-"));
  const secretValue = async (name: string, key: string) => {
    const s = await core.readNamespacedSecret({ namespace, name });
    const v = s.data?.[key];
    if (v === undefined) throw new Error(`Secret ${name} has no key ${key}`);
    return Buffer.from(v, "base64").toString("utf8");
  };

  // volumes: each mount becomes a directory under `dir`
  const mounts = new Map<string, string>();
  for (const m of container.volumeMounts ?? []) {
    const local = join(dir, m.name);
    await mkdir(local, { recursive: true });
    mounts.set(m.mountPath, local);
    const volume = pod.volumes?.find((v) => v.name === m.name);
    if (volume?.secret) {
      for (const item of volume.secret.items ?? []) await writeFile(join(local, item.path), await secretValue(volume.secret.secretName!, item.key), { mode: 0o400 });
    }
  }
  const remap = (v: string) => {
    for (const [mountPath, local] of mounts) if (v === mountPath || v.startsWith(`${mountPath}/`)) return local + v.slice(mountPath.length);
    return v;
  };

  const env: Record<string, string> = {};
  for (const e of container.env ?? []) {
    if (e.valueFrom?.secretKeyRef) env[e.name] = await secretValue(e.valueFrom.secretKeyRef.name!, e.valueFrom.secretKeyRef.key);
    else env[e.name] = remap(expandEnv(e.value ?? "", env));
  }
  const [port, adminPort] = [await freePort(), await freePort()];
  env.HOST = "127.0.0.1";
  env.PORT = String(port);
  if (env.ADMIN_PORT !== undefined) env.ADMIN_PORT = String(adminPort);
  const child = spawn(process.execPath, [opts.binary, ...(container.args ?? [])], {
    // TMPDIR stays the host's: tsx keeps its compile cache there (a pod has /tmp as an emptyDir)
    env: { PATH: process.env.PATH ?? "", HOME: process.env.HOME ?? dir, ...(process.env.TMPDIR ? { TMPDIR: process.env.TMPDIR } : {}), LOG_LEVEL: "warn", ...env },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let output = "";
  const collect = (d: Buffer) => {
    output = (output + d.toString()).slice(-4000);
    opts.logTo?.(d.toString());
  };
  child.stdout?.on("data", collect);
  child.stderr?.on("data", collect);
  const url = `http://127.0.0.1:${port}/v2`;
  const deadline = Date.now() + 120_000; // the facilitator's first start creates its embedded store: seconds, more on a busy machine
  for (;;) {
    if (child.exitCode !== null) throw new Error(`the pod's process exited with ${child.exitCode}: ${output}`);
    try {
      const res = await fetch(`${url}/supported`);
      if (res.ok) break;
    } catch {
      // not listening yet
    }
    if (Date.now() > deadline) {
      child.kill("SIGKILL");
      throw new Error(`the pod's process did not listen within 120 s: ${output}`);
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  return {
    url,
    env,
    process: child,
    stop: async () => {
      await stopChild(child);
      await rm(dir, { recursive: true, force: true });
    },
  };
}
