// npm run bench: our router + facilitator against the reference facilitator, on the same devnet
// chain, tokens and pre-signed payloads, in one run. Prints a table and writes
// bench/results/latest.json and latest.md. Figures are measurements, never test assertions.
import { spawn, type ChildProcess } from "node:child_process";
import { createWriteStream, readFileSync } from "node:fs";
import { mkdtemp, readFile, readdir, rm, writeFile, mkdir } from "node:fs/promises";
import { cpus, tmpdir } from "node:os";
import { join } from "node:path";
import { Pool } from "undici";
import { createPublicClient, http, type Hex } from "viem";
import { generatePrivateKey, privateKeyToAccount } from "viem/accounts";
import { startAnvil, freePort } from "../services/devnet/anvil.ts";
import { setupDevnetChain } from "../services/devnet/chain-setup.ts";
import { networkInfo } from "../services/x402/networks.ts";
import { signEip3009, standardShape, type PaymentSpec } from "../test/helpers/payments.ts";
import { startCountingProxy } from "./counting-proxy.ts";
import { percentile, runLoad, type LoadResult } from "./load.ts";

const ROOT = new URL("..", import.meta.url).pathname;
const net = networkInfo("eip155:8453")!;
const children: ChildProcess[] = [];

/** BENCH_CPU_PROFILE_DIR=dir writes a V8 CPU profile of every service process there (open in Chrome DevTools). */
const profile = process.env.BENCH_CPU_PROFILE_DIR ? ["--cpu-prof", `--cpu-prof-dir=${process.env.BENCH_CPU_PROFILE_DIR}`] : [];

// Our services run with the image's Node options (its young-generation size), as deployed.
const IMAGE_NODE_OPTIONS = /NODE_OPTIONS="([^"]*)"/.exec(readFileSync(join(ROOT, "Dockerfile"), "utf8"))?.[1] ?? "";

/** BENCH_LOG_DIR=dir keeps every service's log there, one file per service (at the services' default level, or LOG_LEVEL's). */
const LOG_DIR = process.env.BENCH_LOG_DIR;

function start(name: string, args: string[], env: Record<string, string>): ChildProcess {
  const ours = args[0] === "bin/x402-fleet.js" ? { NODE_OPTIONS: IMAGE_NODE_OPTIONS } : {};
  const child = spawn(process.execPath, [...profile, ...args], { cwd: ROOT, env: { ...process.env, ...ours, ...env }, stdio: ["ignore", LOG_DIR ? "pipe" : "ignore", "inherit"] });
  if (LOG_DIR) child.stdout!.pipe(createWriteStream(join(LOG_DIR, `${name}.log`)));
  children.push(child);
  return child;
}

