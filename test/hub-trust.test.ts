// The hub under a hostile caller: read and write-attempt limits keyed by the caller's address (two
// real source addresses, 127.0.0.1 and 127.0.0.2, and X-Forwarded-For only from a trusted proxy),
// the per-owner storage quota (bytes and keys, under concurrency, on both engines), pruning of old
// versions (never the latest), the usage backfill of existing data, and a per-deployment EIP-712
// domain (salt, verifyingContract) that the client picks up from GET /api/info.
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Agent, fetch as undiciFetch } from "undici";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { generatePrivateKey, privateKeyToAccount, type PrivateKeyAccount } from "viem/accounts";
import { createHubClient, HubClientError } from "../services/hub/client.ts";
import { HUB_MIGRATIONS } from "../services/hub/store.ts";
import { migrate, openDatabase } from "../services/platform/storage.ts";
import { ENGINES, JSON_TYPE, errorCode, send, signedHeaders, startTestHub, type RawResponse, type TestHub } from "./helpers/hub.ts";

/** Requests from a given loopback source address: a second, real client address. */
const agents = new Map<string, Agent>();
async function from(source: string, url: string, init: { method?: string; headers?: Record<string, string>; body?: string } = {}): Promise<RawResponse> {
  let dispatcher = agents.get(source);
  if (!dispatcher) agents.set(source, (dispatcher = new Agent({ localAddress: source })));
  const res = await undiciFetch(url, { method: init.method ?? (init.body !== undefined ? "POST" : "GET"), headers: init.headers, body: init.body, dispatcher });
  const bytes = Buffer.from(await res.arrayBuffer());
  const text = bytes.toString("utf8");
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch {
    json = undefined;
  }
  return { status: res.status, headers: res.headers as unknown as Headers, bytes, text, json };
}
afterAll(async () => Promise.all([...agents.values()].map((a) => a.close())));

const A = "127.0.0.1";
const B = "127.0.0.2";

describe("rate limits keyed by the caller", () => {
  let hub: TestHub;
  let proxied: TestHub;
  let clock = Date.UTC(2030, 0, 1);
  const owners: PrivateKeyAccount[] = [];
  const wallet = () => {
    const a = privateKeyToAccount(generatePrivateKey());
    owners.push(a);
    hub?.track(a.address);
    return a;
  };

  beforeAll(async () => {
    const limits = { now: () => clock, readRateLimit: { burst: 3, perSecond: 1 }, writeAttemptRateLimit: { burst: 3, perSecond: 1 } };
    [hub, proxied] = await Promise.all([startTestHub("embedded", limits), startTestHub("embedded", { ...limits, trustProxy: ["127.0.0.1"] })]);
  });
  afterAll(async () => Promise.all([hub?.stop(), proxied?.stop()]));

  it("one hostile reader can neither exhaust an owner's reads for others nor dodge its limit by varying owners", async () => {
    const x = wallet().address;
    const read = (source: string, owner: string, headers: Record<string, string> = {}) => from(source, `${hub.url}/api/conversation?owner=${owner}`, { headers });
    for (let i = 0; i < 3; i++) expect((await read(A, x)).status).toBe(200);
    const limited = await read(A, x);
    expect(limited.status).toBe(429);
    expect(errorCode(limited)).toBe("rate_limited");
    expect(limited.headers.get("retry-after")).toBe("1");
    expect((await read(A, wallet().address)).status).toBe(429); // another owner: the same caller, the same bucket
    expect((await read(A, x, { "x-forwarded-for": "198.51.100.9" })).status).toBe(429); // no proxy is trusted: the header is ignored
    expect((await read(B, x)).status).toBe(200); // another caller still reads x
    clock += 1000;
    expect((await read(A, x)).status).toBe(200);
  });

  it("behind a trusted proxy, X-Forwarded-For names the caller", async () => {
    const x = wallet().address;
    const read = (client: string) => from(A, `${proxied.url}/api/download?owner=${x}&id=none`, { headers: { "x-forwarded-for": client } });
    for (let i = 0; i < 3; i++) expect((await read("203.0.113.1")).status).toBe(404);
    expect((await read("203.0.113.1")).status).toBe(429);
    expect((await read("203.0.113.2")).status).toBe(404); // another client behind the same proxy
  });

  it("counts every upload of a caller before any signature work: unsigned floods use up the caller's attempts, not the owner's", async () => {
    const owner = wallet();
    const fields = { owner: owner.address, bucket: "b", id: "k", message: "m" };
    const upload = async (source: string, headers: Record<string, string>) => from(source, `${hub.url}/api/upload`, { headers: { ...JSON_TYPE, ...headers }, body: JSON.stringify(fields) });
    for (let i = 0; i < 3; i++) expect(errorCode(await upload(A, {}))).toBe("missing_signature");
    const signed = await signedHeaders(owner, hub.domain, fields, { now: clock });
    const refused = await upload(A, signed);
    expect(refused.status).toBe(429);
    expect(errorCode(refused)).toBe("rate_limited");
    // the owner's own writes from elsewhere are unaffected, with the very same signed request (its nonce was not used)
    const stored = await upload(B, signed);
    expect(stored.status, stored.text).toBe(200);
  });
});

