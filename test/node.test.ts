// A real node: the operator's facilitator pod runs on a kubelet with containerd and runc
// (test/helpers/node.ts), from the image built here from the Dockerfile (scripts/build-image.sh),
// not on kwok. A FacilitatorNetwork for a devnet chain (anvil on the host, offered to the pods at
// the node's IP) → the operator (in this process, against the real control plane, the router's
// token Secret wired as the chart does) → its Deployment, its claim bound to a volume on the node
// → the kubelet starts the pod: the image's entrypoint, read-only root filesystem as uid 65532,
// the signer Secret and the router-token ConfigMap mounted → the kubelet's own readiness probe
// marks it Ready → the network turns Ready. A payment signed by the reference client, through the
// router to the pod's address, settles on chain; a settle that skips the router is refused by the
// pod (nothing sent). Then the pod's RPC is taken away: the kubelet's probe turns the pod and the
// network not Ready, and back once the RPC returns, which a fake node never does.
// With CI=true a missing node, image or control plane fails the suite; elsewhere it is skipped with one line.
import { randomBytes } from "node:crypto";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, expect, it } from "vitest";
import { pino } from "pino";
import { startTestDevnet } from "./helpers/devnet.ts";
import { postJson, serviceShape, signEip3009 } from "./helpers/payments.ts";
import { balanceOf, receiptStatus } from "./helpers/chain.ts";
import { describeWithControlPlane } from "./helpers/control-plane.ts";
import { CRD_PATH, clusterOf, condition, until, type Cluster } from "./helpers/cluster.ts";
import { imageBuild } from "./helpers/image.ts";
import { describeOnNode, startNode, type HostPort, type RealNode } from "./helpers/node.ts";
import { startRouterService, type RunningRouter } from "../services/router/service.ts";
import { startOperator, type RunningOperator } from "../operator/operator.ts";
import { parseRoutingTable } from "../services/router/routing-table.ts";
import { ROUTING_TABLE_KEY } from "../operator/api.ts";
import type { RunningDevnet } from "../services/devnet/devnet.ts";

const SUITE = "a real node";
const NS = "payments";
const OPERATOR_NS = "x402-system";
const STORAGE_CLASS = "node-local";
// importing the image, creating the embedded store and the startup probe: minutes on a loaded machine
const POD_READY_MS = 300_000;
const silent = pino({ level: "silent" });