async function waitUp(url: string): Promise<void> {
  for (let i = 0; i < 600; i++) {
    try {
      if ((await fetch(url)).ok) return;
    } catch {
      // not yet
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`${url} did not come up`);
}

/** CPU seconds (user + system) and resident memory of a process, from /proc. */
async function procStats(pid: number): Promise<{ cpu: number; rssMb: number; peakRssMb: number }> {
  const stat = (await readFile(`/proc/${pid}/stat`, "utf8")).split(") ")[1]!.split(" ");
  const status = await readFile(`/proc/${pid}/status`, "utf8");
  const rssKb = Number(/VmRSS:\s+(\d+)/.exec(status)?.[1] ?? 0);
  const peakKb = Number(/VmHWM:\s+(\d+)/.exec(status)?.[1] ?? 0);
  return { cpu: (Number(stat[11]) + Number(stat[12])) / 100, rssMb: Math.round(rssKb / 1024), peakRssMb: Math.round(peakKb / 1024) };
}

/** A non-negative number after `name` on the command line, or 0. */
function flag(name: string, unit: string): number {
  const i = process.argv.indexOf(name);
  const v = i >= 0 ? Number(process.argv[i + 1]) : 0;
  if (!Number.isFinite(v) || v < 0) throw new Error(`${name} takes a number of ${unit}`);
  return v;
}
/** `--rpc-rtt-ms N`: every JSON-RPC round trip of both facilitators costs N ms more (a provider that far away). */
const RPC_RTT_MS = flag("--rpc-rtt-ms", "milliseconds");
/** `--block-time S`: anvil mines a block every S seconds instead of one per transaction. */
const BLOCK_TIME_S = flag("--block-time", "seconds");
/** Concurrent distinct settlements of the throughput run: 1,000 under block times, 200 on an automine chain. */
const BURST = BLOCK_TIME_S > 0 ? 1000 : 200;
/** `--burst-only`: only the settlement bursts (no verify, router or sequential runs); results in `latest-burst-*`. */
const BURST_ONLY = process.argv.includes("--burst-only");
/** `--targets a,b`: the bursts of these targets only (ours1Key, ours4Keys, ours1KeyPostgres, ours4KeysPostgres, reference). */
const TARGETS = (() => {
  const i = process.argv.indexOf("--targets");
  return i >= 0 ? new Set(process.argv[i + 1]!.split(",")) : undefined;
})();

const round = (n: number, d = 2) => Math.round(n * 10 ** d) / 10 ** d;
const ratio = (a: number, b: number) => (b === 0 ? null : round(a / b));

async function main() {
  const dir = await mkdtemp(join(tmpdir(), "x402-bench-"));
  const anvil = await startAnvil({ chainId: net.chainId, blockTime: BLOCK_TIME_S || undefined });
  const pg = process.env.DATABASE_URL;
  const keys = { ours1: [generatePrivateKey()], ours4: Array.from({ length: 4 }, () => generatePrivateKey()), ours1pg: [generatePrivateKey()], ours4pg: Array.from({ length: 4 }, () => generatePrivateKey()), ref: [generatePrivateKey()] };
  const payerKey = generatePrivateKey();
  const receiver = privateKeyToAccount(generatePrivateKey()).address;
  await setupDevnetChain({
    rpcUrl: anvil.rpcUrl,
    chainId: net.chainId,
    assets: net.assets,
    gasFunded: [...keys.ours1, ...keys.ours4, ...keys.ours1pg, ...keys.ours4pg, ...keys.ref].map((k) => privateKeyToAccount(k).address),
    payers: [{ privateKey: payerKey, permit2Approved: true }],
  });
  const proxyOurs = await startCountingProxy(anvil.rpcUrl, RPC_RTT_MS);
  const proxyRef = await startCountingProxy(anvil.rpcUrl, RPC_RTT_MS);

  const facilitator = async (name: string, signerKeys: string[], databaseUrl = "") => {
    const keyFile = join(dir, `${name}.key`);
    await writeFile(keyFile, signerKeys.join("\n") + "\n");
    const port = await freePort();
    const adminPort = await freePort();
    const child = start(name, ["bin/x402-fleet.js", "facilitator", "--network", net.network, "--rpc-url", proxyOurs.url, "--signer-key-file", keyFile, "--schemes", "exact", "--port", String(port), "--admin-port", String(adminPort)], {
      X402_DATA_DIR: join(dir, `${name}-db`),
      DATABASE_URL: databaseUrl,
      // A user's defaults for eip155:8453 but two settings (README, "Performance"): anvil serves
      // eth_sendRawTransactionSync (EIP-7966), off by default; its blocks keep the --block-time
      // schedule (2 s is Base's default), and without one it mines on demand (no guaranteed interval).
      X402_POLICY: JSON.stringify({ sendRawTransactionSync: true, minBlockIntervalMs: BLOCK_TIME_S * 1000 }),
      // A burst of 1,000 settlements spans several blocks: answers wait for their receipts.
      ...(BLOCK_TIME_S > 0 ? { X402_RECEIPT_TIMEOUT_MS: "180000" } : {}),
    });
    const url = `http://127.0.0.1:${port}/v2`;
    await waitUp(`${url}/supported`);
    return { child, url, metricsUrl: `http://127.0.0.1:${adminPort}/metrics` };
  };
  const ours1 = await facilitator("ours1", keys.ours1);
  const ours4 = await facilitator("ours4", keys.ours4);
  // With DATABASE_URL set, the same settle loads on PostgreSQL (the embedded engine serialises every query).
  const ours1pg = pg ? await facilitator("ours1pg", keys.ours1pg, pg) : undefined;
  const ours4pg = pg ? await facilitator("ours4pg", keys.ours4pg, pg) : undefined;
  const tablePath = join(dir, "routing.json");
  await writeFile(tablePath, JSON.stringify({ backends: [{ network: net.network, url: ours1.url, kinds: [{ x402Version: 2, scheme: "exact", network: net.network }] }] }));
  const routerPort = await freePort();
  const router = start("router", ["bin/x402-fleet.js", "router", "--routing-table", tablePath, "--port", String(routerPort), "--admin-port", String(await freePort())], {});
  const routerUrl = `http://127.0.0.1:${routerPort}/v2`;
  await waitUp(`${routerUrl}/supported`);
  // The Node floor beside the router, in front of the same facilitator (bench/floor-proxy.ts).
  const floorPort = await freePort();
  const floor = start("floor-proxy", ["--import", "tsx", "bench/floor-proxy.ts"], { UPSTREAM: ours1.url, PORT: String(floorPort) });
  const floorUrl = `http://127.0.0.1:${floorPort}/v2`;
  await waitUp(`${floorUrl}/up`);
  const refPort = await freePort();
  const ref = start("reference", ["--import", "tsx", "bench/reference-facilitator.ts"], { RPC_URL: proxyRef.url, PRIVATE_KEY: keys.ref[0]!, NETWORK: net.network, PORT: String(refPort) });
  const refUrl = `http://127.0.0.1:${refPort}`;
  await waitUp(`${refUrl}/supported`);

  const spec = (): PaymentSpec => ({ network: net.network, chainId: net.chainId, asset: net.assets[0]!, payerKey, payTo: receiver, amount: 1000n });
  const sign = async (n: number) => Promise.all(Array.from({ length: n }, async () => JSON.stringify(standardShape(spec(), await signEip3009(spec())))));
  console.error("signing payloads...");
  const verifyBodies = await sign(256);

  // How full the blocks that carried a burst's settlements were, against what the block gas limit
  // allows: every block from the first that holds one of them to the last, empty ones included (a
  // block the backlog missed counts as empty), and the same without the last block, which only
  // holds what was left (the measure of "every block full while a backlog exists").
  const chainClient = createPublicClient({ transport: http(anvil.rpcUrl) });
  const stop = async () => {
    for (const c of children) c.kill("SIGTERM");
    await proxyOurs.close();
    await proxyRef.close();
    await anvil.stop();
    await rm(dir, { recursive: true, force: true });
  };
  async function packing(hashes: Hex[]) {
    if (hashes.length === 0) return {};
    const receipts = await Promise.all(hashes.map((hash) => chainClient.getTransactionReceipt({ hash })));
    const perBlock = new Map<bigint, number>();
    for (const r of receipts) perBlock.set(r.blockNumber, (perBlock.get(r.blockNumber) ?? 0) + 1);
    const numbers = [...perBlock.keys()].sort((a, b) => (a < b ? -1 : 1));
    const first = numbers[0]!;
    const last = numbers[numbers.length - 1]!;
    const gasLimit = (await chainClient.getBlock({ blockNumber: first })).gasLimit;
    const gasEach = receipts.reduce((sum, r) => sum + r.gasUsed, 0n) / BigInt(receipts.length);
    const capacity = Number(gasLimit / gasEach);
    const spanned = Number(last - first) + 1;
    const counts = Array.from({ length: spanned }, (_, i) => perBlock.get(first + BigInt(i)) ?? 0);
    const beforeLast = counts.slice(0, -1);
    return {
      blocks: spanned,
      perBlock: counts,
      perBlockMax: Math.max(...counts),
      blockCapacity: capacity,
      // The fewest blocks these settlements fit in at the gas limit.
      fullBlocksNeeded: Math.ceil(hashes.length / capacity),
      fillBeforeLast: beforeLast.length ? round(beforeLast.reduce((a, b) => a + b, 0) / (beforeLast.length * capacity), 3) : 1,
    };
  }

  /** A facilitator's RPC figures from its /metrics: calls by method, round trips and their seconds. */
  async function rpcFigures(metricsUrl: string): Promise<{ calls: Record<string, number>; roundTrips: number; seconds: number }> {
    const text = await (await fetch(metricsUrl)).text();
    const calls: Record<string, number> = {};
    let roundTrips = 0;
    let seconds = 0;
    for (const line of text.split("\n")) {
      const call = /^x402_rpc_calls_total\{.*method="([^"]+)".*\} ([0-9.e+]+)$/.exec(line);
      if (call) calls[call[1]!] = (calls[call[1]!] ?? 0) + Number(call[2]);
      const count = /^x402_rpc_request_duration_seconds_count\{.*\} ([0-9.e+]+)$/.exec(line);
      if (count) roundTrips += Number(count[1]);
      const sum = /^x402_rpc_request_duration_seconds_sum\{.*\} ([0-9.e+]+)$/.exec(line);
      if (sum) seconds += Number(sum[1]);
    }
    return { calls, roundTrips, seconds };
  }

  /**
   * CPU seconds of the PostgreSQL server on this machine (the facilitators' database share): every
   * postgres process's own time and its exited children's (a backend that ends between two readings
   * moves its time to the postmaster's children, so the sum only grows).
   */
  async function postgresCpu(): Promise<number> {
    let total = 0;
    for (const pid of await readdir("/proc").catch(() => [] as string[])) {
      if (!/^\d+$/.test(pid)) continue;
      const comm = await readFile(`/proc/${pid}/comm`, "utf8").catch(() => "");
      if (comm.trim() !== "postgres") continue;
      const stat = await readFile(`/proc/${pid}/stat`, "utf8").catch(() => undefined);
      const f = stat?.split(") ")[1]?.split(" ");
      if (f) total += (Number(f[11]) + Number(f[12]) + Number(f[13]) + Number(f[14])) / 100;
    }
    return total;
  }

  type BurstResult = { successes: number; failures: number; reasons: Record<string, number>; seconds: number; throughput: number; cpuPerSettleMs: number; physicalLimitS?: number; ratioToLimit?: number } & Awaited<ReturnType<typeof packing>>;
  /**
   * BURST settlements at once against each target, one target after another: answers, seconds, the
   * blocks they went into, and CPU per settlement of the process (and of PostgreSQL's processes for
   * a target on PostgreSQL, which nothing else uses meanwhile).
   */
  async function bursts(targets: [string, string, number, boolean, string?][]): Promise<Record<string, BurstResult>> {
    const settle: Record<string, BurstResult> = {};
    for (const [name, url, pid, onPostgres, metricsUrl] of targets) {
      if (TARGETS && !TARGETS.has(name)) continue;
      console.error(`settle ${BURST} at once: ${name}...`);
      const bodies = await sign(BURST);
      // Starts just after a block, as the worst case of a chain on a schedule.
      if (BLOCK_TIME_S > 0) {
        const at = await chainClient.getBlockNumber({ cacheTime: 0 });
        while ((await chainClient.getBlockNumber({ cacheTime: 0 })) === at) await new Promise((r) => setTimeout(r, 20));
      }
      const cpu0 = (await procStats(pid)).cpu + (onPostgres ? await postgresCpu() : 0);
      const rpc0 = metricsUrl ? await rpcFigures(metricsUrl) : undefined;
      // When each block appeared, seen from here (ms since the burst began): the timeline beside the answers'.
      const t0 = performance.now();
      const seen: number[] = [];
      let watching = true;
      const watcher = (async () => {
        let last = await chainClient.getBlockNumber({ cacheTime: 0 });
        while (watching) {
          const n = await chainClient.getBlockNumber({ cacheTime: 0 });
          if (n !== last) seen.push(Math.round(performance.now() - t0));
          last = n;
          await new Promise((r) => setTimeout(r, 25));
        }
      })();
      const r = await runLoad(`${url}/settle`, bodies, { requests: BURST, concurrency: BURST, keepBodies: true });
      watching = false;
      await watcher;
      const answersAt = [10, 50, 90, 100].map((p) => Math.round(percentile(r.latencies, p)));
      console.error(`  blocks at ms ${seen.join(", ")}; answers at p10/p50/p90/max ${answersAt.join(" / ")} ms`);
      if (metricsUrl && rpc0) {
        // What the burst asked of the RPC endpoint, and how long its round trips took (queueing in the client's pool included).
        const rpc1 = await rpcFigures(metricsUrl);
        const calls = Object.fromEntries(Object.entries(rpc1.calls).map(([m, n]) => [m, n - (rpc0.calls[m] ?? 0)]).filter(([, n]) => (n as number) > 0));
        const trips = rpc1.roundTrips - rpc0.roundTrips;
        console.error(`  RPC: ${trips} round trips, mean ${round(((rpc1.seconds - rpc0.seconds) / Math.max(trips, 1)) * 1000)} ms; calls ${JSON.stringify(calls)}`);
      }
      const cpuUsed = (await procStats(pid)).cpu + (onPostgres ? await postgresCpu() : 0) - cpu0;
      const reasons: Record<string, number> = {};
      let successes = 0;
      const hashes: Hex[] = [];
      for (const b of r.bodies as { success?: boolean; errorReason?: string; error?: string; transaction?: string }[]) {
        if (b.success) {
          successes++;
          hashes.push(b.transaction as Hex);
        } else {
          const reason = (b.errorReason ?? b.error ?? "unknown").split(":")[0]!.slice(0, 80);
          reasons[reason] = (reasons[reason] ?? 0) + 1;
        }
      }
      const blocks = await packing(hashes);
      // The physical limit: the fewest blocks the burst fits in, one block time each.
      const physicalLimitS = blocks.fullBlocksNeeded && BLOCK_TIME_S > 0 ? blocks.fullBlocksNeeded * BLOCK_TIME_S : undefined;
      settle[name] = { successes, failures: BURST - successes, reasons, seconds: round(r.seconds), throughput: round(successes / r.seconds, 1), cpuPerSettleMs: round((cpuUsed / BURST) * 1000, 2), ...blocks, ...(physicalLimitS ? { physicalLimitS, ratioToLimit: round(r.seconds / physicalLimitS) } : {}) };
      console.error(`  ${JSON.stringify(settle[name])}`);
    }
    return settle;
  }
  const burstTargets: [string, string, number, boolean, string?][] = [
    ["ours1Key", ours1.url, ours1.child.pid!, false, ours1.metricsUrl],
    ["ours4Keys", ours4.url, ours4.child.pid!, false, ours4.metricsUrl],
    ...(ours1pg ? [["ours1KeyPostgres", ours1pg.url, ours1pg.child.pid!, true, ours1pg.metricsUrl] as [string, string, number, boolean, string]] : []),
    ...(ours4pg ? [["ours4KeysPostgres", ours4pg.url, ours4pg.child.pid!, true, ours4pg.metricsUrl] as [string, string, number, boolean, string]] : []),
    ["reference", refUrl, ref.pid!, false],
  ];
  const burstLabel = { ours1Key: "1 key", ours4Keys: "4 keys", ours1KeyPostgres: "1 key on PostgreSQL", ours4KeysPostgres: "4 keys on PostgreSQL", reference: "reference (1 key, nonce manager)" } as Record<string, string>;
  /** One table row per burst. */
  const burstRows = (settle: Record<string, BurstResult>) =>
    Object.entries(settle).map(([k, r]) => {
      const blocks = r.blockCapacity ? `; ${r.blocks} blocks [${r.perBlock!.join(", ")}] of ${r.blockCapacity} each, ${r.fullBlocksNeeded} needed; fill before the last: ${r.fillBeforeLast}` : "";
      const limit = r.physicalLimitS ? `; ${r.ratioToLimit}× the physical limit of ${r.physicalLimitS} s` : "";
      const ref = settle.reference;
      const vsRef = k !== "reference" && ref ? `; ${ratio(r.throughput, ref.throughput)}× the reference's rate` : "";
      return `| settle ${BURST} at once, ${burstLabel[k]}: ok / failed, s, ok/s, CPU ms per settlement${onPostgresNote(k)} | ${r.successes} / ${r.failures}, ${r.seconds}, ${r.throughput}, ${r.cpuPerSettleMs}${blocks}${limit}${vsRef} |`;
    });
  const onPostgresNote = (k: string) => (k.endsWith("Postgres") ? " (with PostgreSQL's processes)" : "");

  /**
   * Sustained settlement: payments arriving at a steady rate (open loop: each at its time, whatever
   * the answers), RATE_STEP_S seconds per rate, the rate raised until p99 passes the bound or a
   * payment fails. On a chain with a block schedule a settlement waits for the next block (up to one
   * block time) and then for its answer, so the bound is two block times: the answer within one block
   * time of the first block that could have held it. Where the rate stops, says which limit it met:
   * the blocks' capacity (the rate times the block time past what a block holds), or the process.
   */
  async function sustained(name: string, url: string, pid: number, onPostgres: boolean) {
    const RATE_STEP_S = 10;
    const boundMs = Math.max(1, BLOCK_TIME_S) * 2000;
    const rows: { rate: number; ok: number; failed: number; p50ms: number; p99ms: number; cpuPerSettleMs: number }[] = [];
    for (const rate of [50, 100, 150, 200, 300, 400]) {
      const n = rate * RATE_STEP_S;
      console.error(`sustained ${name}: ${rate}/s for ${RATE_STEP_S} s (signing ${n})...`);
      const bodies = await sign(n);
      const pool = new Pool(new URL(url).origin, { connections: 512 });
      const path = `${new URL(url).pathname}/settle`;
      const latencies: number[] = [];
      let ok = 0;
      const cpu0 = (await procStats(pid)).cpu + (onPostgres ? await postgresCpu() : 0);
      const t0 = performance.now();
      await Promise.all(
        bodies.map(async (body, i) => {
          const at = t0 + (i * 1000) / rate;
          const wait = at - performance.now();
          if (wait > 0) await new Promise((r) => setTimeout(r, wait));
          const started = performance.now();
          const res = await pool.request({ method: "POST", path, headers: { "content-type": "application/json" }, body });
          const answer = (await res.body.json()) as { success?: boolean };
          latencies.push(performance.now() - started);
          if (answer.success) ok++;
        }),
      );
      const cpuUsed = (await procStats(pid)).cpu + (onPostgres ? await postgresCpu() : 0) - cpu0;
      await pool.close();
      latencies.sort((a, b) => a - b);
      const row = { rate, ok, failed: n - ok, p50ms: Math.round(percentile(latencies, 50)), p99ms: Math.round(percentile(latencies, 99)), cpuPerSettleMs: round((cpuUsed / n) * 1000, 2) };
      rows.push(row);
      console.error(`  ${JSON.stringify(row)}`);
      if (row.failed > 0 || row.p99ms > boundMs) break;
    }
    return { boundMs, rows };
  }

  if (process.argv.includes("--sustained")) {
    const target = burstTargets.find(([k]) => (TARGETS ? TARGETS.has(k) : k === "ours4KeysPostgres")) ?? burstTargets[0]!;
    const result = await sustained(target[0], target[1], target[2], target[3]);
    const held = result.rows.filter((r) => r.failed === 0 && r.p99ms <= result.boundMs).pop();
    const header = `Measured ${new Date().toISOString()} (--sustained --rpc-rtt-ms ${RPC_RTT_MS}${BLOCK_TIME_S ? ` --block-time ${BLOCK_TIME_S}` : ""}, ${target[0]}) on ${cpus().length} × ${cpus()[0]?.model}, Node ${process.version}.`;
    const md = [
      `| settles/s offered | ok / failed | p50 / p99 ms | CPU ms per settlement |`,
      `|---|---|---|---|`,
      ...result.rows.map((r) => `| ${r.rate} | ${r.ok} / ${r.failed} | ${r.p50ms} / ${r.p99ms} | ${r.cpuPerSettleMs} |`),
      ``,
      `Highest rate with p99 within ${result.boundMs} ms and nothing failed: ${held ? `${held.rate}/s` : "none"}.`,
    ].join("\n");
    await writeFile(join(ROOT, `bench/results/latest-sustained.md`), `${header}\n\n${md}\n`);
    console.log(`\n${header}\n\n${md}\n`);
    return stop();
  }

  if (BURST_ONLY) {
    const settle = await bursts(burstTargets);
    const header = `Measured ${new Date().toISOString()} (--burst-only --rpc-rtt-ms ${RPC_RTT_MS}${BLOCK_TIME_S ? ` --block-time ${BLOCK_TIME_S}` : ""}) on ${cpus().length} × ${cpus()[0]?.model}, Node ${process.version}.`;
    const md = [`| burst | figures |`, `|---|---|`, ...burstRows(settle)].join("\n");
    await mkdir(join(ROOT, "bench/results"), { recursive: true });
    const name = `latest-burst${BLOCK_TIME_S > 0 ? `-block-time-${BLOCK_TIME_S}s` : ""}`;
    await writeFile(join(ROOT, `bench/results/${name}.json`), JSON.stringify({ when: new Date().toISOString(), rpcRttMs: RPC_RTT_MS, blockTimeS: BLOCK_TIME_S, settle }, null, 2) + "\n");
    await writeFile(join(ROOT, `bench/results/${name}.md`), `${header}\n\n${md}\n`);
    console.log(`\n${header}\n\n${md}\n`);
    return stop();
  }

  // Warm-up (JIT, caches, connections) for every target.
  for (const url of [`${ours1.url}/verify`, `${routerUrl}/verify`, `${floorUrl}/verify`, `${refUrl}/verify`]) await runLoad(url, verifyBodies, { requests: 300, concurrency: 8 });
  const check = await runLoad(`${routerUrl}/verify`, verifyBodies.slice(0, 4), { requests: 4, concurrency: 1, keepBodies: true });
  if (!check.bodies.every((b) => (b as { isValid: boolean }).isValid)) throw new Error(`verify payloads are not valid: ${JSON.stringify(check.bodies[0])}`);

  const verify: Record<string, Record<string, LoadResult>> = { ours: {}, oursViaRouter: {}, reference: {} };
  for (const concurrency of [1, 16, 64]) {
    const requests = concurrency === 1 ? 500 : 3000;
    console.error(`verify at concurrency ${concurrency}...`);
    verify.ours![`c${concurrency}`] = await runLoad(`${ours1.url}/verify`, verifyBodies, { requests, concurrency });
    verify.oursViaRouter![`c${concurrency}`] = await runLoad(`${routerUrl}/verify`, verifyBodies, { requests, concurrency });
    verify.reference![`c${concurrency}`] = await runLoad(`${refUrl}/verify`, verifyBodies, { requests, concurrency });
  }

  // CPU per verify at concurrency 16: process CPU time over a run of 3,000 requests, the median of
  // CPU_ROUNDS runs (one run on a shared machine swings by a third), for each process in the path.
  console.error("CPU per verify...");
  const CPU_ROUNDS = 3;
  const cpuRuns: Record<"oursFacilitatorMs" | "routerMs" | "floorProxyMs" | "referenceMs", number[]> = { oursFacilitatorMs: [], routerMs: [], floorProxyMs: [], referenceMs: [] };
  const cpuPerRequest = async (pid: number, url: string) => {
    const before = await procStats(pid);
    await runLoad(url, verifyBodies, { requests: 3000, concurrency: 16 });
    return (((await procStats(pid)).cpu - before.cpu) / 3000) * 1000;
  };
  for (let i = 0; i < CPU_ROUNDS; i++) {
    cpuRuns.oursFacilitatorMs.push(await cpuPerRequest(ours1.child.pid!, `${ours1.url}/verify`));
    cpuRuns.routerMs.push(await cpuPerRequest(router.pid!, `${routerUrl}/verify`));
    cpuRuns.floorProxyMs.push(await cpuPerRequest(floor.pid!, `${floorUrl}/verify`));
    cpuRuns.referenceMs.push(await cpuPerRequest(ref.pid!, `${refUrl}/verify`));
  }
  const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
  const cpu = { oursFacilitatorMs: median(cpuRuns.oursFacilitatorMs), routerMs: median(cpuRuns.routerMs), floorProxyMs: median(cpuRuns.floorProxyMs), referenceMs: median(cpuRuns.referenceMs) };

  // Router overhead at concurrency 1: each request's time through the router minus the time the
  // router waited for the facilitator (its Server-Timing "upstream"): what the router itself adds,
  // without the facilitator's and the node's own variance. The floor proxy is measured the same way,
  // its requests alternating with the router's, so both see the machine in the same state.
  // The client is a keep-alive undici pool, as the load runs use: WHATWG fetch's own overhead (about
  // half a millisecond of CPU a call) would count as the router's.
  console.error("router overhead...");
  const targets = [routerUrl, floorUrl].map((url) => ({ pool: new Pool(new URL(url).origin, { connections: 1 }), path: `${new URL(url).pathname}/verify`, overheads: [] as number[] }));
  for (let i = 0; i < 1000; i++) {
    const target = targets[i % 2]!;
    const t0 = performance.now();
    const res = await target.pool.request({ method: "POST", path: target.path, headers: { "content-type": "application/json" }, body: verifyBodies[i % verifyBodies.length]! });
    await res.body.arrayBuffer();
    const total = performance.now() - t0;
    const timing = res.headers["server-timing"];
    const upstream = Number(/upstream;dur=([0-9.]+)/.exec(typeof timing === "string" ? timing : "")?.[1]);
    if (Number.isFinite(upstream)) target.overheads.push(total - upstream);
  }
  const [routerOverheadC1, floorOverheadC1] = (await Promise.all(
    targets.map(async ({ pool, overheads }) => {
      await pool.close();
      overheads.sort((a, b) => a - b);
      return { p50ms: round(percentile(overheads, 50), 3), p99ms: round(percentile(overheads, 99), 3) };
    }),
  )) as [{ p50ms: number; p99ms: number }, { p50ms: number; p99ms: number }];

  console.error("RPC calls per verify...");
  proxyOurs.reset();
  proxyRef.reset();
  await runLoad(`${ours1.url}/verify`, verifyBodies, { requests: 200, concurrency: 1 });
  await runLoad(`${refUrl}/verify`, verifyBodies, { requests: 200, concurrency: 1 });
  const rpc = { ours: proxyOurs.counts(), reference: proxyRef.counts() };

  // One settlement at a time, each verified first (as a resource server does): the settlement's
  // latency and its RPC calls on the critical path, against the physical limit (round trips x RTT,
  // plus half a block on average under --block-time; on demand anvil mines on receipt, so inclusion
  // adds nothing). Reads our facilitator makes in the
  // background (fees and the head block, once a second) are measured while idle and subtracted.
  const sequential: Record<string, { p50ms: number; p99ms: number; callsPerSettle: number; roundTripsPerSettle: number; backgroundCallsPerSecond: number; cpuPerVerifyAndSettleMs: number; methods: Record<string, number> }> = {};
  for (const [name, url, proxy, pid] of [["ours", ours1.url, proxyOurs, ours1.child.pid!], ["reference", refUrl, proxyRef, ref.pid!]] as const) {
    console.error(`settle one at a time: ${name}...`);
    const bodies = await sign(40);
    await runLoad(`${url}/settle`, bodies.slice(0, 5), { requests: 5, concurrency: 1 }); // warm fee caches and connections
    await new Promise((r) => setTimeout(r, 1500)); // let background receipt/fee work of the warm-up end
    proxy.reset();
    await new Promise((r) => setTimeout(r, 3000));
    const background = proxy.counts();
    const perMs = { calls: background.calls / 3000, roundTrips: background.roundTrips / 3000 };
    const latencies: number[] = [];
    let calls = 0;
    let roundTrips = 0;
    const methods: Record<string, number> = {};
    const cpu0 = await procStats(pid);
    for (const body of bodies.slice(5)) {
      await fetch(`${url}/verify`, { method: "POST", headers: { "content-type": "application/json" }, body });
      // Under block times, payments arrive at random points of a block (as in production), not
      // right after the block that carried the previous one: that would always wait a whole block.
      if (BLOCK_TIME_S > 0) await new Promise((r) => setTimeout(r, Math.random() * BLOCK_TIME_S * 1000));
      proxy.reset();
      const t0 = performance.now();
      const answer = (await (await fetch(`${url}/settle`, { method: "POST", headers: { "content-type": "application/json" }, body })).json()) as { success?: boolean };
      const ms = performance.now() - t0;
      if (!answer.success) throw new Error(`${name}: a sequential settlement failed: ${JSON.stringify(answer)}`);
      const c = proxy.counts();
      latencies.push(ms);
      calls += Math.max(0, c.calls - perMs.calls * ms);
      roundTrips += Math.max(0, c.roundTrips - perMs.roundTrips * ms);
      for (const [m, n] of Object.entries(c.methods)) methods[m] = (methods[m] ?? 0) + n;
    }
    const cpuUsed = (await procStats(pid)).cpu - cpu0.cpu;
    latencies.sort((a, b) => a - b);
    const n = latencies.length;
    sequential[name] = {
      cpuPerVerifyAndSettleMs: round((cpuUsed / n) * 1000, 3),
      p50ms: round(latencies[Math.floor(n * 0.5)]!),
      p99ms: round(latencies[Math.min(n - 1, Math.floor(n * 0.99))]!),
      callsPerSettle: round(calls / n),
      roundTripsPerSettle: round(roundTrips / n),
      backgroundCallsPerSecond: round(perMs.calls * 1000),
      methods: Object.fromEntries(Object.entries(methods).map(([m, k]) => [m, round(k / n)])),
    };
  }

  const settle = await bursts(burstTargets);

  // Resident memory right after the bursts (the heap that a burst's requests in flight grew), then
  // in the steady state: after IDLE_S seconds without requests, when V8's memory reducer has
  // given back what the burst needed. The peak is the most the process ever held.
  const processes = { facilitatorEmbedded: ours1.child.pid, facilitatorPostgres: ours4pg?.child.pid, router: router.pid, reference: ref.pid };
  const readMemory = async () =>
    Object.fromEntries(await Promise.all(Object.entries(processes).map(async ([k, pid]) => [k, pid === undefined ? undefined : await procStats(pid)]))) as Record<keyof typeof processes, { rssMb: number; peakRssMb: number } | undefined>;
  const afterLoad = await readMemory();
  const IDLE_S = 20;
  console.error(`memory: ${IDLE_S} s idle...`);
  await new Promise((r) => setTimeout(r, IDLE_S * 1000));
  const steady = await readMemory();
  const memory = {
    idleSeconds: IDLE_S,
    facilitatorEmbeddedRssMb: steady.facilitatorEmbedded!.rssMb,
    facilitatorPostgresRssMb: steady.facilitatorPostgres?.rssMb,
    routerRssMb: steady.router!.rssMb,
    referenceRssMb: steady.reference!.rssMb,
    afterLoadRssMb: Object.fromEntries(Object.entries(afterLoad).map(([k, v]) => [k, v?.rssMb])),
    peakRssMb: Object.fromEntries(Object.entries(steady).map(([k, v]) => [k, v?.peakRssMb])),
  };
  const trio = (m: Record<string, number | undefined>) => `${m.facilitatorEmbedded}; ${m.facilitatorPostgres ?? "n/a"}; ${m.router}`;

  const v = (k: string, c: number) => verify[k]![`c${c}`]!;
  // The physical limit of one settlement: its round trips x RTT, plus the wait for the next block
  // (half a block on average; anvil's automine includes at once).
  const limitMs = (roundTrips: number) => round(roundTrips * RPC_RTT_MS + (BLOCK_TIME_S * 1000) / 2);
  const results = {
    when: new Date().toISOString(),
    machine: { cpus: cpus().length, model: cpus()[0]?.model, node: process.version },
    workloads: {
      verify: Object.fromEntries(
        [1, 16, 64].map((c) => [
          `concurrency${c}`,
          {
            ours: { throughput: round(v("ours", c).throughput, 1), p50ms: round(v("ours", c).p50ms), p99ms: round(v("ours", c).p99ms) },
            oursViaRouter: { throughput: round(v("oursViaRouter", c).throughput, 1), p50ms: round(v("oursViaRouter", c).p50ms), p99ms: round(v("oursViaRouter", c).p99ms) },
            reference: { throughput: round(v("reference", c).throughput, 1), p50ms: round(v("reference", c).p50ms), p99ms: round(v("reference", c).p99ms) },
            throughputRatio: ratio(v("ours", c).throughput, v("reference", c).throughput),
          },
        ]),
      ),
      rpcPerVerify: { ours: round(rpc.ours.calls / 200), oursRoundTrips: round(rpc.ours.roundTrips / 200), reference: round(rpc.reference.calls / 200), referenceRoundTrips: round(rpc.reference.roundTrips / 200), ratio: ratio(rpc.reference.calls, rpc.ours.calls), oursMethods: rpc.ours.methods, referenceMethods: rpc.reference.methods },
      // c=1: the router's own share of each request (Server-Timing); c=16: the difference of the two p50s only (p99s of two runs do not subtract).
      // floorProxy: the same measures of a bare Node proxy (bench/floor-proxy.ts), taken alongside.
      routerOverhead: { concurrency1: routerOverheadC1, floorProxyConcurrency1: floorOverheadC1, concurrency16: { p50ms: round(v("oursViaRouter", 16).p50ms - v("ours", 16).p50ms) } },
      cpuPerVerifyMs: { ours: round(cpu.oursFacilitatorMs, 3), router: round(cpu.routerMs, 3), floorProxy: round(cpu.floorProxyMs, 3), reference: round(cpu.referenceMs, 3), ratio: ratio(cpu.referenceMs, cpu.oursFacilitatorMs), runs: Object.fromEntries(Object.entries(cpuRuns).map(([k, xs]) => [k, xs.map((x) => round(x, 3))])) },
      settleSequential: { rpcRttMs: RPC_RTT_MS, blockTimeS: BLOCK_TIME_S, ...sequential, limitMs: { withSync: limitMs(1), withoutSync: limitMs(2) } },
      settleBurst: { concurrent: BURST, ...settle, throughputRatio4KeysVsReference: settle.ours4Keys && settle.reference ? ratio(settle.ours4Keys.throughput, settle.reference.throughput) : null },
      memory,
    },
  };

  const w = results.workloads;
  const md = [
    `| workload | ours | reference | ratio (ours vs reference) |`,
    `|---|---|---|---|`,
    ...[1, 16, 64].map((c) => {
      const r = w.verify[`concurrency${c}`] as { ours: { throughput: number; p50ms: number; p99ms: number }; reference: { throughput: number; p50ms: number; p99ms: number }; throughputRatio: number };
      return `| verify c=${c}: req/s, p50 / p99 ms | ${r.ours.throughput}, ${r.ours.p50ms} / ${r.ours.p99ms} | ${r.reference.throughput}, ${r.reference.p50ms} / ${r.reference.p99ms} | ${r.throughputRatio}× |`;
    }),
    `| RPC calls per verify (round trips) | ${w.rpcPerVerify.ours} (${w.rpcPerVerify.oursRoundTrips}) | ${w.rpcPerVerify.reference} (${w.rpcPerVerify.referenceRoundTrips}) | ${w.rpcPerVerify.ratio}× fewer |`,
    `| router overhead p50 / p99 ms (c=1: client time minus Server-Timing upstream) | ${w.routerOverhead.concurrency1.p50ms} / ${w.routerOverhead.concurrency1.p99ms} | n/a | Node floor (a bare proxy, alternating with the router): ${w.routerOverhead.floorProxyConcurrency1.p50ms} / ${w.routerOverhead.floorProxyConcurrency1.p99ms} |`,
    `| router overhead p50 ms (c=16, difference of p50s) | ${w.routerOverhead.concurrency16.p50ms} | n/a | |`,
    `| CPU per verify at c=16, ms (facilitator; router; median of ${CPU_ROUNDS} runs of 3,000) | ${w.cpuPerVerifyMs.ours}; ${w.cpuPerVerifyMs.router} | ${w.cpuPerVerifyMs.reference} | ${w.cpuPerVerifyMs.ratio}× less; Node floor for the router (a bare proxy): ${w.cpuPerVerifyMs.floorProxy} |`,
    `| settle one at a time (RPC RTT ${RPC_RTT_MS} ms${BLOCK_TIME_S ? `, ${BLOCK_TIME_S} s blocks` : ", automine"}): p50 / p99 ms | ${sequential.ours!.p50ms} / ${sequential.ours!.p99ms} | ${sequential.reference!.p50ms} / ${sequential.reference!.p99ms} | ${ratio(sequential.reference!.p50ms, sequential.ours!.p50ms)}× faster; physical limit ${limitMs(1)} ms with sync (${round(sequential.ours!.p50ms / Math.max(limitMs(1), 0.001))}× it), ${limitMs(2)} ms without |`,
    `| RPC calls per settle on its path (round trips), after a verify | ${sequential.ours!.callsPerSettle} (${sequential.ours!.roundTripsPerSettle}) ${JSON.stringify(sequential.ours!.methods)}; background ${sequential.ours!.backgroundCallsPerSecond}/s | ${sequential.reference!.callsPerSettle} (${sequential.reference!.roundTripsPerSettle}) ${JSON.stringify(sequential.reference!.methods)} | |`,
    `| CPU per verify + settle, ms (facilitator) | ${sequential.ours!.cpuPerVerifyAndSettleMs} | ${sequential.reference!.cpuPerVerifyAndSettleMs} | |`,
    ...burstRows(settle).map((row) => `${row.slice(0, -2)} | | |`),
    `| reference settle failure reasons | | ${JSON.stringify(settle.reference?.reasons ?? {})} | |`,
    `| steady-state RSS MB, ${memory.idleSeconds} s after the load (facilitator embedded; on PostgreSQL; router) | ${memory.facilitatorEmbeddedRssMb}; ${memory.facilitatorPostgresRssMb ?? "n/a"}; ${memory.routerRssMb} | ${memory.referenceRssMb} | right after the load: ${trio(memory.afterLoadRssMb)} (reference ${memory.afterLoadRssMb.reference}); peak: ${trio(memory.peakRssMb)} (reference ${memory.peakRssMb.reference}) |`,
  ].join("\n");
  const header = `Measured ${results.when} (--rpc-rtt-ms ${RPC_RTT_MS}${BLOCK_TIME_S ? ` --block-time ${BLOCK_TIME_S}` : ""}) on ${results.machine.cpus} × ${results.machine.model}, Node ${results.machine.node}; anvil, router, facilitators, reference and load generator on the same machine.`;
  await mkdir(join(ROOT, "bench/results"), { recursive: true });
  // Runs under block times are kept apart from the automine ones: both are in the README.
  const name = BLOCK_TIME_S > 0 ? `latest-block-time-${BLOCK_TIME_S}s` : "latest";
  await writeFile(join(ROOT, `bench/results/${name}.json`), JSON.stringify(results, null, 2) + "\n");
  await writeFile(join(ROOT, `bench/results/${name}.md`), `${header}\n\n${md}\n`);
  console.log(`\n${header}\n\n${md}\n`);

  await stop();
}

main().catch((e) => {
  for (const c of children) c.kill("SIGKILL");
  console.error(e);
  process.exit(1);
});