describe.each(ENGINES)("quota and version pruning on the %s engine", (engine) => {
  let hub: TestHub;
  beforeAll(async () => {
    hub = await startTestHub(engine, { storeLimits: { maxBytesPerOwner: 100, maxKeysPerOwner: 3, maxVersionsPerKey: 2 } });
  });
  afterAll(() => hub?.stop());

  const owner = () => {
    const a = privateKeyToAccount(generatePrivateKey());
    hub.track(a.address);
    return a;
  };
  const upload = async (signer: PrivateKeyAccount, id: string, message: string, headers?: Record<string, string>) => {
    const fields = { owner: signer.address, bucket: "b", id, message };
    return send(`${hub.url}/api/upload`, { headers: { ...JSON_TYPE, ...(headers ?? (await signedHeaders(signer, hub.domain, fields))) }, body: JSON.stringify(fields) });
  };
  const history = async (signer: PrivateKeyAccount, id: string) =>
    (await send(`${hub.url}/api/history?owner=${signer.address}&id=${id}`)).json as { latest: number; versions: { version: number; message: string }[] };

  it("publishes its limits in GET /api/info", async () => {
    expect((await send(`${hub.url}/api/info`)).json).toMatchObject({ quota: { bytesPerOwner: 100, keysPerOwner: 3, versionsPerKey: 2 } });
  });

  it("keeps at most N versions of a key, never dropping the latest; pruned versions free their bytes", async () => {
    const a = owner();
    for (let v = 1; v <= 5; v++) expect((await upload(a, "k", `${v}`.repeat(40))).status).toBe(200);
    const h = await history(a, "k");
    expect(h.latest).toBe(5);
    expect(h.versions.map((v) => v.version)).toEqual([4, 5]);
    expect((await send(`${hub.url}/api/download?owner=${a.address}&id=k`)).text).toBe("5".repeat(40));
    expect((await send(`${hub.url}/api/download?owner=${a.address}&id=k&version=1`)).status).toBe(404);
    // 5 × 40 bytes were written, but only 80 are kept: 20 more fit, 21 do not
    expect((await upload(a, "other", "x".repeat(20))).status).toBe(200);
    const over = await upload(a, "third", "y");
    expect(over.status).toBe(413);
    expect(errorCode(over)).toBe("quota_exceeded");
    expect(over.text).toContain("101 bytes, over its quota of 100");
  });

  it("refuses a write past the byte quota with 413 quota_exceeded: nothing stored, the nonce still unused", async () => {
    const a = owner();
    expect((await upload(a, "k1", "a".repeat(90))).status).toBe(200);
    const fields = { owner: a.address, bucket: "b", id: "k2", message: "b".repeat(20) };
    const headers = await signedHeaders(a, hub.domain, fields);
    const refused = await upload(a, "k2", fields.message, headers);
    expect(refused.status).toBe(413);
    expect(errorCode(refused)).toBe("quota_exceeded");
    expect((await send(`${hub.url}/api/download?owner=${a.address}&id=k2`)).status).toBe(404);
    // overwriting k1 with less data frees room (versionsPerKey 2 keeps 90 + 5 bytes); then the same signed write goes through
    expect((await upload(a, "k1", "c".repeat(5))).status).toBe(200);
    expect((await upload(a, "k1", "d".repeat(5))).status).toBe(200); // prunes the 90-byte version
    const again = await upload(a, "k2", fields.message, headers);
    expect(again.status, again.text).toBe(200);
  });

  it("counts keys per owner; new versions of an existing key are not new keys; concurrent writers cannot overshoot", async () => {
    const a = owner();
    const results = await Promise.all([1, 2, 3, 4, 5, 6].map((i) => upload(a, `c${i}`, "z")));
    expect(results.filter((r) => r.status === 200)).toHaveLength(3);
    expect(results.filter((r) => r.status === 413).map(errorCode)).toEqual(["quota_exceeded", "quota_exceeded", "quota_exceeded"]);
    const stored = results.map((r, i) => (r.status === 200 ? `c${i + 1}` : undefined)).filter(Boolean) as string[];
    expect((await upload(a, stored[0]!, "again")).status).toBe(200);
    const fourth = await upload(a, "c-new", "z");
    expect(errorCode(fourth)).toBe("quota_exceeded");
    expect(fourth.text).toContain("4 keys, over its quota of 3");
    // another owner has its own quota
    expect((await upload(owner(), "c1", "z")).status).toBe(200);
  });
});

