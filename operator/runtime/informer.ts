// A client-node informer (list, then watch from the list's resourceVersion; a 410 Gone relists)
// with what client-node leaves to us: restarting with backoff after a non-410 error, ignoring
// the error that stop() itself raises, and knowing when the first list has been delivered.
import { makeInformer, type Informer as ClientInformer, type KubeConfig, type KubernetesObject, type ListPromise, type ObjectCache } from "@kubernetes/client-node";
import type { Logger } from "../../services/platform/logger.ts";
import { describeError } from "../kube.ts";

export interface InformerOptions<T extends KubernetesObject> {
  kubeConfig: KubeConfig;
  /** API path of the collection, e.g. /apis/apps/v1/deployments. */
  path: string;
  list: ListPromise<T>;
  labelSelector?: string;
  logger: Logger;
  onAdd?(obj: T): void;
  onUpdate?(obj: T): void;
  onDelete?(obj: T): void;
  restartDelayMs?: { base: number; max: number };
}

export interface Informer<T extends KubernetesObject> {
  get(name: string, namespace?: string): T | undefined;
  list(namespace?: string): T[];
  /** Resolves once the first list has been delivered to the handlers. */
  synced(): Promise<void>;
  hasSynced(): boolean;
  stop(): Promise<void>;
  /** Count of (re)lists and restarts, for tests and metrics. */
  stats(): { connects: number; errors: number; restarts: number };
}

export function startInformer<T extends KubernetesObject>(opts: InformerOptions<T>): Informer<T> {
  const base = opts.restartDelayMs?.base ?? 200;
  const max = opts.restartDelayMs?.max ?? 30_000;
  const informer: ClientInformer<T> & ObjectCache<T> = makeInformer(opts.kubeConfig, opts.path, opts.list, opts.labelSelector);
  const log = opts.logger.child({ informer: opts.path });
  let stopping = false;
  let synced = false;
  let failures = 0;
  let restartTimer: NodeJS.Timeout | undefined;
  const stats = { connects: 0, errors: 0, restarts: 0 };
  let resolveSynced!: () => void;
  const syncedPromise = new Promise<void>((r) => (resolveSynced = r));

  if (opts.onAdd) informer.on("add", opts.onAdd);
  if (opts.onUpdate) informer.on("update", opts.onUpdate);
  if (opts.onDelete) informer.on("delete", opts.onDelete);
  informer.on("connect", () => {
    stats.connects++;
  });
  informer.on("error", (err: unknown) => {
    // client-node raises an error from stop() itself; and after any other error it stays stopped.
    if (stopping) return;
    stats.errors++;
    failures++;
    const delay = Math.min(max, base * 2 ** Math.min(failures - 1, 20));
    log.warn({ reason: describeError(err), retryInMs: delay }, "informer stopped; restarting");
    restartTimer = setTimeout(() => {
      restartTimer = undefined;
      if (stopping) return;
      stats.restarts++;
      void run();
    }, delay);
    restartTimer.unref?.();
  });

  async function run() {
    const errorsBefore = stats.errors;
    try {
      await informer.start();
    } catch (e) {
      // start() reports failures through the error handler; a throw here is unexpected.
      log.warn({ reason: describeError(e) }, "informer start failed");
      return;
    }
    if (stats.errors === errorsBefore && !stopping) {
      failures = 0;
      if (!synced) {
        synced = true;
        resolveSynced();
      }
    }
  }
  void run();

  return {
    get: (name, namespace) => informer.get(name, namespace),
    list: (namespace) => [...informer.list(namespace)],
    synced: () => syncedPromise,
    hasSynced: () => synced,
    stats: () => ({ ...stats }),
    stop: async () => {
      stopping = true;
      if (restartTimer) clearTimeout(restartTimer);
      await informer.stop();
    },
  };
}
