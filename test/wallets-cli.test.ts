// `x402-fleet wallets` as it is run: master key and admin token from files (mounted Secrets), the
// embedded engine under --data-dir; logs carry no key, token or credential; metrics and readiness on
// the admin port; clear start-up errors; a clean exit on SIGTERM.
import { describe, expect, it } from "vitest";
import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { call, errorCode, paymentRequired } from "./helpers/wallets.ts";

async function until<T>(fn: () => T | undefined, what: string, ms = 60_000): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = fn();
    if (v !== undefined) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

function run(args: string[], env: Record<string, string> = {}) {
  const child = spawn(process.execPath, ["bin/x402-fleet.js", "wallets", ...args], {
    stdio: ["ignore", "pipe", "pipe"],
    env: { ...process.env, LOG_LEVEL: "trace", DATABASE_URL: "", WALLETS_MASTER_KEY_FILE: "", WALLETS_ADMIN_TOKEN_FILE: "", ...env },
  });
  let out = "";
  child.stdout.on("data", (d: Buffer) => (out += d.toString()));
  child.stderr.on("data", (d: Buffer) => (out += d.toString()));
  const exited = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)));
  return { child, exited, out: () => out };
}

describe("x402-fleet wallets", () => {
  it("serves with secrets from files, logs none of them, exposes metrics and readiness, and exits cleanly on SIGTERM", async () => {
    const dir = await mkdtemp(join(tmpdir(), "x402-wallets-cli-"));
    const masterHex = randomBytes(32).toString("hex");
    const adminToken = randomBytes(24).toString("base64url");
    await writeFile(join(dir, "master.keys"), `cli-1:${masterHex}\n`, { mode: 0o600 });
    await writeFile(join(dir, "admin.token"), `${adminToken}\n`, { mode: 0o600 });
    const p = run(["--port", "0", "--data-dir", join(dir, "db"), "--master-key-file", join(dir, "master.keys"), "--admin-token-file", join(dir, "admin.token")]);
    try {
      const listening = await until(() => {
        const line = p.out().split("\n").find((l) => l.includes('"wallets listening"'));
        return line ? (JSON.parse(line) as { url: string; admin: string; masterKeys: { primary: string } }) : undefined;
      }, "the wallet service to listen");
      expect(listening.masterKeys.primary).toBe("cli-1");

      const platform = await call<{ apiKey: { key: string } }>(listening.url, adminToken, "POST", "/v1/admin/platforms", { name: "cli" });
      expect(platform.status).toBe(201);
      const key = platform.json.apiKey.key;
      const wallet = await call<{ id: string }>(listening.url, key, "POST", "/v1/wallets", { policy: { assets: [{ network: "eip155:8453", asset: "USDC" }] } });
      const paid = await call<{ paymentSignature: string }>(listening.url, key, "POST", `/v1/wallets/${wallet.json.id}/pay`, { paymentRequired: paymentRequired() });
      expect(paid.status).toBe(200);
      expect(errorCode(await call(listening.url, "wrong", "GET", "/v1/wallets"))).toBe("unauthorized");

      const metrics = await (await fetch(`${listening.admin}/metrics`)).text();
      expect(metrics).toMatch(/x402_wallet_payments_total\{[^}]*network="eip155:8453"[^}]*result="signed"[^}]*\} 1/);
      expect(metrics).toMatch(/x402_wallet_data_keys\{[^}]*master_key="cli-1"[^}]*\} 1/);
      expect(await (await fetch(`${listening.admin}/readyz`)).json()).toEqual({ status: "ready", checks: { database: true } });

      const out = p.out();
      expect(out).toContain("wallets platform created");
      expect(out).not.toContain(masterHex);
      expect(out).not.toContain(adminToken);
      expect(out).not.toContain(key.slice("x402w_".length + 17)); // the secret (base64url may contain "_")
      expect(out).not.toContain(paid.json.paymentSignature.slice(0, 40));
    } finally {
      p.child.kill("SIGTERM");
      expect(await p.exited).toBe(0);
      await rm(dir, { recursive: true, force: true });
    }
  });

  it("refuses to start without a master key, or with an unreadable one, and says why without quoting it", async () => {
    const dir = await mkdtemp(join(tmpdir(), "x402-wallets-cli-"));
    try {
      const none = run(["--port", "0", "--data-dir", join(dir, "db")]);
      expect(await none.exited).toBe(1);
      expect(none.out()).toContain("--master-key-file (or WALLETS_MASTER_KEY_FILE) is required");

      const short = randomBytes(20).toString("hex");
      await writeFile(join(dir, "bad.keys"), `k:${short}\n`);
      const bad = run(["--port", "0", "--data-dir", join(dir, "db")], { WALLETS_MASTER_KEY_FILE: join(dir, "bad.keys") });
      expect(await bad.exited).toBe(1);
      expect(bad.out()).toMatch(/line 1: a master key is 32 bytes/);
      expect(bad.out()).not.toContain(short);

      const rpc = run(["--port", "0", "--data-dir", join(dir, "db"), "--master-key-file", join(dir, "bad.keys"), "--rpc-url", "https://rpc.example/KEY123"]);
      expect(await rpc.exited).toBe(1);
      expect(rpc.out()).toContain("eip155:<chain id>=<http(s) URL>");
      expect(rpc.out()).not.toContain("KEY123");
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
});
