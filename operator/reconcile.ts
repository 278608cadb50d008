// Reconcile one FacilitatorNetwork, level-triggered and idempotent: read it, hold the finalizer,
// check its inputs, apply its children, write its status when it changed, record events for
// state changes, and bring the routing table in line. Also the routing-table sync itself.
import type { V1Deployment } from "@kubernetes/client-node";
import { parseRoutingTable } from "../services/router/routing-table.ts";
import type { Logger } from "../services/platform/logger.ts";
import { CONTROLLER_NAME, FINALIZER, keyOf, splitKey, type FacilitatorNetwork } from "./api.ts";
import {
  buildDeployment,
  buildEvent,
  buildNetworkPolicy,
  buildPersistentVolumeClaim,
  buildPodDisruptionBudget,
  buildRoutingConfigMap,
  buildRoutingTable,
  buildRouterTokensConfigMap,
  buildService,
  buildStatus,
  childName,
  conditionOf,
  deploymentState,
  networkOwner,
  rfc3339,
  sameStatus,
  transitionEvents,
  type DeploymentState,
  type EventSpec,
  DEFAULT_ROUTER_POD_LABELS,
  type RouterAccess,
} from "./builders.ts";
import { routerTokenDigests } from "../services/platform/router-token.ts";
import type { ChainChecker } from "./chain-checks.ts";
import { checkInputs, type InputCheck } from "./checks.ts";
import { apply, deleteOwnedPdb, describeError, getNetwork, readSecret, updateNetwork, type Kube } from "./kube.ts";
import { done, type ReconcileResult } from "./runtime/controller.ts";

export interface ReconcilerConfig {
  image: string;
  clusterDomain: string;
  routingConfigMap: { name: string; namespace: string };
  identity: string;
  /** The router's pods (the only peers of a facilitator's service port) and its token Secret, when it has one; default: pods labelled component=router beside the routing ConfigMap, no token. */
  router?: { namespace: string; podLabels: Record<string, string>; tokenSecret?: { name: string; key: string } };
}

export interface ReconcilerDeps {
  kube: Kube;
  /** Informer caches: every FacilitatorNetwork, and the Deployments the operator manages. */
  cachedNetworks(): FacilitatorNetwork[];
  cachedDeployment(namespace: string, name: string): V1Deployment | undefined;
  chainIdOf(url: string): Promise<number>;
  /** The doctor's chain checks, reported as the ChainChecked condition (off when absent). */
  chainChecks?: ChainChecker;
  config: ReconcilerConfig;
  logger: Logger;
  clock?: () => Date;
}

export interface Reconciler {
  reconcileNetwork(key: string): Promise<ReconcileResult>;
  /** Rewrites the routing ConfigMap from the cache (plus a fresher copy of one resource, when given). */
  syncRoutingTable(fresh?: FacilitatorNetwork): Promise<void>;
}

/** Serialises the routing-table writes of concurrent workers. */
function mutex() {
  let tail: Promise<unknown> = Promise.resolve();
  return <T>(fn: () => Promise<T>): Promise<T> => {
    const run = tail.then(fn, fn);
    tail = run.catch(() => undefined);
    return run;
  };
}

const TOMBSTONE_TTL_MS = 10 * 60_000;

