// The admin port of every service, apart from the public /v2 surface (the contract has no health
// endpoint): /metrics (Prometheus), /healthz (liveness), /readyz (readiness with named checks).
import Fastify, { type FastifyBaseLogger, type FastifyInstance } from "fastify";
import type { Registry } from "prom-client";
import type { Logger } from "./logger.ts";
import { resolveServerTimeouts, serverTimeoutOptions, type ServerTimeouts } from "./timeouts.ts";

export interface ReadinessCheck {
  name: string;
  /** Resolves true when ready; a rejection or false means not ready. */
  check(): Promise<boolean>;
}

export interface AdminOptions {
  host: string;
  port: number;
  registry: Registry;
  checks: ReadinessCheck[];
  logger: Logger;
  /** Per-check bound so /readyz itself never hangs. */
  checkTimeoutMs?: number;
  /** Connection bounds (slow clients); unset ones come from HTTP_*_TIMEOUT_MS or the defaults. */
  timeouts?: Partial<ServerTimeouts>;
  /** A service's own admin routes (their own error handling: registered in a scope of their own). */
  routes?: (app: FastifyInstance) => void;
}

export interface RunningAdmin {
  url: string;
  close(): Promise<void>;
}

async function runCheck(c: ReadinessCheck, timeoutMs: number): Promise<boolean> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<boolean>((resolve) => (timer = setTimeout(() => resolve(false), timeoutMs)));
  try {
    return await Promise.race([c.check().catch(() => false), timeout]);
  } finally {
    clearTimeout(timer);
  }
}

export async function startAdminServer(opts: AdminOptions): Promise<RunningAdmin> {
  const app = Fastify({ loggerInstance: opts.logger as FastifyBaseLogger, ...serverTimeoutOptions(resolveServerTimeouts(opts.timeouts)) });
  app.get("/metrics", async (_req, reply) => reply.type(opts.registry.contentType).send(await opts.registry.metrics()));
  app.get("/healthz", async () => ({ status: "ok" }));
  app.get("/readyz", async (_req, reply) => {
    const results = await Promise.all(opts.checks.map(async (c) => [c.name, await runCheck(c, opts.checkTimeoutMs ?? 2000)] as const));
    const ready = results.every(([, ok]) => ok);
    return reply.code(ready ? 200 : 503).send({ status: ready ? "ready" : "not_ready", checks: Object.fromEntries(results) });
  });
  if (opts.routes) await app.register(async (scope) => opts.routes!(scope));
  const address = await app.listen({ host: opts.host, port: opts.port });
  return { url: address, close: () => app.close() };
}
