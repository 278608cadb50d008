// The hub's pure parts: field collection, conversation ids, bucket derivation, the signature format
// (the worked example of docs/hub.md, recomputed by hand), and the rate limiter with a fake clock.
import { describe, expect, it } from "vitest";
import { pino } from "pino";
import { concat, encodeAbiParameters, hashTypedData, keccak256, recoverTypedDataAddress, stringToBytes, type Hex } from "viem";
import { privateKeyToAccount } from "viem/accounts";
import { hubMessageHash, hubWriteTypedData, readAuthorization, type HubWrite } from "../services/hub/auth.ts";
import { HubError } from "../services/hub/errors.ts";
import { createRateLimiter } from "../services/hub/rate-limit.ts";
import { startHubService } from "../services/hub/service.ts";
import { collectFields, conversationOf, deriveBucket, parseConversation, parseForm, parseUpload } from "../services/hub/wire.ts";

const OWNER = "0x70997970C51812dc3A010C7d01b50e0d17dc79C8";

describe("field collection", () => {
  it("merges query and body under lower-cased names", () => {
    const fields = collectFields(parseForm("Owner=0xabc&offset=2"), { ID: "x", message: "m" });
    expect({ ...fields }).toEqual({ owner: "0xabc", offset: "2", id: "x", message: "m" });
  });

  it("refuses a field given twice with different values, accepts the same value twice", () => {
    expect(() => collectFields(undefined, { owner: "a", OWNER: "b" })).toThrow(/field owner is given twice/);
    expect(() => collectFields(parseForm("id=a"), { id: "b" })).toThrow(HubError);
    expect(() => collectFields(parseForm("id=a&id=b"), undefined)).toThrow(/more than once/);
    expect({ ...collectFields(parseForm("id=a&id=a"), { Id: "a" }) }).toEqual({ id: "a" });
  });

  it("decodes forms like Python's urlencode encodes them", () => {
    expect({ ...parseForm("id=a+b%2Fc%7E&owner=0x1&empty=") }).toEqual({ id: "a b/c~", owner: "0x1", empty: "" });
  });

  it("parses an upload with defaults and lower-cases the owner", () => {
    const req = parseUpload(collectFields(undefined, { Owner: OWNER, ID: "k", Message: '{"name":"agent"}', bucket: "" }));
    expect(req).toEqual({ owner: OWNER.toLowerCase(), id: "k", message: '{"name":"agent"}', kind: "memory", bucket: "agent" });
  });

  it("pages conversations with defaults and clamps the page length", () => {
    expect(parseConversation({ owner: OWNER })).toEqual({ owner: OWNER.toLowerCase(), offset: 0, length: 1024 });
    expect(parseConversation({ owner: OWNER, name: "c", offset: "5", length: 99999 })).toMatchObject({ id: "c", offset: 5, length: 1024 });
    expect(() => parseConversation({ owner: OWNER, length: "1.5" })).toThrow(/field length/);
  });
});

describe("conversation ids", () => {
  it("splits at the last underscore followed only by digits", () => {
    expect(conversationOf("a_0")).toEqual({ conversationId: "a", index: "0" });
    expect(conversationOf("a_b_12")).toEqual({ conversationId: "a_b", index: "12" });
    expect(conversationOf("a%_3")).toEqual({ conversationId: "a%", index: "3" });
    expect(conversationOf("_0")).toBeUndefined();
    expect(conversationOf("a_x")).toBeUndefined();
    expect(conversationOf("a0")).toBeUndefined();
  });
});

describe("bucket derivation", () => {
  it("takes the message's name, else the owner", () => {
    expect(deriveBucket(OWNER, '{"name": "agent9527"}')).toBe("agent9527");
    expect(deriveBucket(OWNER, '{"name": 5}')).toBe(OWNER.toLowerCase());
    expect(deriveBucket(OWNER, '{"name": ""}')).toBe(OWNER.toLowerCase());
    expect(deriveBucket(OWNER, "[1]")).toBe(OWNER.toLowerCase());
    expect(deriveBucket(OWNER, "plain text")).toBe(OWNER.toLowerCase());
  });
});

