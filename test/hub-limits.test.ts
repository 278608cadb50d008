// Limits and durability on both engines: per-owner rate limits (429, with a frozen clock: nothing
// here waits), body size (413), data and used nonces surviving a restart, and the nonce sweep.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pino } from "pino";
import { generatePrivateKey, privateKeyToAccount, type PrivateKeyAccount } from "viem/accounts";
import { startHubService } from "../services/hub/service.ts";
import { createHubStore, HUB_MIGRATIONS } from "../services/hub/store.ts";
import { openDatabase } from "../services/platform/storage.ts";
import { ENGINES, JSON_TYPE, PG_URL, deleteOwners, errorCode, send, signedHeaders, startTestHub, type TestHub } from "./helpers/hub.ts";

const silent = pino({ level: "silent" });

describe.each(ENGINES)("hub limits on the %s engine", (engine) => {
  let hub: TestHub;
  let clock = Date.UTC(2030, 0, 1);
  beforeAll(async () => {
    hub = await startTestHub(engine, {
      now: () => clock,
      writeRateLimit: { burst: 3, perSecond: 1 },
      readRateLimit: { burst: 4, perSecond: 1 },
      bodyLimit: 2048,
    });
  });
  afterAll(() => hub?.stop());

  const wallet = (): PrivateKeyAccount => {
    const account = privateKeyToAccount(generatePrivateKey());
    hub.track(account.address);
    return account;
  };
  const upload = async (signer: PrivateKeyAccount, owner: PrivateKeyAccount, id: string, headers?: Record<string, string>) => {
    const fields = { owner: owner.address, bucket: "b", id, message: `m ${id}` };
    const auth = headers ?? (await signedHeaders(signer, hub.domain, fields, { now: clock }));
    return { res: await send(`${hub.url}/api/upload`, { headers: { ...JSON_TYPE, ...auth }, body: JSON.stringify(fields) }), auth };
  };

  it("limits writes per owner (429 with Retry-After); refused writes use no quota and keep their nonce", async () => {
    const a = wallet();
    const stranger = wallet();
    // unsigned and forged writes into a's space do not use up a's quota
    for (let i = 0; i < 5; i++) {
      expect(errorCode((await upload(a, a, "x", {})).res)).toBe("missing_signature");
      expect(errorCode((await upload(stranger, a, "x")).res)).toBe("invalid_signature");
    }
    for (const id of ["k1", "k2", "k3"]) expect((await upload(a, a, id)).res.status).toBe(200);
    const limited = await upload(a, a, "k4");
    expect(limited.res.status).toBe(429);
    expect(errorCode(limited.res)).toBe("rate_limited");
    expect(limited.res.headers.get("retry-after")).toBe("1");
    expect((await upload(stranger, stranger, "own")).res.status).toBe(200); // other owners are not affected

    clock += 1000;
    // the refused request was not consumed: the same signed request now goes through
    expect((await upload(a, a, "k4", limited.auth)).res.status).toBe(200);
    expect((await upload(a, a, "k5")).res.status).toBe(429);
  });

  it("limits reads per caller: reading other owners does not dodge the limit (the caller-keyed tests are in hub-trust.test.ts)", async () => {
    clock += 10_000; // a full bucket
    const a = wallet();
    const read = (owner: string) => send(`${hub.url}/api/conversation?owner=${owner}`);
    for (let i = 0; i < 4; i++) expect((await read(a.address)).status).toBe(200);
    const limited = await read(a.address);
    expect(limited.status).toBe(429);
    expect(errorCode(limited)).toBe("rate_limited");
    expect((await read(wallet().address)).status).toBe(429);
    clock += 1000;
    expect((await read(a.address)).status).toBe(200);
  });

  it("refuses a body over the configured limit with 413", async () => {
    const a = wallet();
    const fields = { owner: a.address, bucket: "b", id: "big", message: "x".repeat(4096) };
    const res = await send(`${hub.url}/api/upload`, { headers: { ...JSON_TYPE, ...(await signedHeaders(a, hub.domain, fields, { now: clock })) }, body: JSON.stringify(fields) });
    expect(res.status).toBe(413);
    expect(errorCode(res)).toBe("payload_too_large");
    const form = await send(`${hub.url}/api/download`, { headers: { "content-type": "application/x-www-form-urlencoded" }, body: `owner=${a.address}&id=${"x".repeat(4096)}` });
    expect(form.status).toBe(413);
  });
});

describe.each(ENGINES)("hub durability on the %s engine", (engine) => {
  let dataDir: string | undefined;
  const owners: string[] = [];
  beforeAll(async () => {
    dataDir = engine === "embedded" ? await mkdtemp(join(tmpdir(), "x402-hub-restart-")) : undefined;
  });
  afterAll(async () => {
    if (dataDir) await rm(dataDir, { recursive: true, force: true });
    if (engine === "postgres") await deleteOwners(owners);
  });
  const start = () => startHubService({ port: 0, databaseUrl: engine === "postgres" ? PG_URL : undefined, dataDir, logger: silent });

  it("keeps values, versions, conversations and used nonces across a restart", async () => {
    const a = privateKeyToAccount(generatePrivateKey());
    owners.push(a.address.toLowerCase());
    const fields = { owner: a.address, bucket: "b", id: "c_0", message: "before restart" };
    let hub = await start();
    const headers = { ...JSON_TYPE, ...(await signedHeaders(a, hub.domain, fields)) };
    try {
      expect((await send(`${hub.url}/api/upload`, { headers, body: JSON.stringify(fields) })).status).toBe(200);
    } finally {
      await hub.close();
    }
    hub = await start();
    try {
      expect((await send(`${hub.url}/api/download?owner=${a.address}&id=c_0`)).text).toBe("before restart");
      expect((await send(`${hub.url}/api/conversation?owner=${a.address}`)).json).toEqual(["c"]);
      const replay = await send(`${hub.url}/api/upload`, { headers, body: JSON.stringify(fields) });
      expect(errorCode(replay)).toBe("replayed_nonce");
    } finally {
      await hub.close();
    }
  });

  it("sweeps nonces only once their expiry has passed", async () => {
    const owner = privateKeyToAccount(generatePrivateKey()).address.toLowerCase();
    owners.push(owner);
    const db = await openDatabase({ url: engine === "postgres" ? PG_URL : undefined, migrations: HUB_MIGRATIONS });
    try {
      const store = createHubStore(db);
      const write = (nonce: string, expiry: bigint) =>
        store.write({ owner, bucket: "b", id: `k${nonce}`, kind: "memory", message: new Uint8Array([1]), messageHash: "0x", nonce, expiry });
      await write("n1", 1000n);
      await write("n2", 2000n);
      await store.sweepNonces(1500);
      const left = await db.query<{ nonce: string }>("SELECT nonce FROM hub_nonces WHERE owner = $1 ORDER BY nonce", [owner]);
      expect(left.map((r) => r.nonce)).toEqual(["n2"]);
    } finally {
      await db.close();
    }
  });
});
