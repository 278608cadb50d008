// The chart on a real node, end to end, as a platform team runs it: a control plane advertising
// this host's address, one real node (containerd, runc, kubelet) with Service networking
// (kube-proxy in nftables mode, CoreDNS) and the image built here imported (test/helpers/node.ts),
// then `helm install` of charts/x402-fleet with that image: operator (two replicas, leader
// election, in its pods under the chart's ServiceAccount, reaching kube-apiserver through the
// `kubernetes` Service), router (its Service as a NodePort), hub and wallets (PostgreSQL on this
// host, offered to the pods at the node IP). A FacilitatorNetwork for a devnet chain (anvil on this
// host, at the node IP) turns Ready because its pod passes the kubelet's readiness probe; a payment
// signed by the reference client (@x402/evm) is sent to the router's NodePort, which reaches the
// facilitator by its Service's DNS name, and settles: judged on chain (receipt, both balances).
// Then operations under payment load (careful clients re-sending each payment until a final
// answer): the facilitator pod deleted while settles are in flight (its Recreate rollout brings a
// new pod onto the same store) and a `helm upgrade` rolling every Deployment of the chart. Judged
// on chain by the chaos harness's rules (test/helpers/chaos.ts): every payment told success is its
// transfer on chain, once; no caller of a paid payment told failure; no valid payment refused.
// A NetworkPolicy engine runs on the node throughout (kube-network-policies,
// test/helpers/network-policy.ts); the last test proves the operator's and the chart's policies by
// connections from pods, refused and admitted, a payment still settling through the router.
// With CI=true a missing node, image or control plane fails the suite; elsewhere it is skipped with one line.
import { randomBytes } from "node:crypto";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, expect, it } from "vitest";
import pg from "pg";
import { privateKeyToAccount } from "viem/accounts";
import { createPublicClient, http, type Address, type Hex } from "viem";
import { ExactEvmScheme as ExactEvmClient } from "@x402/evm/exact/client";
import { NetworkingV1Api } from "@kubernetes/client-node";
import { startTestDevnet } from "./helpers/devnet.ts";
import { postJson } from "./helpers/payments.ts";
import { balanceOf, receiptStatus } from "./helpers/chain.ts";
import { describeWithControlPlane } from "./helpers/control-plane.ts";
import { carefulSettle, judge, type Payment } from "./helpers/chaos.ts";
import { clusterOf, condition, until, type Cluster } from "./helpers/cluster.ts";
import { CHART, helmOn } from "./helpers/helm.ts";
import { PG_URL } from "./helpers/hub.ts";
import { imageBuild } from "./helpers/image.ts";
import { describeOnNode, hostAddress, startNode, type HostPort, type RealNode } from "./helpers/node.ts";
import { networkPolicyAvailability, startNetworkPolicies, type NetworkPolicyEngine } from "./helpers/network-policy.ts";
import type { RunningDevnet } from "../services/devnet/devnet.ts";

const SUITE = "the chart on a real node";
const NS = "x402-system"; // the release's namespace, which the operator serves by default
const RELEASE = "fleet";
const FULLNAME = "fleet-x402-fleet";
const STORAGE_CLASS = "node-local";
// several pods starting from one image on a loaded machine (the image's start, embedded stores, probes)
const READY_MS = 600_000;

