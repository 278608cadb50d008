// The operator process: campaign for the Lease; as the leader, start informers on
// FacilitatorNetworks, the Deployments we manage, Secret metadata and the routing ConfigMap, wait for
// their first lists, and run the workers. On SIGTERM: stop taking keys, let passes in progress
// finish, release the Lease. On a lost Lease: stop at once (the process exits and restarts).
import { hostname } from "node:os";
import { randomBytes } from "node:crypto";
import type { KubeConfig, KubernetesObject, V1ConfigMap, V1Deployment } from "@kubernetes/client-node";
import { createLogger, type Logger } from "../services/platform/logger.ts";
import type { Metrics } from "../services/platform/metrics.ts";
import { API_VERSION, KIND, LABEL_COMPONENT, LABEL_MANAGED_BY, MANAGED_BY, keyOf, type FacilitatorNetwork } from "./api.ts";
import { DEFAULT_ROUTER_POD_LABELS, referencedSecrets } from "./builders.ts";
import { createChainChecker } from "./chain-checks.ts";
import { fetchChainId } from "./checks.ts";
import { createEgress } from "../services/platform/egress.ts";
import { connect, listNetworks, listSecretMetadata, metadataWatchConfig, networksPath } from "./kube.ts";
import { createReconciler } from "./reconcile.ts";
import { createController, done, type Controller } from "./runtime/controller.ts";
import { startInformer, type Informer } from "./runtime/informer.ts";
import { startLeaderElection, type LeaderElector } from "./runtime/leader-election.ts";
import type { RateLimiterOptions } from "./runtime/queue.ts";

export const ROUTING_KEY = "~routing-table";

const asNetwork = (o: KubernetesObject) => o as unknown as FacilitatorNetwork;

export interface OperatorOptions {
  kubeConfig: KubeConfig;
  /** The operator's own namespace: the routing ConfigMap and the Lease live here. */
  namespace: string;
  /** Watch one namespace only (default: all). */
  watchNamespace?: string;
  /** Facilitator image for resources that do not set spec.image. */
  facilitatorImage: string;
  identity?: string;
  routingConfigMap?: string;
  clusterDomain?: string;
  /** The router's pod labels in `namespace` (default: app.kubernetes.io/component=router): the only peers of a facilitator's service port. */
  routerPodLabels?: Record<string, string>;
  /** A Secret in `namespace` holding the router's tokens (platform/router-token.ts): facilitators then settle only for the router. */
  routerTokenSecret?: { name: string; key: string };
  /** false disables leader election (a single replica); durations default to controller-runtime's. */
  leaderElection?: false | { leaseName?: string; leaseDurationMs?: number; renewDeadlineMs?: number; retryPeriodMs?: number };
  workers?: number;
  resyncPeriodMs?: number;
  rateLimits?: RateLimiterOptions;
  rpcTimeoutMs?: number;
  /**
   * Let RPC endpoints of FacilitatorNetworks be loopback, private or cluster-internal addresses
   * (a node in the cluster, a devnet). Off by default: the operator then never connects to them.
   */
  allowPrivateRpc?: boolean;
  /** The doctor's checks per network as its ChainChecked condition; false turns them off. */
  chainChecks?: false | { intervalMs?: number };
  shutdownTimeoutMs?: number;
  logger?: Logger;
  /** x402_operator_* series (services/platform/metrics.ts), when the process exports metrics. */
  metrics?: Metrics;
}

export type Outcome = "done" | "requeue" | "backoff" | "conflict" | "error";

export interface RunningOperator {
  identity: string;
  isLeader(): boolean;
  /** The leader's informers have delivered their first lists. */
  synced(): boolean;
  /** Resolves with why the operator ended: a graceful stop, or a lost Lease. */
  ended: Promise<"stopped" | "leadership-lost">;
  /** Graceful: stop taking work, finish passes in progress, release the Lease. */
  stop(): Promise<void>;
  /** What a crash looks like to the others: everything stops, the Lease is not released. */
  halt(): Promise<void>;
  stats(): { reconciles: Record<Outcome, number>; informers: Record<string, { connects: number; errors: number; restarts: number }> };
}

/** x402_operator_networks{condition,status}: how many resources are in each condition state. */
function countNetworks(metrics: Metrics, fns: FacilitatorNetwork[]) {
  metrics.operatorNetworks.reset();
  for (const type of ["Ready", "Progressing", "Degraded"] as const) {
    // every status present, at 0 when no network has it: "0 not Ready" on a dashboard, not "No data"
    for (const status of ["True", "False", "Unknown"]) metrics.operatorNetworks.set({ condition: type, status }, 0);
    for (const fn of fns) {
      const status = fn.status?.conditions?.find((c) => c.type === type)?.status ?? "Unknown";
      metrics.operatorNetworks.inc({ condition: type, status });
    }
  }
}

