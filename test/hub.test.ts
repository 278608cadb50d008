// The hub against both engines (embedded and PostgreSQL): the existing clients' requests byte for
// byte, conversations, write authorisation, concurrent versions, and bad input.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { generatePrivateKey, privateKeyToAccount, type PrivateKeyAccount } from "viem/accounts";
import type { Address } from "viem";
import { hubMessageHash, newHubNonce } from "../services/hub/auth.ts";
import { createHubClient } from "../services/hub/client.ts";
import type { Kind } from "../services/hub/wire.ts";
import { ENGINES, FORM_TYPE, JSON_TYPE, errorCode, pythonJsonDumps, send, signedHeaders, startTestHub, type SignOptions, type TestHub } from "./helpers/hub.ts";

describe.each(ENGINES)("hub on the %s engine", (engine) => {
  let hub: TestHub;
  beforeAll(async () => {
    hub = await startTestHub(engine, { writeRateLimit: { burst: 100_000, perSecond: 100_000 }, readRateLimit: { burst: 100_000, perSecond: 100_000 } });
  });
  afterAll(() => hub?.stop());

  const wallet = (): PrivateKeyAccount => {
    const account = privateKeyToAccount(generatePrivateKey());
    hub.track(account.address);
    return account;
  };
  const api = (path: string) => `${hub.url}/api/${path}`;

  /** A signed JSON upload of exactly these fields (the bucket is always explicit here). */
  async function put(account: PrivateKeyAccount, id: string, message: string, opts: { bucket?: string; kind?: Kind } & SignOptions = {}) {
    const fields = { owner: account.address, bucket: opts.bucket ?? "b", id, message, kind: opts.kind };
    const headers = { ...JSON_TYPE, ...(await signedHeaders(account, hub.domain, fields, opts)) };
    const res = await send(api("upload"), { headers, body: JSON.stringify({ owner: account.address, bucket: fields.bucket, id, message, kind: opts.kind }) });
    expect(res.status, res.text).toBe(200);
    return res;
  }

  const conversation = async (owner: Address, fields: string) => {
    const res = await send(api("conversation"), { headers: FORM_TYPE, body: `owner=${owner}${fields}` });
    expect(res.status, res.text).toBe(200);
    return res.json as string[];
  };

  describe("the existing clients' requests, byte for byte", () => {
    it("upload as the Python client sends it; download by POST form and by GET query returns the stored bytes", async () => {
      const a = wallet();
      // What the Python client's Message serialises to: json.dumps, so non-ASCII arrives \u-escaped.
      const message = pythonJsonDumps({ name: "agent9527", role: "user", content: 'café ☕ 😀 "quoted" \\ \n tab\t' });
      expect(message).toBe(
        '{"name": "agent9527", "role": "user", "content": "caf\\u00e9 \\u2615 \\ud83d\\ude00 \\"quoted\\" \\\\ \\n tab\\t"}',
      );
      // client: json.dumps({"owner": owner, "bucket": bucket, "id": msg_id, "message": message}), Content-Type: application/json
      const body = pythonJsonDumps({ owner: a.address, bucket: "agent9527", id: "chat7_0", message });
      expect(body.startsWith(`{"owner": "${a.address}", "bucket": "agent9527", "id": "chat7_0", "message": "{\\"name\\": `)).toBe(true);
      const headers = { ...JSON_TYPE, ...(await signedHeaders(a, hub.domain, { owner: a.address, bucket: "agent9527", id: "chat7_0", message })) };
      const up = await send(api("upload"), { headers, body });
      expect(up.status, up.text).toBe(200);
      expect(up.json).toMatchObject({
        owner: a.address.toLowerCase(),
        bucket: "agent9527",
        id: "chat7_0",
        kind: "memory",
        version: 1,
        messageHash: hubMessageHash(message),
        size: Buffer.byteLength(message),
      });

      // client: data=urlencode({'id': filename, 'owner': owner}), Content-Type: application/x-www-form-urlencoded
      const byForm = await send(api("download"), { headers: FORM_TYPE, body: `id=chat7_0&owner=${a.address}` });
      expect(byForm.status).toBe(200);
      expect(byForm.headers.get("content-type")).toMatch(/^text\/plain/);
      expect(byForm.bytes.equals(Buffer.from(message, "utf8"))).toBe(true);

      const byQuery = await send(`${api("download")}?owner=${a.address}&id=chat7_0`);
      expect(byQuery.status).toBe(200);
      expect(byQuery.bytes.equals(Buffer.from(message, "utf8"))).toBe(true);
      // the owner is compared lower-cased
      const lower = await send(`${api("download")}?owner=${a.address.toLowerCase()}&id=chat7_0`);
      expect(lower.bytes.equals(byQuery.bytes)).toBe(true);
    });

    it("raw UTF-8 (with NUL and emoji) sent by a JavaScript client as text/plain is returned byte for byte", async () => {
      const a = wallet();
      const message = JSON.stringify({ name: "agent", content: "naïve 日本語 😀 \u0000 end" });
      const body = JSON.stringify({ owner: a.address, bucket: "agent", id: "raw", message });
      const headers = { "content-type": "text/plain;charset=UTF-8", ...(await signedHeaders(a, hub.domain, { owner: a.address, bucket: "agent", id: "raw", message })) };
      expect((await send(api("upload"), { headers, body })).status).toBe(200);
      const down = await send(api("download"), { headers: FORM_TYPE, body: `id=raw&owner=${a.address}` });
      expect(down.bytes.equals(Buffer.from(message, "utf8"))).toBe(true);
    });

    it("the older client's capitalised fields (Owner, ID, Message); without a bucket it is the message's name, else the owner", async () => {
      const a = wallet();
      const named = pythonJsonDumps({ name: "memo-agent", content: "x" });
      const body = pythonJsonDumps({ Owner: a.address, ID: "k1", Message: named });
      const headers = { ...JSON_TYPE, ...(await signedHeaders(a, hub.domain, { owner: a.address, bucket: "memo-agent", id: "k1", message: named })) };
      const up = await send(api("upload"), { headers, body });
      expect(up.status, up.text).toBe(200);
      expect(up.json).toMatchObject({ bucket: "memo-agent", id: "k1" });

      const plain = "not json";
      const headers2 = { ...JSON_TYPE, ...(await signedHeaders(a, hub.domain, { owner: a.address, bucket: a.address.toLowerCase(), id: "k2", message: plain })) };
      const up2 = await send(api("upload"), { headers: headers2, body: pythonJsonDumps({ OWNER: a.address, Id: "k2", message: plain }) });
      expect(up2.status, up2.text).toBe(200);
      expect(up2.json).toMatchObject({ bucket: a.address.toLowerCase() });

      // download's `name` alias, capitalised as well
      const down = await send(api("download"), { headers: FORM_TYPE, body: `Name=k1&OWNER=${a.address}` });
      expect(down.text).toBe(named);
    });

    it("conversation list and get as the Python client sends them, paged by form, query and JSON", async () => {
      const a = wallet();
      const msgs = [0, 1, 2, 3, 4].map((n) => pythonJsonDumps({ name: "agent", role: n % 2 ? "assistant" : "user", content: `m${n}` }));
      for (const [n, m] of msgs.entries()) await put(a, `chat_${n}`, m);
      await put(a, "second_0", "s0");
      await put(a, "third_0", "t0");

      // list: data=urlencode({'owner': owner}); get: data=urlencode({'owner': owner, 'id': conversation_id})
      expect(await conversation(a.address, "")).toEqual(["third", "second", "chat"]); // newest first
      expect(await conversation(a.address, "&id=chat")).toEqual(msgs);
      expect(await conversation(a.address, "&id=chat&offset=1&length=2")).toEqual(msgs.slice(1, 3));
      expect(await conversation(a.address, "&offset=1&length=1")).toEqual(["second"]);

      const byQuery = await send(`${api("conversation")}?OWNER=${a.address}&Name=chat&Offset=3&LENGTH=10`);
      expect(byQuery.json).toEqual(msgs.slice(3));
      const byJson = await send(api("conversation"), { headers: JSON_TYPE, body: JSON.stringify({ owner: a.address, id: "chat", offset: 4, length: 5 }) });
      expect(byJson.json).toEqual(msgs.slice(4));
      // an owner with nothing: empty lists
      expect(await conversation(wallet().address, "")).toEqual([]);
      expect(await conversation(a.address, "&id=nothing")).toEqual([]);
    });

    it("a conversation exists once <id>_0 is written", async () => {
      const a = wallet();
      await put(a, "late_1", "one");
      await put(a, "late_2", "two");
      expect(await conversation(a.address, "")).toEqual([]);
      expect(await conversation(a.address, "&id=late")).toEqual([]);
      await put(a, "late_0", "zero");
      expect(await conversation(a.address, "")).toEqual(["late"]);
      expect(await conversation(a.address, "&id=late")).toEqual(["one", "two", "zero"]); // write order
    });

    it("conversation ids match exactly: a_1 is not in ab, and `_` or `%` in an id is not a wildcard", async () => {
      const a = wallet();
      for (const id of ["a_0", "a_1", "ab_0", "ab_1", "a_b_0", "x_y_0", "xzy_0", "x_y_z_0", "a%_0"]) await put(a, id, `v:${id}`);
      expect(await conversation(a.address, "&id=a")).toEqual(["v:a_0", "v:a_1"]);
      expect(await conversation(a.address, "&id=ab")).toEqual(["v:ab_0", "v:ab_1"]);
      expect(await conversation(a.address, "&id=a_b")).toEqual(["v:a_b_0"]);
      expect(await conversation(a.address, "&id=x_y")).toEqual(["v:x_y_0"]);
      expect(await conversation(a.address, "&id=xzy")).toEqual(["v:xzy_0"]);
      expect(await conversation(a.address, "&id=a%25")).toEqual(["v:a%_0"]);
      expect(await conversation(a.address, "&id=_")).toEqual([]);
      expect((await conversation(a.address, "")).sort()).toEqual(["a", "a%", "a_b", "ab", "x_y", "x_y_z", "xzy"]);
      // another owner's identical ids are another space
      const b = wallet();
      await put(b, "a_0", "b's");
      expect(await conversation(b.address, "&id=a")).toEqual(["b's"]);
      expect(await conversation(a.address, "&id=a")).toEqual(["v:a_0", "v:a_1"]);
    });

    it("buckets are per owner: two wallets using the same agent name do not collide", async () => {
      const a = wallet();
      const b = wallet();
      await put(a, "same_0", "from a", { bucket: "agent" });
      await put(b, "same_0", "from b", { bucket: "agent" });
      expect(await conversation(a.address, "&id=same&bucket=agent")).toEqual(["from a"]);
      expect(await conversation(b.address, "&id=same&bucket=agent")).toEqual(["from b"]);
      expect(await conversation(a.address, "&bucket=other")).toEqual([]);
    });
  });

  describe("write authorisation", () => {
    const fieldsOf = (owner: Address, message = "hello") => ({ owner, bucket: "b", id: "k", message });
    const bodyOf = (f: ReturnType<typeof fieldsOf>) => JSON.stringify(f);
    const stored = async (owner: Address, id = "k") => (await send(`${api("download")}?owner=${owner}&id=${id}`)).status;

    it("an unsigned write (the original's request as is) → 401 missing_signature, nothing stored", async () => {
      const a = wallet();
      const res = await send(api("upload"), { headers: JSON_TYPE, body: pythonJsonDumps({ owner: a.address, bucket: "b", id: "k", message: "m" }) });
      expect(res.status).toBe(401);
      expect(errorCode(res)).toBe("missing_signature");
      expect(await stored(a.address)).toBe(404);
    });

    it("a signature by another wallet → 401 invalid_signature: writing as another owner is impossible", async () => {
      const victim = wallet();
      const attacker = wallet();
      const f = fieldsOf(victim.address);
      const res = await send(api("upload"), { headers: { ...JSON_TYPE, ...(await signedHeaders(attacker, hub.domain, f)) }, body: bodyOf(f) });
      expect(res.status).toBe(401);
      expect(errorCode(res)).toBe("invalid_signature");
      expect(await stored(victim.address)).toBe(404);
    });

    it("a replayed nonce → 401 replayed_nonce, also under a new signature; nonces are per owner", async () => {
      const a = wallet();
      const f = fieldsOf(a.address);
      const headers = { ...JSON_TYPE, ...(await signedHeaders(a, hub.domain, f)) };
      expect((await send(api("upload"), { headers, body: bodyOf(f) })).status).toBe(200);
      const replay = await send(api("upload"), { headers, body: bodyOf(f) });
      expect(replay.status).toBe(401);
      expect(errorCode(replay)).toBe("replayed_nonce");

      const nonce = headers["x-hub-nonce"] as `0x${string}`;
      const f2 = fieldsOf(a.address, "other");
      const resigned = await send(api("upload"), { headers: { ...JSON_TYPE, ...(await signedHeaders(a, hub.domain, f2, { nonce })) }, body: bodyOf(f2) });
      expect(errorCode(resigned)).toBe("replayed_nonce");
      const history = await send(`${api("history")}?owner=${a.address}&id=k`);
      expect((history.json as { versions: unknown[] }).versions).toHaveLength(1);

      const b = wallet();
      const fb = fieldsOf(b.address);
      expect((await send(api("upload"), { headers: { ...JSON_TYPE, ...(await signedHeaders(b, hub.domain, fb, { nonce })) }, body: bodyOf(fb) })).status).toBe(200);
    });

    it("an expired authorisation → 401 expired_signature; one valid for too long → 401 expiry_too_far", async () => {
      const a = wallet();
      const f = fieldsOf(a.address);
      const now = BigInt(Math.floor(Date.now() / 1000));
      const expired = await send(api("upload"), { headers: { ...JSON_TYPE, ...(await signedHeaders(a, hub.domain, f, { expiry: now - 1n })) }, body: bodyOf(f) });
      expect(expired.status).toBe(401);
      expect(errorCode(expired)).toBe("expired_signature");
      const tooFar = await send(api("upload"), { headers: { ...JSON_TYPE, ...(await signedHeaders(a, hub.domain, f, { expiry: now + 86_400n })) }, body: bodyOf(f) });
      expect(tooFar.status).toBe(401);
      expect(errorCode(tooFar)).toBe("expiry_too_far");
      expect(await stored(a.address)).toBe(404);
    });

    it("the message, or any other signed part, changed after signing → 401 invalid_signature", async () => {
      const a = wallet();
      const f = fieldsOf(a.address, "signed message");
      const headers = { ...JSON_TYPE, ...(await signedHeaders(a, hub.domain, f)) };
      const tampered: [string, Record<string, unknown>, Record<string, string>][] = [
        ["message", { ...f, message: "tampered message" }, {}],
        ["bucket", { ...f, bucket: "other" }, {}],
        ["id", { ...f, id: "k2" }, {}],
        ["kind", { ...f, kind: "knowledgebase" }, {}],
        ["nonce", f, { "x-hub-nonce": newHubNonce() }],
        ["expiry", f, { "x-hub-expiry": String(Number(headers["x-hub-expiry"]) + 1) }],
      ];
      for (const [what, body, extra] of tampered) {
        const res = await send(api("upload"), { headers: { ...headers, ...extra }, body: JSON.stringify(body) });
        expect(res.status, what).toBe(401);
        expect(errorCode(res), what).toBe("invalid_signature");
      }
      expect(await stored(a.address)).toBe(404);
      expect(await stored(a.address, "k2")).toBe(404);
      // the untouched request still goes through
      expect((await send(api("upload"), { headers, body: bodyOf(f) })).status).toBe(200);
    });

    it("a signature for another store (domain name or chain id) → 401 invalid_signature", async () => {
      const a = wallet();
      const f = fieldsOf(a.address);
      for (const domain of [{ ...hub.domain, chainId: hub.domain.chainId + 1 }, { ...hub.domain, name: "another hub" }, { ...hub.domain, version: "2" }]) {
        const res = await send(api("upload"), { headers: { ...JSON_TYPE, ...(await signedHeaders(a, hub.domain, f, { domain })) }, body: bodyOf(f) });
        expect(errorCode(res)).toBe("invalid_signature");
      }
    });

    it("the authorisation may travel as body fields instead of headers, not in the query string", async () => {
      const a = wallet();
      const f = fieldsOf(a.address, "via form");
      const h = await signedHeaders(a, hub.domain, f);
      const form = new URLSearchParams({ ...f, signature: h["x-hub-signature"]!, nonce: h["x-hub-nonce"]!, expiry: h["x-hub-expiry"]! });
      const res = await send(api("upload"), { headers: FORM_TYPE, body: form.toString() });
      expect(res.status, res.text).toBe(200);
      expect((await send(`${api("download")}?owner=${a.address}&id=k`)).text).toBe("via form");
      // but never in the query string, which ends up in access logs
      const f2 = fieldsOf(a.address, "via query");
      const h2 = await signedHeaders(a, hub.domain, f2);
      const query = new URLSearchParams({ signature: h2["x-hub-signature"]!, nonce: h2["x-hub-nonce"]!, expiry: h2["x-hub-expiry"]! });
      const res2 = await send(`${api("upload")}?${query}`, { headers: JSON_TYPE, body: bodyOf(f2) });
      expect(errorCode(res2)).toBe("missing_signature");
    });

    it("a partial or malformed authorisation is refused with 401 and says which part", async () => {
      const a = wallet();
      const f = fieldsOf(a.address);
      const h = await signedHeaders(a, hub.domain, f);
      const partial = await send(api("upload"), { headers: { ...JSON_TYPE, "x-hub-signature": h["x-hub-signature"]! }, body: bodyOf(f) });
      expect(partial.status).toBe(401);
      expect(partial.json).toEqual({ error: expect.stringMatching(/^missing_signature: .*x-hub-nonce, x-hub-expiry missing/) });
      for (const [header, value] of [
        ["x-hub-signature", "not hex"],
        ["x-hub-signature", "0x1234"],
        ["x-hub-nonce", "0x12"],
        ["x-hub-expiry", "-5"],
        ["x-hub-expiry", "99999999999999999999999"],
      ] as const) {
        const res = await send(api("upload"), { headers: { ...JSON_TYPE, ...h, [header]: value }, body: bodyOf(f) });
        expect(res.status, `${header}=${value}`).toBe(401);
        expect(errorCode(res), `${header}=${value}`).toBe("invalid_signature");
      }
    });
  });

  describe("versions", () => {
    it("100 concurrent writes to one key: all versions kept, the latest wins, nothing lost", async () => {
      const a = wallet();
      const messages = Array.from({ length: 100 }, (_, i) => `write ${i}`);
      const results = await Promise.all(
        messages.map(async (message) => {
          const f = { owner: a.address, bucket: "b", id: "hot", message };
          const res = await send(api("upload"), { headers: { ...JSON_TYPE, ...(await signedHeaders(a, hub.domain, f)) }, body: JSON.stringify(f) });
          return { message, status: res.status, version: (res.json as { version: number }).version };
        }),
      );
      expect(results.map((r) => r.status)).toEqual(messages.map(() => 200));
      expect(results.map((r) => r.version).sort((x, y) => x - y)).toEqual(messages.map((_, i) => i + 1));

      const history = (await send(`${api("history")}?owner=${a.address}&id=hot&length=1000`)).json as {
        latest: number;
        versions: { version: number; message: string; messageHash: string }[];
      };
      expect(history.latest).toBe(100);
      expect(history.versions.map((v) => v.version)).toEqual(messages.map((_, i) => i + 1));
      expect(history.versions.map((v) => v.message).sort()).toEqual([...messages].sort());
      for (const v of history.versions) {
        expect(v.messageHash).toBe(hubMessageHash(v.message));
        expect(results.find((r) => r.message === v.message)!.version).toBe(v.version); // each write got the version it was told
      }
      const latest = (await send(`${api("download")}?owner=${a.address}&id=hot`)).text;
      expect(latest).toBe(history.versions[99]!.message);
      expect(latest).toBe(results.find((r) => r.version === 100)!.message);
    });

    it("overwriting keeps earlier versions readable: history and download of a version", async () => {
      const a = wallet();
      await put(a, "doc", "v1", { bucket: "one" });
      await put(a, "doc", "v2", { bucket: "two", kind: "knowledgebase" });
      expect((await send(`${api("download")}?owner=${a.address}&id=doc`)).text).toBe("v2");
      const first = await send(`${api("download")}?owner=${a.address}&id=doc&version=1`);
      expect(first.text).toBe("v1");
      expect(first.headers.get("x-hub-version")).toBe("1");
      expect(errorCode(await send(`${api("download")}?owner=${a.address}&id=doc&version=3`))).toBe("not_found");
      const history = (await send(api("history"), { headers: FORM_TYPE, body: `owner=${a.address}&id=doc` })).json as { versions: { version: number; bucket: string; kind: string; message: string }[] };
      expect(history.versions.map(({ version, bucket, kind, message }) => ({ version, bucket, kind, message }))).toEqual([
        { version: 1, bucket: "one", kind: "memory", message: "v1" },
        { version: 2, bucket: "two", kind: "knowledgebase", message: "v2" },
      ]);
      expect(errorCode(await send(`${api("history")}?owner=${a.address}&id=none`))).toBe("not_found");
    });
  });

  describe("bad input: a clear 4xx, never a 500", () => {
    it("answers each mistake with its status and code", async () => {
      const a = wallet();
      const owner = a.address;
      const cases: [string, Promise<Awaited<ReturnType<typeof send>>>, number, string, RegExp?][] = [
        ["bad owner", send(`${api("download")}?owner=0x123&id=k`), 400, "invalid_request", /field owner/],
        ["missing id", send(`${api("download")}?owner=${owner}`), 400, "invalid_request", /field id is required/],
        ["missing owner", send(api("conversation"), { headers: FORM_TYPE, body: "id=x" }), 400, "invalid_request", /field owner is required/],
        ["message not a string", send(api("upload"), { headers: JSON_TYPE, body: JSON.stringify({ owner, id: "k", message: { a: 1 } }) }), 400, "invalid_request", /field message/],
        ["unknown kind", send(api("upload"), { headers: JSON_TYPE, body: JSON.stringify({ owner, id: "k", message: "m", kind: "other" }) }), 400, "invalid_request", /field kind/],
        ["control character in id", send(api("upload"), { headers: JSON_TYPE, body: JSON.stringify({ owner, id: "k\u0000", message: "m" }) }), 400, "invalid_request", /field id/],
        ["lone surrogate in message", send(api("upload"), { headers: JSON_TYPE, body: `{"owner":"${owner}","id":"k","message":"\\ud800"}` }), 400, "invalid_request", /field message/],
        ["owner and Owner differ", send(api("download"), { headers: JSON_TYPE, body: JSON.stringify({ owner, Owner: wallet().address, id: "k" }) }), 400, "invalid_request", /given twice/],
        ["id and name differ", send(`${api("download")}?owner=${owner}&id=a&name=b`), 400, "invalid_request", /alias/],
        ["repeated form field", send(api("download"), { headers: FORM_TYPE, body: `owner=${owner}&id=a&id=b` }), 400, "invalid_request", /more than once/],
        ["negative offset", send(`${api("conversation")}?owner=${owner}&offset=-1`), 400, "invalid_request", /field offset/],
        ["JSON array body", send(api("download"), { headers: JSON_TYPE, body: "[1]" }), 400, "invalid_request"],
        ["broken JSON", send(api("upload"), { headers: JSON_TYPE, body: '{"owner": ' }), 400, "invalid_json"],
        ["multipart", send(api("upload"), { headers: { "content-type": "multipart/form-data; boundary=x" }, body: "--x--" }), 415, "unsupported_media_type"],
        ["GET upload", send(api("upload")), 405, "method_not_allowed"],
        ["DELETE download", send(api("download"), { method: "DELETE" }), 405, "method_not_allowed"],
        ["unknown path", send(`${hub.url}/api/uploads`), 404, "not_found"],
        ["missing value", send(`${api("download")}?owner=${owner}&id=never`), 404, "not_found"],
      ];
      for (const [what, pending, status, code, detail] of cases) {
        const res = await pending;
        expect(res.status, `${what}: ${res.text}`).toBe(status);
        expect(errorCode(res), what).toBe(code);
        if (detail) expect((res.json as { error: string }).error, what).toMatch(detail);
      }
      expect((await send(api("upload"), { method: "GET" })).headers.get("allow")).toBe("POST");
    });

    it("hostile values in every field: only 2xx or 4xx, always a well-formed body", async () => {
      const a = wallet();
      const HOSTILE: unknown[] = [null, 0, -1, 1e308, "", "x", "0x", "%", "_", "\u0000", "9".repeat(400), "é".repeat(600), true, [], {}, { $ne: 1 }, "__proto__"];
      const base = { owner: a.address, bucket: "b", id: "k_0", message: "m", kind: "memory", offset: 0, length: 2, version: 1, name: "k_0" };
      const statuses = new Map<number, number>();
      for (const endpoint of ["upload", "download", "conversation", "history"]) {
        for (const field of Object.keys(base)) {
          for (const value of HOSTILE) {
            const res = await send(api(endpoint), { headers: JSON_TYPE, body: JSON.stringify({ ...base, [field]: value }) });
            statuses.set(res.status, (statuses.get(res.status) ?? 0) + 1);
            expect(res.status, `${endpoint} ${field}=${JSON.stringify(value)}: ${res.text}`).toBeLessThan(500);
            if (res.status >= 400) expect(res.json, `${endpoint} ${field}`).toEqual({ error: expect.stringMatching(/^[a-z_]+: .+/) });
          }
        }
      }
      expect(statuses.get(400)).toBeGreaterThan(0);
    });

    it("a body over the 4 MiB limit → 413 payload_too_large", async () => {
      const a = wallet();
      const res = await send(api("upload"), { headers: JSON_TYPE, body: JSON.stringify({ owner: a.address, id: "big", message: "x".repeat(4 * 1024 * 1024) }) });
      expect(res.status).toBe(413);
      expect(errorCode(res)).toBe("payload_too_large");
    });
  });

  it("the TypeScript client signs writes and reads them back", async () => {
    const a = wallet();
    const client = createHubClient({ url: hub.url, signer: a });
    const up = await client.upload({ id: "c_0", message: JSON.stringify({ name: "helper", content: "hi" }) });
    expect(up).toMatchObject({ owner: a.address.toLowerCase(), bucket: "helper", id: "c_0", version: 1 });
    await client.upload({ id: "c_1", message: "second", bucket: "helper" });
    await client.upload({ id: "c_1", message: "second, edited", bucket: "helper" });
    expect(await client.download({ id: "c_1" })).toBe("second, edited");
    expect(await client.download({ id: "c_1", version: 1 })).toBe("second");
    expect(await client.download({ id: "missing" })).toBeUndefined();
    expect(await client.listConversations()).toEqual(["c"]);
    expect(await client.getConversation({ id: "c", offset: 1 })).toEqual(["second, edited"]);
    expect((await client.history({ id: "c_1" }))?.versions.map((v) => v.message)).toEqual(["second", "second, edited"]);
    // a reader without a signer reads another owner's public data
    const reader = createHubClient({ url: hub.url });
    expect(await reader.getConversation({ id: "c", owner: a.address })).toHaveLength(2);
    await expect(reader.upload({ id: "x", message: "y", owner: a.address })).rejects.toThrow(/need a signer/);
    // the client cannot write into another owner's space either
    const other = wallet();
    await expect(createHubClient({ url: hub.url, signer: other, owner: a.address }).upload({ id: "x", message: "y" })).rejects.toMatchObject({ status: 401, code: "invalid_signature" });
  });
});