describeOnNode(SUITE, () =>
  describeWithControlPlane(SUITE, { controllers: true, crds: [CRD_PATH] }, (cp) => {
    let node: RealNode;
    let cluster: Cluster;
    let devnet: RunningDevnet & { dir: string };
    let rpc: HostPort;
    let operator: RunningOperator;
    let router: RunningRouter | undefined;
    let dir: string;
    let image: string;
    const routerToken = randomBytes(32).toString("hex");

    beforeAll(async () => {
      const built = imageBuild();
      if (!("image" in built)) throw new Error(built.missing);
      image = built.image;
      cluster = clusterOf(cp());
      // side by side, and whatever started is kept for afterAll even when the other failed
      const started = await Promise.allSettled([startNode(cp(), { images: [built.archive] }), startTestDevnet(["eip155:8453"]), mkdtemp(join(tmpdir(), "x402-node-test-"))]);
      if (started[0].status === "fulfilled") node = started[0].value;
      if (started[1].status === "fulfilled") devnet = started[1].value;
      if (started[2].status === "fulfilled") dir = started[2].value;
      for (const s of started) if (s.status === "rejected") throw s.reason;
      rpc = await node.expose(Number(new URL(devnet.info.networks[0]!.rpcUrl).port));
      await Promise.all([cluster.ensureNamespace(NS), cluster.ensureNamespace(OPERATOR_NS)]);
      // the chart's router-token Secret: the operator mounts its digests in every facilitator pod
      await cluster.putSecret(OPERATOR_NS, "x402-fleet-router-token", { tokens: `${routerToken}\n` });
      await node.localVolume("base-store", STORAGE_CLASS);
      operator = await startOperator({
        kubeConfig: cluster.kc,
        namespace: OPERATOR_NS,
        facilitatorImage: image,
        routerTokenSecret: { name: "x402-fleet-router-token", key: "tokens" },
        leaderElection: false,
        allowPrivateRpc: true, // the chain is at the node's address
        chainChecks: false,
        logger: silent,
      });
    }, 600_000);

    afterAll(async () => {
      await router?.close();
      await operator?.stop();
      await node?.stop();
      await devnet?.stop();
      if (dir) await rm(dir, { recursive: true, force: true });
    }, 180_000);

    const facilitatorPod = async () => (await cluster.core.listNamespacedPod({ namespace: NS, labelSelector: "app.kubernetes.io/component=facilitator" })).items[0];
    const podReady = async () => (await facilitatorPod())?.status?.conditions?.find((c) => c.type === "Ready")?.status;
    const networkReady = async () => condition(await cluster.getNetwork(NS, "base"), "Ready")?.status;
    const explain = async (e: Error) => {
      const pod = await facilitatorPod();
      const log = pod ? node.containerLog(NS, pod.metadata!.name!, "facilitator").slice(-3000) : "(no pod)";
      throw new Error(`${e.message}\npod: ${JSON.stringify(pod?.status?.containerStatuses ?? pod?.status?.conditions)}\nlog:\n${log}\n--- kubelet ---\n${node.logOf("kubelet")}`);
    };

    it("the operator's facilitator pod runs the image on the node, passes the kubelet's readiness probe, and settles a payment through the router on chain", async () => {
      const net = devnet.info.networks[0]!;
      const rpcUrl = `http://${rpc.host}${new URL(net.rpcUrl).pathname}`;
      const signerKeys = readFileSync(join(devnet.dir, "keys", `${net.chainId}.key`), "utf8");
      await cluster.putSecret(NS, "base-signer", { "signer-keys": signerKeys });
      await cluster.putSecret(NS, "base-rpc", { url: rpcUrl });
      await cluster.createNetwork(NS, "base", {
        network: net.network,
        rpc: [{ secretKeyRef: { name: "base-rpc", key: "url" } }],
        signerSecretRef: { name: "base-signer" },
        schemes: ["exact"],
        storage: { storageClassName: STORAGE_CLASS, size: "1Gi" },
      });

      const ready = await until(async () => ((await networkReady()) === "True" ? cluster.getNetwork(NS, "base") : undefined), "the network Ready", POD_READY_MS).catch(explain);
      expect(ready!.status!.signers).toEqual(net.signers);

      // The pod is the kubelet's, not a fake: bound to the real node, its container started by
      // containerd from the image, Ready by the kubelet's probe of the facilitator's /readyz.
      const pod = (await facilitatorPod())!;
      expect(pod.spec!.nodeName).toBe(node.name);
      expect(pod.status!.podIP!.startsWith(node.podSubnet.replace(/0\/24$/, ""))).toBe(true);
      const status = pod.status!.containerStatuses![0]!;
      expect(status).toMatchObject({ name: "facilitator", ready: true, started: true, restartCount: 0 });
      expect(status.image).toBe(image);
      expect(status.containerID).toMatch(/^containerd:\/\//);
      expect(node.ctr(["containers", "ls"]).output).toContain(image);
      expect(node.containerLog(NS, pod.metadata!.name!, "facilitator")).toMatch(/listening|ready/i);
      // its claim was bound to the volume on the node, and the embedded store is in it
      const claim = await cluster.core.readNamespacedPersistentVolumeClaim({ namespace: NS, name: "base-facilitator-store" });
      expect(claim.status!.phase).toBe("Bound");
      expect(claim.spec!.volumeName).toBe("base-store");

      // the router, with the chart's token, routes to the pod's address (no cluster DNS or kube-proxy here)
      const serviceUrl = `http://base-facilitator.${NS}.svc.cluster.local:4021/v2`;
      const podUrl = `http://${pod.status!.podIP}:4021/v2`;
      const table = await until(async () => {
        const cm = await cluster.core.readNamespacedConfigMap({ namespace: OPERATOR_NS, name: "x402-fleet-routing" }).catch(() => undefined);
        const t = cm?.data?.[ROUTING_TABLE_KEY] ? parseRoutingTable(cm.data[ROUTING_TABLE_KEY]) : undefined;
        return t?.backends.some((b) => b.url === serviceUrl) ? t : undefined;
      }, "the routing entry");
      const tableFile = join(dir, "routing.json");
      const tokenFile = join(dir, "router-token");
      await writeFile(tableFile, JSON.stringify({ backends: table.backends.map((b) => (b.url === serviceUrl ? { ...b, url: podUrl } : b)) }));
      await writeFile(tokenFile, `${routerToken}\n`, { mode: 0o600 });
      router = await startRouterService({ routingTablePath: tableFile, routerTokenFile: tokenFile, host: "127.0.0.1", port: 0 }, silent);

      const asset = net.assets.find((a) => a.transferMethods.includes("eip3009"))!;
      const payer = devnet.info.payers[0]!;
      const spec = { network: net.network, chainId: net.chainId, asset, payerKey: payer.privateKey, payTo: devnet.info.receivers[0]!.address, amount: 7919n };
      const body = serviceShape(spec, await signEip3009(spec));
      const signer = net.signers[0]!;
      const nonce = async () => BigInt((await postJson(net.rpcUrl, { jsonrpc: "2.0", id: 1, method: "eth_getTransactionCount", params: [signer, "pending"] })).json.result as string);

      // straight to the pod, skipping the router: refused by the token digests the kubelet mounted, nothing sent
      const nonceBefore = await nonce();
      const direct = await postJson(`${podUrl}/settle`, body);
      expect(direct.status).toBe(401);
      expect(await nonce()).toBe(nonceBefore);

      const balanceBefore = await balanceOf(net.rpcUrl, asset.address, spec.payTo);
      expect((await postJson(`${router.url}/verify`, body)).json).toEqual({ isValid: true, payer: payer.address });
      const settle = await postJson(`${router.url}/settle`, body);
      expect(settle.status).toBe(200);
      expect(settle.json).toMatchObject({ success: true, network: net.network, payer: payer.address });
      expect(await receiptStatus(net.rpcUrl, settle.json.transaction as `0x${string}`)).toBe("success");
      expect(await balanceOf(net.rpcUrl, asset.address, spec.payTo)).toBe(balanceBefore + 7919n);
      expect(await nonce()).toBe(nonceBefore + 1n); // one transaction, signed in the pod
    }, POD_READY_MS + 120_000);

    it("the kubelet's readiness probe follows the pod's RPC: the network turns not Ready while the chain is unreachable from the pod, and Ready again after", async () => {
      const port = rpc.port;
      await rpc.close(); // the pod's RPC address now refuses connections
      await until(async () => ((await podReady()) === "False" ? true : undefined), "the pod not Ready", 180_000).catch(explain);
      await until(async () => ((await networkReady()) === "False" ? true : undefined), "the network not Ready", 60_000);
      const pod = (await facilitatorPod())!;
      expect(pod.status!.containerStatuses![0]).toMatchObject({ ready: false, started: true, restartCount: 0 }); // alive, only unready

      rpc = await node.expose(Number(new URL(devnet.info.networks[0]!.rpcUrl).port), port);
      await until(async () => ((await networkReady()) === "True" ? true : undefined), "the network Ready again", 180_000).catch(explain);
      expect((await facilitatorPod())!.status!.containerStatuses![0]).toMatchObject({ ready: true, restartCount: 0 });
    }, 420_000);
  }),
);
