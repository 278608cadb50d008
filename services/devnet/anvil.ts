// Spawns real anvil nodes from the npm package (or an anvil on PATH) and stops them reliably.
import { spawn, type ChildProcess } from "node:child_process";
import { existsSync } from "node:fs";
import { createRequire } from "node:module";
import { createServer } from "node:net";
import { dirname, join } from "node:path";

export interface AnvilNode {
  chainId: number;
  port: number;
  rpcUrl: string;
  process: ChildProcess;
  stop(): Promise<void>;
}

export function anvilBinary(): string {
  try {
    const require = createRequire(import.meta.url);
    const pkg = require.resolve("@foundry-rs/anvil-linux-amd64/package.json");
    const bin = join(dirname(pkg), "bin", "anvil");
    if (existsSync(bin)) return bin;
  } catch {
    // not installed for this platform: fall back to PATH below
  }
  return "anvil";
}

/** Asks the OS for a free loopback port. */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.unref();
    srv.on("error", reject);
    srv.listen(0, "127.0.0.1", () => {
      const addr = srv.address();
      srv.close(() => (typeof addr === "object" && addr ? resolve(addr.port) : reject(new Error("no port"))));
    });
  });
}

async function waitForRpc(rpcUrl: string, child: ChildProcess, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (child.exitCode !== null) throw new Error(`anvil exited with code ${child.exitCode}`);
    try {
      const res = await fetch(rpcUrl, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ jsonrpc: "2.0", id: 1, method: "eth_chainId", params: [] }),
      });
      if (res.ok) return;
    } catch {
      // not listening yet
    }
    await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`anvil at ${rpcUrl} did not answer within ${timeoutMs} ms`);
}

export interface StartAnvilOptions {
  chainId: number;
  port?: number;
  /** Interval mining every this many seconds (fractions allowed); unset: a block per transaction. */
  blockTime?: number;
  /** The first block's base fee in wei (EIP-1559 moves it from there; 0 stays 0, as on BNB Smart Chain). */
  baseFeePerGas?: bigint;
}

export async function startAnvil(opts: StartAnvilOptions): Promise<AnvilNode> {
  // A free port we picked can be taken by another process before anvil binds it: pick another.
  for (let attempt = 1; ; attempt++) {
    try {
      return await startAnvilOn(opts.port ?? (await freePort()), opts);
    } catch (e) {
      if (opts.port !== undefined || attempt >= 3 || !/Address already in use/.test((e as Error).message)) throw e;
    }
  }
}

async function startAnvilOn(port: number, opts: StartAnvilOptions): Promise<AnvilNode> {
  const args = ["--chain-id", String(opts.chainId), "--port", String(port), "--host", "127.0.0.1", "--silent"];
  if (opts.blockTime) args.push("--block-time", String(opts.blockTime));
  if (opts.baseFeePerGas !== undefined) args.push("--base-fee", opts.baseFeePerGas.toString());
  const bin = anvilBinary();
  const child = spawn(bin, args, { stdio: ["ignore", "ignore", "pipe"] });
  let stderr = "";
  child.stderr?.on("data", (d: Buffer) => (stderr = (stderr + d.toString()).slice(-2000)));
  const spawnError = new Promise<never>((_, reject) =>
    child.once("error", (e) =>
      reject(new Error(bin === "anvil" ? `anvil not found: install @foundry-rs/anvil-linux-amd64 or put anvil on PATH (${e.message})` : e.message)),
    ),
  );
  const rpcUrl = `http://127.0.0.1:${port}`;
  try {
    await Promise.race([waitForRpc(rpcUrl, child, 60_000), spawnError]); // generous: CI machines can be loaded
  } catch (e) {
    child.kill("SIGKILL");
    throw new Error(`${(e as Error).message}${stderr ? `: ${stderr.trim()}` : ""}`);
  }
  return {
    chainId: opts.chainId,
    port,
    rpcUrl,
    process: child,
    stop: () => stopChild(child),
  };
}

export function stopChild(child: ChildProcess, graceMs = 3000): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
  return new Promise((resolve) => {
    const timer = setTimeout(() => child.kill("SIGKILL"), graceMs);
    child.once("exit", () => {
      clearTimeout(timer);
      resolve();
    });
    child.kill("SIGTERM");
  });
}

/**
 * Keeps an on-demand chain's head recent: a real chain's newest block is seconds old, but anvil
 * mining one block per transaction leaves an idle devnet's head minutes behind the clock, and every
 * simulation runs at the head's timestamp, so a payment signed as valid from a minute ago looks
 * "not yet valid" (answered 503: the provider is behind). Mines one empty block when the head is
 * older than maxAgeMs and anvil is automining (never while a test has paused mining).
 */
export function keepHeadFresh(rpcUrl: string, maxAgeMs = 30_000): () => void {
  const call = async (method: string, params: unknown[] = []) => {
    const res = await fetch(rpcUrl, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ jsonrpc: "2.0", id: 1, method, params }), signal: AbortSignal.timeout(5000) });
    return ((await res.json()) as { result?: unknown }).result;
  };
  const timer = setInterval(() => {
    void (async () => {
      if ((await call("anvil_getAutomine")) !== true) return;
      const head = (await call("eth_getBlockByNumber", ["latest", false])) as { timestamp?: string } | undefined;
      if (head?.timestamp && Date.now() - Number(BigInt(head.timestamp)) * 1000 > maxAgeMs) await call("evm_mine");
    })().catch(() => undefined); // the node stopping, or busy: the next tick tries again
  }, Math.max(1000, maxAgeMs / 3));
  timer.unref();
  return () => clearInterval(timer);
}
