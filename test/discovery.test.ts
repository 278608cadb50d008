// The discovery catalog (bazaar), end to end with the reference packages: a @x402/express resource
// server declaring the bazaar extension is paid once through a discovery-enabled router, then
// appears in GET /v2/discovery/resources (read with the reference `withBazaar` client), filterable
// and searchable. Hostile declarations (a client echoes whatever it likes) are soft-dropped field by
// field, or refused whole when the resource URL is an IP literal or localhost. A declarer cannot
// take over someone else's entry: /verify writes nothing; a settled declaration (judged on chain:
// its payment landed) is unproven and only appends its own payment option, even when it paid the
// owner's payTo; an entry is owned, rewritten and re-priced only by what the resource's own 402
// answer says (reference resource servers the router fetches), and a squatter's entry is taken over
// by the real service once the resource vouches for it (rows read from the catalog, on PostgreSQL
// and on the embedded engine).
import type { Server } from "node:http";
import type { AddressInfo } from "node:net";
import { randomBytes } from "node:crypto";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import express from "express";
import { pino } from "pino";
import { paymentMiddleware, x402ResourceServer } from "@x402/express";
import { HTTPFacilitatorClient } from "@x402/core/server";
import { x402Client } from "@x402/core/client";
import type { PaymentPayload, PaymentRequired, PaymentRequirements } from "@x402/core/types";
import { ExactEvmScheme as ExactEvmServer } from "@x402/evm/exact/server";
import { ExactEvmScheme as ExactEvmClient } from "@x402/evm/exact/client";
import { bazaarResourceServerExtension, declareDiscoveryExtension, withBazaar } from "@x402/extensions/bazaar";
import { wrapFetchWithPayment } from "@x402/fetch";
import { generatePrivateKey, privateKeyToAccount } from "viem/accounts";
import type { Address, Hex } from "viem";
import { startRouterService, type RunningRouter } from "../services/router/service.ts";
import { openDatabase, type Database } from "../services/platform/storage.ts";
import { DISCOVERY_MIGRATIONS, MAX_UNPROVEN_ACCEPTS, createCatalog } from "../services/discovery/catalog.ts";
import { createApiKeyStore, type ApiKeyStore } from "../services/tenants/api-keys.ts";
import { devnetRouterTokenFile, type RunningDevnet } from "../services/devnet/devnet.ts";
import { startTestDevnet } from "./helpers/devnet.ts";
import { balanceOf, receiptStatus } from "./helpers/chain.ts";
import { nonceOf } from "./helpers/onchain.ts";
import { PG_URL } from "./helpers/hub.ts";
import { postJson } from "./helpers/payments.ts";
import { until } from "./helpers/wait.ts";

const run = randomBytes(4).toString("hex"); // this run's resources, apart from any other run's rows
const host = `weather-${run}.example.com`;
let devnet: RunningDevnet & { dir: string };
let router: RunningRouter;
/** A second router on the same catalog, with API keys required: declarers are tenants too. */
let keyedRouter: RunningRouter;
let keys: ApiKeyStore;
const keyIds: string[] = [];
let db: Database;
let server: Server;
/** Resource servers the routers prove declarations against: their public-looking hosts, mapped to the local servers (past the SSRF guard, for these hosts only). */
const hosts: Record<string, string> = {};
/** A reference resource server that declares bazaar: the real service behind svc-<run>.example.com. */
let services: Server;
const svcHost = `svc-${run}.example.com`;
/** The real payees of /c2 and of /liar, which no declarer below pays. */
const realPayee = privateKeyToAccount(generatePrivateKey()).address;
const liarsPayee = privateKeyToAccount(generatePrivateKey()).address;

