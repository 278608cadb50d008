// A closed-loop load generator: `concurrency` workers send requests back to back over a
// keep-alive pool and record each latency.
import { Pool } from "undici";

export interface LoadResult {
  requests: number;
  seconds: number;
  throughput: number;
  p50ms: number;
  p99ms: number;
  statuses: Record<string, number>;
  bodies: unknown[];
  /** Every request's latency in ms, sorted. */
  latencies: number[];
}

export function percentile(sorted: number[], p: number): number {
  if (sorted.length === 0) return 0;
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))]!;
}

export async function runLoad(url: string, bodies: string[], opts: { requests: number; concurrency: number; keepBodies?: boolean }): Promise<LoadResult> {
  const u = new URL(url);
  const pool = new Pool(u.origin, { connections: opts.concurrency, pipelining: 1 });
  const latencies: number[] = [];
  const statuses: Record<string, number> = {};
  const kept: unknown[] = [];
  let next = 0;
  const started = performance.now();
  const worker = async () => {
    for (;;) {
      const i = next++;
      if (i >= opts.requests) return;
      const t0 = performance.now();
      const res = await pool.request({ method: "POST", path: u.pathname, headers: { "content-type": "application/json" }, body: bodies[i % bodies.length] });
      const text = await res.body.text();
      latencies.push(performance.now() - t0);
      statuses[res.statusCode] = (statuses[res.statusCode] ?? 0) + 1;
      if (opts.keepBodies) kept.push(JSON.parse(text));
    }
  };
  await Promise.all(Array.from({ length: opts.concurrency }, worker));
  const seconds = (performance.now() - started) / 1000;
  await pool.close();
  latencies.sort((a, b) => a - b);
  return { requests: opts.requests, seconds, throughput: opts.requests / seconds, p50ms: percentile(latencies, 50), p99ms: percentile(latencies, 99), statuses, bodies: kept, latencies };
}
