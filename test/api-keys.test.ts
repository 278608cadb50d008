// API keys at the router (opt-in), judged on chain: a reference @x402/express resource server
// whose HTTPFacilitatorClient sends a key through createAuthHeaders pays through a key-requiring
// router; without a key, with a revoked key and with a key for another network it is refused and
// nothing is sent (the facilitator signer's nonce and the receiver's balance do not move). Keys
// live hashed in the shared PostgreSQL; the CLI creates, lists, rotates and revokes them. A gas
// budget is charged what the facilitator's signer lost (fees and the value of gas fundings),
// whatever the answer's status.
import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { randomBytes } from "node:crypto";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import type { Server } from "node:http";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import express from "express";
import { pino } from "pino";
import { paymentMiddleware, x402ResourceServer } from "@x402/express";
import { HTTPFacilitatorClient } from "@x402/core/server";
import { ExactEvmScheme as ExactEvmServer } from "@x402/evm/exact/server";
import { ExactEvmScheme as ExactEvmClient } from "@x402/evm/exact/client";
import { toClientEvmSigner } from "@x402/evm";
import { wrapFetchWithPayment, x402Client } from "@x402/fetch";
import { createPublicClient, createTestClient, createWalletClient, erc20Abi, http, type Address } from "viem";
import { generatePrivateKey, privateKeyToAccount, type PrivateKeyAccount } from "viem/accounts";
import { resolveFacilitatorConfig } from "../services/facilitator/config.ts";
import { startFacilitatorService } from "../services/facilitator/service.ts";
import type { RoutingTable } from "../services/router/routing-table.ts";
import { startRpcFaultProxy } from "./helpers/rpc-fault-proxy.ts";
import { startRouterService, type RunningRouter } from "../services/router/service.ts";
import { openDatabase, type Database } from "../services/platform/storage.ts";
import { API_KEY_MIGRATIONS, createApiKeyStore, type ApiKeyStore } from "../services/tenants/api-keys.ts";
import { devnetRouterTokenFile, type RunningDevnet } from "../services/devnet/devnet.ts";
import { startTestDevnet } from "./helpers/devnet.ts";
import { balanceOf } from "./helpers/chain.ts";
import { PG_URL } from "./helpers/hub.ts";
import { freePort, stopChild } from "../services/devnet/anvil.ts";
import { until } from "./helpers/wait.ts";
import { postJson, serviceShape, signEip3009 } from "./helpers/payments.ts";
import { FLEET_HEADERS } from "../services/platform/http.ts";

/** The secret part of x402k_<16 hex id>_<secret> (base64url: it may contain "_" itself). */
const secretOf = (key: string) => key.slice("x402k_".length + 17);
const BIN = fileURLToPath(new URL("../bin/x402-fleet.js", import.meta.url));
let devnet: RunningDevnet & { dir: string };
let router: RunningRouter;
let db: Database;
let keys: ApiKeyStore;
const servers: Server[] = [];
const createdIds: string[] = [];

beforeAll(async () => {
  // Base for most tests; BNB Smart Chain for approval sponsoring (fundings that carry value).
  devnet = await startTestDevnet(["eip155:8453", "eip155:56"], { hub: false, wallets: false });
  db = await openDatabase({ url: PG_URL, migrations: API_KEY_MIGRATIONS });
  keys = createApiKeyStore(db, { cacheMs: 0 });
  // a second router on the devnet's routing table, with keys required
  router = await startRouterService({ routingTablePath: join(devnet.dir, "routing.json"), host: "127.0.0.1", port: 0, databaseUrl: PG_URL, apiKeys: true, routerTokenFile: devnetRouterTokenFile(devnet.dir) }, pino({ level: "silent" }));
});

afterAll(async () => {
  for (const s of servers) await new Promise((r) => s.close(r));
  await router?.close();
  if (createdIds.length) {
    await db.query("DELETE FROM tenant_api_keys WHERE id = ANY($1::text[])", [createdIds]);
    await db.query("DELETE FROM tenant_quota_usage WHERE key_id = ANY($1::text[])", [createdIds]);
    await db.query("DELETE FROM tenant_usage WHERE key_id = ANY($1::text[])", [createdIds]);
    await db.query("DELETE FROM tenant_gas_budget_usage WHERE key_id = ANY($1::text[])", [createdIds]);
  }
  await db?.close();
  await devnet?.stop();
});

async function newKey(name: string, scope: Parameters<ApiKeyStore["create"]>[1] = {}) {
  const k = await keys.create(name, scope);
  createdIds.push(k.info.id);
  return k;
}