beforeAll(async () => {
  devnet = await startTestDevnet(["eip155:8453"], { hub: false, wallets: false });
  db = await openDatabase({ url: PG_URL, migrations: DISCOVERY_MIGRATIONS });
  const discoveryVerification = { hosts, timeoutMs: 10_000 };
  router = await startRouterService({ routingTablePath: join(devnet.dir, "routing.json"), host: "127.0.0.1", port: 0, databaseUrl: PG_URL, discovery: true, discoveryVerification, routerTokenFile: devnetRouterTokenFile(devnet.dir) }, pino({ level: "silent" }));
  keyedRouter = await startRouterService({ routingTablePath: join(devnet.dir, "routing.json"), host: "127.0.0.1", port: 0, databaseUrl: PG_URL, discovery: true, apiKeys: true, discoveryVerification, routerTokenFile: devnetRouterTokenFile(devnet.dir) }, pino({ level: "silent" }));
  keys = createApiKeyStore(db, { cacheMs: 0 });

  // The real services: each route answers 402 with its own text and payee (1000 atomic USDC); /free answers 200.
  const route = (path: string, to: Address, text: string) => ({
    accepts: { scheme: "exact", price: "$0.001", network: "eip155:8453" as const, payTo: to },
    resource: `https://${svcHost}${path}`,
    description: text,
    serviceName: "Real Co",
    tags: ["real"],
    extensions: declareDiscoveryExtension({ input: { q: "x" }, inputSchema: { properties: { q: { type: "string" } } } }),
  });
  const app = express();
  const resourceServer = new x402ResourceServer(new HTTPFacilitatorClient({ url: router.url })).register("eip155:8453", new ExactEvmServer()).registerExtension(bazaarResourceServerExtension);
  app.use(paymentMiddleware({ "GET /c1": route("/c1", payTo(), "The real C1 API"), "GET /c2": route("/c2", realPayee, "The real C2 API"), "GET /c3": route("/c3", realPayee, "The real C3 API"), "GET /liar": route("/liar", liarsPayee, "The liar's real API") }, resourceServer));
  app.get("/free", (_req, res) => void res.json({ free: true }));
  services = await new Promise<Server>((resolve) => {
    const s = app.listen(0, "127.0.0.1", () => resolve(s));
  });
  const origin = `http://127.0.0.1:${(services.address() as AddressInfo).port}`;
  // The other hosts below run no x402 resource: mapped here, their check gets a plain 404 at once instead of a DNS lookup.
  for (const name of [svcHost, `owned-${run}.example.com`, `tenant-${run}.example.com`, `poisoned-${run}.example.com`, `broken-${run}.example.com`]) hosts[name] = origin;
});

afterAll(async () => {
  await new Promise((r) => server?.close(r));
  await new Promise((r) => services?.close(r));
  await router?.close();
  await keyedRouter?.close();
  if (keyIds.length) for (const table of ["tenant_api_keys", "tenant_quota_usage", "tenant_usage"]) await db.query(`DELETE FROM ${table} WHERE ${table === "tenant_api_keys" ? "id" : "key_id"} = ANY($1::text[])`, [keyIds]);
  await db?.query("DELETE FROM discovery_resources WHERE resource LIKE $1", [`%${run}%`]);
  await db?.close();
  await devnet?.stop();
});

const payTo = () => devnet.info.receivers[0]!.address;
const bazaar = () => withBazaar(new HTTPFacilitatorClient({ url: router.url })).extensions.bazaar;
const usdcOf = () => devnet.info.networks[0]!.assets.find((a) => a.transferMethods.includes("eip3009"))!;
const rpcUrl = () => devnet.info.networks[0]!.rpcUrl;

/** A declaration as the resource server's extension sends it (enriched with the route's method). */
function declaration(): Record<string, unknown> {
  const declared = declareDiscoveryExtension({ input: { q: "x" }, inputSchema: { properties: { q: { type: "string" } } } }).bazaar!;
  return { bazaar: { ...declared, info: { ...declared.info, input: { ...declared.info.input, method: "GET" } } } };
}

/**
 * A client's payment echoing whatever `resource` and `extensions` it likes, sent to a router's
 * /verify or /settle (with an API key when given): the answer and the catalog's outcome header.
 */
async function declare(action: "verify" | "settle", resource: Record<string, unknown>, opts: { extensions?: Record<string, unknown>; payTo?: Address; amount?: string; key?: string; via?: RunningRouter } = {}) {
  const usdc = usdcOf();
  const requirements = { scheme: "exact", network: "eip155:8453" as const, asset: usdc.address, amount: opts.amount ?? "1000", payTo: opts.payTo ?? payTo(), maxTimeoutSeconds: 300, extra: { name: usdc.eip712!.name, version: usdc.eip712!.version } };
  const client = x402Client.fromConfig({ schemes: [{ network: "eip155:*", client: new ExactEvmClient(privateKeyToAccount(devnet.info.payers[1]!.privateKey)) }] });
  const paymentRequired = { x402Version: 2, resource, accepts: [requirements], extensions: opts.extensions ?? declaration() } as unknown as PaymentRequired;
  const paymentPayload = await client.createPaymentPayload(paymentRequired);
  const res = await fetch(`${(opts.via ?? router).url}/${action}`, {
    method: "POST",
    headers: { "content-type": "application/json", ...(opts.key ? { authorization: `Bearer ${opts.key}` } : {}) },
    body: JSON.stringify({ x402Version: 2, paymentPayload, paymentRequirements: requirements }),
  });
  const header = res.headers.get("extension-responses");
  const json = (await res.json()) as { isValid?: boolean; success?: boolean; transaction?: Hex };
  return { status: res.status, json, bazaar: header ? (JSON.parse(Buffer.from(header, "base64").toString("utf8")) as { bazaar: unknown }).bazaar : undefined };
}