export function defaultIdentity(): string {
  return process.env.POD_NAME ?? `${hostname()}_${randomBytes(4).toString("hex")}`;
}

export async function startOperator(opts: OperatorOptions): Promise<RunningOperator> {
  const identity = opts.identity ?? defaultIdentity();
  const logger = (opts.logger ?? createLogger("operator")).child({ identity });
  const kube = connect(opts.kubeConfig);
  // Every request to a FacilitatorNetwork's RPC endpoints goes through the guard (SSRF).
  const egress = createEgress({ allowPrivateNetworks: opts.allowPrivateRpc ?? false });
  const reconciles: Record<Outcome, number> = { done: 0, requeue: 0, backoff: 0, conflict: 0, error: 0 };
  let informers: Record<string, Informer<KubernetesObject>> = {};
  let controller: Controller | undefined;
  let resync: NodeJS.Timeout | undefined;
  let state: "candidate" | "leading" | "ended" = "candidate";
  let synced = false;
  let resolveEnded!: (why: "stopped" | "leadership-lost") => void;
  const ended = new Promise<"stopped" | "leadership-lost">((r) => (resolveEnded = r));

  const le = opts.leaderElection === false ? undefined : (opts.leaderElection ?? {});
  const elector: LeaderElector | undefined = le
    ? startLeaderElection({
        api: kube.coordination,
        namespace: opts.namespace,
        name: le.leaseName ?? "x402-fleet-operator",
        identity,
        leaseDurationMs: le.leaseDurationMs ?? 15_000,
        renewDeadlineMs: le.renewDeadlineMs ?? 10_000,
        retryPeriodMs: le.retryPeriodMs ?? 2_000,
        logger,
      })
    : undefined;

  async function lead() {
    // The queue and workers exist before any informer can deliver an event; the caches they read
    // (declared below) are only read once the workers start, after the first lists.
    const reconciler = createReconciler({
      kube,
      cachedNetworks: () => networks.list(),
      cachedDeployment: (namespace, name) => deployments.get(name, namespace),
      chainIdOf: (url) => fetchChainId(url, opts.rpcTimeoutMs ?? 5000, egress.fetch),
      chainChecks:
        opts.chainChecks === false
          ? undefined
          : createChainChecker({ onDone: (key) => controller?.enqueue(key), logger, intervalMs: opts.chainChecks?.intervalMs, rpcTimeoutMs: opts.rpcTimeoutMs, fetchFn: egress.fetch }),
      config: {
        image: opts.facilitatorImage,
        clusterDomain: opts.clusterDomain ?? "cluster.local",
        routingConfigMap: { name: opts.routingConfigMap ?? "x402-fleet-routing", namespace: opts.namespace },
        router: { namespace: opts.namespace, podLabels: opts.routerPodLabels ?? DEFAULT_ROUTER_POD_LABELS, tokenSecret: opts.routerTokenSecret },
        identity,
      },
      logger,
    });
    const ctrl = createController({
      name: "facilitatornetwork",
      workers: opts.workers ?? 2,
      rateLimits: opts.rateLimits,
      logger,
      reconcile: async (key) => (key === ROUTING_KEY ? (await reconciler.syncRoutingTable(), done) : reconciler.reconcileNetwork(key)),
      onResult: (_key, outcome, ms) => {
        reconciles[outcome]++;
        opts.metrics?.reconcileTotal.inc({ result: outcome });
        opts.metrics?.reconcileDuration.observe(ms / 1000);
        if (opts.metrics) countNetworks(opts.metrics, networks.list());
      },
    });
    controller = ctrl;

    const networkObjects = startInformer<KubernetesObject>({
      kubeConfig: opts.kubeConfig,
      path: networksPath(opts.watchNamespace),
      list: () => listNetworks(kube, opts.watchNamespace),
      logger,
      onAdd: (o) => onNetwork(asNetwork(o), true),
      onUpdate: (o) => onNetwork(asNetwork(o), false),
      onDelete: (o) => onNetwork(asNetwork(o), true),
    });
    const networks = { list: (namespace?: string) => networkObjects.list(namespace).map(asNetwork) };
    const ns = opts.watchNamespace;
    const managed = `${LABEL_MANAGED_BY}=${MANAGED_BY}`;
    const deployments = startInformer<V1Deployment>({
      kubeConfig: opts.kubeConfig,
      path: ns ? `/apis/apps/v1/namespaces/${ns}/deployments` : "/apis/apps/v1/deployments",
      list: () =>
        ns ? kube.apps.listNamespacedDeployment({ namespace: ns, labelSelector: managed }) : kube.apps.listDeploymentForAllNamespaces({ labelSelector: managed }),
      labelSelector: managed,
      logger,
      onAdd: onOwned,
      onUpdate: onOwned,
      onDelete: onOwned,
    });
    // Secret metadata only: a change to a referenced Secret queues its networks, whose reconcile
    // then reads just the Secrets they reference.
    const secrets = startInformer<KubernetesObject>({
      kubeConfig: metadataWatchConfig(opts.kubeConfig),
      path: ns ? `/api/v1/namespaces/${ns}/secrets` : "/api/v1/secrets",
      list: () => listSecretMetadata(kube, ns),
      logger,
      onAdd: onSecret,
      onUpdate: onSecret,
      onDelete: onSecret,
    });
    const routingSelector = `${managed},${LABEL_COMPONENT}=routing-table`;
    const routing = startInformer<V1ConfigMap>({
      kubeConfig: opts.kubeConfig,
      path: `/api/v1/namespaces/${opts.namespace}/configmaps`,
      list: () => kube.core.listNamespacedConfigMap({ namespace: opts.namespace, labelSelector: routingSelector }),
      labelSelector: routingSelector,
      logger,
      onUpdate: () => controller?.enqueue(ROUTING_KEY),
      onDelete: () => controller?.enqueue(ROUTING_KEY),
    });
    informers = { networks: networkObjects, deployments, secrets, routing } as Record<string, Informer<KubernetesObject>>;


    function onNetwork(fn: FacilitatorNetwork, membershipChanged: boolean) {
      const key = keyOf(fn.metadata.namespace!, fn.metadata.name);
      ctrl.enqueue(key);
      ctrl.enqueue(ROUTING_KEY);
      // Who serves a network is decided among all resources naming it: let the others re-decide.
      if (membershipChanged) {
        for (const other of networks.list()) {
          if (other.spec.network === fn.spec.network && other.metadata.uid !== fn.metadata.uid) ctrl.enqueue(keyOf(other.metadata.namespace!, other.metadata.name));
        }
      }
    }
    function onOwned(d: V1Deployment) {
      const owner = d.metadata?.ownerReferences?.find((r) => r.controller && r.kind === KIND && r.apiVersion === API_VERSION);
      if (owner && d.metadata?.namespace) ctrl.enqueue(keyOf(d.metadata.namespace, owner.name));
    }
    function onSecret(s: KubernetesObject) {
      const namespace = s.metadata?.namespace;
      const name = s.metadata?.name;
      if (!namespace || !name) return;
      // the router's tokens reach every network's facilitators
      if (namespace === opts.namespace && name === opts.routerTokenSecret?.name) for (const fn of networks.list()) ctrl.enqueue(keyOf(fn.metadata.namespace!, fn.metadata.name));
      for (const fn of networks.list(namespace)) if (referencedSecrets(fn).includes(name)) ctrl.enqueue(keyOf(namespace, fn.metadata.name));
    }

    await Promise.all(Object.values(informers).map((i) => i.synced()));
    if (state !== "leading") return;
    synced = true;
    ctrl.enqueue(ROUTING_KEY);
    ctrl.start();
    logger.info({ watchNamespace: opts.watchNamespace ?? "(all)", networks: networks.list().length }, "caches synced; reconciling");
    const period = opts.resyncPeriodMs ?? 10 * 60_000;
    resync = setInterval(() => {
      for (const fn of networks.list()) ctrl.enqueue(keyOf(fn.metadata.namespace!, fn.metadata.name));
      ctrl.enqueue(ROUTING_KEY);
    }, period);
    resync.unref?.();
  }

  async function shutDownControllers(graceful: boolean) {
    if (resync) clearInterval(resync);
    await Promise.all(Object.values(informers).map((i) => i.stop()));
    if (controller) await (graceful ? controller.stop(opts.shutdownTimeoutMs ?? 30_000) : controller.stop(0));
  }

  async function begin() {
    if (elector) {
      await elector.acquired();
      if (state !== "candidate") return;
    }
    state = "leading";
    await lead();
  }
  void begin().catch((e) => logger.error({ reason: (e as Error).message }, "operator failed to start"));

  void elector?.lost().then(async () => {
    if (state === "ended") return;
    state = "ended";
    logger.error("leadership lost; stopping");
    // A failed shutdown must still end the term (the process exits and restarts as a candidate).
    await shutDownControllers(false).catch((e) => logger.error({ reason: (e as Error).message }, "controllers did not shut down cleanly"));
    resolveEnded("leadership-lost");
  });

  return {
    identity,
    isLeader: () => state === "leading" && (elector?.isLeader() ?? true),
    synced: () => synced,
    ended,
    stats: () => ({
      reconciles: { ...reconciles },
      informers: Object.fromEntries(Object.entries(informers).map(([k, i]) => [k, i.stats()])),
    }),
    async stop() {
      if (state === "ended") return;
      state = "ended";
      logger.info("shutting down");
      await shutDownControllers(true);
      await elector?.stop({ release: true });
      await egress.close();
      resolveEnded("stopped");
    },
    async halt() {
      if (state === "ended") return;
      state = "ended";
      await elector?.stop({ release: false });
      await shutDownControllers(false);
      await egress.close();
      resolveEnded("stopped");
    },
  };
}