export function createReconciler(deps: ReconcilerDeps): Reconciler {
  const { kube, config } = deps;
  const clock = deps.clock ?? (() => new Date());
  const serial = mutex();
  /** uids whose finalizer we released: never listed again, even from a stale cache. */
  const tombstones = new Map<string, number>();
  let eventSeq = 0;

  async function syncRoutingTable(fresh?: FacilitatorNetwork): Promise<void> {
    await serial(async () => {
      const now = clock().getTime();
      for (const [uid, at] of tombstones) if (now - at > TOMBSTONE_TTL_MS) tombstones.delete(uid);
      const byUid = new Map<string, FacilitatorNetwork>();
      for (const fn of deps.cachedNetworks()) byUid.set(fn.metadata.uid ?? keyOf(fn.metadata.namespace!, fn.metadata.name), fn);
      if (fresh?.metadata.uid) byUid.set(fresh.metadata.uid, fresh);
      const listed = [...byUid.values()].filter((fn) => !tombstones.has(fn.metadata.uid ?? ""));
      const table = buildRoutingTable(listed, config.clusterDomain);
      parseRoutingTable(JSON.stringify(table)); // the router's own parser: never write a table it would refuse
      await apply.configMap(kube, buildRoutingConfigMap(table, config.routingConfigMap));
    });
  }

  async function recordEvents(fn: FacilitatorNetwork, events: EventSpec[], log: Logger) {
    for (const e of events) {
      const body = buildEvent(fn, e, { now: clock(), seq: eventSeq++, instance: config.identity, controller: CONTROLLER_NAME });
      try {
        await kube.events.createNamespacedEvent({ namespace: fn.metadata.namespace!, body: body as never });
      } catch (err) {
        log.warn({ reason: describeError(err), event: e.reason }, "could not record an event");
      }
    }
  }

  async function reconcileNetwork(key: string): Promise<ReconcileResult> {
    const { namespace, name } = splitKey(key);
    let fn = await getNetwork(kube, namespace, name);
    if (!fn) {
      await syncRoutingTable(); // gone: make sure no entry outlives it
      return done;
    }
    const log = deps.logger.child({ facilitatorNetwork: key, generation: fn.metadata.generation });

    if (fn.metadata.deletionTimestamp) {
      if (!fn.metadata.finalizers?.includes(FINALIZER)) return done;
      tombstones.set(fn.metadata.uid!, clock().getTime());
      deps.chainChecks?.forget(fn);
      await syncRoutingTable(fn);
      await updateNetwork(kube, { ...fn, metadata: { ...fn.metadata, finalizers: fn.metadata.finalizers.filter((f) => f !== FINALIZER) } });
      log.info({ network: fn.spec.network }, "routing entry removed; finalizer released (children are garbage-collected)");
      return done;
    }

    if (!fn.metadata.finalizers?.includes(FINALIZER)) {
      // Before any external state exists. This does not bump the generation: go on with the result.
      fn = await updateNetwork(kube, { ...fn, metadata: { ...fn.metadata, finalizers: [...(fn.metadata.finalizers ?? []), FINALIZER] } });
    }

    const check = await observe(fn);
    if (!check.observation.blocker && check.resolved && deps.chainChecks) {
      check.observation.chainCheck = deps.chainChecks.resultFor(fn, { resolved: check.resolved, secretsHash: check.secretsHash });
    }
    let dep: DeploymentState | undefined;
    if (!check.observation.blocker) {
      // The claim first: a pod of the new template must not wait for it. Kept when a database is
      // added later (it may hold settlements still in flight); collected with the resource.
      const claim = buildPersistentVolumeClaim(fn);
      if (claim) await apply.persistentVolumeClaim(kube, claim);
      // The router's token digests before the pods that mount them; the policy with the Service.
      const router = await routerAccess();
      if (router.tokenDigests) await apply.configMap(kube, buildRouterTokensConfigMap(fn, router.tokenDigests));
      const applied = await apply.deployment(kube, buildDeployment(fn, { image: config.image, secretsHash: check.secretsHash, routerTokens: Boolean(router.tokenDigests) }));
      await apply.networkPolicy(kube, buildNetworkPolicy(fn, router));
      await apply.service(kube, buildService(fn));
      const pdb = buildPodDisruptionBudget(fn);
      if (pdb) await apply.podDisruptionBudget(kube, pdb);
      else await deleteOwnedPdb(kube, namespace, childName(fn), fn.metadata.uid!);
      dep = deploymentState(applied);
    } else {
      // Inputs are broken: leave running pods alone (they still hold the last good configuration).
      const existing = deps.cachedDeployment(namespace, childName(fn));
      dep = existing ? deploymentState(existing) : undefined;
    }

    const status = buildStatus(fn, check.observation, dep, { now: rfc3339(clock()), clusterDomain: config.clusterDomain });
    let current = fn;
    if (!sameStatus(fn.status, status)) {
      current = await apply.networkStatus(kube, fn, status);
      const ready = conditionOf(status, "Ready")!;
      log.info({ ready: ready.status, reason: ready.reason, observedGeneration: status.observedGeneration }, "status updated");
      await recordEvents(current, transitionEvents(fn.status, status), log);
    }
    await syncRoutingTable(current);

    const problem = check.observation.blocker ?? check.observation.warning;
    if (problem) {
      log.info({ reason: problem.reason, blocking: Boolean(check.observation.blocker) }, "degraded; will check again");
      return { action: "backoff", reason: problem.reason };
    }
    return done;
  }

  /** Read on every reconcile (a rotation edits the Secret): a missing or broken Secret fails the pass, never opens the port. */
  async function routerAccess(): Promise<RouterAccess> {
    const { namespace, podLabels, tokenSecret } = config.router ?? { namespace: config.routingConfigMap.namespace, podLabels: DEFAULT_ROUTER_POD_LABELS };
    if (!tokenSecret) return { namespace, podLabels };
    const value = (await readSecret(kube, namespace, tokenSecret.name))?.data[tokenSecret.key];
    if (value === undefined) throw new Error(`the router token Secret ${namespace}/${tokenSecret.name} has no key ${tokenSecret.key}`);
    return { namespace, podLabels, tokenDigests: routerTokenDigests(value) };
  }

  async function observe(fn: FacilitatorNetwork): Promise<InputCheck> {
    const owner = networkOwner([...deps.cachedNetworks().filter((f) => f.metadata.uid !== fn.metadata.uid), fn], fn.spec.network);
    if (owner && owner.metadata.uid !== fn.metadata.uid) {
      return {
        observation: {
          blocker: {
            reason: "NetworkConflict",
            message: `${fn.spec.network} is already served by FacilitatorNetwork ${owner.metadata.namespace}/${owner.metadata.name}`,
          },
        },
        secretsHash: "",
      };
    }
    return checkInputs(fn, { readSecret: (ns, n) => readSecret(kube, ns, n), chainIdOf: deps.chainIdOf });
  }

  return { reconcileNetwork, syncRoutingTable };
}