/** A settled declaration, checked on chain: its transfer was mined and `payTo` received the amount. */
async function settled(resource: Record<string, unknown>, opts: Parameters<typeof declare>[2] = {}) {
  const to = opts.payTo ?? payTo();
  const before = await balanceOf(rpcUrl(), usdcOf().address, to);
  const answer = await declare("settle", resource, opts);
  expect(answer.json.success, JSON.stringify(answer.json)).toBe(true);
  expect(await receiptStatus(rpcUrl(), answer.json.transaction!)).toBe("success");
  expect(await balanceOf(rpcUrl(), usdcOf().address, to)).toBe(before + BigInt(opts.amount ?? "1000"));
  return answer;
}

/** How many declarations a router has checked against their resource (every result counted, skips too). */
async function checks(via: RunningRouter = router): Promise<number> {
  const text = await (await fetch(`${via.adminUrl}/metrics`)).text();
  return text.split("\n").filter((l) => l.startsWith("x402_discovery_verifications_total{")).reduce((sum, l) => sum + Number(l.split(" ").pop()), 0);
}

/** A settled declaration, and its check against the resource finished (the router counted it). */
async function settledAndChecked(resource: Record<string, unknown>, opts: Parameters<typeof declare>[2] = {}) {
  const before = await checks(opts.via);
  const answer = await settled(resource, opts);
  await until(async () => ((await checks(opts.via)) > before ? true : undefined), "the declaration's check against its resource");
  return answer;
}

type EntryRow = { description: string | null; service_name: string | null; tags: string[] | null; icon_url: string | null; accepts: { payTo: string; amount: string; asset: string }[]; accept_tenants: string[]; accept_verified: boolean[]; owner_pay_to: string | null; owner_tenant: string; last_updated: Date };
/** A resource's catalog row as stored (undefined when it is not catalogued). */
async function entryRow(resource: string, on: Database = db): Promise<EntryRow | undefined> {
  const [row] = await on.query<EntryRow>("SELECT description, service_name, tags, icon_url, accepts, accept_tenants, accept_verified, owner_pay_to, owner_tenant, last_updated FROM discovery_resources WHERE resource = $1", [resource]);
  return row;
}

/** Every column of a resource's row, as text: equal means byte-identical. */
async function wholeRow(resource: string): Promise<string | undefined> {
  const [row] = await db.query<{ row: string }>("SELECT r::text AS row FROM discovery_resources r WHERE resource = $1", [resource]);
  return row?.row;
}

