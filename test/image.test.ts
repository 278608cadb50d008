// The container image built here from the Dockerfile, unchanged (scripts/build-image.sh: base
// images from Debian's packages and the official Node.js binary, `--pull=never`), run as the chart
// runs its pods: read-only root filesystem, a tmpfs /tmp, uid 65532, no capabilities. router,
// facilitator (against an anvil on the host), hub, wallets and operator (against a real
// kube-apiserver when one is built, else refusing cleanly) start from it and reach readiness on
// their admin ports; the facilitator answers /v2/supported with its signer, and the router serves
// it through its routing table. With CI=true the pretest step builds the image and a missing one
// fails; elsewhere the suite is skipped with one line.
import { chmodSync, chownSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { generatePrivateKey, privateKeyToAccount } from "viem/accounts";
import { freePort, startAnvil, type AnvilNode } from "../services/devnet/anvil.ts";
import { controlPlaneBinaries, startControlPlane, type ControlPlane } from "./helpers/control-plane.ts";
import { imageAvailability, loadImage, runContainer, type Container } from "./helpers/image.ts";
import { until } from "./helpers/wait.ts";
import { masterKeyLine } from "./helpers/wallets.ts";

const SUITE = "the image";
const UID = 65532;
const NETWORK = "eip155:8453";
// Readiness on a loaded machine took 29 s (facilitator, new embedded store) and 45 s (wallets);
// the chart's startup probes allow 180 s, and so does this.
const READY_MS = 180_000;

const availability = imageAvailability(SUITE);
if (availability.fail) {
  const why = availability.fail;
  describe(SUITE, () => {
    it("has the x402-fleet image (CI=true)", () => {
      throw new Error(why);
    });
  });
} else (availability.run ? describe : describe.skip)(SUITE, () => {
  let image: string;
  let dir: string;
  let anvil: AnvilNode;
  let cp: ControlPlane | undefined;
  const signer = generatePrivateKey();
  const ports: Record<string, { port: number; admin: number }> = {};
  const containers: Record<string, Container> = {};

  // A Secret volume's file: owned by root, readable by the pod's group (fsGroup 65532), as the kubelet mounts it.
  const secretFile = (name: string, content: string) => {
    const file = join(dir, name);
    writeFileSync(file, content);
    chownSync(file, 0, UID);
    chmodSync(file, 0o440);
    return file;
  };
  const serve = (component: string) => ({ HOST: "127.0.0.1", PORT: String(ports[component]!.port), ADMIN_PORT: String(ports[component]!.admin), LOG_LEVEL: "warn" });
  // How each component is started, read again for a restart on other ports.
  const specs: Record<string, () => Parameters<typeof runContainer>[0]> = {};
  // Ports are picked right before the container binds them (host networking). Another test's
  // process may still take one in between; a container that then exits with EADDRINUSE is started
  // again on fresh ports (ready() below), as often as that happens, up to three times.
  const start = async (component: string, spec: () => Parameters<typeof runContainer>[0]) => {
    specs[component] = spec;
    ports[component] = { port: await freePort(), admin: await freePort() };
    containers[component] = runContainer(spec());
  };
  const restarts: Record<string, number> = {};

  beforeAll(async () => {
    image = loadImage();
    dir = mkdtempSync(join(tmpdir(), "x402-image-"));
    chmodSync(dir, 0o755);
    anvil = await startAnvil({ chainId: 8453 });
    // a funded signer: the facilitator is ready only then (signer_funded)
    await fetch(anvil.rpcUrl, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ jsonrpc: "2.0", id: 1, method: "anvil_setBalance", params: [privateKeyToAccount(signer).address, "0x8ac7230489e80000"] }) });
    // The operator gets a real kube-apiserver when one is built here (CI builds it); else it runs without a cluster.
    if ("dir" in controlPlaneBinaries()) cp = await startControlPlane();

    const signerKeys = secretFile("signer-keys", `${signer}\n`);
    await start("facilitator", () => ({
      image,
      args: ["facilitator", "--network", NETWORK, "--rpc-url", anvil.rpcUrl, "--signer-key-file", "/var/run/secrets/x402/signer/signer-keys"],
      env: serve("facilitator"),
      files: { [signerKeys]: "/var/run/secrets/x402/signer/signer-keys" },
    }));
    await start("router", () => {
      const routing = { backends: [{ network: NETWORK, url: `http://127.0.0.1:${ports.facilitator!.port}/v2`, kinds: [{ x402Version: 2, scheme: "exact", network: NETWORK }] }] };
      return {
        image,
        args: ["router", "--routing-table", "/etc/x402-fleet/routing/routing.json"],
        env: serve("router"),
        files: { [secretFile("routing.json", JSON.stringify(routing))]: "/etc/x402-fleet/routing/routing.json" },
      };
    });
    await start("hub", () => ({ image, args: ["hub"], env: { ...serve("hub"), HUB_CHAIN_ID: "8453" } }));
    const masterKeys = secretFile("master-keys", `${masterKeyLine().line}\n`);
    await start("wallets", () => ({
      image,
      args: ["wallets"],
      env: { ...serve("wallets"), WALLETS_MASTER_KEY_FILE: "/var/run/secrets/x402/wallets/master-keys" },
      files: { [masterKeys]: "/var/run/secrets/x402/wallets/master-keys" },
    }));
    const operatorFiles: Record<string, string> = {};
    // Wide Lease timings: the control plane shares this machine with the whole suite, and a renewal
    // it answers late would restart the operator (seen once; the chart's defaults are kube's 15/10/2 s).
    const operatorEnv: Record<string, string> = {
      POD_NAME: "operator-0",
      POD_NAMESPACE: "x402-system",
      X402_FACILITATOR_IMAGE: image,
      X402_LEASE_DURATION_SECONDS: "60",
      X402_LEASE_RENEW_DEADLINE_SECONDS: "45",
      X402_LEASE_RETRY_PERIOD_SECONDS: "5",
    };
    if (cp) {
      await cp.applyFile(join(process.cwd(), "crds", "facilitatornetworks.x402fleet.io.yaml"));
      await cp.request("/api/v1/namespaces", { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ metadata: { name: "x402-system" } }) });
      const kubeconfig = cp.writeKubeconfig(cp.adminToken, join(dir, "kubeconfig"));
      chownSync(kubeconfig, 0, UID);
      chmodSync(kubeconfig, 0o440);
      operatorFiles[kubeconfig] = "/var/run/secrets/x402/kubeconfig";
      Object.assign(operatorEnv, { KUBECONFIG: "/var/run/secrets/x402/kubeconfig", X402_WATCH_NAMESPACE: "x402-system" });
    }
    await start("operator", () => ({ image, args: ["operator"], env: { ...serve("operator"), ...operatorEnv }, files: operatorFiles }));
  }, 600_000);

  afterAll(async () => {
    await Promise.all(Object.values(containers).map((c) => c.remove()));
    await anvil?.stop();
    await cp?.stop();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });

  const admin = (component: string, path: string) => fetch(`http://127.0.0.1:${ports[component]!.admin}${path}`, { signal: AbortSignal.timeout(5000) });
  // Polls /readyz until 200; a container that exited fails at once with its log.
  const ready = (component: string) =>
    until(async () => {
      const c = containers[component]!;
      if (!c.running()) {
        const logs = c.logs();
        if (/EADDRINUSE/.test(logs) && (restarts[component] ?? 0) < 3) {
          restarts[component] = (restarts[component] ?? 0) + 1;
          await c.remove();
          await start(component, specs[component]!);
          return undefined;
        }
        throw new Error(`${component} exited:\n${logs.slice(-3000)}`);
      }
      const r = await admin(component, "/readyz").catch(() => undefined);
      return r?.status === 200 ? ((await r.json()) as { status: string }) : undefined;
    }, `${component} /readyz`, READY_MS).catch(async (e: Error) => {
      const last = await admin(component, "/readyz").then((r) => r.text(), (f: Error) => f.message);
      throw new Error(`${e.message} (last: ${last})\n${containers[component]!.logs().slice(-3000)}`);
    });

  // What the chart's securityContext promises, seen from inside the running container.
  const expectLockedDown = (component: string) => {
    const c = containers[component]!;
    expect(c.exec(["id", "-u"]).output.trim()).toBe(String(UID));
    const write = c.exec(["node", "-e", "require('fs').writeFileSync('/app/probe', 'x')"]);
    expect(write.status).not.toBe(0);
    expect(write.output).toMatch(/EROFS|read-only file system/);
    expect(c.exec(["node", "-e", "require('fs').writeFileSync('/tmp/probe', 'x')"]).status).toBe(0);
  };

  it("facilitator: ready against the host's anvil, read-only, its embedded store under /tmp; /v2/supported names its kinds and signer", async () => {
    expect((await ready("facilitator")).status).toBe("ready");
    expectLockedDown("facilitator");
    // the image's default data directory (X402_DATA_DIR) is on the tmpfs, not beside the read-only /app
    expect(containers.facilitator!.exec(["ls", "/tmp/x402-fleet/facilitator"]).output.trim()).not.toBe("");
    const supported = (await (await fetch(`http://127.0.0.1:${ports.facilitator!.port}/v2/supported`)).json()) as { kinds: { scheme: string; network: string }[]; signers: Record<string, string[]> };
    expect(supported.kinds.map((k) => `${k.scheme}@${k.network}`)).toContain(`exact@${NETWORK}`);
    expect(Object.values(supported.signers).flat()).toEqual([privateKeyToAccount(signer).address]);
  }, READY_MS + 30_000);

  it("router: ready with its mounted routing table, read-only; serves the facilitator container's kinds", async () => {
    expect((await ready("router")).status).toBe("ready");
    expectLockedDown("router");
    const supported = await until(async () => {
      const r = await fetch(`http://127.0.0.1:${ports.router!.port}/v2/supported`).catch(() => undefined);
      return r?.status === 200 ? ((await r.json()) as { kinds: { scheme: string; network: string }[] }) : undefined;
    }, "the router's /v2/supported", READY_MS);
    expect(supported.kinds.map((k) => `${k.scheme}@${k.network}`)).toContain(`exact@${NETWORK}`);
  }, 2 * READY_MS);

  it("hub: ready on its embedded store in the image's default directory (/tmp), read-only", async () => {
    expect((await ready("hub")).status).toBe("ready");
    expectLockedDown("hub");
    expect(containers.hub!.exec(["ls", "/tmp/x402-fleet/hub"]).output.trim()).not.toBe("");
  }, READY_MS + 30_000);

  it("wallets: ready with its master keys mounted as a Secret, its embedded store under /tmp, read-only", async () => {
    expect((await ready("wallets")).status).toBe("ready");
    expectLockedDown("wallets");
    expect(containers.wallets!.exec(["ls", "/tmp/x402-fleet/wallets"]).output.trim()).not.toBe("");
  }, READY_MS + 30_000);

  it("operator: ready as the leader against a real kube-apiserver (or, without one, alive and refusing cleanly)", async () => {
    const operator = containers.operator!;
    if (cp) {
      expect((await ready("operator")).status).toBe("ready");
      const lease = await cp.request("/apis/coordination.k8s.io/v1/namespaces/x402-system/leases");
      expect(lease.status).toBe(200);
      expect(lease.text).toContain("operator-0");
    } else {
      await until(async () => ((await admin("operator", "/healthz").catch(() => undefined))?.status === 200 ? true : undefined), "operator /healthz", READY_MS);
      await until(() => (/lease request failed/.test(operator.logs()) ? true : undefined), "the operator's refusal in its log", READY_MS);
      expect(operator.logs()).not.toMatch(/\n\s+at .*\(/); // a logged reason, not a stack trace
    }
    // (Once seen false on a loaded CI machine, 2 s after it was ready and held the Lease: its log says why.)
    expect(operator.running(), operator.logs().slice(-3000)).toBe(true);
    expectLockedDown("operator");
  }, READY_MS + 30_000);
});
