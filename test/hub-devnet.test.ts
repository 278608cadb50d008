// The hub as it is run: the devnet starts it and writes hubUrl to devnet.json; the `x402-fleet hub`
// command serves it, logs no secrets or stored values, exposes metrics, and stops on SIGTERM.
import { describe, expect, it } from "vitest";
import { spawn } from "node:child_process";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { existsSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { generatePrivateKey, privateKeyToAccount } from "viem/accounts";
import { createHubClient } from "../services/hub/client.ts";
import { startTestDevnet } from "./helpers/devnet.ts";
import { JSON_TYPE, send, signedHeaders } from "./helpers/hub.ts";
import { until } from "./helpers/wait.ts";


describe("the devnet's hub", () => {
  it("starts with the devnet, is in devnet.json as hubUrl, shares the devnet's store, and stops with it", async () => {
    const devnet = await startTestDevnet(["eip155:84532"]);
    let hubUrl: string;
    try {
      const info = JSON.parse(await readFile(devnet.infoPath, "utf8")) as { hubUrl: string | null };
      expect(info.hubUrl).toBe(devnet.info.hubUrl);
      expect(info.hubUrl).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/);
      hubUrl = info.hubUrl!;
      expect(existsSync(join(devnet.dir, "hub"))).toBe(false); // no engine of its own: the devnet's in-memory one

      // the devnet's payer key writes its own memory; the domain's chain is the devnet chain
      const payer = privateKeyToAccount(devnet.info.payers[0]!.privateKey);
      const hub = createHubClient({ url: hubUrl, signer: payer });
      expect((await hub.info()).domain.chainId).toBe(84532);
      expect((await hub.info()).contractWallets).toBe(true);
      await hub.upload({ id: "devnet_0", message: "hello from the devnet" });
      expect(await hub.getConversation({ id: "devnet" })).toEqual(["hello from the devnet"]);
    } finally {
      await devnet.stop();
    }
    await expect(fetch(`${hubUrl}/api/info`)).rejects.toThrow();
  });
});

describe("x402-fleet hub", () => {
  it("serves on the embedded engine, logs neither signatures nor values, exposes metrics, and exits cleanly on SIGTERM", async () => {
    const dataDir = await mkdtemp(join(tmpdir(), "x402-hub-cli-"));
    const child = spawn(process.execPath, ["bin/x402-fleet.js", "hub", "--port", "0", "--data-dir", dataDir, "--chain-id", "84532"], {
      stdio: ["ignore", "pipe", "pipe"],
      env: { ...process.env, LOG_LEVEL: "info", DATABASE_URL: "", HUB_RPC_URL: "" },
    });
    let out = "";
    child.stdout.on("data", (d: Buffer) => (out += d.toString()));
    child.stderr.on("data", (d: Buffer) => (out += d.toString()));
    const exited = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)));
    try {
      const listening = await until(() => {
        const line = out.split("\n").find((l) => l.includes('"hub listening"'));
        return line ? (JSON.parse(line) as { url: string; admin: string; domain: { chainId: number } }) : undefined;
      }, "the hub to listen");
      expect(listening.domain.chainId).toBe(84532);

      const key = generatePrivateKey();
      const account = privateKeyToAccount(key);
      const secretMessage = "a private note 7f3a9c";
      const fields = { owner: account.address, bucket: "b", id: "k", message: secretMessage };
      const headers = await signedHeaders(account, { name: "x402-fleet hub", version: "1", chainId: 84532 }, fields);
      const res = await send(`${listening.url}/api/upload`, { headers: { ...JSON_TYPE, ...headers }, body: JSON.stringify(fields) });
      expect(res.status, res.text).toBe(200);
      expect((await send(`${listening.url}/api/download?owner=${account.address}&id=k`)).text).toBe(secretMessage);

      const metrics = (await send(`${listening.admin}/metrics`)).text;
      expect(metrics).toMatch(/x402_http_requests_total\{[^}]*route="\/api\/upload"[^}]*status="200"[^}]*\} 1/);
      expect((await send(`${listening.admin}/readyz`)).json).toEqual({ status: "ready", checks: { database: true } });

      expect(out).not.toContain(headers["x-hub-signature"]!.slice(2));
      expect(out).not.toContain(key.slice(2));
      expect(out).not.toContain(secretMessage);
    } finally {
      child.kill("SIGTERM");
      expect(await exited).toBe(0);
      await rm(dataDir, { recursive: true, force: true });
    }
  });
});
