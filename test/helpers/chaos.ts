// The chaos harness (issue 33): real processes as a cluster runs them, faults on a seeded schedule,
// careful clients, and a verdict read from the chain. The pieces: anvil (mining paused at times), a
// PostgreSQL of its own (crashed with an immediate stop and restarted), facilitator replicas on it
// (SIGKILLed and restarted), a round-robin TCP proxy standing in for their Kubernetes Service, and
// the router in front (SIGKILLed and restarted). Clients sign EIP-3009 payments and /settle them
// through the router, retrying the same body until a final answer. A seed replays the same fault
// schedule and the same payments; only the interleaving differs between runs.
import { execFile, spawn, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { chmodSync, chownSync, createWriteStream, existsSync, readdirSync, type WriteStream } from "node:fs";
import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { connect, createServer, type Server, type Socket } from "node:net";
import { tmpdir, userInfo } from "node:os";
import { join } from "node:path";
import { createPublicClient, encodePacked, http, keccak256, parseAbi, parseAbiItem, toHex, type Address, type Hex } from "viem";
import { privateKeyToAccount } from "viem/accounts";
import { freePort, startAnvil, type AnvilNode } from "../../services/devnet/anvil.ts";
import { setupDevnetChain } from "../../services/devnet/chain-setup.ts";
import { networkInfo } from "../../services/x402/networks.ts";
import { serviceShape, signEip3009, type PaymentSpec } from "./payments.ts";
import { rpc } from "./onchain.ts";
import { prng } from "./seeded.ts";

export interface ChaosOptions {
  seed: number;
  /** How long faults are injected and payments started. */
  durationMs: number;
  replicas?: number;
  /** Concurrent client loops, each with its own payer. */
  clients?: number;
  /** Progress lines (faults as they happen); silent when unset. */
  log?: (line: string) => void;
  /** Keep the temp directory (process logs) after the run. */
  keepLogs?: boolean;
}

export type FaultKind = "replica" | "router" | "mining" | "database";
export interface Fault {
  atMs: number;
  kind: FaultKind;
  downMs: number;
  /** replica index (replica faults; database faults that also restart a replica during the outage). */
  replica?: number;
}

export interface Violation {
  rule: string;
  count: number;
  examples: string[];
}

export interface ChaosReport {
  seed: number;
  durationMs: number;
  payments: number;
  callers: number;
  answers: Record<string, number>;
  faults: Record<FaultKind, number>;
  settledOnChain: number;
  freshSettleMs: number | undefined;
  storeRows: Record<string, number>;
  /** Transactions the signers sent (their pending nonces), against the authorizations used. */
  signerTransactions: number;
  violations: Violation[];
  logDir: string;
}

// ---- the fault schedule (seeded: helpers/seeded.ts)

const between = (rng: () => number, lo: number, hi: number) => Math.floor(lo + rng() * (hi - lo));
const seededKey = (seed: number, role: string, i: number): Hex => keccak256(encodePacked(["string", "uint256", "string", "uint256"], ["x402-chaos", BigInt(seed), role, BigInt(i)]));
const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/**
 * The faults of a run, one at a time: SIGKILL a replica or the router (restarted after `downMs`),
 * pause mining, crash PostgreSQL. A database crash at about a quarter and two thirds of the run at
 * least, so even the short form crashes it twice; half of the crashes also restart a replica while
 * the database is down (start-up must wait for it).
 */
export function faultSchedule(seed: number, durationMs: number, replicas: number): Fault[] {
  const rng = prng(seed ^ 0x5eed);
  const faults: Fault[] = [];
  const dbMarks = [0.25, 0.65].map((f) => f * durationMs);
  let t = 4_000;
  while (t < durationMs - 8_000) {
    const dbDue = dbMarks.some((m) => t >= m && !faults.some((f) => f.kind === "database" && f.atMs >= m - 15_000));
    const r = rng();
    const kind: FaultKind = dbDue ? "database" : r < 0.35 ? "replica" : r < 0.55 ? "router" : r < 0.8 ? "mining" : "database";
    const downMs = kind === "replica" ? between(rng, 300, 3_000) : kind === "router" ? between(rng, 200, 2_000) : between(rng, 2_000, 6_000);
    const replica = kind === "replica" || (kind === "database" && rng() < 0.5) ? between(rng, 0, replicas) : undefined;
    faults.push({ atMs: t, kind, downMs, ...(replica === undefined ? {} : { replica }) });
    t += downMs + between(rng, 2_000, 8_000);
  }
  return faults;
}

// ---- PostgreSQL of its own

function pgBinDir(): string {
  if (process.env.X402_PG_BIN) return process.env.X402_PG_BIN;
  const root = "/usr/lib/postgresql";
  const versions = existsSync(root) ? readdirSync(root).filter((v) => existsSync(join(root, v, "bin", "initdb"))) : [];
  if (!versions.length) throw new Error("chaos: no PostgreSQL server binaries (initdb, pg_ctl) under /usr/lib/postgresql/*/bin; set X402_PG_BIN");
  return join(root, versions.sort((a, b) => Number(b) - Number(a))[0]!, "bin");
}

function run(cmd: string, args: string[]): Promise<void> {
  // initdb refuses to run as root: as root, the server runs as the postgres user.
  const [file, argv] = userInfo().uid === 0 ? ["runuser", ["-u", "postgres", "--", cmd, ...args]] : [cmd, args];
  return new Promise((resolve, reject) =>
    execFile(file, argv, { timeout: 120_000 }, (e, _out, stderr) => (e ? reject(new Error(`${cmd.split("/").pop()} ${args[0] ?? ""}: ${String(stderr).trim().split("\n").pop() || e.message}`)) : resolve())),
  );
}

interface OwnPostgres {
  url: string;
  crash(): Promise<void>;
  start(): Promise<void>;
  stop(): Promise<void>;
}

async function startOwnPostgres(dir: string): Promise<OwnPostgres> {
  const bin = pgBinDir();
  const dataDir = join(dir, "pgdata");
  await mkdir(dataDir, { mode: 0o700 });
  if (userInfo().uid === 0) {
    const { uid, gid } = await new Promise<{ uid: number; gid: number }>((resolve, reject) =>
      execFile("id", ["-u", "postgres"], (e, u) => (e ? reject(e) : execFile("id", ["-g", "postgres"], (e2, g) => (e2 ? reject(e2) : resolve({ uid: Number(u), gid: Number(g) }))))),
    );
    chmodSync(dir, 0o755);
    chownSync(dataDir, uid, gid);
  }
  await run(join(bin, "initdb"), ["-D", dataDir, "-U", "postgres", "-A", "trust", "--no-sync", "-E", "UTF8"]);
  const port = await freePort();
  // fsync off: a process crash (what we inject) keeps every write in the page cache; commits still wait for their WAL write.
  const options = `-p ${port} -k ${dataDir} -c listen_addresses=127.0.0.1 -c fsync=off -c full_page_writes=off -c shared_buffers=16MB -c max_connections=200`;
  const start = () => run(join(bin, "pg_ctl"), ["start", "-D", dataDir, "-w", "-t", "60", "-l", join(dataDir, "server.log"), "-o", options]);
  await start();
  return {
    url: `postgres://postgres@127.0.0.1:${port}/postgres`,
    crash: () => run(join(bin, "pg_ctl"), ["stop", "-D", dataDir, "-m", "immediate", "-w"]),
    start,
    stop: () => run(join(bin, "pg_ctl"), ["stop", "-D", dataDir, "-m", "immediate", "-w"]).catch(() => undefined),
  };
}

// ---- processes, restarted as Kubernetes would

interface Supervised {
  name: string;
  /** SIGKILL; not restarted until start(). */
  kill(): Promise<void>;
  /** Spawns it; resolves once it listens (or rejects when it exits first). */
  start(): Promise<void>;
  running(): boolean;
  stop(): Promise<void>;
}

export interface ProcessFindings {
  /** Log lines naming an unhandled error, by process. */
  unhandled: string[];
  /** Exits nobody asked for (code, last output). */
  exits: string[];
}

function supervise(name: string, args: string[], env: Record<string, string>, logDir: string, findings: ProcessFindings, listening: RegExp): Supervised {
  const out: WriteStream = createWriteStream(join(logDir, `${name}.log`), { flags: "a" });
  let child: ChildProcess | undefined;
  let stopping = false;
  let backoffMs = 1_000;
  let restartTimer: NodeJS.Timeout | undefined;
  const spawnOnce = () =>
    new Promise<void>((resolve, reject) => {
      clearTimeout(restartTimer); // one process at a time: an asked start replaces a pending back-off restart
      const c = spawn(process.execPath, ["bin/x402-fleet.js", ...args], { env: { ...process.env, ...env }, stdio: ["ignore", "pipe", "pipe"] });
      child = c;
      let tail = "";
      let up = false;
      const onData = (d: Buffer) => {
        const text = d.toString();
        out.write(text);
        tail = (tail + text).slice(-2_000);
        for (const line of text.split("\n")) if (/unhandled/i.test(line)) findings.unhandled.push(`${name}: ${line.slice(0, 300)}`);
        if (!up && listening.test(tail)) {
          up = true;
          backoffMs = 1_000;
          resolve();
        }
      };
      c.stdout!.on("data", onData);
      c.stderr!.on("data", onData);
      c.once("exit", (code, signal) => {
        if (child === c) child = undefined;
        if (signal === "SIGKILL" || stopping) return reject(new Error(`${name} killed`));
        // Nobody asked it to go: a finding, and a restart after a growing back-off (CrashLoopBackOff).
        findings.exits.push(`${name} exited with code ${code}${up ? "" : " before listening"}: ${tail.trim().split("\n").slice(-2).join(" | ").slice(0, 400)}`);
        reject(new Error(`${name} exited (${code})`));
        restartTimer = setTimeout(() => void spawnOnce().catch(() => undefined), backoffMs);
        backoffMs = Math.min(backoffMs * 2, 10_000);
      });
    });
  const kill = async () => {
    clearTimeout(restartTimer);
    const c = child;
    if (!c) return;
    const gone = new Promise((r) => c.once("exit", r));
    c.kill("SIGKILL");
    await gone;
  };
  return {
    name,
    kill,
    start: () => spawnOnce(),
    running: () => child !== undefined,
    async stop() {
      stopping = true;
      await kill();
      out.end();
    },
  };
}

// ---- the Service: round robin over the replicas, the next one when a connection is refused

function startServiceProxy(targets: number[]): Promise<{ port: number; close(): Promise<void> }> {
  const sockets = new Set<Socket>();
  let next = 0;
  const server: Server = createServer((client) => {
    sockets.add(client);
    client.on("close", () => sockets.delete(client));
    client.on("error", () => undefined);
    client.pause();
    // An endpoint whose pod is gone refuses; a Service would have dropped it, so try the next one.
    const attempt = (left: number) => {
      const upstream = connect(targets[next++ % targets.length]!, "127.0.0.1");
      sockets.add(upstream);
      upstream.on("close", () => sockets.delete(upstream));
      let connected = false;
      upstream.once("connect", () => {
        connected = true;
        client.pipe(upstream).pipe(client);
        client.resume();
        client.on("close", () => upstream.destroy());
        upstream.on("close", () => client.destroy());
      });
      upstream.on("error", () => {
        if (!connected && left > 1 && !client.destroyed) attempt(left - 1);
        else client.destroy();
      });
    };
    attempt(targets.length);
  });
  return new Promise((resolve) =>
    server.listen(0, "127.0.0.1", () =>
      resolve({
        port: (server.address() as { port: number }).port,
        close: () =>
          new Promise<void>((r) => {
            for (const s of sockets) s.destroy();
            server.close(() => r());
          }),
      }),
    ),
  );
}

// ---- careful clients

export interface Payment {
  id: number;
  from: Address;
  nonce: Hex;
  payTo: Address;
  amount: bigint;
  body: unknown;
  callers: CallerOutcome[];
}

export interface CallerOutcome {
  /** The kinds of every answer, in order (e.g. "503 backend_unavailable", "connection error"). */
  answers: string[];
  final?: { success: boolean; transaction?: string; reason?: string; message?: string; status: number };
  gaveUp?: boolean;
}

function kindOf(status: number, json: Record<string, unknown> | undefined): string {
  if (status === 200 && json?.success === true) return "200 success";
  const reason = json?.errorReason ?? json?.error ?? json?.code;
  // The reason and the start of its detail: "503 backend_unavailable: the settlement store is unavailable…".
  return `${status} ${typeof reason === "string" ? reason.slice(0, 72) : "(no reason)"}`;
}

/** Posts the same body until a final answer: 200 success, or a 200/4xx that is not settlement_pending. */
export async function carefulSettle(routerUrl: string, body: string, giveUpMs: number): Promise<CallerOutcome> {
  const outcome: CallerOutcome = { answers: [] };
  const deadline = Date.now() + giveUpMs;
  while (Date.now() < deadline) {
    let pauseMs = 300;
    try {
      const res = await fetch(`${routerUrl}/settle`, { method: "POST", headers: { "content-type": "application/json" }, body, signal: AbortSignal.timeout(75_000) });
      const text = await res.text();
      let json: Record<string, unknown> | undefined;
      try {
        json = JSON.parse(text) as Record<string, unknown>;
      } catch {
        json = undefined;
      }
      const kind = kindOf(res.status, json);
      outcome.answers.push(kind);
      const retryable = res.status >= 500 || (res.status === 200 && json?.success !== true && json?.errorReason === "settlement_pending") || json === undefined;
      if (!retryable) {
        outcome.final = {
          success: res.status === 200 && json?.success === true,
          transaction: typeof json?.transaction === "string" ? json.transaction : undefined,
          reason: kind,
          message: typeof json?.errorMessage === "string" ? json.errorMessage : typeof json?.message === "string" ? json.message : undefined,
          status: res.status,
        };
        return outcome;
      }
      const retryAfter = Number(res.headers.get("retry-after"));
      if (retryAfter > 0) pauseMs = Math.min(retryAfter * 1000, 2_000);
    } catch {
      outcome.answers.push("connection error");
    }
    await sleep(pauseMs);
  }
  outcome.gaveUp = true;
  return outcome;
}

// ---- the run

const tokenAbi = parseAbi(["function authorizationState(address authorizer, bytes32 nonce) view returns (bool)", "function balanceOf(address) view returns (uint256)"]);
const authorizationUsed = parseAbiItem("event AuthorizationUsed(address indexed authorizer, bytes32 indexed nonce)");
const transferEvent = parseAbiItem("event Transfer(address indexed from, address indexed to, uint256 value)");

export async function runChaos(opts: ChaosOptions): Promise<ChaosReport> {
  const log = opts.log ?? (() => undefined);
  const replicaCount = opts.replicas ?? 2;
  const clientCount = opts.clients ?? 4;
  const giveUpMs = 90_000;
  const net = networkInfo("eip155:8453")!;
  const usdc = net.assets[0]!;
  const dir = await mkdtemp(join(tmpdir(), "x402-chaos-"));
  const logDir = join(dir, "logs");
  await mkdir(logDir);
  const findings: ProcessFindings = { unhandled: [], exits: [] };
  const cleanups: (() => Promise<void>)[] = [];
  let keep = opts.keepLogs ?? false;
  const faultsDone: Record<FaultKind, number> = { replica: 0, router: 0, mining: 0, database: 0 };
  try {
    // The chain: payers and receivers from the seed, signer keys shared by every replica (as in a cluster).
    const anvil: AnvilNode = await startAnvil({ chainId: net.chainId });
    cleanups.push(() => anvil.stop());
    const signerKeys = [0, 1].map((i) => seededKey(opts.seed, "signer", i));
    const payerKeys = Array.from({ length: clientCount }, (_, i) => seededKey(opts.seed, "payer", i));
    const receivers = [0, 1].map((i) => privateKeyToAccount(seededKey(opts.seed, "receiver", i)).address);
    await setupDevnetChain({
      rpcUrl: anvil.rpcUrl,
      chainId: net.chainId,
      assets: net.assets,
      gasFunded: signerKeys.map((k) => privateKeyToAccount(k).address),
      payers: payerKeys.map((privateKey) => ({ privateKey, permit2Approved: false })),
    });
    const chain = createPublicClient({ transport: http(anvil.rpcUrl) });
    const balances = () => Promise.all(receivers.map((r) => chain.readContract({ address: usdc.address, abi: tokenAbi, functionName: "balanceOf", args: [r] })));
    const startBalances = await balances();
    const keyFile = join(dir, "signers.key");
    await writeFile(keyFile, signerKeys.join("\n") + "\n", { mode: 0o600 });
    const tokenFile = join(dir, "router-token");
    await writeFile(tokenFile, `${randomBytes(32).toString("hex")}\n`, { mode: 0o600 });

    const pg = await startOwnPostgres(dir);
    cleanups.push(() => pg.stop());

    // Fixed ports: a restarted process comes back where the Service and the router expect it.
    const replicaPorts = await Promise.all(Array.from({ length: replicaCount }, () => freePort()));
    const replicas = await Promise.all(
      replicaPorts.map(async (port, i) => {
        const adminPort = await freePort();
        const args = ["facilitator", "--network", net.network, "--rpc-url", anvil.rpcUrl, "--signer-key-file", keyFile, "--port", String(port), "--admin-port", String(adminPort)];
        const env = { LOG_LEVEL: "info", DATABASE_URL: pg.url, X402_DATA_DIR: "", X402_ROUTER_TOKEN_FILE: tokenFile, X402_CONFIRMATIONS: "1", X402_POLICY: JSON.stringify({ minBlockIntervalMs: 0 }) };
        return supervise(`facilitator-${i}`, args, env, logDir, findings, /facilitator listening/);
      }),
    );
    for (const r of replicas) cleanups.push(() => r.stop());
    await Promise.all(replicas.map((r) => r.start()));
    const service = await startServiceProxy(replicaPorts);
    cleanups.push(() => service.close());

    const supported = (await (await fetch(`http://127.0.0.1:${replicaPorts[0]}/v2/supported`)).json()) as { kinds: unknown[]; extensions?: string[]; signers?: Record<string, string[]> };
    const tablePath = join(dir, "routing.json");
    const backend = { network: net.network, url: `http://127.0.0.1:${service.port}/v2`, kinds: supported.kinds, signers: Object.values(supported.signers ?? {}).flat(), extensions: supported.extensions ?? [] };
    await writeFile(tablePath, JSON.stringify({ backends: [backend] }));
    const [routerPort, routerAdminPort] = [await freePort(), await freePort()];
    const router = supervise("router", ["router", "--routing-table", tablePath, "--port", String(routerPort), "--admin-port", String(routerAdminPort)], { LOG_LEVEL: "info", DATABASE_URL: "", X402_ROUTER_TOKEN_FILE: tokenFile }, logDir, findings, /router listening/);
    cleanups.push(() => router.stop());
    await router.start();
    const routerUrl = `http://127.0.0.1:${routerPort}/v2`;
    log(`chaos: seed ${opts.seed}, ${replicaCount} replicas, ${clientCount} clients, ${Math.round(opts.durationMs / 1000)} s; logs in ${logDir}`);

    // Clients: each its own payer and its own random stream (the same payments for the same seed).
    const payments: Payment[] = [];
    const startedAt = Date.now();
    const endAt = startedAt + opts.durationMs;
    const client = async (c: number) => {
      const rng = prng(opts.seed * 31 + c + 1);
      const payerKey = payerKeys[c]!;
      while (Date.now() < endAt) {
        const spec: PaymentSpec = {
          network: net.network,
          chainId: net.chainId,
          asset: usdc,
          payerKey,
          payTo: receivers[between(rng, 0, receivers.length)]!,
          amount: BigInt(between(rng, 1, 10_000)),
          auth: { nonce: toHex(Uint8Array.from({ length: 32 }, () => between(rng, 0, 256))) },
        };
        // About one payment in five is settled by two or three callers at once (a resource server's retries racing).
        const callers = rng() < 0.2 ? (rng() < 0.5 ? 2 : 3) : 1;
        const body = serviceShape(spec, await signEip3009(spec));
        const payment: Payment = { id: payments.length, from: privateKeyToAccount(payerKey).address, nonce: spec.auth!.nonce as Hex, payTo: spec.payTo, amount: spec.amount, body, callers: [] };
        payments.push(payment);
        const text = JSON.stringify(body);
        payment.callers = await Promise.all(Array.from({ length: callers }, () => carefulSettle(routerUrl, text, giveUpMs)));
        await sleep(between(rng, 20, 200));
      }
    };
    const clientsDone = Promise.all(Array.from({ length: clientCount }, (_, c) => client(c)));

    // The faults, one at a time, on the seed's schedule.
    for (const fault of faultSchedule(opts.seed, opts.durationMs, replicaCount)) {
      const wait = startedAt + fault.atMs - Date.now();
      if (wait > 0) await sleep(wait);
      log(`chaos: +${Math.round((Date.now() - startedAt) / 1000)} s ${fault.kind}${fault.replica === undefined ? "" : ` (replica ${fault.replica})`} for ${fault.downMs} ms`);
      faultsDone[fault.kind]++;
      if (fault.kind === "replica") {
        const r = replicas[fault.replica!]!;
        await r.kill();
        await sleep(fault.downMs);
        void r.start().catch(() => undefined);
      } else if (fault.kind === "router") {
        await router.kill();
        await sleep(fault.downMs);
        void router.start().catch(() => undefined);
      } else if (fault.kind === "mining") {
        await rpc(anvil.rpcUrl, "evm_setAutomine", [false]);
        await sleep(fault.downMs);
        await rpc(anvil.rpcUrl, "evm_setAutomine", [true]);
        await rpc(anvil.rpcUrl, "evm_mine", []); // what piled up while paused
      } else {
        await pg.crash();
        if (fault.replica !== undefined) {
          // A replica that starts while the database is down must wait for it, not exit.
          await sleep(fault.downMs / 3);
          await replicas[fault.replica]!.kill();
          void replicas[fault.replica]!.start().catch(() => undefined);
          await sleep((fault.downMs * 2) / 3);
        } else await sleep(fault.downMs);
        await pg.start();
      }
    }

    // After the chaos: every process back (a replica in its back-off gets its time), then the clients finish.
    const back = async (p: Supervised) => {
      for (let i = 0; i < 60 && !p.running(); i++) await sleep(500);
      if (!p.running()) await p.start().catch(() => undefined);
    };
    await Promise.all([...replicas, router].map(back));
    await clientsDone;
    log(`chaos: faults over after ${Math.round((Date.now() - startedAt) / 1000)} s; ${payments.length} payments; a fresh one now`);

    // A fresh payment settles within 30 s of the chaos.
    const freshSpec: PaymentSpec = { network: net.network, chainId: net.chainId, asset: usdc, payerKey: payerKeys[0]!, payTo: receivers[0]!, amount: 4242n };
    const freshBody = serviceShape(freshSpec, await signEip3009(freshSpec));
    const freshStart = Date.now();
    const fresh = await carefulSettle(routerUrl, JSON.stringify(freshBody), 30_000);
    const freshSettleMs = fresh.final?.success ? Date.now() - freshStart : undefined;
    const freshPayment: Payment = {
      id: payments.length,
      from: privateKeyToAccount(payerKeys[0]!).address,
      nonce: (freshBody.paymentPayload.payload as { authorization: { nonce: Hex } }).authorization.nonce,
      payTo: freshSpec.payTo,
      amount: freshSpec.amount,
      body: freshBody,
      callers: [fresh],
    };

    // Every nonce a signer took ends in a mined transaction (automine is on again: the pool drains).
    const signers = signerKeys.map((k) => privateKeyToAccount(k).address);
    const nonces = async () => Promise.all(signers.map(async (a) => ({ latest: await chain.getTransactionCount({ address: a }), pending: await chain.getTransactionCount({ address: a, blockTag: "pending" }) })));
    let signerNonces = await nonces();
    for (let i = 0; i < 60 && signerNonces.some((n) => n.pending !== n.latest); i++) {
      await sleep(500);
      signerNonces = await nonces();
    }
    const { violations, settledOnChain } = await judge({ chain, token: usdc.address, payments: [...payments, freshPayment], receivers, startBalances, endBalances: await balances(), findings });
    for (const [i, n] of signerNonces.entries()) if (n.pending !== n.latest) violations.push({ rule: "a signer key left with unmined transactions 30 s after the chaos", count: 1, examples: [`${signers[i]}: latest ${n.latest}, pending ${n.pending}`] });
    if (freshSettleMs === undefined) violations.push({ rule: "a fresh payment after the chaos did not settle within 30 s", count: 1, examples: [fresh.answers.slice(-5).join(", ")] });

    // A failed run keeps its process logs (the report names the directory).
    if (violations.length) keep = true;
    const answers: Record<string, number> = {};
    for (const p of payments) for (const c of p.callers) for (const a of c.answers) answers[a] = (answers[a] ?? 0) + 1;
    return {
      seed: opts.seed,
      durationMs: opts.durationMs,
      payments: payments.length,
      callers: payments.reduce((n, p) => n + p.callers.length, 0),
      answers,
      faults: faultsDone,
      settledOnChain,
      freshSettleMs,
      storeRows: await storeRows(pg.url),
      signerTransactions: signerNonces.reduce((n, x) => n + x.pending, 0),
      violations,
      logDir,
    };
  } finally {
    for (const cleanup of cleanups.reverse()) await cleanup().catch(() => undefined);
    await rm(keep ? join(dir, "pgdata") : dir, { recursive: true, force: true });
  }
}

/** The payment rows by state, and claims left behind (a lease run out, nothing sent). */
async function storeRows(url: string): Promise<Record<string, number>> {
  const { default: pg } = await import("pg");
  const client = new pg.Client({ connectionString: url });
  client.on("error", () => undefined);
  try {
    await client.connect();
    const rows = (await client.query<{ state: string; n: string }>("SELECT state || CASE WHEN state = 'claimed' AND lease_until < now() THEN ' (lease expired)' ELSE '' END AS state, count(*) AS n FROM settlement_payments GROUP BY 1")).rows;
    return Object.fromEntries(rows.map((r) => [r.state, Number(r.n)]));
  } catch (e) {
    return { [`unreadable: ${(e as Error).message}`]: 0 };
  } finally {
    await client.end().catch(() => undefined);
  }
}

export interface JudgeInput {
  chain: ReturnType<typeof createPublicClient>;
  token: Address;
  payments: Payment[];
  receivers: Address[];
  startBalances: bigint[];
  endBalances: bigint[];
  findings: ProcessFindings;
}

/** Every rule of issue 33, judged on the chain: the answers are what is checked, never the evidence. */
export async function judge(input: JudgeInput): Promise<{ violations: Violation[]; settledOnChain: number }> {
  const { chain, token, payments } = input;
  const found = new Map<string, Violation>();
  const note = (rule: string, example: string) => {
    const v = found.get(rule) ?? { rule, count: 0, examples: [] };
    v.count++;
    if (v.examples.length < 3) v.examples.push(example);
    found.set(rule, v);
  };

  // Which authorizations the chain used, and in which transaction.
  const usedIn = new Map<string, Hex>();
  for (const l of await chain.getLogs({ address: token, event: authorizationUsed, fromBlock: 0n, toBlock: "latest" })) usedIn.set(`${l.args.authorizer!.toLowerCase()}:${l.args.nonce!.toLowerCase()}`, l.transactionHash!);
  const used: boolean[] = [];
  for (let i = 0; i < payments.length; i += 50) {
    const slice = payments.slice(i, i + 50);
    used.push(...(await Promise.all(slice.map((p) => chain.readContract({ address: token, abi: tokenAbi, functionName: "authorizationState", args: [p.from, p.nonce] })))));
  }
  const transfers = await chain.getLogs({ address: token, event: transferEvent, args: { to: input.receivers }, fromBlock: 0n, toBlock: "latest" });
  const transfersByTx = new Map<string, typeof transfers>();
  for (const t of transfers) transfersByTx.set(t.transactionHash!, [...(transfersByTx.get(t.transactionHash!) ?? []), t]);

  const expectedGain = input.receivers.map(() => 0n);
  const paidGain = input.receivers.map(() => 0n);
  for (const [i, p] of payments.entries()) {
    const onChain = used[i]!;
    const tx = usedIn.get(`${p.from.toLowerCase()}:${p.nonce.toLowerCase()}`);
    const label = `payment ${p.id} (${p.amount} to ${p.payTo.slice(0, 10)}…, nonce ${p.nonce.slice(0, 10)}…)`;
    const r = input.receivers.indexOf(p.payTo);
    if (onChain) paidGain[r] = paidGain[r]! + p.amount;
    const finals = p.callers.filter((c) => c.final);
    const successes = finals.filter((c) => c.final!.success);
    for (const c of p.callers) {
      if (c.answers.some((a) => a.startsWith("500 "))) note("an HTTP 500", `${label}: ${c.answers.join(", ")}`);
      if (c.gaveUp) note(onChain ? "a paid payment never got a final answer (gave up after 90 s)" : "no final answer within 90 s", `${label}: last answers ${c.answers.slice(-4).join(", ")}`);
      const f = c.final;
      if (!f || f.success) continue;
      const example = `${label}: ${f.reason}${f.message ? ` "${f.message.slice(0, 160)}"` : ""} after ${c.answers.length} answers`;
      if (onChain) note("a paid payment answered as a failure", example);
      else note("a valid payment refused with a final failure (an outage must be 503, never a verdict)", example);
      if (f.reason?.includes("unexpected_settle_error")) note("unexpected_settle_error answered", example);
    }
    if (successes.length) {
      if (r >= 0) expectedGain[r] = expectedGain[r]! + p.amount;
      if (!onChain) note("a success without its transfer on chain (authorizationState false)", label);
      const hashes = new Set(successes.map((c) => c.final!.transaction?.toLowerCase()));
      if (hashes.size > 1) note("more than one transaction hash for one payment", `${label}: ${[...hashes].join(", ")}`);
      const hash = successes[0]!.final!.transaction?.toLowerCase();
      const moved = hash ? transfersByTx.get(hash as Hex)?.some((t) => t.args.from?.toLowerCase() === p.from.toLowerCase() && t.args.to?.toLowerCase() === p.payTo.toLowerCase() && t.args.value === p.amount) : false;
      if (onChain && (hash !== tx?.toLowerCase() || !moved)) note("a success whose transaction is not the payment's transfer", `${label}: answered ${hash}, used in ${tx}`);
      if (successes.length < finals.length) note("contradictory answers to callers of one payment", `${label}: ${finals.map((c) => c.final!.reason).join(" / ")}`);
    }
  }
  for (const [i, r] of input.receivers.entries()) {
    const gain = input.endBalances[i]! - input.startBalances[i]!;
    if (gain !== expectedGain[i]) note("the receiver's gain is not the sum of the payments answered success", `${r}: gained ${gain}, answered success ${expectedGain[i]}, authorizations used ${paidGain[i]}`);
  }
  for (const line of input.findings.unhandled) note("an unhandled error in a process log", line);
  for (const exit of input.findings.exits) note("a process exited without being killed", exit);
  return { violations: [...found.values()], settledOnChain: used.filter(Boolean).length };
}

export function formatReport(r: ChaosReport): string {
  const lines = [
    `chaos verdict, seed ${r.seed} (replay: --seed ${r.seed}), ${Math.round(r.durationMs / 1000)} s of faults`,
    `  payments: ${r.payments} (${r.callers} callers), ${r.settledOnChain} used on chain; a fresh payment afterwards: ${r.freshSettleMs === undefined ? "NOT settled" : `${r.freshSettleMs} ms`}`,
    `  faults: ${Object.entries(r.faults).map(([k, n]) => `${k} ${n}`).join(", ")}`,
    `  answers: ${Object.entries(r.answers).sort((a, b) => b[1] - a[1]).map(([k, n]) => `${k} ×${n}`).join(", ")}`,
    `  signer transactions: ${r.signerTransactions} for ${r.settledOnChain} authorizations used`,
    `  store rows: ${Object.entries(r.storeRows).map(([k, n]) => `${k} ${n}`).join(", ")}`,
    r.violations.length ? `  VIOLATIONS (${r.violations.length} rules):` : "  no violations",
    ...r.violations.flatMap((v) => [`  - ${v.rule}: ${v.count}`, ...v.examples.map((e) => `      e.g. ${e}`)]),
    ...(r.violations.length ? [`  process logs kept in ${r.logDir}`] : []),
  ];
  return lines.join("\n");
}