/** A reference resource server whose facilitator client sends `key` (if any) on verify and settle, to `via` (default: the keyed router on PostgreSQL). */
async function resourceServer(key: string | undefined, via: RunningRouter = router): Promise<string> {
  const payTo = devnet.info.receivers[0]!.address;
  const auth: Record<string, string> = key ? { Authorization: `Bearer ${key}` } : {};
  const client = new HTTPFacilitatorClient({ url: via.url, createAuthHeaders: async () => ({ verify: auth, settle: auth, supported: {} }) });
  const app = express();
  app.use(paymentMiddleware({ "GET /weather": { accepts: { scheme: "exact", price: "$0.01", network: "eip155:8453", payTo }, description: "weather" } }, new x402ResourceServer(client).register("eip155:8453", new ExactEvmServer())));
  app.get("/weather", (_req, res) => void res.json({ report: "sunny" }));
  const server = await new Promise<Server>((resolve) => {
    const s = app.listen(0, "127.0.0.1", () => resolve(s));
  });
  servers.push(server);
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}/weather`;
}

const payingFetch = () => wrapFetchWithPayment(fetch, x402Client.fromConfig({ schemes: [{ network: "eip155:*", client: new ExactEvmClient(privateKeyToAccount(devnet.info.payers[1]!.privateKey)) }] }));

/** What the chain says: the receiver's USDC and how many transactions the facilitator's signers sent. */
async function chainState() {
  const net = devnet.info.networks[0]!;
  const usdc = net.assets.find((a) => a.transferMethods.includes("eip3009"))!;
  const client = createPublicClient({ transport: http(net.rpcUrl) });
  const nonces = await Promise.all(net.signers.map((s) => client.getTransactionCount({ address: s as `0x${string}` })));
  const native = await Promise.all(net.signers.map((s) => client.getBalance({ address: s as `0x${string}` })));
  return {
    received: await balanceOf(net.rpcUrl, usdc.address, devnet.info.receivers[0]!.address),
    sent: nonces.reduce((a, b) => a + b, 0),
    /** What the signers hold in wei: gas spent is what leaves it. */
    signerWei: native.reduce((a, b) => a + b, 0n),
  };
}

describe("API keys at the router", () => {
  it("a valid key: the reference resource server is paid through the router, on chain", async () => {
    const k = await newKey("weather-co", { networks: ["eip155:8453"], schemes: ["exact"] });
    const key = k.key;
    const before = await chainState();
    const res = await payingFetch()(await resourceServer(key));
    expect(res.status).toBe(200);
    expect(await res.json()).toEqual({ report: "sunny" });
    const after = await chainState();
    expect(after.received).toBe(before.received + 10_000n); // $0.01 of 6-decimal USDC
    expect(after.sent).toBe(before.sent + 1);
    // usage for billing equals what the chain says moved
    const usage = await keys.usage({ keyId: k.info.id });
    const usdc = devnet.info.networks[0]!.assets.find((a) => a.transferMethods.includes("eip3009"))!.address.toLowerCase();
    expect(usage).toEqual([{ keyId: k.info.id, day: new Date().toISOString().slice(0, 10), network: "eip155:8453", asset: usdc, verifies: 1, valid: 1, settles: 1, settled: 1, volume: String(after.received - before.received), gasWei: String(before.signerWei - after.signerWei) }]);
    const metrics = await (await fetch(`${router.adminUrl}/metrics`)).text();
    expect(metrics).toMatch(new RegExp(`^x402_tenant_requests_total\\{key="${k.info.id}",network="eip155:8453",action="settle",result="ok"[^}]*\\} 1$`, "m"));
  });

  it("no key, a revoked key, a key for another network: refused with a clear code, nothing sent", async () => {
    const revoked = await newKey("revoked-co");
    await keys.revoke(revoked.info.id);
    const elsewhere = await newKey("bsc-only", { networks: ["eip155:56"] });
    const before = await chainState();
    for (const key of [undefined, revoked.key, elsewhere.key, `${revoked.key.slice(0, -4)}AAAA`]) {
      const res = await payingFetch()(await resourceServer(key));
      expect(res.status, String(key)).not.toBe(200);
    }
    expect(await chainState()).toEqual(before);

    // the router's answers, as the contract's error body
    const body = { x402Version: 2, paymentPayload: { x402Version: 2, accepted: { scheme: "exact", network: "eip155:8453" }, payload: {} }, paymentRequirements: { scheme: "exact", network: "eip155:8453" } };
    const post = async (headers: Record<string, string>) => {
      const r = await fetch(`${router.url}/settle`, { method: "POST", headers: { "content-type": "application/json", ...headers }, body: JSON.stringify(body) });
      return { status: r.status, error: ((await r.json()) as { error: string }).error, challenge: r.headers.get("www-authenticate") };
    };
    expect(await post({})).toMatchObject({ status: 401, error: expect.stringMatching(/^api_key_required: /), challenge: "Bearer" });
    expect(await post({ authorization: `Bearer ${revoked.key}` })).toMatchObject({ status: 403, error: expect.stringMatching(/^api_key_revoked: x402k_[0-9a-f]{16}_… was revoked/) });
    expect(await post({ "x-api-key": elsewhere.key })).toMatchObject({ status: 403, error: expect.stringContaining("api_key_out_of_scope: ") });
    const forged = await post({ authorization: `Bearer ${revoked.key.slice(0, -4)}AAAA` });
    expect(forged).toMatchObject({ status: 401, error: expect.stringMatching(/^api_key_invalid: /) });
    expect(JSON.stringify(forged)).not.toContain(secretOf(revoked.key)); // never echoes a secret
    // /supported stays open: resource servers discover kinds before they have a key
    expect((await fetch(`${router.url}/supported`)).status).toBe(200);
  });

  it("stores only a hash; rotation kills the old key at once", async () => {
    const { key, info } = await newKey("rotating-co");
    const secret = secretOf(key);
    const [row] = await db.query<Record<string, unknown>>("SELECT * FROM tenant_api_keys WHERE id = $1", [info.id]);
    expect(JSON.stringify(row)).not.toContain(secret);
    expect((await keys.authenticate(key)).ok).toBe(true);
    const rotated = (await keys.rotate(info.id))!;
    expect(await keys.authenticate(key)).toMatchObject({ ok: false, code: "api_key_invalid" });
    expect((await keys.authenticate(rotated.key)).ok).toBe(true);
  });

  it("quotas hold across two router replicas sharing PostgreSQL: settlements per day and requests per minute, refused before anything is sent", async () => {
    const second = await startRouterService({ routingTablePath: join(devnet.dir, "routing.json"), host: "127.0.0.1", port: 0, databaseUrl: PG_URL, apiKeys: true, routerTokenFile: devnetRouterTokenFile(devnet.dir) }, pino({ level: "silent" }));
    try {
      const { key } = await newKey("one-a-day", { settlementsPerDay: 1 });
      const net = devnet.info.networks[0]!;
      const asset = net.assets.find((a) => a.transferMethods.includes("eip3009"))!;
      const payment = async (amount: bigint) => {
        const spec = { network: net.network, chainId: net.chainId, asset, payerKey: devnet.info.payers[0]!.privateKey, payTo: devnet.info.receivers[0]!.address, amount };
        return serviceShape(spec, await signEip3009(spec));
      };
      const headers = { authorization: `Bearer ${key}` };
      const first = await postJson(`${router.url}/settle`, await payment(1111n), { headers });
      expect(first.json).toMatchObject({ success: true });
      const before = await chainState();
      const again = await postJson(`${second.url}/settle`, await payment(2222n), { headers }); // the other replica
      expect(again.status).toBe(429);
      expect(again.json.error).toMatch(/^quota_exceeded: x402k_[0-9a-f]{16}_… has used its 1 settlements per day \(UTC\)$/);
      expect(await chainState()).toEqual(before); // nothing sent
      expect((await postJson(`${second.url}/verify`, await payment(2222n), { headers })).json.isValid).toBe(true); // verify is not a settlement

      // three requests inside one minute window (the counter is per UTC minute): start early in one
      if (new Date().getUTCSeconds() > 40) await new Promise((r) => setTimeout(r, (61 - new Date().getUTCSeconds()) * 1000));
      const { key: chatty, info } = await newKey("chatty", { requestsPerMinute: 2 });
      const verify = (url: string) => postJson(`${url}/verify`, { x402Version: 2 }, { headers: { "x-api-key": chatty } });
      expect((await verify(router.url)).status).toBe(400); // counted, then judged (a bad body)
      expect((await verify(second.url)).status).toBe(400);
      const third = await verify(router.url);
      expect(third.status).toBe(429);
      expect(third.json.error).toContain("has used its 2 requests per minute");
      await keys.setLimits(info.id, { requestsPerMinute: null });
      await new Promise((r) => setTimeout(r, 5200)); // the routers' 5 s key cache
      expect((await verify(second.url)).status).toBe(400);
    } finally {
      await second.close();
    }
  });

  it("a daily gas budget holds across two router processes sharing PostgreSQL: charged what the chain says, refused before anything is signed", async () => {
    // Two real router processes, keys required, on the devnet's routing table.
    const routers: { url: string; child: ChildProcess }[] = [];
    const spawnRouter = async () => {
      const [port, adminPort] = [await freePort(), await freePort()];
      const child = spawn(process.execPath, [BIN, "router", "--routing-table", join(devnet.dir, "routing.json"), "--port", String(port), "--admin-port", String(adminPort), "--host", "127.0.0.1"], {
        stdio: "ignore",
        env: { ...process.env, X402_ROUTER_API_KEYS: "required", X402_ROUTER_TOKEN_FILE: devnetRouterTokenFile(devnet.dir), DATABASE_URL: PG_URL, OTEL_EXPORTER_OTLP_ENDPOINT: "" },
      });
      const url = `http://127.0.0.1:${port}/v2`;
      routers.push({ url, child });
      await until(async () => ((await fetch(`${url}/supported`).then((r) => r.status, () => 0)) === 200 ? true : undefined), "a router process", 20_000);
      return url;
    };
    try {
      const [a, b] = [await spawnRouter(), await spawnRouter()];
      const net = devnet.info.networks[0]!;
      const asset = net.assets.find((x) => x.transferMethods.includes("eip3009"))!;
      const chain = createPublicClient({ transport: http(net.rpcUrl) });
      const payment = async (amount: bigint) => {
        const spec = { network: net.network, chainId: net.chainId, asset, payerKey: devnet.info.payers[0]!.privateKey, payTo: devnet.info.receivers[0]!.address, amount };
        return serviceShape(spec, await signEip3009(spec));
      };
      const { key, info } = await newKey("gas-capped", { gasBudgets: { [net.network]: "1000000000000000000" } });
      const headers = { authorization: `Bearer ${key}` };

      // 1. A settlement through router A is charged what its receipt says it cost.
      const first = await postJson(`${a}/settle`, await payment(3333n), { headers });
      expect(first.json).toMatchObject({ success: true });
      const receipt = await chain.getTransactionReceipt({ hash: first.json.transaction as `0x${string}` });
      const cost = receipt.gasUsed * receipt.effectiveGasPrice;
      const [row] = await db.query<{ spent: string; reserved: string }>("SELECT spent::text, reserved::text FROM tenant_gas_budget_usage WHERE key_id = $1", [info.id]);
      expect(row).toEqual({ spent: cost.toString(), reserved: "0" });
      expect((await keys.usage({ keyId: info.id }))[0]).toMatchObject({ settled: 1, gasWei: cost.toString() });

      // fleet headers stay between router and facilitator
      expect([...first.headers.keys()].filter((h) => h.startsWith("x402-fleet"))).toEqual([]);

      // 2. The budget now leaves less than a settlement's worst case (the quote the facilitator gave A).
      await keys.setLimits(info.id, { gasBudgets: { [net.network]: (cost + 1000n).toString() } });
      await new Promise((r) => setTimeout(r, 5200)); // the routers' 5 s key cache
      const before = await chainState();
      // Router A knows the worst case and refuses before forwarding…
      const refusedA = await postJson(`${a}/settle`, await payment(4444n), { headers });
      expect(refusedA.status).toBe(429);
      const refusal = new RegExp(`^gas_budget_exhausted: x402k_${info.id}_… has 1000 wei left of its gas budget of ${cost + 1000n} wei on eip155:8453 today \\(UTC\\); one settlement may cost up to (\\d+) wei$`).exec(String(refusedA.json.error));
      expect(refusal, String(refusedA.json.error)).not.toBeNull();
      const quote = BigInt(refusal![1]!);
      expect(quote).toBeGreaterThan(cost); // the worst case (gas ceiling x fee cap) bounds what a settlement costs
      // …router B has no quote yet: it lends the 1000 wei left, and the facilitator refuses to sign beyond them.
      const refusedB = await postJson(`${b}/settle`, await payment(5555n), { headers });
      expect(refusedB.json).toMatchObject({ success: false, errorReason: "gas_budget_exhausted", transaction: "" });
      expect(await chainState()).toEqual(before); // nothing signed, nothing sent
      const [after] = await db.query<{ spent: string; reserved: string }>("SELECT spent::text, reserved::text FROM tenant_gas_budget_usage WHERE key_id = $1", [info.id]);
      expect(after).toEqual({ spent: cost.toString(), reserved: "0" });

      // 3. A settlement in flight on one replica holds its worst case from the others.
      await keys.setLimits(info.id, { gasBudgets: { [net.network]: (cost + quote + quote / 2n).toString() } });
      await new Promise((r) => setTimeout(r, 5200));
      const fresh = (await keys.list()).find((k) => k.id === info.id)!;
      const held = await keys.reserveGas(fresh, net.network, quote);
      expect("reservation" in held).toBe(true);
      const busy = await postJson(`${a}/settle`, await payment(6666n), { headers });
      expect(busy.status).toBe(429);
      expect(busy.json.error).toContain(`besides ${quote} wei held by settlements in flight`);
      await keys.settleGas((held as { reservation: Parameters<ApiKeyStore["settleGas"]>[0] }).reservation, 0n);
      const paid = await postJson(`${b}/settle`, await payment(7777n), { headers });
      expect(paid.json).toMatchObject({ success: true });
      expect((await chainState()).received).toBe(before.received + 7777n);
    } finally {
      await Promise.all(routers.map((r) => stopChild(r.child)));
    }
  });

  it("the admin API (admin port, bootstrap token from a file) creates, lists, limits, rotates and revokes keys and reports usage", async () => {
    const dir = mkdtempSync(join(tmpdir(), "x402-admin-"));
    const tokenFile = join(dir, "token");
    writeFileSync(tokenFile, "s3cret-admin-token-0123456789\n");
    const admin = await startRouterService({ routingTablePath: join(devnet.dir, "routing.json"), host: "127.0.0.1", port: 0, databaseUrl: PG_URL, apiKeys: true, adminTokenFile: tokenFile, routerTokenFile: devnetRouterTokenFile(devnet.dir) }, pino({ level: "silent" }));
    try {
      const call = async (method: string, path: string, body?: unknown, token = "s3cret-admin-token-0123456789") => {
        const r = await fetch(`${admin.adminUrl}${path}`, { method, headers: { ...(token ? { authorization: `Bearer ${token}` } : {}), ...(body !== undefined ? { "content-type": "application/json" } : {}) }, body: body === undefined ? undefined : JSON.stringify(body) });
        // eslint-disable-next-line @typescript-eslint/no-explicit-any
        return { status: r.status, json: (await r.json()) as Record<string, any> };
      };
      expect(await call("GET", "/admin/v1/api-keys", undefined, "")).toEqual({ status: 401, json: { error: "unauthorized: send the admin token as Authorization: Bearer <token>" } });
      expect((await call("GET", "/admin/v1/api-keys", undefined, "wrong-token-wrong-token")).status).toBe(401);
      // the public port has no admin paths
      expect((await fetch(`${admin.url.replace(/\/v2$/, "")}/admin/v1/api-keys`)).status).toBe(404);

      const created = await call("POST", "/admin/v1/api-keys", { name: "api-co", networks: ["eip155:8453"], schemes: ["exact"], settlementsPerDay: 10, gasBudgets: { "eip155:8453": "1000000000000000" } });
      expect(created.status).toBe(201);
      const { key, apiKey } = created.json as { key: string; apiKey: { id: string } };
      createdIds.push(apiKey.id);
      expect(apiKey).toMatchObject({ name: "api-co", networks: ["eip155:8453"], schemes: ["exact"], settlementsPerDay: 10, requestsPerMinute: null, gasBudgets: { "eip155:8453": "1000000000000000" }, revokedAt: null });
      // the key works at the public port
      const net = devnet.info.networks[0]!;
      const spec = { network: net.network, chainId: net.chainId, asset: net.assets.find((a) => a.transferMethods.includes("eip3009"))!, payerKey: devnet.info.payers[0]!.privateKey, payTo: devnet.info.receivers[0]!.address, amount: 1234n };
      const body = serviceShape(spec, await signEip3009(spec));
      expect((await postJson(`${admin.url}/verify`, body, { headers: { authorization: `Bearer ${key}` } })).json.isValid).toBe(true);

      const listed = await call("GET", "/admin/v1/api-keys");
      expect(JSON.stringify(listed.json)).not.toContain(secretOf(key));
      expect((listed.json.apiKeys as { id: string }[]).map((k) => k.id)).toContain(apiKey.id);
      expect((await call("PATCH", `/admin/v1/api-keys/${apiKey.id}`, { requestsPerMinute: 100, settlementsPerDay: null })).json.apiKey).toMatchObject({ requestsPerMinute: 100, settlementsPerDay: null });
      expect((await call("GET", `/admin/v1/usage?keyId=${apiKey.id}`)).json.usage).toMatchObject([{ keyId: apiKey.id, verifies: 1, valid: 1 }]);

      const rotated = await call("POST", `/admin/v1/api-keys/${apiKey.id}/rotate`);
      expect(rotated.json.key).toMatch(/^x402k_/);
      expect(await keys.authenticate(key)).toMatchObject({ ok: false, code: "api_key_invalid" });
      expect((await call("POST", `/admin/v1/api-keys/${apiKey.id}/revoke`)).json.apiKey).toMatchObject({ revokedAt: expect.any(String) });
      expect(await keys.authenticate(rotated.json.key)).toMatchObject({ ok: false, code: "api_key_revoked" });

      // bad input: a clear code, nothing changed
      expect(await call("POST", "/admin/v1/api-keys", { name: "x", networks: ["base"] })).toEqual({ status: 400, json: { error: "invalid_request: body.networks.0: a CAIP-2 network (eip155:<chain id>)" } });
      expect((await call("POST", "/admin/v1/api-keys", { name: "x", admin: true })).status).toBe(400);
      expect((await call("PATCH", `/admin/v1/api-keys/${apiKey.id}`, { gasBudgets: { "eip155:8453": "1e18" } })).json.error).toContain("wei as a decimal string");
      expect((await call("POST", "/admin/v1/api-keys/zzz/rotate")).json.error).toBe("invalid_request: id: a key id is 16 hex characters");
      expect((await call("POST", "/admin/v1/api-keys/0000000000000000/revoke")).status).toBe(404);
      expect((await call("GET", "/admin/v1/usage?since=yesterday")).status).toBe(400);
      // /metrics stays open on the admin port
      expect((await fetch(`${admin.adminUrl}/metrics`)).status).toBe(200);
    } finally {
      await admin.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it("the CLI creates, lists, rotates and revokes keys (DATABASE_URL), and refuses bad input by name", () => {
    const cli = (...args: string[]) => spawnSync(process.execPath, [BIN, ...args], { encoding: "utf8", env: { ...process.env, DATABASE_URL: PG_URL } });
    const created = cli("api-key-create", "--name", "cli-co", "--networks", "eip155:8453", "--schemes", "exact,upto");
    expect(created.status, created.stderr).toBe(0);
    const id = /^([0-9a-f]{16}) {2}cli-co {2}networks=eip155:8453 {2}schemes=exact,upto/.exec(created.stdout)![1]!;
    createdIds.push(id);
    const key = /key \(shown once, store it now\): (x402k_\S+)/.exec(created.stdout)![1]!;
    expect(cli("api-key-list").stdout).toContain(`${id}  cli-co`);
    expect(cli("api-key-list").stdout).not.toContain(secretOf(key));
    const rotated = cli("api-key-rotate", "--id", id);
    expect(rotated.stdout).toMatch(/new key \(shown once; the old one no longer works\): x402k_/);
    expect(cli("api-key-limits", "--id", id, "--settlements-per-day", "500", "--requests-per-minute", "none").stdout).toContain("requests/min=*  settlements/day=500");
    expect(cli("api-key-limits", "--id", id, "--settlements-per-day", "1.5").stderr).toContain('--settlements-per-day must be a non-negative integer or "none"');
    expect(cli("api-key-revoke", "--id", id).stdout).toMatch(/REVOKED=/);
    expect(cli("api-key-limits", "--id", id, "--gas-budget", "eip155:8453=2000000000000000,eip155:56=5").stdout).toContain("gas/day=eip155:56=5,eip155:8453=2000000000000000");
    expect(cli("api-key-limits", "--id", id, "--gas-budget", "eip155:56=none").stdout).toMatch(/gas\/day=eip155:8453=2000000000000000 {2}created/);
    expect(cli("api-key-limits", "--id", id, "--gas-budget", "eip155:8453=1e18").stderr).toContain("--gas-budget takes NETWORK=WEI or NETWORK=none");
    expect(cli("api-key-usage", "--since", "2026-01-01").stdout.split("\n")[0]).toBe("day,key,network,asset,verifies,valid,settles,settled,volume,gas_wei");
    expect(cli("api-key-usage", "--since", "yesterday").stderr).toContain("--since is a UTC day, YYYY-MM-DD");
    const bad = cli("api-key-create", "--name", "x", "--networks", "base");
    expect(bad.status).not.toBe(0);
    expect(bad.stderr).toContain('"base" is not a valid network');
    expect(cli("api-key-rotate").stderr).toContain("--id <16 hex characters> is required");
  });
});

describe("API keys without PostgreSQL: one router on its embedded engine", () => {
  /** The command as a user runs it; asynchronous, as the router answering it runs in this process. */
  const cliAsync = (args: string[], env: NodeJS.ProcessEnv) =>
    new Promise<{ status: number | null; stdout: string; stderr: string }>((resolve) => {
      const child = spawn(process.execPath, [BIN, ...args], { env });
      let stdout = "";
      let stderr = "";
      child.stdout.on("data", (d: Buffer) => (stdout += d.toString()));
      child.stderr.on("data", (d: Buffer) => (stderr += d.toString()));
      child.once("exit", (status) => resolve({ status, stdout, stderr }));
    });

  it("keys made through the admin API (x402-fleet api-key-create --admin-url) work, usage lands in the router's data dir, and survive a restart", async () => {
    const dir = mkdtempSync(join(tmpdir(), "x402-embedded-keys-"));
    const dataDir = join(dir, "data");
    const tokenFile = join(dir, "admin-token");
    writeFileSync(tokenFile, `${randomBytes(24).toString("hex")}\n`);
    const start = () => startRouterService({ routingTablePath: join(devnet.dir, "routing.json"), host: "127.0.0.1", port: 0, dataDir, apiKeys: true, adminTokenFile: tokenFile, routerTokenFile: devnetRouterTokenFile(devnet.dir) }, pino({ level: "silent" }));
    let embedded = await start();
    const env = { ...process.env, DATABASE_URL: "", X402_ROUTER_ADMIN_URL: "", X402_ROUTER_ADMIN_TOKEN_FILE: "" };
    try {
      // Neither a database nor a router to ask: refused by name.
      expect((await cliAsync(["api-key-list"], env)).stderr).toContain("DATABASE_URL (the routers' PostgreSQL database) or --admin-url");
      const created = await cliAsync(["api-key-create", "--name", "embedded-co", "--networks", "eip155:8453", "--admin-url", embedded.adminUrl, "--admin-token-file", tokenFile], env);
      expect(created.status, created.stderr).toBe(0);
      const id = /^([0-9a-f]{16}) {2}embedded-co {2}networks=eip155:8453/.exec(created.stdout)![1]!;
      const key = /key \(shown once, store it now\): (x402k_\S+)/.exec(created.stdout)![1]!;
      expect((await cliAsync(["api-key-list", "--admin-url", embedded.adminUrl, "--admin-token-file", tokenFile], env)).stdout).toContain(`${id}  embedded-co`);
      expect((await cliAsync(["api-key-list", "--admin-url", embedded.adminUrl, "--admin-token-file", join(dir, "missing")], env)).stderr).toContain("cannot be read (ENOENT)");

      // Without a key: refused, nothing sent. With it: paid on chain.
      const before = await chainState();
      expect((await payingFetch()(await resourceServer(undefined, embedded))).status).not.toBe(200);
      expect(await chainState()).toEqual(before);
      const res = await payingFetch()(await resourceServer(key, embedded));
      expect(res.status).toBe(200);
      const after = await chainState();
      expect(after.received).toBe(before.received + 10_000n);
      expect(after.sent).toBe(before.sent + 1);
      expect(await keys.usage({ keyId: id })).toEqual([]); // nothing in the shared PostgreSQL

      // The router's own files, read once it stopped: the key hashed, the usage what the chain says.
      await embedded.close();
      const db = await openDatabase({ dataDir, migrations: API_KEY_MIGRATIONS });
      try {
        const usdc = devnet.info.networks[0]!.assets.find((a) => a.transferMethods.includes("eip3009"))!.address.toLowerCase();
        expect(await createApiKeyStore(db, { cacheMs: 0 }).usage({ keyId: id })).toEqual([
          { keyId: id, day: new Date().toISOString().slice(0, 10), network: "eip155:8453", asset: usdc, verifies: 1, valid: 1, settles: 1, settled: 1, volume: "10000", gasWei: String(before.signerWei - after.signerWei) },
        ]);
        expect(JSON.stringify(await db.query("SELECT * FROM tenant_api_keys"))).not.toContain(secretOf(key));
      } finally {
        await db.close();
      }
      // Restarted on the same directory, the key still opens /verify.
      embedded = await start();
      const net = devnet.info.networks[0]!;
      const spec = { network: net.network, chainId: net.chainId, asset: net.assets.find((a) => a.transferMethods.includes("eip3009"))!, payerKey: devnet.info.payers[0]!.privateKey, payTo: devnet.info.receivers[0]!.address, amount: 1234n };
      expect((await postJson(`${embedded.url}/verify`, serviceShape(spec, await signEip3009(spec)), { headers: { authorization: `Bearer ${key}` } })).json.isValid).toBe(true);
    } finally {
      await embedded.close();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});

// ------------------------------------------------------------------ gas budgets: what the signer lost

describe("a gas budget is charged what the facilitator's signer lost", () => {
  const bsc = () => devnet.info.networks.find((n) => n.network === "eip155:56")!;
  const bscChain = () => createPublicClient({ transport: http(bsc().rpcUrl) });
  const usdt = () => bsc().assets.find((a) => a.symbol === "USDT")!.address as Address;
  const AMOUNT = 10n ** 16n; // 0.01 USDT (18 decimals)

  /** A payer holding USDT and no native coin, so its Permit2 approval must be funded. */
  async function gaslessPayer(): Promise<PrivateKeyAccount> {
    const payer = privateKeyToAccount(generatePrivateKey());
    const funder = createWalletClient({ account: privateKeyToAccount(devnet.info.payers[0]!.privateKey), transport: http(bsc().rpcUrl) });
    const hash = await funder.writeContract({ chain: null, address: usdt(), abi: erc20Abi, functionName: "transfer", args: [payer.address, 10n * AMOUNT] });
    await bscChain().waitForTransactionReceipt({ hash });
    return payer;
  }

  /** A Permit2 payment whose signed approval rides in the erc20ApprovalGasSponsoring extension (the reference client's). */
  async function sponsoredBody(payer: PrivateKeyAccount) {
    const requirements = { scheme: "exact", network: "eip155:56", asset: usdt(), amount: AMOUNT.toString(), payTo: devnet.info.receivers[0]!.address, maxTimeoutSeconds: 60, extra: { assetTransferMethod: "permit2" } };
    const created = await new ExactEvmClient(toClientEvmSigner(payer, bscChain())).createPaymentPayload(2, requirements as never, { extensions: { erc20ApprovalGasSponsoring: {} } } as never);
    return { x402Version: 2, paymentPayload: { ...created, accepted: requirements }, paymentRequirements: requirements };
  }

  /** The native coin the signers hold and the transactions they sent. */
  async function signers(addresses: readonly string[]) {
    const c = bscChain();
    const wei = await Promise.all(addresses.map((a) => c.getBalance({ address: a as Address })));
    const nonces = await Promise.all(addresses.map((a) => c.getTransactionCount({ address: a as Address, blockTag: "pending" })));
    return { wei: wei.reduce((a, b) => a + b, 0n), sent: nonces.reduce((a, b) => a + b, 0) };
  }

  /** What the key was charged today on BNB Smart Chain: the budget's spend, and usage's gas. */
  async function charged(keyId: string) {
    const [row] = await db.query<{ spent: string; reserved: string }>("SELECT spent::text, reserved::text FROM tenant_gas_budget_usage WHERE key_id = $1 AND network = 'eip155:56'", [keyId]);
    const usage = (await keys.usage({ keyId })).filter((u) => u.network === "eip155:56");
    return { spent: BigInt(row?.spent ?? 0), reserved: BigInt(row?.reserved ?? 0), usageGas: usage.reduce((a, u) => a + BigInt(u.gasWei), 0n), settles: usage.reduce((a, u) => a + u.settles, 0) };
  }

  /**
   * A facilitator of its own on BNB Smart Chain (a fresh, funded signer; approval sponsoring on) and
   * a keyed router in front of it, sharing a router token: the signer's balance is this pair's alone.
   */
  async function startKeyedPair(name: string, rpcUrl: string) {
    const signerKey = generatePrivateKey();
    const signer = privateKeyToAccount(signerKey).address;
    await createTestClient({ mode: "anvil", transport: http(bsc().rpcUrl) }).setBalance({ address: signer, value: 10n ** 19n });
    const routerTokenFile = join(devnet.dir, `${name}-router-token`);
    writeFileSync(routerTokenFile, `${randomBytes(32).toString("hex")}\n`, { mode: 0o600 });
    const config = resolveFacilitatorConfig({
      network: "eip155:56",
      rpcUrls: [rpcUrl],
      signerKeys: [signerKey],
      schemes: ["exact"],
      assets: bsc().assets,
      confirmations: 1,
      // the devnet's own: anvil serves eth_sendRawTransactionSync, mines at any moment
      policy: { sendRawTransactionSync: true, minBlockIntervalMs: 0 },
      erc20ApprovalSponsoring: "on",
      routerTokenFile,
      host: "127.0.0.1",
      port: 0,
      adminPort: 0,
      dataDir: join(devnet.dir, `${name}-facilitator`),
    });
    const facilitator = await startFacilitatorService(config, pino({ level: "silent" }));
    const supported = facilitator.facilitator.supported();
    const table: RoutingTable = { backends: [{ network: "eip155:56", url: facilitator.url, kinds: supported.kinds, signers: facilitator.signers, extensions: supported.extensions }] };
    const routingTablePath = join(devnet.dir, `${name}-routing.json`);
    writeFileSync(routingTablePath, JSON.stringify(table));
    const keyed = await startRouterService({ routingTablePath, host: "127.0.0.1", port: 0, databaseUrl: PG_URL, apiKeys: true, routerTokenFile }, pino({ level: "silent" }));
    return {
      url: keyed.url,
      facilitatorUrl: facilitator.url,
      routerToken: readFileSync(routerTokenFile, "utf8").trim(),
      signer,
      close: async () => {
        await keyed.close();
        await facilitator.close();
      },
    };
  }

  it("three sponsored payments: the fundings' value is charged with every fee", async () => {
    const pair = await startKeyedPair("sponsoring", bsc().facilitatorRpcUrl);
    try {
      const { key, info } = await newKey("sponsoring-co", { gasBudgets: { "eip155:56": (10n ** 18n).toString() } });
      const payers = [await gaslessPayer(), await gaslessPayer(), await gaslessPayer()];
      const before = await signers([pair.signer]);
      for (const payer of payers) {
        const settled = await postJson(`${pair.url}/settle`, await sponsoredBody(payer), { headers: { authorization: `Bearer ${key}` } });
        expect(settled.json).toMatchObject({ success: true });
        expect(await bscChain().getBalance({ address: payer.address })).toBeGreaterThan(0n); // funded: the signer lost value, not only fees
      }
      const after = await signers([pair.signer]);
      expect(after.sent).toBe(before.sent + 6); // a funding and a settlement each
      const lost = before.wei - after.wei;
      expect(await charged(info.id)).toEqual({ spent: lost, reserved: 0n, usageGas: lost, settles: 3 });
    } finally {
      await pair.close();
    }
  });

  it("an allowance below the payment's whole worst case is refused before its first step: no funding sent for a settlement the budget could not cover", async () => {
    const pair = await startKeyedPair("plan-budget", bsc().facilitatorRpcUrl);
    try {
      // As the router calls it: its token and an allowance. A first payment, unmetered, says what one settlement may cost (the quote).
      const settle = (body: unknown, allowance: string) => postJson(`${pair.facilitatorUrl}/settle`, body, { headers: { [FLEET_HEADERS.routerToken]: pair.routerToken, [FLEET_HEADERS.gasAllowance]: allowance } });
      const first = await settle(await sponsoredBody(await gaslessPayer()), "unlimited");
      expect(first.json).toMatchObject({ success: true });
      const quote = BigInt(first.headers.get(FLEET_HEADERS.gasQuote)!);
      // Half the worst case: the funding alone fits, and the settlement's real cost would too, but
      // the plan (funding + settlement at their ceilings) does not: nothing may start.
      const payer = await gaslessPayer();
      const before = await signers([pair.signer]);
      const refused = await settle(await sponsoredBody(payer), (quote / 2n).toString());
      expect(refused.json).toMatchObject({ success: false, errorReason: "gas_budget_exhausted", transaction: "" });
      expect(await signers([pair.signer])).toEqual(before); // nothing sent, nothing spent
      expect(await bscChain().getBalance({ address: payer.address })).toBe(0n); // never funded
    } finally {
      await pair.close();
    }
  });

  it("a 503 after a funding was mined is charged what the funding cost", async () => {
    // The facilitator's RPC refuses eth_sendRawTransaction (the payer's approval relay) but serves
    // eth_sendRawTransactionSync (the facilitator's own transactions): it funds the payer, then
    // cannot relay the approval, and answers 503 with the funding on chain.
    const proxy = await startRpcFaultProxy({ upstream: bsc().facilitatorRpcUrl, plan: { rate: 1, kinds: ["http_503"], methods: ["eth_sendRawTransaction"] } });
    const pair = await startKeyedPair("relay-refused", proxy.url);
    try {
      const { key, info } = await newKey("relay-refused-co", { gasBudgets: { "eip155:56": (10n ** 18n).toString() } });
      const payer = await gaslessPayer();
      const before = await signers([pair.signer]);
      const answer = await postJson(`${pair.url}/settle`, await sponsoredBody(payer), { headers: { authorization: `Bearer ${key}` } });
      expect(answer.status).toBe(503);
      const after = await signers([pair.signer]);
      expect(after.sent).toBe(before.sent + 1); // the funding, nothing else
      const lost = before.wei - after.wei;
      const funded = await bscChain().getBalance({ address: payer.address });
      expect(funded).toBeGreaterThan(0n);
      expect(lost).toBeGreaterThan(funded); // the funding's value and its fee
      expect(await charged(info.id)).toEqual({ spent: lost, reserved: 0n, usageGas: lost, settles: 1 });
    } finally {
      await pair.close();
      await proxy.close();
    }
  });
});

describe("settlement status with API keys", () => {
  it("a tenant reads the status of its own settlements only; without a key, none; the router publishes each network's confirmation policy", async () => {
    const net = devnet.info.networks[0]!;
    const asset = net.assets.find((a) => a.transferMethods.includes("eip3009"))!;
    const owner = (await newKey("status-owner")).key;
    const stranger = (await newKey("status-stranger")).key;
    const spec = { network: net.network, chainId: net.chainId, asset, payerKey: devnet.info.payers[0]!.privateKey, payTo: devnet.info.receivers[0]!.address, amount: 4321n };
    const body = serviceShape(spec, await signEip3009(spec));
    const before = await chainState();
    const settled = await postJson(`${router.url}/settle`, body, { headers: { "x-api-key": owner } });
    expect(settled.json).toMatchObject({ success: true });
    const hash = settled.json.transaction as `0x${string}`;
    const receipt = await createPublicClient({ transport: http(net.rpcUrl) }).getTransactionReceipt({ hash });
    expect(receipt.status).toBe("success");
    expect((await chainState()).received - before.received).toBe(4321n);

    const ask = (key?: string) => fetch(`${router.url}/settlements/status?network=${net.network}&transaction=${hash}`, { headers: key ? { "x-api-key": key } : {} }).then(async (r) => ({ status: r.status, json: (await r.json()) as Record<string, unknown> }));
    expect(await ask(owner)).toMatchObject({ status: 200, json: { status: "settled", state: "confirmed", transaction: hash, amount: "4321", blockNumber: receipt.blockNumber.toString() } });
    // Another tenant: not found (never "forbidden": it learns nothing of whose it is).
    expect(await ask(stranger)).toMatchObject({ status: 404, json: { error: expect.stringMatching(/^payment_not_found: /) } });
    expect(await ask()).toMatchObject({ status: 401, json: { error: expect.stringMatching(/^api_key_required: /) } });
    // The same with the payment itself.
    expect((await postJson(`${router.url}/settlements/status`, body, { headers: { "x-api-key": owner } })).json).toMatchObject({ transaction: hash, state: "confirmed" });
    expect((await postJson(`${router.url}/settlements/status`, body, { headers: { "x-api-key": stranger } })).status).toBe(404);
    // The facilitator's own port answers only its router.
    const direct = await fetch(`${net.facilitatorUrl}/settlements/status?network=${net.network}&transaction=${hash}`);
    expect(direct.status).toBe(401);

    // The router learns each facilitator's policy from its /supported (probed at start and every few seconds).
    const supported = await until(async () => {
      const s = (await (await fetch(`${router.url}/supported`)).json()) as { confirmationPolicy?: Record<string, { confirmations: number }>; extensions: string[] };
      return s.confirmationPolicy?.[net.network] ? s : undefined;
    }, "the router's /supported to carry the confirmation policy", 20_000);
    expect(supported.confirmationPolicy![net.network]).toEqual({ confirmations: 1 });
    expect(supported.extensions).toContain("settlement-status");
  });
});