describe("the signature format (the worked example of docs/hub.md)", () => {
  // anvil's well-known development key #1: guards nothing.
  const key = "0x59c6995e998f97a5a0044966f0945389dc9e86dae88c7a8412f4603b6b78690d";
  const message = '{"name": "agent9527", "role": "user", "content": "hello"}';
  const domain = { name: "x402-fleet hub", version: "1", chainId: 8453 };
  const write: HubWrite = {
    operation: "upload",
    owner: OWNER.toLowerCase() as Hex,
    bucket: "agent9527",
    id: "chat7_0",
    kind: "memory",
    messageHash: hubMessageHash(message),
    nonce: `0x${"11".repeat(32)}`,
    expiry: 1767225600n,
  };
  const DOC = {
    messageHash: "0x0707342ab8595050dec3291c0ef7a4378a4a86d68f85c83741614b49a92cb2fe",
    domainSeparator: "0x0234c131110a33fc907c8e3f38c24417f7ad5ffd2bb84509ab4a98b7568210b8",
    structHash: "0xa3c747270ccac32062d69f18336a9453c20ca28fd92eb0e96f983316c9c7b165",
    digest: "0xf289b06f3684aaa24657b8b76a783a7542febd2196c387689246525c78a95856",
    signature:
      "0x4a6589af9c61408ebd6d33e697dc0b5fa5395da43c2f6c2b54009a1d4b356dce5b89a00237dd91592808396a26a538df22da3a5c4f0791e5ab243dbd134c4dbb1b",
  };

  it("is plain EIP-712: recomputed by hand from the type strings, it gives the documented digest", () => {
    expect(write.messageHash).toBe(keccak256(stringToBytes(message)));
    expect(write.messageHash).toBe(DOC.messageHash);
    const domainType = keccak256(stringToBytes("EIP712Domain(string name,string version,uint256 chainId)"));
    const domainSeparator = keccak256(
      encodeAbiParameters(
        [{ type: "bytes32" }, { type: "bytes32" }, { type: "bytes32" }, { type: "uint256" }],
        [domainType, keccak256(stringToBytes(domain.name)), keccak256(stringToBytes(domain.version)), BigInt(domain.chainId)],
      ),
    );
    expect(domainSeparator).toBe(DOC.domainSeparator);
    const writeType = keccak256(
      stringToBytes("HubWrite(string operation,address owner,string bucket,string id,string kind,bytes32 messageHash,bytes32 nonce,uint64 expiry)"),
    );
    const structHash = keccak256(
      encodeAbiParameters(
        ["bytes32", "bytes32", "address", "bytes32", "bytes32", "bytes32", "bytes32", "bytes32", "uint64"].map((type) => ({ type })),
        [
          writeType,
          keccak256(stringToBytes(write.operation)),
          write.owner,
          keccak256(stringToBytes(write.bucket)),
          keccak256(stringToBytes(write.id)),
          keccak256(stringToBytes(write.kind)),
          write.messageHash,
          write.nonce,
          write.expiry,
        ],
      ),
    );
    expect(structHash).toBe(DOC.structHash);
    const digest = keccak256(concat(["0x1901", domainSeparator, structHash]));
    expect(digest).toBe(DOC.digest);
    expect(hashTypedData(hubWriteTypedData(domain, write))).toBe(DOC.digest);
  });

  it("signs deterministically to the documented signature, which recovers to the owner", async () => {
    const account = privateKeyToAccount(key);
    expect(account.address).toBe(OWNER);
    const typedData = hubWriteTypedData(domain, write);
    expect(await account.signTypedData(typedData)).toBe(DOC.signature);
    expect(await recoverTypedDataAddress({ ...typedData, signature: DOC.signature as Hex })).toBe(OWNER);
  });

  it("is accepted as the documented curl request by a hub whose clock is before the expiry, and refused after it", async () => {
    const body = '{"owner": "0x70997970C51812dc3A010C7d01b50e0d17dc79C8", "bucket": "agent9527", "id": "chat7_0", "message": "{\\"name\\": \\"agent9527\\", \\"role\\": \\"user\\", \\"content\\": \\"hello\\"}"}';
    expect(JSON.parse(body).message).toBe(message);
    const headers = { "content-type": "application/json", "x-hub-signature": DOC.signature, "x-hub-nonce": write.nonce, "x-hub-expiry": "1767225600" };
    let clock = Date.UTC(2025, 11, 31, 23, 55);
    const hub = await startHubService({ port: 0, logger: pino({ level: "silent" }), now: () => clock });
    try {
      expect(hub.domain).toEqual(domain);
      const late = await fetch(`${hub.url}/api/upload`, { method: "POST", headers, body });
      expect(late.status).toBe(200);
      const down = await fetch(`${hub.url}/api/download`, { method: "POST", headers: { "content-type": "application/x-www-form-urlencoded" }, body: `id=chat7_0&owner=${OWNER}` });
      expect(await down.text()).toBe(message);
      clock = Date.UTC(2026, 0, 1, 0, 0, 1);
      const expired = await fetch(`${hub.url}/api/upload`, { method: "POST", headers: { ...headers, "x-hub-nonce": `0x${"22".repeat(32)}` }, body });
      expect(expired.status).toBe(401);
      expect(((await expired.json()) as { error: string }).error).toMatch(/^expired_signature: /);
    } finally {
      await hub.close();
    }
  });

  it("reads the authorisation from headers first, then body fields", () => {
    const auth = readAuthorization({ "x-hub-signature": DOC.signature, "x-hub-nonce": write.nonce.toUpperCase().replace("0X", "0x"), "x-hub-expiry": "1767225600" }, {});
    expect(auth).toEqual({ signature: DOC.signature, nonce: write.nonce, expiry: 1767225600n });
    expect(readAuthorization({}, { signature: DOC.signature, nonce: write.nonce, expiry: 1767225600 })).toEqual(auth);
    expect(readAuthorization({}, {})).toBeUndefined();
  });
});

describe("rate limiter", () => {
  it("allows the burst, then the steady rate, per key (fake clock)", () => {
    let t = 1_000_000;
    const limiter = createRateLimiter({ burst: 3, perSecond: 2 }, () => t);
    expect([1, 2, 3, 4].map(() => limiter.take("a").ok)).toEqual([true, true, true, false]);
    expect(limiter.take("a")).toEqual({ ok: false, retryAfterSeconds: 1 });
    expect(limiter.take("b").ok).toBe(true); // another owner has its own bucket
    t += 500; // one token back
    expect([limiter.take("a").ok, limiter.take("a").ok]).toEqual([true, false]);
    t += 60_000; // never more than the burst
    expect([1, 2, 3, 4].map(() => limiter.take("a").ok)).toEqual([true, true, true, false]);
  });

  it("forgets idle owners instead of growing without bound", () => {
    let t = 0;
    const limiter = createRateLimiter({ burst: 1, perSecond: 1 }, () => t, 10);
    for (let i = 0; i < 10; i++) expect(limiter.take(`o${i}`).ok).toBe(true);
    expect(limiter.take("o0").ok).toBe(false);
    t += 1000; // all refilled: pruned when a new owner arrives
    expect(limiter.take("new").ok).toBe(true);
    expect(limiter.take("o0").ok).toBe(true);
  });
});
