// Exactly-once across processes: several facilitator processes sharing PostgreSQL, and processes
// killed with SIGKILL right after storing and right after broadcasting a settlement.
import { afterEach, describe, expect, it } from "vitest";
import { spawn, type ChildProcess } from "node:child_process";
import { join } from "node:path";
import { createPublicClient, http } from "viem";
import { privateKeyToAccount } from "viem/accounts";
import { DATABASE_URL, ENGINES, startRig, type Rig } from "./helpers/settlement-rig.ts";
import { balanceOf } from "./helpers/chain.ts";
import { postJson } from "./helpers/payments.ts";

let rig: Rig | undefined;
const children: ChildProcess[] = [];
afterEach(async () => {
  for (const c of children.splice(0)) c.kill("SIGKILL");
  await rig?.stop();
  rig = undefined;
});

/** Starts `x402-fleet facilitator` as its own process and resolves once it listens. */
function spawnFacilitator(r: Rig, env: Record<string, string>): Promise<{ url: string; child: ChildProcess; exited: Promise<NodeJS.Signals | null> }> {
  const child = spawn(process.execPath, ["bin/x402-fleet.js", "facilitator", "--network", r.network, "--rpc-url", r.anvil.rpcUrl, "--signer-key-file", r.keyFile, "--port", "0"], {
    env: { ...process.env, LOG_LEVEL: "info", X402_REPLACE_AFTER_MS: "60000", ...env },
    stdio: ["ignore", "pipe", "pipe"],
  });
  children.push(child);
  const exited = new Promise<NodeJS.Signals | null>((resolve) => child.once("exit", (_code, signal) => resolve(signal)));
  return new Promise((resolve, reject) => {
    let out = "";
    child.stdout!.on("data", (d: Buffer) => {
      out += d.toString();
      const m = /"url":"(http:\/\/127\.0\.0\.1:\d+\/v2)"/.exec(out);
      if (m) resolve({ url: m[1]!, child, exited });
    });
    child.once("exit", (code) => reject(new Error(`facilitator exited (${code}) before listening: ${out.slice(-500)}`)));
  });
}

const txCount = (r: Rig) => createPublicClient({ transport: http(r.anvil.rpcUrl) }).getTransactionCount({ address: privateKeyToAccount(r.signerKeys[0]!).address });

describe.skipIf(!DATABASE_URL)("three facilitator processes sharing PostgreSQL", () => {
  it("50 concurrent settles of one payment: one on-chain transaction, 50 identical answers", async () => {
    rig = await startRig({ engine: "postgres" });
    const processes = await Promise.all([0, 1, 2].map(() => spawnFacilitator(rig!, { DATABASE_URL: DATABASE_URL! })));
    const body = await rig.payment(5000n);
    const answers = await Promise.all(Array.from({ length: 50 }, (_, i) => postJson(`${processes[i % 3]!.url}/settle`, body)));
    expect(answers.every((a) => a.status === 200)).toBe(true);
    expect(new Set(answers.map((a) => a.text)).size).toBe(1);
    expect(answers[0]!.json).toMatchObject({ success: true, network: rig.network });
    expect(await txCount(rig)).toBe(1);
    expect(await balanceOf(rig.anvil.rpcUrl, rig.usdc.address, rig.receiver)).toBe(5000n);
  });
});

describe.each(ENGINES)("crash recovery (%s store)", (engine) => {
  it.each([
    ["after_store", 0],
    ["after_broadcast", 1],
  ] as const)("SIGKILL %s: after restart the payment settles exactly once and a retried /settle reports it", async (point, txsAtCrash) => {
    rig = await startRig({ engine });
    const storage: Record<string, string> = engine === "postgres" ? { DATABASE_URL: DATABASE_URL! } : { X402_DATA_DIR: join(rig.dir, "db"), DATABASE_URL: "" };
    const first = await spawnFacilitator(rig, { ...storage, X402_FAULT_CRASH_AT: point });
    const body = await rig.payment(321n);
    await expect(postJson(`${first.url}/settle`, body)).rejects.toThrow();
    expect(await first.exited).toBe("SIGKILL");
    expect(await txCount(rig)).toBe(txsAtCrash);

    const second = await spawnFacilitator(rig, storage);
    let answer: Record<string, unknown> | undefined;
    const deadline = Date.now() + 30_000;
    while (Date.now() < deadline) {
      answer = (await postJson(`${second.url}/settle`, body)).json;
      if (answer.success) break;
      expect(answer.errorReason).toBe("settlement_pending"); // never a second execution, never a false failure
      await new Promise((r) => setTimeout(r, 200));
    }
    expect(answer).toMatchObject({ success: true, network: rig.network });
    expect(await txCount(rig)).toBe(1);
    expect(await balanceOf(rig.anvil.rpcUrl, rig.usdc.address, rig.receiver)).toBe(321n);
    expect((await postJson(`${second.url}/settle`, body)).json).toEqual(answer);
  });
});