describe("the discovery catalog (bazaar)", () => {
  it("a resource server declaring bazaar shows up after one paid request, filterable and searchable", async () => {
    const resource = `https://${host}/weather`;
    const app = express();
    const routes = {
      "GET /weather": {
        accepts: { scheme: "exact", price: "$0.01", network: "eip155:8453" as const, payTo: payTo() },
        resource,
        description: "Weather by city, updated hourly",
        mimeType: "application/json",
        serviceName: "Weather Co",
        tags: ["weather", "forecast"],
        iconUrl: `https://${host}/icon.png`,
        extensions: declareDiscoveryExtension({ input: { city: "Paris" }, inputSchema: { properties: { city: { type: "string" } }, required: ["city"] }, output: { example: { city: "Paris", weather: "sunny" } } }),
      },
    };
    const resourceServer = new x402ResourceServer(new HTTPFacilitatorClient({ url: router.url })).register("eip155:8453", new ExactEvmServer()).registerExtension(bazaarResourceServerExtension);
    app.use(paymentMiddleware(routes, resourceServer));
    app.get("/weather", (_req, res) => void res.json({ city: "Paris", weather: "sunny" }));
    server = await new Promise<Server>((resolve) => {
      const s = app.listen(0, "127.0.0.1", () => resolve(s));
    });
    const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/weather?city=Paris`;
    hosts[host] = `http://127.0.0.1:${(server.address() as AddressInfo).port}`; // the router proves the declaration against this server

    expect((await postJson(`${router.url}/supported`, undefined, { method: "GET" })).json.extensions).toContain("bazaar");
    expect((await bazaar().listResources({ payTo: payTo(), type: "http" })).items.filter((i) => i.resource.includes(run))).toEqual([]);
    const usdc = devnet.info.networks[0]!.assets.find((a) => a.transferMethods.includes("eip3009"))!;
    const before = await balanceOf(devnet.info.networks[0]!.rpcUrl, usdc.address, payTo());
    const pay = wrapFetchWithPayment(fetch, x402Client.fromConfig({ schemes: [{ network: "eip155:*", client: new ExactEvmClient(privateKeyToAccount(devnet.info.payers[1]!.privateKey)) }] }));
    const res = await pay(url);
    expect(res.status).toBe(200);
    expect(await balanceOf(devnet.info.networks[0]!.rpcUrl, usdc.address, payTo())).toBe(before + 10_000n); // the request was paid

    const listed = await bazaar().listResources({ network: "eip155:8453", payTo: payTo().toLowerCase(), type: "http", extensions: "bazaar" });
    const mine = listed.items.filter((i) => i.resource.includes(run));
    expect(mine).toHaveLength(1);
    expect(mine[0]).toMatchObject({
      resource,
      type: "http",
      x402Version: 2,
      description: "Weather by city, updated hourly",
      mimeType: "application/json",
      serviceName: "Weather Co",
      tags: ["weather", "forecast"],
      iconUrl: `https://${host}/icon.png`,
      accepts: [{ scheme: "exact", network: "eip155:8453", amount: "10000", payTo: payTo(), asset: usdc.address }],
      extensions: { bazaar: { info: { input: { type: "http", method: "GET", queryParams: { city: "Paris" } } } } },
    });
    expect(Date.now() - Date.parse(mine[0]!.lastUpdated)).toBeLessThan(60_000);
    expect(listed.pagination).toMatchObject({ limit: 100, offset: 0 });
    expect(listed.pagination.total).toBeGreaterThanOrEqual(1);

    // filters that exclude it
    for (const filter of [{ type: "mcp" }, { scheme: "upto" }, { network: "eip155:56" }, { payTo: "0x000000000000000000000000000000000000dead" }, { extensions: "bazaar,payment-identifier" }]) {
      expect((await bazaar().listResources(filter)).items.filter((i) => i.resource.includes(run)), JSON.stringify(filter)).toEqual([]);
    }
    // search: every word must match its URL, description, name or tags
    const found = await bazaar().search({ query: `Forecast ${run}` });
    expect(found.resources.map((r) => r.resource)).toEqual([resource]);
    expect((await bazaar().search({ query: `${run} tsunami` })).resources).toEqual([]);
    // pagination: a page of one, with a cursor to the next
    const page = await bazaar().search({ query: "weather", limit: 1 });
    expect(page.resources).toHaveLength(1);
    expect(page.pagination?.limit).toBe(1);

    // bad parameters: the contract's error body, never a 500; other unknown paths stay 404
    const bad = await postJson(`${router.url}/discovery/resources?limit=0`, undefined, { method: "GET" });
    expect(bad.status).toBe(400);
    expect(bad.json.error).toMatch(/^invalid_request: limit must be an integer from 1 to 100$/);
    expect((await postJson(`${router.url}/discovery/search`, undefined, { method: "GET" })).json.error).toMatch(/^invalid_request: query is required/);
    expect((await postJson(`${router.url}/discovery/resources`, {})).status).toBe(405);
    expect((await postJson(`${router.url}/discovery/other`, undefined, { method: "GET" })).status).toBe(404);
  });

  it("hostile declarations: invalid service metadata is dropped field by field; an IP-literal or localhost resource is not catalogued", async () => {
    /** Settled, so that its declaration is catalogued (or refused). */
    const settle = async (resource: Record<string, unknown>, extensions?: Record<string, unknown>) => {
      const answer = await declare("settle", resource, { extensions });
      return { settled: answer.json.success, bazaar: answer.bazaar };
    };

    const poisoned = `https://poisoned-${run}.example.com/api`;
    const answer = await settle({
      url: poisoned,
      description: "ok",
      serviceName: "x".repeat(40), // over 32 characters
      tags: ["fine", "bell\u0007", "fine", "a".repeat(33), "second"], // a control character, a duplicate, too long
      iconUrl: "http://localhost/icon.png", // loopback
    });
    expect(answer).toEqual({ settled: true, bazaar: { status: "success" } });
    const [entry] = (await bazaar().search({ query: `poisoned-${run}` })).resources;
    expect(entry).toMatchObject({ resource: poisoned, description: "ok", tags: ["fine", "second"] });
    expect(entry).not.toHaveProperty("serviceName");
    expect(entry).not.toHaveProperty("iconUrl");

    for (const url of [`http://127.0.0.1:8080/${run}`, `http://localhost/${run}`, `http://[::1]/${run}`, `http://2130706433/${run}`, `https://user:pw@creds-${run}.example.com/`]) {
      const refused = await settle({ url });
      expect(refused.settled, url).toBe(true); // the payment itself settled; only its catalogue entry is refused
      expect(refused.bazaar, url).toMatchObject({ status: "rejected", rejectedReason: expect.stringContaining("resource.url") });
    }
    // info that breaks its own schema
    const broken = { bazaar: { ...(declaration().bazaar as object), info: { input: { type: "http", method: "GET", queryParams: { q: 42 } } } } };
    expect((await settle({ url: `https://broken-${run}.example.com/x` }, broken)).bazaar).toMatchObject({ status: "rejected", rejectedReason: expect.stringContaining("schema") });

    const all = (await bazaar().listResources({ limit: 100 })).items.map((i) => i.resource);
    expect(all.filter((r) => r.includes(run) && !r.startsWith(`https://${host}`))).toEqual([poisoned]);
  });

  it("a declaration of another's resource URL: /verify writes nothing; settled, it is unproven: paying the owner's payTo rewrites nothing, its own payTo only appends", async () => {
    const resource = `https://owned-${run}.example.com/api`;
    const owner = { url: resource, description: "The owner's API", serviceName: "Owner Co", tags: ["owned"], iconUrl: `https://owned-${run}.example.com/icon.png` };
    expect((await settledAndChecked(owner)).bazaar).toEqual({ status: "success" });
    const before = (await entryRow(resource))!;
    // Its resource answers no 402 (a 404 here): the entry is listed with its first declaration's text, owned by no one.
    expect(before).toMatchObject({ description: "The owner's API", service_name: "Owner Co", tags: ["owned"], owner_pay_to: null, owner_tenant: "", accept_verified: [false] });

    const attacker = privateKeyToAccount(generatePrivateKey()).address;
    const hostile = { url: resource, description: `Pay me instead ${run}`, serviceName: "Evil Co", tags: ["evil"], iconUrl: `https://evil-${run}.example.com/icon.png` };
    // C1: a payer of the owner's payTo (1 atomic unit, landed on chain) with its own text: not one byte of the row changes, the listed price included.
    const snapshot = await wholeRow(resource);
    expect((await settledAndChecked(hostile, { amount: "1" })).bazaar).toEqual({ status: "success" });
    expect(await wholeRow(resource)).toBe(snapshot);

    // Only verified: a valid payment, nothing sent (the signers' pending nonces stay), nothing catalogued.
    const network = devnet.info.networks[0]!;
    const nonces = await Promise.all(network.signers.map((s) => nonceOf(rpcUrl(), s, "pending")));
    const verified = await declare("verify", hostile, { payTo: attacker });
    expect(verified.json.isValid).toBe(true);
    expect(verified.bazaar).toBeUndefined();
    const fresh = `https://verified-only-${run}.example.com/x`;
    expect((await declare("verify", { url: fresh, description: "never paid" })).json.isValid).toBe(true);
    expect(await Promise.all(network.signers.map((s) => nonceOf(rpcUrl(), s, "pending")))).toEqual(nonces);
    expect(await entryRow(resource)).toEqual(before);
    expect(await entryRow(fresh)).toBeUndefined();

    // Settled to its own payTo (paid on chain): its option is appended; the entry's text, freshness and first option stay.
    expect((await settledAndChecked(hostile, { payTo: attacker })).bazaar).toEqual({ status: "success" });
    const after = (await entryRow(resource))!;
    expect(after).toMatchObject({ description: before.description, service_name: before.service_name, tags: before.tags, icon_url: before.icon_url, owner_pay_to: null, last_updated: before.last_updated });
    expect(after.accepts.map((a) => a.payTo)).toEqual([payTo(), attacker]);
    expect(after.accepts[0]).toEqual(before.accepts[0]);
    expect((await bazaar().search({ query: `pay me instead ${run}` })).resources).toEqual([]);

    // Unproven, the first declarer's own next declaration rewrites nothing either: the text is write-once until the resource vouches for someone.
    await settledAndChecked({ ...owner, description: "The owner's API, second edition" });
    expect(await entryRow(resource)).toEqual(after);
  });

  it("C1: once the resource vouched for its payee, a payer of that payTo declaring its own text and a price of 1 changes not one byte of the row", async () => {
    const resource = `https://${svcHost}/c1`;
    // The owner's payment: recorded from its echo, then proven by the resource's own 402 answer, whose text and price are what the entry keeps.
    expect((await settledAndChecked({ url: resource, description: "the owner's echo" })).bazaar).toEqual({ status: "success" });
    const owned = (await entryRow(resource))!;
    expect(owned).toMatchObject({ description: "The real C1 API", service_name: "Real Co", tags: ["real"], owner_pay_to: payTo().toLowerCase(), accept_verified: [true] });
    expect(owned.accepts).toEqual([expect.objectContaining({ payTo: payTo(), amount: "1000" })]);
    const snapshot = await wholeRow(resource);

    // The attack: 1 atomic unit to the owner's payTo (landed on chain), the victim's URL (a query of its own, so the router checks again), hostile text.
    const hostile = { url: `${resource}?c1=${run}`, description: `Pay me instead ${run}`, serviceName: "Evil Co", tags: ["evil"], iconUrl: `https://evil-${run}.example.com/icon.png` };
    expect((await settledAndChecked(hostile, { amount: "1" })).bazaar).toEqual({ status: "success" });
    expect(await wholeRow(resource)).toBe(snapshot);
    expect((await bazaar().search({ query: `pay me instead ${run}` })).resources).toEqual([]);
  });

  it("C2: a squatter's first declaration (paid to itself) is taken over by the real service once its resource vouches for it: its text, its option first", async () => {
    const resource = `https://${svcHost}/c2`;
    const squatter = privateKeyToAccount(generatePrivateKey()).address;
    expect((await settledAndChecked({ url: resource, description: `Squatted ${run}`, serviceName: "Squat Co" }, { payTo: squatter })).bazaar).toEqual({ status: "success" });
    // The resource lists another payee: the squatter's text is listed but owned by no one.
    expect(await entryRow(resource)).toMatchObject({ description: `Squatted ${run}`, owner_pay_to: null, accept_verified: [false] });

    expect((await settledAndChecked({ url: resource, description: "the real service's echo" }, { payTo: realPayee })).bazaar).toEqual({ status: "success" });
    const taken = (await entryRow(resource))!;
    expect(taken).toMatchObject({ description: "The real C2 API", service_name: "Real Co", tags: ["real"], owner_pay_to: realPayee.toLowerCase(), accept_verified: [true, false] });
    expect(taken.accepts.map((a) => a.payTo)).toEqual([realPayee, squatter]);
    expect((await bazaar().search({ query: `squatted ${run}` })).resources).toEqual([]);

    // The squatter again, with new text and a new price for its listed option: nothing changes.
    const snapshot = await wholeRow(resource);
    expect((await settledAndChecked({ url: resource, description: `Squatted again ${run}` }, { payTo: squatter, amount: "1" })).bazaar).toEqual({ status: "success" });
    expect(await wholeRow(resource)).toBe(snapshot);
  });

  it("a declarer whose resource does not answer 402 with its payTo never owns the entry nor rewrites it", async () => {
    const liar = privateKeyToAccount(generatePrivateKey()).address;
    const listed = `https://${svcHost}/liar`; // answers 402, to another payee
    const free = `https://${svcHost}/free`; // answers 200
    for (const resource of [listed, free]) {
      expect((await settledAndChecked({ url: resource, description: `First claim ${run}` }, { payTo: liar })).bazaar).toEqual({ status: "success" });
      const first = (await entryRow(resource))!;
      expect(first).toMatchObject({ description: `First claim ${run}`, owner_pay_to: null, accept_verified: [false] });
      const second = privateKeyToAccount(generatePrivateKey()).address;
      expect((await settledAndChecked({ url: resource, description: `Second claim ${run}` }, { payTo: second })).bazaar).toEqual({ status: "success" });
      const after = (await entryRow(resource))!;
      expect(after).toMatchObject({ description: first.description, owner_pay_to: null, accept_verified: [false, false], last_updated: first.last_updated });
      expect(after.accepts.map((a) => a.payTo)).toEqual([liar, second]);
    }
    expect(liarsPayee).not.toBe(liar);
  });

  it("with API keys, an entry is its tenant's: another tenant paid to the same payTo changes nothing of it", async () => {
    const [a, b] = [await keys.create(`discovery-a-${run}`), await keys.create(`discovery-b-${run}`)];
    keyIds.push(a.info.id, b.info.id);
    const resource = `https://tenant-${run}.example.com/api`;
    expect((await settledAndChecked({ url: resource, description: "Tenant A's API", serviceName: "A Co" }, { key: a.key, via: keyedRouter })).bazaar).toEqual({ status: "success" });
    const before = (await entryRow(resource))!;
    expect(before).toMatchObject({ owner_tenant: "", owner_pay_to: null, accept_tenants: [a.info.id], accept_verified: [false] });

    // Same URL, same payTo, another tenant: paid on chain, refused by the catalog, the row untouched.
    const sameOption = await settledAndChecked({ url: resource, description: "Tenant B's takeover", serviceName: "B Co" }, { key: b.key, via: keyedRouter });
    expect(sameOption.bazaar).toMatchObject({ status: "rejected", rejectedReason: expect.stringContaining("another declarer") });
    expect(await entryRow(resource)).toEqual(before);
    // Its own payee: appended after tenant A's option, under its own name.
    const other = privateKeyToAccount(generatePrivateKey()).address;
    expect((await settledAndChecked({ url: resource, description: "Tenant B's takeover" }, { key: b.key, via: keyedRouter, payTo: other })).bazaar).toEqual({ status: "success" });
    const after = (await entryRow(resource))!;
    expect(after).toMatchObject({ description: "Tenant A's API", service_name: "A Co", last_updated: before.last_updated, accept_tenants: [a.info.id, b.info.id] });
    expect(after.accepts.map((x) => x.payTo)).toEqual([payTo(), other]);
  });

  it("with API keys, a tenant squats too: the tenant whose payee the resource lists takes the entry over", async () => {
    const [real, squatting] = [await keys.create(`discovery-real-${run}`), await keys.create(`discovery-squat-${run}`)];
    keyIds.push(real.info.id, squatting.info.id);
    const resource = `https://${svcHost}/c3`;
    const squatter = privateKeyToAccount(generatePrivateKey()).address;
    expect((await settledAndChecked({ url: resource, description: `Tenant squat ${run}` }, { key: squatting.key, via: keyedRouter, payTo: squatter })).bazaar).toEqual({ status: "success" });
    expect(await entryRow(resource)).toMatchObject({ description: `Tenant squat ${run}`, owner_pay_to: null, owner_tenant: "", accept_tenants: [squatting.info.id] });
    expect((await settledAndChecked({ url: resource }, { key: real.key, via: keyedRouter, payTo: realPayee })).bazaar).toEqual({ status: "success" });
    const taken = (await entryRow(resource))!;
    expect(taken).toMatchObject({ description: "The real C3 API", owner_pay_to: realPayee.toLowerCase(), owner_tenant: real.info.id, accept_tenants: [real.info.id, squatting.info.id], accept_verified: [true, false] });
    expect(taken.accepts.map((x) => x.payTo)).toEqual([realPayee, squatter]);
  });


  it("a resource nobody paid for in the retention period is pruned; fresh ones stay", async () => {
    const stale = `https://stale-${run}.example.com/x`;
    await db.query(
      `INSERT INTO discovery_resources (resource, tool, type, x402_version, accepts, pay_to, schemes, networks, extension_keys, search_text, last_updated)
       VALUES ($1, '', 'http', 2, '[]', '{}', '{}', '{}', '{bazaar}', $1, now() - interval '31 days')`,
      [stale],
    );
    const pruned = await createCatalog(db).prune(30 * 24 * 3_600_000);
    expect(pruned).toBeGreaterThanOrEqual(1);
    const left = (await db.query<{ resource: string }>("SELECT resource FROM discovery_resources WHERE resource LIKE $1", [`%${run}%`])).map((r) => r.resource);
    expect(left).not.toContain(stale);
    expect(left).toContain(`https://${host}/weather`); // paid minutes ago
  });
});

