// The reconcile loop: workers take keys from the queue and run reconcile(key). The result says
// what happens next (kube-rs style): done (forget the key's backoff), requeue after a delay, or
// back off (a condition outside our control, e.g. a missing Secret); a thrown error backs off too.
import type { Logger } from "../../services/platform/logger.ts";
import { describeError, isConflict } from "../kube.ts";
import { RateLimiter, WorkQueue, type RateLimiterOptions } from "./queue.ts";

export type ReconcileResult = { action: "done" } | { action: "requeueAfter"; ms: number } | { action: "backoff"; reason: string };

export const done: ReconcileResult = { action: "done" };

export interface ControllerOptions {
  name: string;
  reconcile(key: string): Promise<ReconcileResult>;
  workers: number;
  rateLimits?: RateLimiterOptions;
  logger: Logger;
  /** Called after every pass, for metrics and tests. */
  onResult?(key: string, outcome: "done" | "requeue" | "backoff" | "conflict" | "error", durationMs: number): void;
}

export interface Controller {
  enqueue(key: string): void;
  enqueueAfter(key: string, ms: number): void;
  start(): void;
  /** Stops handing out keys and waits (up to timeoutMs) for passes in progress. */
  stop(timeoutMs?: number): Promise<void>;
  queue: WorkQueue;
}

export function createController(opts: ControllerOptions): Controller {
  const queue = new WorkQueue(new RateLimiter(opts.rateLimits));
  const log = opts.logger.child({ controller: opts.name });
  let workers: Promise<void>[] = [];

  async function worker() {
    for (;;) {
      const key = await queue.get();
      if (key === undefined) return;
      const started = performance.now();
      let outcome: "done" | "requeue" | "backoff" | "conflict" | "error" = "done";
      try {
        const result = await opts.reconcile(key);
        if (result.action === "done") queue.forget(key);
        else if (result.action === "requeueAfter") {
          outcome = "requeue";
          queue.forget(key);
          queue.addAfter(key, result.ms);
        } else {
          outcome = "backoff";
          const delay = queue.addRateLimited(key);
          log.debug({ key, reason: result.reason, retryInMs: delay }, "backing off");
        }
      } catch (e) {
        const delay = queue.addRateLimited(key);
        if (isConflict(e)) {
          outcome = "conflict";
          log.debug({ key, retryInMs: delay }, "conflict; reading again");
        } else {
          outcome = "error";
          log.warn({ key, reason: describeError(e), retryInMs: delay }, "reconcile failed");
        }
      } finally {
        queue.done(key);
      }
      opts.onResult?.(key, outcome, performance.now() - started);
    }
  }

  return {
    queue,
    enqueue: (key) => queue.add(key),
    enqueueAfter: (key, ms) => queue.addAfter(key, ms),
    start() {
      workers = Array.from({ length: opts.workers }, () => worker());
    },
    async stop(timeoutMs = 30_000) {
      let timer: NodeJS.Timeout | undefined;
      const timeout = new Promise<void>((r) => {
        timer = setTimeout(() => {
          log.warn({ timeoutMs }, "reconciles still running at shutdown; giving up waiting");
          r();
        }, timeoutMs);
      });
      await Promise.race([Promise.all([queue.shutDown(), ...workers]).then(() => undefined), timeout]);
      clearTimeout(timer);
    },
  };
}
