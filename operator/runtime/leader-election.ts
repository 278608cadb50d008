// Leader election over a coordination.k8s.io/v1 Lease, as client-go does it: a candidate takes
// the Lease when it is free or its holder stopped renewing for a whole lease duration (measured
// on our own clock from when we last saw the record change, so clock skew between nodes does
// not matter); the leader renews every retry period and steps down when it could not renew
// within the renew deadline. Every write carries the resourceVersion read: two candidates
// racing for the same Lease get one success and one 409.
import type { CoordinationV1Api, V1Lease } from "@kubernetes/client-node";
import type { Logger } from "../../services/platform/logger.ts";
import { microTime } from "../builders.ts";
import { describeError, isConflict, isNotFound } from "../kube.ts";

export interface LeaderElectionOptions {
  api: CoordinationV1Api;
  namespace: string;
  name: string;
  identity: string;
  /** controller-runtime defaults: 15 s, 10 s, 2 s. */
  leaseDurationMs: number;
  renewDeadlineMs: number;
  retryPeriodMs: number;
  logger: Logger;
  now?: () => number;
}

export interface LeaderElector {
  /** Resolves when this candidate becomes the leader (or never, if stopped first). */
  acquired(): Promise<void>;
  /** Resolves when leadership is lost after having been acquired. */
  lost(): Promise<void>;
  isLeader(): boolean;
  /** Stops campaigning; a leader releases the Lease so another replica takes over at once. */
  stop(opts?: { release?: boolean }): Promise<void>;
}

export function startLeaderElection(opts: LeaderElectionOptions): LeaderElector {
  const now = opts.now ?? Date.now;
  const log = opts.logger.child({ lease: `${opts.namespace}/${opts.name}` });
  let observed: { key: string; at: number } | undefined;
  let leader = false;
  let stopped = false;
  let lastRenew = 0;
  let timer: NodeJS.Timeout | undefined;
  let inFlight: Promise<unknown> = Promise.resolve();
  let resolveAcquired!: () => void;
  let resolveLost!: () => void;
  const acquired = new Promise<void>((r) => (resolveAcquired = r));
  const lost = new Promise<void>((r) => (resolveLost = r));
  const leaseSeconds = Math.max(1, Math.ceil(opts.leaseDurationMs / 1000));

  const record = (lease: V1Lease) => `${lease.spec?.holderIdentity ?? ""}|${String(lease.spec?.renewTime ?? "")}|${lease.metadata?.resourceVersion ?? ""}`;

  async function tryAcquireOrRenew(): Promise<boolean> {
    const stamp = microTime(new Date(now()));
    let lease: V1Lease;
    try {
      lease = await opts.api.readNamespacedLease({ namespace: opts.namespace, name: opts.name });
    } catch (e) {
      if (!isNotFound(e)) throw e;
      try {
        await opts.api.createNamespacedLease({
          namespace: opts.namespace,
          body: {
            apiVersion: "coordination.k8s.io/v1",
            kind: "Lease",
            metadata: { name: opts.name, namespace: opts.namespace },
            spec: { holderIdentity: opts.identity, leaseDurationSeconds: leaseSeconds, acquireTime: stamp as never, renewTime: stamp as never, leaseTransitions: 0 },
          },
        });
        return true;
      } catch (err) {
        if (isConflict(err)) return false; // somebody else created it first
        throw err;
      }
    }
    const key = record(lease);
    if (!observed || observed.key !== key) observed = { key, at: now() };
    const holder = lease.spec?.holderIdentity ?? "";
    const mine = holder === opts.identity;
    if (holder && !mine && observed.at + opts.leaseDurationMs > now()) return false; // held and fresh
    const spec = lease.spec ?? {};
    const body: V1Lease = {
      ...lease,
      spec: {
        ...spec,
        holderIdentity: opts.identity,
        leaseDurationSeconds: leaseSeconds,
        renewTime: stamp as never,
        acquireTime: (mine ? spec.acquireTime : stamp) as never,
        leaseTransitions: mine ? (spec.leaseTransitions ?? 0) : (spec.leaseTransitions ?? 0) + (holder ? 1 : 0),
      },
    };
    try {
      const updated = await opts.api.replaceNamespacedLease({ namespace: opts.namespace, name: opts.name, body });
      observed = { key: record(updated), at: now() };
      return true;
    } catch (e) {
      if (isConflict(e)) return false;
      throw e;
    }
  }

  async function tick() {
    timer = undefined;
    if (stopped) return;
    let ok = false;
    try {
      const attempt = tryAcquireOrRenew();
      inFlight = attempt.catch(() => undefined);
      ok = await attempt;
    } catch (e) {
      log.warn({ reason: describeError(e) }, "lease request failed");
    }
    if (stopped) return;
    if (ok) {
      lastRenew = now();
      if (!leader) {
        leader = true;
        log.info("became the leader");
        resolveAcquired();
      }
    } else if (leader && now() - lastRenew > opts.renewDeadlineMs) {
      leader = false;
      stopped = true;
      log.error("could not renew the lease within the renew deadline; stepping down");
      resolveLost();
      return;
    }
    timer = setTimeout(() => void tick(), opts.retryPeriodMs);
  }
  void tick();

  return {
    acquired: () => acquired,
    lost: () => lost,
    isLeader: () => leader,
    async stop({ release = true } = {}) {
      stopped = true;
      if (timer) clearTimeout(timer);
      await inFlight;
      const wasLeader = leader;
      leader = false;
      if (!wasLeader || !release) return;
      try {
        const lease = await opts.api.readNamespacedLease({ namespace: opts.namespace, name: opts.name });
        if (lease.spec?.holderIdentity !== opts.identity) return;
        const stamp = microTime(new Date(now()));
        // client-go's release: an empty holder and a 1 s lease, so a candidate need not wait.
        await opts.api.replaceNamespacedLease({
          namespace: opts.namespace,
          name: opts.name,
          body: { ...lease, spec: { ...lease.spec, holderIdentity: "", leaseDurationSeconds: 1, renewTime: stamp as never, acquireTime: stamp as never } },
        });
        log.info("released the lease");
      } catch (e) {
        log.warn({ reason: describeError(e) }, "could not release the lease");
      }
    },
  };
}
