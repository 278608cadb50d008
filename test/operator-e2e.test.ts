// End to end: `kubectl apply` of a FacilitatorNetwork for a devnet chain → the operator (against
// a real kube-apiserver, kube-controller-manager, kube-scheduler and a kwok node) → the
// Deployment's pod Ready (kwok) → the routing ConfigMap → written to a file → the router routes a
// real payment, settled on the anvil chain, to that chain's facilitator. Then the schemes change
// (only the kinds both pod generations serve are advertised during the rollout), the signer
// Secret is rotated (pods roll; the next payment is settled by the new key, on chain), the network
// scales to two replicas, and `kubectl delete` takes it out of the table and its children away. kwok only pretends to run
// the pod, so the facilitator runs as a local process started from the operator's own
// Deployment (image args, env with the Secret references resolved, the signer Secret written
// where the pod would mount it: test/helpers/local-pod.ts), and the Service's cluster DNS name is
// mapped to the process's local address when the ConfigMap is written to the router's file.
import { afterAll, beforeAll, expect, it } from "vitest";
import { execFileSync, spawnSync } from "node:child_process";
import { createPublicClient, http } from "viem";
import { generatePrivateKey, privateKeyToAccount } from "viem/accounts";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { pino } from "pino";
import { startTestDevnet } from "./helpers/devnet.ts";
import { postJson, serviceShape, signEip3009 } from "./helpers/payments.ts";
import { balanceOf, receiptStatus } from "./helpers/chain.ts";
import { startRouterService, type RunningRouter } from "../services/router/service.ts";
import type { RunningDevnet } from "../services/devnet/devnet.ts";
import { parseRoutingTable } from "../services/router/routing-table.ts";
import { ROUTING_TABLE_KEY } from "../operator/api.ts";
import { startOperator, type RunningOperator } from "../operator/operator.ts";
import { describeWithControlPlane } from "./helpers/control-plane.ts";
import { CRD_PATH, clusterOf, condition, until, type Cluster } from "./helpers/cluster.ts";
import { runPodLocally, type RunningPod } from "./helpers/local-pod.ts";

const BINARY = fileURLToPath(new URL("../bin/x402-fleet.js", import.meta.url));
let KUBECTL: string;
const NS = "payments";
const OPERATOR_NS = "x402-system";
const RPC_KEY = "e2e-secret-api-key-19c2";
const silent = pino({ level: "silent" });

let devnet: RunningDevnet & { dir: string };
let cluster: Cluster;
let operator: RunningOperator;
let router: RunningRouter | undefined;
let pod: RunningPod | undefined;
let dir: string;
const operatorLogs: string[] = [];

