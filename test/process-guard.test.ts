// The last-resort process guard: a service started through the real CLI entry point survives an
// unhandled rejection and an uncaught exception, counts both in x402_unhandled_errors_total, logs
// them without the secrets their messages quote, and keeps serving.
import { afterEach, describe, expect, it } from "vitest";
import { spawn, type ChildProcess } from "node:child_process";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";

const children: ChildProcess[] = [];
const dirs: string[] = [];
afterEach(async () => {
  for (const c of children.splice(0)) c.kill("SIGKILL");
  for (const d of dirs.splice(0)) await rm(d, { recursive: true, force: true });
});

const counterOf = (metrics: string, kind: string) => Number(new RegExp(`^x402_unhandled_errors_total\\{kind="${kind}"[^}]*\\} (\\d+)$`, "m").exec(metrics)?.[1] ?? NaN);

describe("process guard", () => {
  it("router via the CLI: a stray rejection and exception are counted and logged without secrets; the process keeps serving", async () => {
    const dir = await mkdtemp(join(tmpdir(), "x402-guard-"));
    dirs.push(dir);
    const table = join(dir, "routing.json");
    await writeFile(table, JSON.stringify({ backends: [] }));
    const child = spawn(process.execPath, ["--import", "./test/helpers/stray-errors.mjs", "bin/x402-fleet.js", "router", "--routing-table", table, "--port", "0"], {
      env: { ...process.env, LOG_LEVEL: "info" },
      stdio: ["ignore", "pipe", "pipe"],
    });
    children.push(child);
    let out = "";
    child.stdout!.on("data", (d: Buffer) => (out += d.toString()));
    child.stderr!.on("data", (d: Buffer) => (out += d.toString()));
    let exited = false;
    child.once("exit", () => (exited = true));
    const until = async <T>(what: string, probe: () => Promise<T | undefined> | T | undefined): Promise<T> => {
      for (let i = 0; i < 300; i++) {
        const v = await probe();
        if (v !== undefined) return v;
        if (exited) throw new Error(`router exited while waiting for ${what}: ${out.slice(-800)}`);
        await new Promise((r) => setTimeout(r, 50));
      }
      throw new Error(`timed out waiting for ${what}: ${out.slice(-800)}`);
    };
    const [url, adminUrl] = await until("listening", () => {
      const m = /"url":"(http:\/\/127\.0\.0\.1:\d+\/v2)","admin":"(http:\/\/127\.0\.0\.1:\d+)"/.exec(out);
      return m ? [m[1]!, m[2]!] : undefined;
    });
    const metrics = async () => (await fetch(`${adminUrl}/metrics`)).text();
    // The series exist before anything went wrong (alerts need a zero to compare against).
    expect(counterOf(await metrics(), "rejection")).toBe(0);
    expect(counterOf(await metrics(), "exception")).toBe(0);

    child.kill("SIGUSR2");
    await until("both counted", async () => {
      const m = await metrics();
      return counterOf(m, "rejection") === 1 && counterOf(m, "exception") === 1 ? true : undefined;
    });
    // The log lines come through a pipe, the counts through HTTP: the two channels keep no order
    // between them, so wait for the two lines before reading them.
    const guardLines = () => out.split("\n").filter((l) => l.includes("unhandled"));
    await until("both logged", () => (["rejection", "exception"].every((k) => guardLines().some((l) => l.includes(`"kind":"${k}"`))) ? true : undefined));

    expect(exited).toBe(false);
    expect((await fetch(`${url}/supported`)).status).toBe(200);
    const lines = guardLines();
    expect(lines.some((l) => l.includes('"kind":"rejection"') && l.includes('"type":"Error"') && l.includes("<rpc>"))).toBe(true);
    expect(lines.some((l) => l.includes('"kind":"exception"') && l.includes('"type":"TypeError"'))).toBe(true);
    expect(out).not.toContain("SECRET");
  });
});