describe("without PostgreSQL: the devnet's router and one router on its embedded engine", () => {
  it("npm start's router catalogues a settled declaration and lists it at GET /v2/discovery/resources (a loopback resource: unproven)", async () => {
    const resource = `https://devnet-${run}.example.com/api`;
    const devnetRouter = { url: devnet.info.routerUrl } as RunningRouter;
    expect((await settled({ url: resource, description: `On the devnet ${run}` }, { via: devnetRouter })).bazaar).toEqual({ status: "success" });
    const listed = await withBazaar(new HTTPFacilitatorClient({ url: devnet.info.routerUrl })).extensions.bazaar.listResources({ payTo: payTo() });
    expect(listed.items.filter((i) => i.resource === resource)).toEqual([expect.objectContaining({ description: `On the devnet ${run}`, accepts: [expect.objectContaining({ payTo: payTo(), amount: "1000" })] })]);
  });

  it("a router with --data-dir keeps the catalog in its own embedded engine: the row is there after it stops, and served again after a restart", async () => {
    const dataDir = await mkdtemp(join(tmpdir(), "x402-router-data-"));
    const start = () => startRouterService({ routingTablePath: join(devnet.dir, "routing.json"), host: "127.0.0.1", port: 0, dataDir, discovery: true, routerTokenFile: devnetRouterTokenFile(devnet.dir) }, pino({ level: "silent" }));
    const resource = `https://embedded-${run}.example.com/api`;
    let embedded = await start();
    try {
      expect((await settled({ url: resource, description: `Embedded ${run}` }, { via: embedded })).bazaar).toEqual({ status: "success" });
      await embedded.close();
      // The router's own files, read once it stopped (an embedded engine has one process at a time).
      const store = await openDatabase({ dataDir });
      try {
        expect(await entryRow(resource, store)).toMatchObject({ description: `Embedded ${run}`, owner_pay_to: null, accept_verified: [false], accepts: [expect.objectContaining({ payTo: payTo(), amount: "1000" })] });
      } finally {
        await store.close();
      }
      expect(await entryRow(resource)).toBeUndefined(); // nothing in the shared PostgreSQL
      embedded = await start();
      const listed = await withBazaar(new HTTPFacilitatorClient({ url: embedded.url })).extensions.bazaar.listResources({});
      expect(listed.items.map((i) => i.resource)).toEqual([resource]);
    } finally {
      await embedded.close();
      await rm(dataDir, { recursive: true, force: true });
    }
  });
});