describe("the usage of data written before quotas existed", () => {
  it("is backfilled by the migration: every kept version's bytes and every key", async () => {
    const dir = await mkdtemp(join(tmpdir(), "x402-hub-usage-"));
    try {
      const db = await openDatabase({ dataDir: dir });
      await migrate(db, HUB_MIGRATIONS.slice(0, 1));
      for (const [owner, id, version, message] of [
        ["0xaa", "k1", 1, "12345"],
        ["0xaa", "k1", 2, "123"],
        ["0xaa", "k2", 1, "1"],
        ["0xbb", "k1", 1, "1234567"],
      ] as const) {
        await db.query("INSERT INTO hub_keys (owner, id, bucket, kind, latest_version) VALUES ($1, $2, 'b', 'memory', $3) ON CONFLICT (owner, id) DO UPDATE SET latest_version = EXCLUDED.latest_version", [owner, id, version]);
        await db.query("INSERT INTO hub_versions (owner, id, version, bucket, kind, message, message_hash, nonce) VALUES ($1, $2, $3, 'b', 'memory', $4, '0x', '0x')", [owner, id, version, Buffer.from(message)]);
      }
      await migrate(db, HUB_MIGRATIONS);
      const rows = await db.query<{ owner: string; bytes: string | number; keys: string | number }>("SELECT owner, bytes, keys FROM hub_usage ORDER BY owner");
      expect(rows.map((r) => [r.owner, Number(r.bytes), Number(r.keys)])).toEqual([
        ["0xaa", 9, 2],
        ["0xbb", 7, 1],
      ]);
      await db.close();
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  });
});

describe("a per-deployment EIP-712 domain", () => {
  const salt = `0x${"ab".repeat(32)}` as const;
  const verifyingContract = "0x00000000000000000000000000000000000A11cE" as const;
  let salted: TestHub;
  let plain: TestHub;
  beforeAll(async () => {
    [salted, plain] = await Promise.all([startTestHub("embedded", { domainSalt: salt, domainVerifyingContract: verifyingContract }), startTestHub("embedded")]);
  });
  afterAll(async () => Promise.all([salted?.stop(), plain?.stop()]));

  it("is served by GET /api/info; the default domain stays name, version and chain id only (existing clients)", async () => {
    expect(((await send(`${salted.url}/api/info`)).json as { domain: unknown }).domain).toEqual({ name: "x402-fleet hub", version: "1", chainId: 8453, verifyingContract, salt });
    expect(((await send(`${plain.url}/api/info`)).json as { domain: unknown }).domain).toEqual({ name: "x402-fleet hub", version: "1", chainId: 8453 });
  });

  it("the client signs for the domain it reads; a signature for another deployment's domain is refused", async () => {
    const signer = privateKeyToAccount(generatePrivateKey());
    const client = createHubClient({ url: salted.url, signer });
    expect(await client.upload({ id: "chat_0", message: "hello" })).toMatchObject({ version: 1 });
    expect(await client.download({ id: "chat_0" })).toBe("hello");

    // signed for the default domain (another deployment, or a client that hard-codes it): refused here, accepted there
    const other = createHubClient({ url: salted.url, signer, domain: plain.domain });
    const refused = await other.upload({ id: "chat_1", message: "x" }).catch((e: unknown) => e);
    expect(refused).toBeInstanceOf(HubClientError);
    expect((refused as HubClientError).code).toBe("invalid_signature");
    expect(await createHubClient({ url: plain.url, signer }).upload({ id: "chat_1", message: "x" })).toMatchObject({ version: 1 });
  });

  it("refuses a malformed salt or contract at start", async () => {
    await expect(startTestHub("embedded", { domainSalt: "0x1234" })).rejects.toThrow(/salt must be 32 bytes/);
    await expect(startTestHub("embedded", { domainVerifyingContract: "0xnope" as `0x${string}` })).rejects.toThrow(/verifyingContract must be a 0x address/);
  });
});
