// Service lifecycle: the router's table reloads without a restart, a facilitator refuses a wrong
// chain, the signer key file is validated without echoing secrets, and the devnet cleans up.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pino } from "pino";
import { generatePrivateKey } from "viem/accounts";
import { startTestDevnet } from "./helpers/devnet.ts";
import { postJson, serviceShape, signEip3009 } from "./helpers/payments.ts";
import { startRouterService } from "../services/router/service.ts";
import { startFacilitatorService } from "../services/facilitator/service.ts";
import { parseSignerKeys, resolveFacilitatorConfig } from "../services/facilitator/config.ts";
import { startAnvil } from "../services/devnet/anvil.ts";
import type { RunningDevnet } from "../services/devnet/devnet.ts";
import { until } from "./helpers/wait.ts";

const silent = pino({ level: "silent" });
let devnet: RunningDevnet;
let dir: string;
beforeAll(async () => {
  devnet = await startTestDevnet(["eip155:84532"]);
  dir = await mkdtemp(join(tmpdir(), "x402-services-"));
});
afterAll(async () => {
  await devnet?.stop();
  await rm(dir, { recursive: true, force: true });
});


describe("router routing table", () => {
  it("serves a network added to the table file without a restart, and keeps the last good table on a broken file", async () => {
    const table = join(dir, "routing.json");
    await writeFile(table, JSON.stringify({ backends: [] }));
    const router = await startRouterService({ routingTablePath: table, host: "127.0.0.1", port: 0 }, silent);
    try {
      const net = devnet.info.networks[0]!;
      const spec = { network: net.network, chainId: net.chainId, asset: net.assets[0]!, payerKey: devnet.info.payers[0]!.privateKey, payTo: devnet.info.receivers[0]!.address, amount: 77n };
      const body = serviceShape(spec, await signEip3009(spec));
      expect((await postJson(`${router.url}/verify`, body)).json.error).toMatch(/^unsupported_scheme_network: .*registered pairs: \(none\)/);

      const backend = { network: net.network, url: net.facilitatorUrl, kinds: [{ x402Version: 2, scheme: "exact", network: net.network }], signers: net.signers };
      await writeFile(table, JSON.stringify({ backends: [backend] }));
      await until(async () => ((await postJson(`${router.url}/supported`, undefined, { method: "GET" })).json.kinds as unknown[]).length === 1 || undefined, "reload");
      expect((await postJson(`${router.url}/verify`, body)).json).toEqual({ isValid: true, payer: devnet.info.payers[0]!.address });

      await writeFile(table, "{ not json");
      await new Promise((r) => setTimeout(r, 1200)); // give the watcher time to see (and reject) the broken file
      expect((await postJson(`${router.url}/verify`, body)).json.isValid).toBe(true);
    } finally {
      await router.close();
    }
  });
});

describe("facilitator start-up checks", () => {
  it("refuses to start when the RPC reports another chain id", async () => {
    const anvil = await startAnvil({ chainId: 137 });
    try {
      const keyFile = join(dir, "k.key");
      await writeFile(keyFile, `${generatePrivateKey()}\n`);
      const config = resolveFacilitatorConfig({ network: "eip155:8453", rpcUrls: [anvil.rpcUrl], signerKeyFile: keyFile, port: 0 });
      await expect(startFacilitatorService(config, silent)).rejects.toThrow(/reports chain id 137, but this facilitator serves eip155:8453/);
    } finally {
      await anvil.stop();
    }
  });

  it("rejects a malformed signer key file without echoing its content", () => {
    const secret = "0xnot-a-key-but-secret-looking-0123456789";
    expect(() => parseSignerKeys(`# comment\n${generatePrivateKey()}\n${secret}\n`)).toThrow(/line 2 is not a 0x-prefixed 32-byte hex key/);
    try {
      parseSignerKeys(secret);
    } catch (e) {
      expect((e as Error).message).not.toContain(secret);
    }
    expect(parseSignerKeys(`\n${"0x" + "11".repeat(32)}\n\n`)).toHaveLength(1);
  });

  it("requires network, RPC URLs and keys, naming what is missing", () => {
    expect(() => resolveFacilitatorConfig({})).toThrow(/network is required/);
    expect(() => resolveFacilitatorConfig({ network: "eip155:8453" })).toThrow(/RPC URL/);
    expect(() => resolveFacilitatorConfig({ network: "eip155:8453", rpcUrls: ["http://127.0.0.1:1"] })).toThrow(/no signer keys/);
    expect(() => resolveFacilitatorConfig({ network: "base" as never, rpcUrls: ["http://127.0.0.1:1"] })).toThrow(/network/);
  });
});

describe("x402-fleet devnet", () => {
  it("writes devnet.json and stops every child process on SIGTERM", async () => {
    const stateDir = join(dir, "cli-devnet");
    const child = spawn(process.execPath, ["bin/x402-fleet.js", "devnet", "--networks", "eip155:8453,eip155:137", "--port", "0", "--state-dir", stateDir], { stdio: ["ignore", "pipe", "pipe"] });
    let out = "";
    child.stdout.on("data", (d: Buffer) => (out += d.toString()));
    try {
      const infoPath = join(stateDir, "devnet.json");
      await until(async () => (existsSync(infoPath) && out.includes("Ctrl-C") ? true : undefined), "devnet start", 60_000);
      const info = JSON.parse(await readFile(infoPath, "utf8"));
      expect(info.networks.map((n: { network: string }) => n.network)).toEqual(["eip155:8453", "eip155:137"]);
      for (const n of info.networks) {
        expect(n).toMatchObject({ chainId: expect.any(Number), rpcUrl: expect.stringMatching(/^http/), facilitatorUrl: expect.stringMatching(/\/v2$/), signers: [expect.stringMatching(/^0x/)] });
        expect(n.assets[0]).toMatchObject({ symbol: "USDC", decimals: 6, eip712: { version: "2" }, transferMethods: ["eip3009", "permit2"] });
      }
      expect(info.payers.map((p: { permit2Approved: boolean }) => p.permit2Approved)).toEqual([true, false]);
      expect(info.routerUrl).toMatch(/^http:\/\/127\.0\.0\.1:\d+\/v2$/);
      expect(info.hubUrl).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/); // the hub (issue 8)
      expect(out).toContain("curl");

      const exited = new Promise<number | null>((r) => child.once("exit", (code) => r(code)));
      child.kill("SIGTERM");
      expect(await exited).toBe(0);
      for (const n of info.networks) {
        await expect(fetch(n.rpcUrl, { method: "POST", body: "{}" })).rejects.toThrow();
      }
      await expect(fetch(`${info.routerUrl}/supported`)).rejects.toThrow();
    } finally {
      child.kill("SIGKILL");
    }
  });
});
