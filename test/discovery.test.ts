// The discovery catalog (bazaar), end to end with the reference packages: a @x402/express resource
// server declaring the bazaar extension is paid once through a discovery-enabled router, then
// appears in GET /v2/discovery/resources (read with the reference `withBazaar` client), filterable
// and searchable. Hostile declarations (a client echoes whatever it likes) are soft-dropped field by
// field, or refused whole when the resource URL is an IP literal or localhost.
import type { Server } from "node:http";
import type { AddressInfo } from "node:net";
import { randomBytes } from "node:crypto";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import express from "express";
import { pino } from "pino";
import { paymentMiddleware, x402ResourceServer } from "@x402/express";
import { HTTPFacilitatorClient } from "@x402/core/server";
import { x402Client } from "@x402/core/client";
import type { PaymentRequired } from "@x402/core/types";
import { ExactEvmScheme as ExactEvmServer } from "@x402/evm/exact/server";
import { ExactEvmScheme as ExactEvmClient } from "@x402/evm/exact/client";
import { bazaarResourceServerExtension, declareDiscoveryExtension, withBazaar } from "@x402/extensions/bazaar";
import { wrapFetchWithPayment } from "@x402/fetch";
import { privateKeyToAccount } from "viem/accounts";
import { startRouterService, type RunningRouter } from "../services/router/service.ts";
import { openDatabase, type Database } from "../services/platform/storage.ts";
import { DISCOVERY_MIGRATIONS, createCatalog } from "../services/discovery/catalog.ts";
import type { RunningDevnet } from "../services/devnet/devnet.ts";
import { startTestDevnet } from "./helpers/devnet.ts";
import { balanceOf } from "./helpers/chain.ts";
import { PG_URL } from "./helpers/hub.ts";
import { postJson } from "./helpers/payments.ts";

const run = randomBytes(4).toString("hex"); // this run's resources, apart from any other run's rows
const host = `weather-${run}.example.com`;
let devnet: RunningDevnet & { dir: string };
let router: RunningRouter;
let db: Database;
let server: Server;

beforeAll(async () => {
  devnet = await startTestDevnet(["eip155:8453"], { hub: false, wallets: false });
  db = await openDatabase({ url: PG_URL, migrations: DISCOVERY_MIGRATIONS });
  router = await startRouterService({ routingTablePath: join(devnet.dir, "routing.json"), host: "127.0.0.1", port: 0, databaseUrl: PG_URL, discovery: true }, pino({ level: "silent" }));
});

afterAll(async () => {
  await new Promise((r) => server?.close(r));
  await router?.close();
  await db?.query("DELETE FROM discovery_resources WHERE resource LIKE $1", [`%${run}%`]);
  await db?.close();
  await devnet?.stop();
});

const payTo = () => devnet.info.receivers[0]!.address;
const bazaar = () => withBazaar(new HTTPFacilitatorClient({ url: router.url })).extensions.bazaar;

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
    const client = x402Client.fromConfig({ schemes: [{ network: "eip155:*", client: new ExactEvmClient(privateKeyToAccount(devnet.info.payers[1]!.privateKey)) }] });
    const usdc = devnet.info.networks[0]!.assets.find((a) => a.transferMethods.includes("eip3009"))!;
    const requirements = { scheme: "exact", network: "eip155:8453" as const, asset: usdc.address, amount: "1000", payTo: payTo(), maxTimeoutSeconds: 300, extra: { name: usdc.eip712!.name, version: usdc.eip712!.version } };
    // A declaration as the resource server's extension sends it (enriched with the route's method).
    const declared = declareDiscoveryExtension({ input: { q: "x" }, inputSchema: { properties: { q: { type: "string" } } } }).bazaar!;
    const declaration = { bazaar: { ...declared, info: { ...declared.info, input: { ...declared.info.input, method: "GET" } } } };
    /** A client's payment echoing whatever `resource` and `extensions` it likes, verified at the router (nothing is sent). */
    const verify = async (resource: Record<string, unknown>, extensions: Record<string, unknown> = declaration) => {
      const paymentRequired = { x402Version: 2, resource, accepts: [requirements], extensions } as unknown as PaymentRequired;
      const paymentPayload = await client.createPaymentPayload(paymentRequired);
      const res = await fetch(`${router.url}/verify`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ x402Version: 2, paymentPayload, paymentRequirements: requirements }) });
      const header = res.headers.get("extension-responses");
      return { valid: ((await res.json()) as { isValid: boolean }).isValid, bazaar: header ? (JSON.parse(Buffer.from(header, "base64").toString("utf8")) as { bazaar: unknown }).bazaar : undefined };
    };

    const poisoned = `https://poisoned-${run}.example.com/api`;
    const answer = await verify({
      url: poisoned,
      description: "ok",
      serviceName: "x".repeat(40), // over 32 characters
      tags: ["fine", "bell\u0007", "fine", "a".repeat(33), "second"], // a control character, a duplicate, too long
      iconUrl: "http://localhost/icon.png", // loopback
    });
    expect(answer).toEqual({ valid: true, bazaar: { status: "success" } });
    const [entry] = (await bazaar().search({ query: `poisoned-${run}` })).resources;
    expect(entry).toMatchObject({ resource: poisoned, description: "ok", tags: ["fine", "second"] });
    expect(entry).not.toHaveProperty("serviceName");
    expect(entry).not.toHaveProperty("iconUrl");

    for (const url of [`http://127.0.0.1:8080/${run}`, `http://localhost/${run}`, `http://[::1]/${run}`, `http://2130706433/${run}`, `https://user:pw@creds-${run}.example.com/`]) {
      const refused = await verify({ url });
      expect(refused.valid, url).toBe(true); // the payment itself is fine; only its catalogue entry is refused
      expect(refused.bazaar, url).toMatchObject({ status: "rejected", rejectedReason: expect.stringContaining("resource.url") });
    }
    // info that breaks its own schema
    const broken = { bazaar: { ...declaration.bazaar, info: { input: { type: "http", method: "GET", queryParams: { q: 42 } } } } };
    expect((await verify({ url: `https://broken-${run}.example.com/x` }, broken)).bazaar).toMatchObject({ status: "rejected", rejectedReason: expect.stringContaining("schema") });

    const all = (await bazaar().listResources({ limit: 100 })).items.map((i) => i.resource);
    expect(all.filter((r) => r.includes(run) && !r.startsWith(`https://${host}`))).toEqual([poisoned]);
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