describe.each(["postgres", "embedded"] as const)("catalog ownership on %s", (engine) => {
  let store: Database;
  beforeAll(async () => {
    store = engine === "postgres" ? db : await openDatabase({ migrations: DISCOVERY_MIGRATIONS });
  });
  afterAll(async () => {
    if (engine === "embedded") await store?.close();
  });

  const requirementsFor = (to: string, amount = "1000"): PaymentRequirements => ({ scheme: "exact", network: "eip155:8453", asset: "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913", amount, payTo: to, maxTimeoutSeconds: 300, extra: {} });
  const paymentFor = (url: string, description: string, to: string) => ({ x402Version: 2, resource: { url, description }, accepted: requirementsFor(to), payload: {}, extensions: declaration() }) as unknown as PaymentPayload;
  const addressOf = (i: number) => `0x${(i + 1).toString(16).padStart(40, "0")}`;

  it("of concurrent first declarations exactly one writes the entry, owned by no one; the others' options follow, at most MAX_UNPROVEN_ACCEPTS unproven ones; only proofs rewrite, re-price and come first", async () => {
    const catalog = createCatalog(store);
    const resource = `https://race-${engine}-${run}.example.com/api`;
    const declarers = Array.from({ length: 4 }, (_, i) => addressOf(i));
    const outcomes = await Promise.all(declarers.map((to) => catalog.record(paymentFor(resource, `declared by ${to}`, to), requirementsFor(to))));
    expect(outcomes.every((o) => o?.status === "success")).toBe(true);
    const raced = (await entryRow(resource, store))!;
    const first = raced.accepts[0]!.payTo;
    expect(declarers).toContain(first);
    expect(raced).toMatchObject({ description: `declared by ${first}`, owner_pay_to: null, accept_verified: [false, false, false, false] });
    expect(raced.accepts.map((a) => a.payTo).sort()).toEqual([...declarers].sort());

    // A flood of other payees: bounded, and the entry's text stays as it was.
    const flood = Array.from({ length: MAX_UNPROVEN_ACCEPTS + 4 }, (_, i) => addressOf(100 + i));
    const floodOutcomes = [];
    for (const to of flood) floodOutcomes.push(await catalog.record(paymentFor(resource, "flood", to), requirementsFor(to)));
    expect(floodOutcomes.filter((o) => o?.status === "success")).toHaveLength(MAX_UNPROVEN_ACCEPTS - declarers.length);
    const flooded = (await entryRow(resource, store))!;
    expect(flooded.accepts).toHaveLength(MAX_UNPROVEN_ACCEPTS);
    expect(flooded.accepts.slice(0, raced.accepts.length)).toEqual(raced.accepts);
    expect(flooded).toMatchObject({ description: raced.description, owner_pay_to: null, last_updated: raced.last_updated });

    // Unproven, nobody re-prices a listed option or rewrites the text, not even the first declarer.
    const second = raced.accepts[1]!.payTo;
    for (const to of [first, second]) expect(await catalog.record(paymentFor(resource, "again", to), requirementsFor(to, "1"))).toEqual({ status: "success" });
    expect(await entryRow(resource, store)).toEqual(flooded);

    // The resource vouches for the second payee: it owns the entry, its text and price are the proof's, its option comes first.
    expect(await catalog.record(paymentFor(resource, "proven", second), requirementsFor(second, "2000"), {}, { verified: true })).toEqual({ status: "success" });
    const proven = (await entryRow(resource, store))!;
    expect(proven).toMatchObject({ description: "proven", owner_pay_to: second, accept_verified: [true, ...Array<boolean>(MAX_UNPROVEN_ACCEPTS - 1).fill(false)] });
    expect(proven.accepts[0]).toMatchObject({ payTo: second, amount: "2000" });
    expect(proven.accepts.slice(1)).toEqual(flooded.accepts.filter((a) => a.payTo !== second));
    // The proven option has left the unproven ones: one more unproven option fits.
    expect(await catalog.record(paymentFor(resource, "one more", addressOf(200)), requirementsFor(addressOf(200)))).toEqual({ status: "success" });
    // Another proven option (the owner's second asset) joins the proven ones, ahead of the rest; the owner stays.
    const usdt = { ...requirementsFor(first), asset: "0xfde4C96c8593536E31F229EA8f37b2ADa2699bb2" };
    expect(await catalog.record({ ...paymentFor(resource, "proven again", first), accepted: usdt }, usdt, {}, { verified: true })).toEqual({ status: "success" });
    const grown = (await entryRow(resource, store))!;
    expect(grown.accepts.slice(0, 2).map((a) => [a.payTo, a.asset])).toEqual([[second, proven.accepts[0]!.asset], [first, usdt.asset]]);
    expect(grown).toMatchObject({ description: "proven again", owner_pay_to: second, accept_verified: [true, true, ...Array<boolean>(MAX_UNPROVEN_ACCEPTS).fill(false)] });
    // A proof that changes nothing writes nothing.
    const [before] = await store.query<{ row: string }>("SELECT r::text AS row FROM discovery_resources r WHERE resource = $1", [resource]);
    expect(await catalog.record({ ...paymentFor(resource, "proven again", first), accepted: usdt }, usdt, {}, { verified: true })).toEqual({ status: "success" });
    expect(await store.query("SELECT r::text AS row FROM discovery_resources r WHERE resource = $1", [resource])).toEqual([before]);
  });
});