describeOnNode(SUITE, () =>
  describeWithControlPlane(SUITE, { controllers: true, address: hostAddress }, (cp) => {
    let node: RealNode;
    let cluster: Cluster;
    let devnet: RunningDevnet & { dir: string };
    let rpc: HostPort;
    let postgres: HostPort;
    let helm: ReturnType<typeof helmOn>;
    let image: string;
    // the NetworkPolicy engine, from the start: every test runs with the operator's policy enforced
    const policyEngine = networkPolicyAvailability(SUITE);
    let networkPolicies: NetworkPolicyEngine | undefined;
    const databases = [`x402_e2e_hub_${randomBytes(4).toString("hex")}`, `x402_e2e_wallets_${randomBytes(4).toString("hex")}`];
    const admin = () => new pg.Client({ connectionString: PG_URL });
    const sql = async (text: string) => {
      const c = admin();
      await c.connect();
      try {
        await c.query(text);
      } finally {
        await c.end();
      }
    };

    beforeAll(async () => {
      const built = imageBuild();
      if (!("image" in built)) throw new Error(built.missing);
      image = built.image;
      cluster = clusterOf(cp());
      helm = helmOn(cp().kubeconfigPath);
      // side by side, and whatever started is kept for afterAll even when the other failed
      const started = await Promise.allSettled([startNode(cp(), { images: [built.archive], services: true }), startTestDevnet(["eip155:8453"])]);
      if (started[0].status === "fulfilled") node = started[0].value;
      if (started[1].status === "fulfilled") devnet = started[1].value;
      for (const s of started) if (s.status === "rejected") throw s.reason;
      if (policyEngine.run) networkPolicies = await startNetworkPolicies(cp(), node);
      rpc = await node.expose(Number(new URL(devnet.info.networks[0]!.rpcUrl).port));
      postgres = await node.expose(Number(new URL(PG_URL).port || 5432));
      for (const db of databases) await sql(`CREATE DATABASE ${db}`);
      await node.localVolume("base-store", STORAGE_CLASS);
    }, 600_000);

    afterAll(async () => {
      const policiesLeft = await networkPolicies?.stop().then(() => undefined, (e: Error) => e);
      await node?.stop();
      await devnet?.stop();
      for (const db of databases) await sql(`DROP DATABASE IF EXISTS ${db} WITH (FORCE)`).catch(() => undefined);
      if (policiesLeft) throw policiesLeft;
    }, 240_000);

    const pods = async (component: string) => (await cluster.core.listNamespacedPod({ namespace: NS, labelSelector: `app.kubernetes.io/component=${component}` })).items;
    const explain = (component: string) => async (e: Error) => {
      const list = await pods(component).catch(() => []);
      const logs = list.map((p) => `--- ${p.metadata!.name} ${JSON.stringify(p.status?.containerStatuses ?? p.status?.conditions)}\n${node.containerLog(NS, p.metadata!.name!, component).slice(-3000)}`);
      throw new Error(`${e.message}\n${logs.join("\n")}\n--- kubelet ---\n${node.logOf("kubelet")}\n--- kube-proxy ---\n${node.logOf("kube-proxy")}\n--- coredns ---\n${node.logOf("coredns")}`);
    };
    const dbUrl = (db: string) => `postgres://postgres@${postgres.host}/${db}`;

    it("helm install with the image built here: every Deployment available on the real node; the operator in its pods, under the chart's ServiceAccount, holds its Lease", async () => {
      await cluster.ensureNamespace(NS);
      await cluster.putSecret(NS, "wallets-master", { "master-keys": `k1:${randomBytes(32).toString("hex")}\n` });
      const [repository, tag] = [image.slice(0, image.lastIndexOf(":")), image.slice(image.lastIndexOf(":") + 1)];
      const out = await helm(["install", RELEASE, CHART, "--namespace", NS, "--wait", "--timeout", `${READY_MS / 1000}s`], {
        image: { repository, tag },
        operator: { allowPrivateRpc: true }, // the devnet chain is at the node's address
        router: { replicas: 2, service: { type: "NodePort" } },
        hub: { replicas: 1, database: { url: dbUrl(databases[0]!) } },
        wallets: { enabled: true, replicas: 1, masterKeys: { existingSecret: "wallets-master" }, database: { url: dbUrl(databases[1]!) } },
      });
      expect(out).toContain("STATUS: deployed");

      const deployments = (await cluster.apps.listNamespacedDeployment({ namespace: NS })).items;
      expect(deployments.map((d) => d.metadata!.name).sort()).toEqual([`${FULLNAME}-hub`, `${FULLNAME}-operator`, `${FULLNAME}-router`, `${FULLNAME}-wallets`]);
      for (const d of deployments) expect(d.status!.availableReplicas).toBe(d.spec!.replicas);
      const all = (await cluster.core.listNamespacedPod({ namespace: NS })).items;
      expect(all.length).toBe(6);
      for (const p of all) {
        expect(p.spec!.nodeName).toBe(node.name);
        expect(p.status!.containerStatuses![0]).toMatchObject({ ready: true, image });
        expect(p.status!.containerStatuses![0]!.containerID).toMatch(/^containerd:\/\//);
      }
      // the operator's pods run as the chart's ServiceAccount, and one of them leads: it reached
      // kube-apiserver from its pod (the `kubernetes` Service, through kube-proxy) with that token
      const operators = await pods("operator");
      for (const p of operators) expect(p.spec!.serviceAccountName).toBe(`${FULLNAME}-operator`);
      const lease = await until(async () => (await cluster.coordination.readNamespacedLease({ namespace: NS, name: `${FULLNAME}-operator` })).spec?.holderIdentity, "the operator's Lease held");
      expect(operators.map((p) => p.metadata!.name)).toContain(lease);
    }, READY_MS + 60_000);

    let routerUrl: string;
    /** A payment as a client of a resource server makes it: the reference client signs for the requirements. */
    const paymentBody = async (payerKey: Hex, amount: bigint) => {
      const net = devnet.info.networks[0]!;
      const asset = net.assets.find((a) => a.transferMethods.includes("eip3009"))!;
      const payTo = devnet.info.receivers[0]!.address as Address;
      const requirements = { scheme: "exact", network: net.network, asset: asset.address, amount: amount.toString(), payTo, maxTimeoutSeconds: 60, extra: { name: asset.eip712!.name, version: asset.eip712!.version } };
      const created = await new ExactEvmClient(privateKeyToAccount(payerKey)).createPaymentPayload(2, requirements as never);
      const nonce = (created.payload as { authorization: { nonce: Hex } }).authorization.nonce;
      return { body: { x402Version: 2, paymentPayload: { ...created, accepted: requirements }, paymentRequirements: requirements }, asset, payTo, nonce };
    };
    /** A payment signed by the reference client and sent to the router's NodePort settles: judged on chain (receipt, both balances). */
    const settlesThroughNodePort = async (payerIndex: number, amount: bigint) => {
      const net = devnet.info.networks[0]!;
      const payer = privateKeyToAccount(devnet.info.payers[payerIndex]!.privateKey);
      const { body, asset, payTo } = await paymentBody(devnet.info.payers[payerIndex]!.privateKey, amount);
      const [payerBefore, payeeBefore] = [await balanceOf(net.rpcUrl, asset.address, payer.address), await balanceOf(net.rpcUrl, asset.address, payTo)];
      const settle = await postJson(`${routerUrl}/settle`, body).catch(explain("router"));
      expect(settle.status).toBe(200);
      expect(settle.json).toMatchObject({ success: true, network: net.network, payer: payer.address });
      expect(await receiptStatus(net.rpcUrl, settle.json.transaction as `0x${string}`)).toBe("success");
      expect(await balanceOf(net.rpcUrl, asset.address, payer.address)).toBe(payerBefore - amount);
      expect(await balanceOf(net.rpcUrl, asset.address, payTo)).toBe(payeeBefore + amount);
    };
    it("a FacilitatorNetwork for the devnet chain turns Ready by its pod's readiness; a payment signed by the reference client, sent to the router's NodePort, settles on chain", async () => {
      const net = devnet.info.networks[0]!;
      const signerKeys = readFileSync(join(devnet.dir, "keys", `${net.chainId}.key`), "utf8");
      await cluster.putSecret(NS, "base-signer", { "signer-keys": signerKeys });
      await cluster.putSecret(NS, "base-rpc", { url: `http://${rpc.host}${new URL(net.rpcUrl).pathname}` });
      await cluster.createNetwork(NS, "base", {
        network: net.network,
        rpc: [{ secretKeyRef: { name: "base-rpc", key: "url" } }],
        signerSecretRef: { name: "base-signer" },
        schemes: ["exact"],
        storage: { storageClassName: STORAGE_CLASS, size: "1Gi" },
      });
      const ready = await until(async () => {
        const fn = await cluster.getNetwork(NS, "base");
        return condition(fn, "Ready")?.status === "True" ? fn : undefined;
      }, "the network Ready", READY_MS).catch(explain("facilitator"));
      expect(ready.status!.signers).toEqual(net.signers);
      const [facilitator] = await pods("facilitator");
      expect(facilitator!.spec!.nodeName).toBe(node.name);
      expect(facilitator!.status!.conditions!.find((c) => c.type === "Ready")?.status).toBe("True"); // the kubelet's probe

      // the router's Service as a resource server reaches the ingress: the NodePort at the node IP
      const service = await cluster.core.readNamespacedService({ namespace: NS, name: `${FULLNAME}-router` });
      const nodePort = service.spec!.ports!.find((p) => p.name === "http")!.nodePort!;
      routerUrl = `http://${node.ip}:${nodePort}/v2`;
      // each router pod reloads the routing table the operator wrote (a ConfigMap volume the kubelet
      // refreshes on its own schedule, pod by pod): asked at each pod's address until all list the network
      const routers = await pods("router");
      expect(routers).toHaveLength(2);
      type Supported = { kinds: { x402Version: number; scheme: string; network: string }[] };
      const listed = async (url: string) => {
        const body = (await (await fetch(`${url}/supported`, { signal: AbortSignal.timeout(5000) })).json()) as Supported;
        return body.kinds.some((k) => k.network === net.network) ? body : undefined;
      };
      for (const p of routers) await until(() => listed(`http://${p.status!.podIP}:4020/v2`), `the network in router pod ${p.metadata!.name}'s /supported`, 180_000).catch(explain("router"));
      const supported = await until(() => listed(routerUrl), "the network in /supported through the NodePort");
      expect(supported.kinds.filter((k) => k.network === net.network)).toEqual([{ x402Version: 2, scheme: "exact", network: net.network }]);

      // router pod → base-facilitator.x402-system.svc.cluster.local (CoreDNS) → its ClusterIP (kube-proxy) → the pod
      await settlesThroughNodePort(0, 7919n);
    }, READY_MS + 300_000);

    it("under payment load, a facilitator pod deleted and its container killed by the runtime mid-settlement, the node's kubelet stopped and started, the leader operator's pod killed and the database-less network rolled out by the new leader (never two of its pods at once), and a helm upgrade rolling every Deployment: each payment told success is its transfer on chain, once; no paid payment told failure", async () => {
      const net = devnet.info.networks[0]!;
      const chain = createPublicClient({ transport: http(net.rpcUrl) });
      const payTo = devnet.info.receivers[0]!.address as Address;
      const { asset } = await paymentBody(devnet.info.payers[0]!.privateKey, 1n);
      const startBalances = [await balanceOf(net.rpcUrl, asset.address, payTo)];
      const payments: Payment[] = [];
      let inFlight = 0;
      let loading = true;
      const successes = () => payments.filter((p) => p.callers.some((c) => c.final?.success)).length;
      /** Three more payments told success: the fleet serves again after an operation. */
      const settlesAgain = async (after: string) => {
        const before = successes();
        await until(() => successes() >= before + 3 || undefined, `payments settling ${after}`, 300_000);
      };
      const readyFacilitator = (differentFrom?: string) =>
        until(async () => {
          const [p] = await pods("facilitator");
          return p && p.metadata!.uid !== differentFrom && !p.metadata!.deletionTimestamp && p.status?.conditions?.some((c) => c.type === "Ready" && c.status === "True") ? p : undefined;
        }, "a facilitator pod Ready", READY_MS).catch(explain("facilitator"));
      // three careful clients, each paying again as soon as its payment has a final answer
      const clients = [0, 1, 2].map(async (i) => {
        const payerKey = devnet.info.payers[i % devnet.info.payers.length]!.privateKey;
        while (loading) {
          const amount = 10_000n + BigInt(payments.length);
          const { body, nonce } = await paymentBody(payerKey, amount);
          const payment: Payment = { id: payments.length, from: privateKeyToAccount(payerKey).address, nonce, payTo, amount, body, callers: [] };
          payments.push(payment);
          inFlight++;
          payment.callers.push(await carefulSettle(routerUrl, JSON.stringify(body), 300_000));
          inFlight--;
        }
      });
      try {
        await until(() => successes() >= 3 || undefined, "payments settling before the operations", 300_000);

        // the facilitator pod deleted while a settle is in flight; a new one (Recreate, same claim) takes over
        const [before] = await pods("facilitator");
        await until(() => inFlight > 0 || undefined, "a settle in flight");
        await cluster.core.deleteNamespacedPod({ namespace: NS, name: before!.metadata!.name! });
        const replaced = await readyFacilitator(before!.metadata!.uid);
        await settlesAgain("through the new pod");

        // its container killed by the runtime mid-settlement (SIGKILL, no shutdown: the embedded store
        // recovers from a crash); the kubelet restarts it in the same pod
        const status = replaced.status!.containerStatuses![0]!;
        await until(() => inFlight > 0 || undefined, "a settle in flight");
        node.killContainer(status.containerID!);
        const restarted = await until(async () => {
          const [p] = await pods("facilitator");
          const s = p?.status?.containerStatuses?.[0];
          return p?.metadata!.uid === replaced.metadata!.uid && s && s.restartCount > status.restartCount && s.ready ? s : undefined;
        }, "the killed container restarted and ready", READY_MS).catch(explain("facilitator"));
        expect(restarted.lastState?.terminated?.exitCode).toBe(137);
        await settlesAgain("after the container was killed");

        // the node's kubelet stopped long enough for the node to be unreachable (pods NotReady, out of
        // their Services), its containers still running; then started again: it adopts them
        await node.stopKubelet();
        const nodeReady = async () => (await cluster.core.readNode({ name: node.name })).status!.conditions!.find((c) => c.type === "Ready")!.status;
        await until(async () => ((await nodeReady()) !== "True") || undefined, "the node without its kubelet marked not ready", 180_000);
        node.startKubelet();
        await until(async () => ((await nodeReady()) === "True") || undefined, "the node ready again", 180_000).catch(explain("facilitator"));
        const adopted = await readyFacilitator();
        expect(adopted.metadata!.uid).toBe(replaced.metadata!.uid); // the same pod, never recreated
        await settlesAgain("after the kubelet came back");

        // the leader operator's pod killed (no grace): the other replica takes the Lease, and a change
        // to the network (its resources: a new pod template) is rolled out by the new leader
        const leaseOf = async () => (await cluster.coordination.readNamespacedLease({ namespace: NS, name: `${FULLNAME}-operator` })).spec!.holderIdentity;
        const leader = await leaseOf();
        await cluster.core.deleteNamespacedPod({ namespace: NS, name: leader!, gracePeriodSeconds: 0 });
        const newLeader = await until(async () => {
          const holder = await leaseOf();
          return holder && holder !== leader ? holder : undefined;
        }, "another operator pod holding the Lease", 120_000).catch(explain("operator"));
        expect((await pods("operator")).map((p) => p.metadata!.name)).toContain(newLeader);
        // The network's store is one pod's (no spec.database): through its rollout (Recreate) its
        // containers are counted on the node. (A pod deleted outside a rollout is replaced at once by
        // its ReplicaSet; the replacement waits for the store's lock, unready: test/storage.test.ts.)
        const facilitatorsRunning = node.watchRunning("facilitator");
        const generation = (await cluster.patchNetwork(NS, "base", { spec: { resources: { requests: { cpu: "50m", memory: "256Mi" }, limits: { memory: "1536Mi" } } } })).metadata!.generation!;
        const rolled = await until(async () => {
          const [p] = await pods("facilitator");
          return p && p.spec!.containers[0]!.resources?.limits?.memory === "1536Mi" && p.status?.conditions?.some((c) => c.type === "Ready" && c.status === "True") ? p : undefined;
        }, "the network's new pod template rolled out and Ready", READY_MS).catch(explain("facilitator"));
        expect(rolled.metadata!.uid).not.toBe(replaced.metadata!.uid);
        await until(async () => {
          const fn = await cluster.getNetwork(NS, "base");
          return condition(fn, "Ready")?.status === "True" && fn!.status!.observedGeneration === generation ? fn : undefined;
        }, "the network Ready at its new generation", READY_MS);
        const { max, samples } = await facilitatorsRunning.stop();
        expect(samples).toBeGreaterThan(10);
        expect(max).toBe(1);
        await settlesAgain("after the rollout by the new leader");

        // helm upgrade: a changed pod template for every Deployment of the chart, rolled one pod at a time
        const rollout = { podAnnotations: { "x402fleet.io/rollout": randomBytes(4).toString("hex") } };
        const chartDeployments = async () => (await cluster.apps.listNamespacedDeployment({ namespace: NS, labelSelector: `app.kubernetes.io/instance=${RELEASE}` })).items;
        const deploymentsBefore = (await chartDeployments()).map((d) => [d.metadata!.name!, d.metadata!.generation!] as const);
        expect(deploymentsBefore.length).toBe(4);
        const upgraded = await helm(["upgrade", RELEASE, CHART, "--namespace", NS, "--reuse-values", "--wait", "--timeout", `${READY_MS / 1000}s`], { router: rollout, operator: rollout, hub: rollout, wallets: rollout });
        expect(upgraded).toContain("STATUS: deployed");
        for (const [name, generation] of deploymentsBefore) {
          const d = await cluster.apps.readNamespacedDeployment({ namespace: NS, name });
          expect(d.metadata!.generation).toBeGreaterThan(generation);
          expect(d.status).toMatchObject({ updatedReplicas: d.spec!.replicas, availableReplicas: d.spec!.replicas });
        }
        await settlesAgain("after the upgrade");
      } finally {
        loading = false;
        await Promise.all(clients);
      }

      const { violations, settledOnChain } = await judge({
        chain: chain as never,
        token: asset.address,
        payments,
        receivers: [payTo],
        startBalances,
        endBalances: [await balanceOf(net.rpcUrl, asset.address, payTo)],
        findings: { unhandled: [], exits: [] },
      });
      expect(violations).toEqual([]);
      expect(settledOnChain).toBe(successes());
      expect(payments.every((p) => p.callers.every((c) => c.final?.success))).toBe(true);
    }, 2 * READY_MS + 600_000);

    it.skipIf(!policyEngine.run && !policyEngine.fail)(
      "NetworkPolicies enforced on the node (kube-network-policies): the operator's admits only the router's pods to the facilitator's port 4021 and any peer to its admin port; the chart's refuses a peer outside publicFrom on the router's port 4020 and, with restrictEgress, the router's calls to anything but a facilitator; a payment through the router still settles; every pod stays Ready",
      async () => {
        if (policyEngine.fail) throw new Error(policyEngine.fail);
        const engine = networkPolicies!;
        const ready = async (component: string) =>
          (await pods(component)).filter((p) => !p.metadata!.deletionTimestamp && p.status?.conditions?.some((c) => c.type === "Ready" && c.status === "True"));
        const [facilitator] = await ready("facilitator");
        const routers = await ready("router");
        const [hub] = await ready("hub");
        expect(facilitator && hub && routers.length).toBeTruthy();
        /** Until the engine's caches hold these policies and pods (it judges packets by them). */
        const enforcing = (policies: string[], pods: { metadata?: { name?: string }; status?: { podIP?: string } }[]) =>
          until(
            async () => {
              const known = await engine.known();
              return (policies.every((p) => known.policies.includes(`${NS}/${p}`)) && pods.every((p) => known.pods[p.status!.podIP!] === `${NS}/${p.metadata!.name}`)) || undefined;
            },
            `the engine knowing ${policies.join(", ")}`,
            60_000,
          );
        // the operator's policy has selected the facilitator pod since the network exists
        await enforcing(["base-facilitator"], [facilitator!, ...routers]);

        const url = {
          facilitator: `http://${facilitator!.status!.podIP}:4021/v2/supported`,
          facilitatorAdmin: `http://${facilitator!.status!.podIP}:9421/healthz`,
          router: `http://${routers[0]!.status!.podIP}:4020/v2/supported`,
          routerAdmin: `http://${routers[0]!.status!.podIP}:9420/healthz`,
          routerService: `http://${FULLNAME}-router/v2/supported`, // by name, through CoreDNS and kube-proxy
          hubAdmin: `http://${hub!.status!.podIP}:9430/healthz`,
        };
        type Target = keyof typeof url;
        // Fetches each URL at once, after a delay (a new pod's address reaches the engine through the
        // API server), and prints one line per answer: the HTTP status, "timeout" (a dropped SYN) or an error code.
        const PROBE = [
          "const [delay, ...urls] = process.argv.slice(1);",
          "setTimeout(() => urls.forEach(async (url) => {",
          "  let answer;",
          "  try { answer = (await fetch(url, { signal: AbortSignal.timeout(8000) })).status; }",
          "  catch (e) { answer = e.name === 'TimeoutError' ? 'timeout' : String(e.cause?.code ?? e.message); }",
          "  console.log('probe ' + JSON.stringify({ url, answer }));",
          "}), Number(delay));",
        ].join("\n");
        const answers = (output: string, targets: Target[]) => {
          const by = new Map([...output.matchAll(/probe (\{.*\})/g)].map((m) => JSON.parse(m[1]!) as { url: string; answer: number | string }).map((a) => [a.url, a.answer]));
          return Object.fromEntries(targets.map((t) => [t, by.get(url[t]) ?? "no answer"])) as Partial<Record<Target, number | string>>;
        };
        let probes = 0;
        /** A pod of the image in the release's namespace with these labels (restricted Pod Security), run once. */
        const probeFrom = async (labels: Record<string, string>, targets: Target[]) => {
          const name = `np-probe-${++probes}-${randomBytes(3).toString("hex")}`;
          await cluster.core.createNamespacedPod({
            namespace: NS,
            body: {
              metadata: { name, labels },
              spec: {
                restartPolicy: "Never",
                automountServiceAccountToken: false,
                securityContext: { runAsNonRoot: true, runAsUser: 65532, runAsGroup: 65532, seccompProfile: { type: "RuntimeDefault" } },
                containers: [
                  {
                    name: "probe",
                    image,
                    imagePullPolicy: "Never",
                    command: ["node", "-e", PROBE, "3000", ...targets.map((t) => url[t])],
                    securityContext: { allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, capabilities: { drop: ["ALL"] } },
                    resources: { requests: { cpu: "10m", memory: "64Mi" } },
                  },
                ],
              },
            },
          });
          const done = await until(async () => {
            const p = await cluster.core.readNamespacedPod({ namespace: NS, name });
            return p.status?.phase === "Succeeded" || p.status?.phase === "Failed" ? p : undefined;
          }, `probe pod ${name} done`, 180_000);
          const log = node.containerLog(NS, name, "probe");
          await cluster.core.deleteNamespacedPod({ namespace: NS, name, gracePeriodSeconds: 0 });
          expect(done.status!.phase, log).toBe("Succeeded");
          return { name, answers: answers(log, targets) };
        };
        /** The same probe run inside a router pod's container (through the node's containerd): the peer the policies admit. */
        const fromRouter = (targets: Target[]) => {
          const container = routers[0]!.status!.containerStatuses![0]!.containerID!.replace(/^containerd:\/\//, "");
          const r = node.ctr(["tasks", "exec", "--exec-id", `np-probe-${randomBytes(3).toString("hex")}`, container, "node", "-e", PROBE, "0", ...targets.map((t) => url[t])]);
          expect(r.status, r.output).toBe(0);
          return answers(r.output, targets);
        };
        /** The release's and the network's pods (not the probes), running. */
        const serving = async () =>
          (await cluster.core.listNamespacedPod({ namespace: NS })).items.filter((p) => !p.metadata!.name!.startsWith("np-probe-") && p.status?.phase === "Running" && !p.metadata!.deletionTimestamp);
        const restarts = async () => new Map((await serving()).map((p) => [p.metadata!.name!, p.status!.containerStatuses?.[0]?.restartCount ?? 0]));

        // Before the chart's policies: the operator's refuses a pod that is not the router on 4021 (the
        // same probe from a router pod answers), its admin port answers anyone, the router answers anyone.
        const outsider = { "x402-e2e/probe": "outsider" };
        const before = await probeFrom(outsider, ["facilitator", "facilitatorAdmin", "router", "routerService"]);
        expect(before.answers).toEqual({ facilitator: "timeout", facilitatorAdmin: 200, router: 200, routerService: 200 });
        expect(fromRouter(["facilitator", "hubAdmin"])).toEqual({ facilitator: 200, hubAdmin: 200 });
        // the engine judged and dropped that pod's connection to the facilitator
        expect(engine.log()).toContain(`"Evaluating packet" srcPod="${NS}/${before.name}" dstPod="${NS}/${facilitator!.metadata!.name}"`);

        // The chart's policies: the public ports from one label only
        const restartsBefore = await restarts();
        const allowed = { "x402-e2e/client": "allowed" };
        const upgraded = await helm(["upgrade", RELEASE, CHART, "--namespace", NS, "--reuse-values", "--wait", "--timeout", "120s"], {
          networkPolicy: { enabled: true, publicFrom: [{ podSelector: { matchLabels: allowed } }] },
        });
        expect(upgraded).toContain("STATUS: deployed");
        const policies = (await cluster.kc.makeApiClient(NetworkingV1Api).listNamespacedNetworkPolicy({ namespace: NS })).items.map((p) => p.metadata!.name!).sort();
        expect(policies).toEqual(["base-facilitator", `${FULLNAME}-hub`, `${FULLNAME}-operator`, `${FULLNAME}-router`, `${FULLNAME}-wallets`]);
        await enforcing(policies, await serving());
        const policiesOn = Date.now();

        const outside = await probeFrom(outsider, ["router", "routerService", "routerAdmin", "facilitator", "facilitatorAdmin"]);
        expect(outside.answers).toEqual({ router: "timeout", routerService: "timeout", routerAdmin: 200, facilitator: "timeout", facilitatorAdmin: 200 });
        const inside = await probeFrom(allowed, ["router", "routerService", "facilitator"]);
        expect(inside.answers).toEqual({ router: 200, routerService: 200, facilitator: "timeout" });

        // A payment through the router's NodePort (this host's root traffic, never judged) still reaches
        // the facilitator from a router pod, and settles: judged on chain
        await settlesThroughNodePort(1, 4243n);

        // The router's egress restricted: a facilitator still answers it, the hub's admin port no longer
        const egress = await helm(["upgrade", RELEASE, CHART, "--namespace", NS, "--reuse-values", "--wait", "--timeout", "120s"], { networkPolicy: { router: { restrictEgress: true } } });
        expect(egress).toContain("STATUS: deployed");
        const restricted = await until(() => {
          const a = fromRouter(["facilitator", "hubAdmin"]);
          return a.hubAdmin === 200 ? undefined : a; // until the engine has the updated policy
        }, "the router's egress policy applied", 60_000);
        expect(restricted).toEqual({ facilitator: 200, hubAdmin: "timeout" });

        // The kubelet's probes come from this host: every pod stays Ready past the readiness failure
        // threshold (3 x 10 s) with its policies on, none restarted
        await new Promise((r) => setTimeout(r, Math.max(0, 35_000 - (Date.now() - policiesOn))));
        const restartsAfter = await restarts();
        expect([...restartsAfter.keys()].sort()).toEqual([...restartsBefore.keys()].sort());
        for (const p of await serving()) {
          expect(p.status!.conditions!.find((c) => c.type === "Ready")?.status, p.metadata!.name).toBe("True");
          expect(restartsAfter.get(p.metadata!.name!), p.metadata!.name).toBe(restartsBefore.get(p.metadata!.name!));
        }
      },
      READY_MS,
    );
  }),
);