describeWithControlPlane("operator end to end", { controllers: true, fakeNodes: 1, crds: [CRD_PATH] }, (cp) => {
/** The real kubectl (1.33, scripts/install-helm.mjs) as the cluster admin; stdout, or throws with stderr. */
const kubectl = (args: string[], stdin?: string) => {
  const r = spawnSync(KUBECTL, ["--kubeconfig", cp().kubeconfigPath, ...args], { input: stdin, encoding: "utf8" });
  if (r.status !== 0) throw new Error(`kubectl ${args.join(" ")}: ${r.stderr}`);
  return r.stdout;
};
beforeAll(async () => {
  KUBECTL = execFileSync(process.execPath, [fileURLToPath(new URL("../scripts/install-helm.mjs", import.meta.url)), "--kubectl"], { encoding: "utf8" }).trim();
  cluster = clusterOf(cp());
  await Promise.all([cluster.ensureNamespace(NS), cluster.ensureNamespace(OPERATOR_NS)]);
  [devnet, dir] = await Promise.all([startTestDevnet(["eip155:8453"]), mkdtemp(join(tmpdir(), "x402-operator-e2e-"))]);
  operator = await startOperator({
    kubeConfig: cluster.kc,
    namespace: OPERATOR_NS,
    facilitatorImage: "x402-fleet:e2e",
    identity: "op-e2e",
    leaderElection: { leaseDurationMs: 2000, renewDeadlineMs: 1500, retryPeriodMs: 200 },
    allowPrivateRpc: true, // the devnet's anvil is on loopback
    logger: pino({ level: "debug" }, { write: (l: string) => void operatorLogs.push(l) }),
  });
});

afterAll(async () => {
  await router?.close();
  await pod?.stop();
  await operator?.stop();
  await devnet?.stop();
  if (dir) await rm(dir, { recursive: true, force: true });
});

  it("kubectl apply of a FacilitatorNetwork for a devnet chain → routing ConfigMap → router → a real payment settled by that chain's facilitator; schemes change, signer rotation, scale, kubectl delete", async () => {
    const net = devnet.info.networks[0]!;
    const signerKeys = await readFile(join(devnet.dir, "keys", `${net.chainId}.key`), "utf8");
    await cluster.putSecret(NS, "base-signer", { "signer-keys": signerKeys });
    await cluster.putSecret(NS, "base-rpc", { url: `${net.rpcUrl}/?apikey=${RPC_KEY}` });

    // the router starts with an empty table, as a fresh cluster's would
    const tableFile = join(dir, "routing.json");
    await writeFile(tableFile, JSON.stringify({ backends: [] }));
    router = await startRouterService({ routingTablePath: tableFile, host: "127.0.0.1", port: 0 }, silent);

    // what a user does: kubectl apply of the resource
    const manifest = (spec: Record<string, unknown>) =>
      JSON.stringify({ apiVersion: "x402fleet.io/v1alpha1", kind: "FacilitatorNetwork", metadata: { name: "base", namespace: NS }, spec });
    const baseSpec = { network: net.network, rpc: [{ secretKeyRef: { name: "base-rpc", key: "url" } }], signerSecretRef: { name: "base-signer" }, schemes: ["exact"], settlement: { receiptTimeoutSeconds: 20 } };
    expect(kubectl(["apply", "-f", "-"], manifest(baseSpec))).toContain("facilitatornetwork.x402fleet.io/base created");

    // kwok reports the pod Ready; the kubelet's part, running it, is a local process here
    const deployment = await until(() => cluster.apps.readNamespacedDeployment({ namespace: NS, name: "base-facilitator" }).catch(() => undefined), "the Deployment");
    pod = await runPodLocally(cluster.kc, deployment, { binary: BINARY });
    expect(pod.env.X402_RPC_URLS).toBe(`${net.rpcUrl}/?apikey=${RPC_KEY}`); // $(X402_RPC_URL_0) resolved from the Secret
    expect(pod.env.X402_NETWORK).toBe(net.network);
    const pods = await until(async () => {
      const list = await cluster.core.listNamespacedPod({ namespace: NS });
      return list.items.some((p) => p.status?.conditions?.some((c) => c.type === "Ready" && c.status === "True")) ? list : undefined;
    }, "the facilitator pod Ready on the kwok node");
    expect(pods.items[0]!.spec!.nodeName).toBe("kwok-node-0");

    const fn = await until(async () => {
      const f = await cluster.getNetwork(NS, "base");
      return condition(f, "Ready")?.status === "True" ? f : undefined;
    }, "Ready", 60_000);
    expect(fn.status!.signers).toEqual(net.signers);
    expect(fn.status!.chainId).toBe(net.chainId);
    // the doctor's chain checks pass on a devnet chain: contracts, assets, a funded signer, fees
    const checked = await until(async () => {
      const f = await cluster.getNetwork(NS, "base");
      return condition(f, "ChainChecked") ? f : undefined;
    }, "ChainChecked", 60_000);
    expect(condition(checked, "ChainChecked")).toMatchObject({ status: "True", reason: "ChecksPassed" });
    expect(condition(checked, "ChainChecked")!.message).toMatch(/^\d+ checks passed \(rpc, contracts, asset, fees, signer\)$/);
    expect(JSON.stringify(checked.status)).not.toContain(RPC_KEY);

    // the routing ConfigMap, in the router's own format, pointing at the Service
    const serviceUrl = "http://base-facilitator.payments.svc.cluster.local:4021/v2";
    const readTable = async () =>
      parseRoutingTable((await cluster.core.readNamespacedConfigMap({ namespace: OPERATOR_NS, name: "x402-fleet-routing" })).data![ROUTING_TABLE_KEY]!);
    const table = await until(async () => ((await readTable()).backends.length === 1 ? readTable() : undefined), "the routing entry");
    expect(table.backends[0]!.url).toBe(serviceUrl);

    // ConfigMap → file, with the cluster DNS name of the Service mapped to the pod process
    const writeTableFile = async () => {
      const t = await readTable();
      await writeFile(tableFile, JSON.stringify({ backends: t.backends.map((b) => (b.url === serviceUrl ? { ...b, url: pod!.url } : b)) }));
    };
    await writeTableFile();

    // the router serves the new network and its kinds without a restart
    const supported = await until(async () => {
      const r = await postJson(`${router!.url}/supported`, undefined, { method: "GET" });
      return (r.json.kinds as unknown[]).length > 0 ? r.json : undefined;
    }, "the router to load the table");
    const own = await postJson(`${pod.url}/supported`, undefined, { method: "GET" });
    expect(supported.kinds).toEqual(own.json.kinds); // the operator's kinds are what the facilitator serves
    expect(supported.signers).toEqual({ "eip155:*": net.signers });

    // a real payment through the router, settled on the chain by that facilitator
    const asset = net.assets.find((a) => a.transferMethods.includes("eip3009"))!;
    const spec = { network: net.network, chainId: net.chainId, asset, payerKey: devnet.info.payers[0]!.privateKey, payTo: devnet.info.receivers[0]!.address, amount: 4321n };
    const body = serviceShape(spec, await signEip3009(spec));
    const verify = await postJson(`${router.url}/verify`, body);
    expect(verify.json).toEqual({ isValid: true, payer: devnet.info.payers[0]!.address });
    const before = await balanceOf(net.rpcUrl, asset.address, spec.payTo);
    const settle = await postJson(`${router.url}/settle`, body);
    expect(settle.status).toBe(200);
    expect(settle.json).toMatchObject({ success: true, network: net.network, payer: devnet.info.payers[0]!.address });
    expect(await receiptStatus(net.rpcUrl, settle.json.transaction as `0x${string}`)).toBe("success");
    expect(await balanceOf(net.rpcUrl, asset.address, spec.payTo)).toBe(before + 4321n);

    // a facilitator pod "restarted" from the current Deployment (kwok only pretends to run it)
    const restartPod = async () => {
      await pod!.stop();
      pod = await runPodLocally(cluster.kc, await cluster.apps.readNamespacedDeployment({ namespace: NS, name: "base-facilitator" }), { binary: BINARY });
    };
    const status = () => cluster.getNetwork(NS, "base");
    const rolledOut = async (what: string) =>
      until(async () => {
        const f = await status();
        return condition(f, "Ready")?.status === "True" && condition(f, "Progressing")?.reason === "RolloutComplete" && f!.status!.observedGeneration === f!.metadata.generation ? f : undefined;
      }, what, 60_000);

    // change spec.schemes: without a database the pod is replaced, never surged (one pod holds the
    // keys): while the new pod is held back nothing serves; the network is not Ready but keeps its
    // routing entry with the kinds it served, so the router answers 503 (try again), never 400
    await cluster.cordon();
    kubectl(["apply", "-f", "-"], manifest({ ...baseSpec, schemes: ["exact", "upto"] }));
    const rolling = await until(async () => {
      const f = await status();
      return f?.status?.observedGeneration === 2 && condition(f, "Ready")?.status === "False" ? f : undefined;
    }, "the schemes rollout in progress, the old pod gone");
    expect(condition(rolling, "Ready")!.reason).toBe("DeploymentUnavailable");
    expect((await cluster.core.listNamespacedPod({ namespace: NS })).items.map((p) => p.status!.phase)).toEqual(["Pending"]);
    expect((await readTable()).backends.map((b) => b.kinds.map((k) => k.scheme))).toEqual([["exact"]]);
    await cluster.uncordon();
    const withUpto = await rolledOut("the schemes rolled out");
    expect(withUpto.status!.kinds!.map((k) => k.scheme)).toEqual(["exact", "upto"]);
    await until(async () => (await readTable()).backends[0]!.kinds.length === 2, "the table to list upto");
    await restartPod();
    expect(pod!.env.X402_SCHEMES).toBe("exact,upto");
    await writeTableFile();
    await until(async () => ((await postJson(`${router!.url}/supported`, undefined, { method: "GET" })).json.kinds as { scheme: string }[]).some((k) => k.scheme === "upto"), "the router to serve upto");

    // rotate the signer Secret: the pods roll, the new signer is advertised and settles the next payment
    const newKey = generatePrivateKey();
    const newSigner = privateKeyToAccount(newKey).address;
    await postJson(net.rpcUrl, { jsonrpc: "2.0", id: 1, method: "anvil_setBalance", params: [newSigner, "0x56BC75E2D63100000"] }); // 100 ETH for gas
    const templateBefore = (await cluster.apps.readNamespacedDeployment({ namespace: NS, name: "base-facilitator" })).spec!.template.metadata!.annotations;
    kubectl(["apply", "-f", "-"], kubectl(["create", "secret", "generic", "base-signer", "-n", NS, `--from-literal=signer-keys=${newKey}`, "--dry-run=client", "-o", "json"]));
    const rotated = await until(async () => {
      const f = await status();
      return f?.status?.signers?.[0] === newSigner ? f : undefined;
    }, "the new signer in status", 60_000);
    expect(rotated.status!.signers).toEqual([newSigner]);
    expect((await cluster.apps.readNamespacedDeployment({ namespace: NS, name: "base-facilitator" })).spec!.template.metadata!.annotations).not.toEqual(templateBefore); // pods roll
    await rolledOut("the rotation rolled out");
    await until(async () => (await readTable()).backends[0]?.signers[0] === newSigner, "the new signer in the routing table");
    await restartPod();
    await writeTableFile();
    await until(async () => JSON.stringify((await postJson(`${router!.url}/supported`, undefined, { method: "GET" })).json.signers).includes(newSigner), "the router to advertise the new signer");
    const spec2 = { ...spec, amount: 1234n };
    const body2 = serviceShape(spec2, await signEip3009(spec2));
    const settled2 = await postJson(`${router.url}/settle`, body2);
    expect(settled2.json).toMatchObject({ success: true });
    const receipt = await createPublicClient({ transport: http(net.rpcUrl) }).getTransactionReceipt({ hash: settled2.json.transaction as `0x${string}` });
    expect(receipt.status).toBe("success");
    expect(receipt.from.toLowerCase()).toBe(newSigner.toLowerCase()); // settled by the rotated key, on chain

    // scale to two replicas (with the shared database two replicas need): two pods Ready on the kwok node, a PodDisruptionBudget
    kubectl(["create", "secret", "generic", "fleet-db", "-n", NS, "--from-literal=url=postgres://postgres@127.0.0.1:5432/test"]);
    kubectl(["apply", "-f", "-"], manifest({ ...baseSpec, schemes: ["exact", "upto"], replicas: 2, database: { urlSecretRef: { name: "fleet-db", key: "url" } } }));
    const scaled = await until(async () => {
      const f = await status();
      return f?.status?.readyReplicas === 2 && condition(f, "Progressing")?.reason === "RolloutComplete" ? f : undefined;
    }, "two ready replicas", 60_000);
    expect(scaled.status!.readyReplicas).toBe(2);
    expect(await cluster.policy.readNamespacedPodDisruptionBudget({ namespace: NS, name: "base-facilitator" })).toBeDefined();

    // deleting the resource (kubectl delete) takes the network out of the table, and the router follows
    kubectl(["delete", "facilitatornetwork", "base", "-n", NS, "--wait=false"]);
    await until(async () => (await readTable()).backends.length === 0, "the entry to go");
    // The file follows the ConfigMap until the router has dropped the network, as the kubelet keeps a
    // mounted ConfigMap in step (a one-shot copy timed out once on a loaded CI machine).
    await until(async () => {
      await writeTableFile();
      return ((await postJson(`${router!.url}/supported`, undefined, { method: "GET" })).json.kinds as unknown[]).length === 0;
    }, "the router to drop it");
    expect((await postJson(`${router.url}/verify`, body)).json.error).toMatch(/^unsupported_scheme_network: /);
    // and the children are collected by the garbage collector
    await until(async () => (await cluster.apps.listNamespacedDeployment({ namespace: NS })).items.length === 0 && (await cluster.core.listNamespacedService({ namespace: NS })).items.length === 0, "the children collected", 60_000);

    // nothing secret reached the operator's logs
    expect(operatorLogs.join("\n")).not.toContain(RPC_KEY);
    expect(operatorLogs.join("\n")).not.toContain(signerKeys.trim().slice(2));
  }, 400_000); // the facilitator process creates its embedded store on first start
});
