// Stand-ins for the cluster parts the emulation does not have, played explicitly by tests:
//  - the Deployment controller (it would create ReplicaSets and pods and report their counts in
//    the Deployment's status): here it writes that status through /status, and can be paused
//    or told that pods do not become available;
//  - the kubelet (it would pull the image and run the container with its env and mounted
//    Secrets): here it runs the container's `x402-fleet` arguments as a local process with the
//    environment resolved exactly as the kubelet would (values, secretKeyRef, $(VAR) expansion,
//    `$$` escapes), each volume a temporary directory in place of its mount (Secret items written
//    there), and HOST, PORT and ADMIN_PORT moved to free loopback ports (no pod network here).
import { spawn, type ChildProcess } from "node:child_process";
import { mkdtemp, mkdir, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { AppsV1Api, CoreV1Api, type KubeConfig, type V1Deployment } from "@kubernetes/client-node";
import { freePort, stopChild } from "../../services/devnet/anvil.ts";

export interface DeploymentControllerStandIn {
  /** Stop reporting progress (rollouts stay in progress). */
  pause(): void;
  resume(): void;
  /** Pods of this Deployment never become available (e.g. crash-looping). */
  setUnavailable(namespace: string, name: string, unavailable: boolean): void;
  stop(): Promise<void>;
}

export function startDeploymentControllerStandIn(kc: KubeConfig, intervalMs = 25): DeploymentControllerStandIn {
  const apps = kc.makeApiClient(AppsV1Api);
  let paused = false;
  let stopped = false;
  const unavailable = new Set<string>();
  let running: Promise<void> = Promise.resolve();

  async function pass() {
    const list = await apps.listDeploymentForAllNamespaces();
    for (const d of list.items) {
      const key = `${d.metadata!.namespace}/${d.metadata!.name}`;
      try {
        await reportDeploymentStatus(apps, d, unavailable.has(key) ? 0 : (d.spec?.replicas ?? 1));
      } catch {
        // 409 (changed meanwhile) or gone: the next pass sees the new state
      }
    }
  }

  let busy = false;
  const timer = setInterval(() => {
    if (paused || stopped || busy) return;
    busy = true;
    running = pass()
      .catch(() => undefined)
      .finally(() => (busy = false));
  }, intervalMs);

  return {
    pause: () => (paused = true),
    resume: () => (paused = false),
    setUnavailable: (namespace, name, flag) => (flag ? unavailable.add(`${namespace}/${name}`) : unavailable.delete(`${namespace}/${name}`)),
    async stop() {
      stopped = true;
      clearInterval(timer);
      await running;
    },
  };
}

/**
 * Writes what the Deployment controller would report once `available` pods of the current
 * template run (through the /status subresource, with the resourceVersion read). No-op when current.
 */
export async function reportDeploymentStatus(apps: AppsV1Api, d: V1Deployment, available: number): Promise<void> {
  const desired = d.spec?.replicas ?? 1;
  const status = {
    observedGeneration: d.metadata!.generation,
    replicas: desired,
    updatedReplicas: desired,
    readyReplicas: available,
    availableReplicas: available,
    unavailableReplicas: desired - available || undefined,
    conditions: [
      { type: "Available", status: available >= desired ? "True" : "False", reason: available >= desired ? "MinimumReplicasAvailable" : "MinimumReplicasUnavailable" },
      { type: "Progressing", status: "True", reason: "NewReplicaSetAvailable" },
    ],
  };
  const s = d.status;
  const current =
    s?.observedGeneration === status.observedGeneration &&
    s?.replicas === status.replicas &&
    s?.availableReplicas === status.availableReplicas &&
    s?.readyReplicas === status.readyReplicas &&
    s?.updatedReplicas === status.updatedReplicas;
  if (current) return;
  await apps.replaceNamespacedDeploymentStatus({ namespace: d.metadata!.namespace!, name: d.metadata!.name!, body: { ...d, status } as V1Deployment });
}

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
