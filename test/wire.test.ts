import { describe, expect, it } from "vitest";
import { normalizeRequest, parseOrThrow, routeOf, wellFormedPayload, wellFormedRequirements } from "../services/x402/wire.ts";
import { checkSchemePayload, eip3009Payload, wellFormedEip3009 } from "../services/x402/payloads.ts";
import { RequestError } from "../services/x402/errors.ts";

const asset = "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913";
const payTo = "0x000000000000000000000000000000000000dEaD";
const serviceReq = {
  scheme: "exact",
  network: "eip155:8453",
  asset,
  payTo,
  maxAmountRequired: "1000",
  resource: "https://api.example.com/x",
  maxTimeoutSeconds: 60,
};
const service = { paymentPayload: { x402Version: 2, scheme: "exact", network: "eip155:8453", payload: { signature: "0x" } }, paymentRequirements: serviceReq };

function codeOf(fn: () => unknown): string {
  try {
    fn();
  } catch (e) {
    if (e instanceof RequestError) return `${e.status} ${e.code}`;
    throw e;
  }
  return "ok";
}

describe("normalizeRequest", () => {
  it("maps the service shape to the standard v2 form", () => {
    const r = normalizeRequest(service);
    expect(r.paymentRequirements).toEqual({ scheme: "exact", network: "eip155:8453", asset, payTo, amount: "1000", maxTimeoutSeconds: 60, extra: {} });
    expect(r.paymentPayload.accepted).toEqual(r.paymentRequirements);
    expect(r.paymentPayload.resource).toEqual({ url: "https://api.example.com/x" });
  });

  it("keeps the standard shape, with accepted as sent", () => {
    const req = { ...serviceReq, amount: "1000", maxAmountRequired: undefined, resource: undefined, extra: { name: "USD Coin", version: "2" } };
    const r = normalizeRequest({ x402Version: 2, paymentPayload: { x402Version: 2, accepted: { ...req, network: "eip155:84532" }, payload: {} }, paymentRequirements: req });
    expect(r.paymentRequirements.amount).toBe("1000");
    expect(r.paymentRequirements.extra).toEqual({ name: "USD Coin", version: "2" });
    // A mismatch between accepted and the requirements is kept for the mechanism to reject (payment level).
    expect(r.paymentPayload.accepted.network).toBe("eip155:84532");
  });

  it("cross-checks the service shape's scheme/network by carrying them into accepted", () => {
    const r = normalizeRequest({ ...service, paymentPayload: { ...service.paymentPayload, network: "eip155:137" } });
    expect(r.paymentPayload.accepted.network).toBe("eip155:137");
    expect(r.paymentRequirements.network).toBe("eip155:8453");
  });

  it("rejects both amounts when they differ, accepts them when equal", () => {
    expect(codeOf(() => normalizeRequest({ ...service, paymentRequirements: { ...serviceReq, amount: "999" } }))).toBe("400 amount_mismatch");
    expect(normalizeRequest({ ...service, paymentRequirements: { ...serviceReq, amount: "1000" } }).paymentRequirements.amount).toBe("1000");
  });

  it("fails version detection when x402Version is only at the top level", () => {
    const { x402Version: _v, ...payloadWithout } = service.paymentPayload;
    expect(codeOf(() => normalizeRequest({ x402Version: 2, paymentPayload: payloadWithout, paymentRequirements: serviceReq }))).toBe("400 unsupported_version");
    expect(codeOf(() => normalizeRequest({ ...service, paymentPayload: { ...service.paymentPayload, x402Version: 1 } }))).toBe("400 unsupported_version");
    expect(codeOf(() => normalizeRequest({ ...service, paymentPayload: { ...service.paymentPayload, x402Version: "2" } }))).toBe("400 unsupported_version");
  });

  it.each([
    ["not an object", 42],
    ["array", []],
    ["missing payload", { paymentRequirements: serviceReq }],
    ["missing requirements", { paymentPayload: service.paymentPayload }],
    ["non-hex payTo", { ...service, paymentRequirements: { ...serviceReq, payTo: "bob" } }],
    ["short asset", { ...service, paymentRequirements: { ...serviceReq, asset: "0x1234" } }],
    ["amount beyond uint256", { ...service, paymentRequirements: { ...serviceReq, maxAmountRequired: "9".repeat(100) } }],
    ["negative amount", { ...service, paymentRequirements: { ...serviceReq, maxAmountRequired: "-1" } }],
    ["float amount", { ...service, paymentRequirements: { ...serviceReq, maxAmountRequired: "1.5" } }],
    ["numeric amount", { ...service, paymentRequirements: { ...serviceReq, maxAmountRequired: 1000 } }],
    ["no amount", { ...service, paymentRequirements: { ...serviceReq, maxAmountRequired: undefined } }],
    ["huge timeout", { ...service, paymentRequirements: { ...serviceReq, maxTimeoutSeconds: 1e30 } }],
    ["bad network", { ...service, paymentRequirements: { ...serviceReq, network: "base" } }],
    ["payload not object", { ...service, paymentPayload: { ...service.paymentPayload, payload: "x" } }],
    ["neither accepted nor scheme", { ...service, paymentPayload: { x402Version: 2, payload: {} } }],
  ])("rejects %s with a 400", (_name, body) => {
    expect(codeOf(() => normalizeRequest(body))).toMatch(/^400 /);
  });

  it("names the offending field in the detail", () => {
    try {
      normalizeRequest({ ...service, paymentRequirements: { ...serviceReq, payTo: "bob" } });
      expect.unreachable();
    } catch (e) {
      expect((e as RequestError).body().error).toBe("invalid_request: paymentRequirements.payTo: expected a 0x-prefixed 20-byte hex address");
    }
  });
});

// normalizeRequest checks the common shapes by hand and leaves anything else to the zod schemas
// (faster, same rules): on every mutation of every field, both ways give the same request or the
// same error, code and words; the hand checks never accept what the schemas refuse.
describe("normalizeRequest's hand checks", () => {
  const standardReq = { scheme: "exact", network: "eip155:8453", asset, payTo, amount: "1000", maxTimeoutSeconds: 60, extra: { name: "USD Coin", version: "2" } };
  const authorization = { from: payTo, to: asset, value: "1000", validAfter: "0", validBefore: "1999999999", nonce: `0x${"ab".repeat(32)}` };
  const standard = {
    x402Version: 2,
    paymentPayload: { x402Version: 2, accepted: standardReq, resource: { url: "https://api.example.com/x", description: "d", mimeType: "text/plain" }, payload: { signature: `0x${"11".repeat(65)}`, authorization }, extensions: { a: 1 } },
    paymentRequirements: standardReq,
  };
  const VALUES: unknown[] = [
    undefined, null, true, 0, 1, -1, 1.5, 2, 60, 31_536_000, 31_536_001, 1e30, Number.NaN, "", "0", "00", "01", "-1", "1.5", "1e3", " 1", "x", "exact",
    "e".repeat(64), "e".repeat(65), "eip155:8453", "eip155:0", "eip155:01", "0x", "0x1", `0x${"a".repeat(40)}`, `0x${"A".repeat(40)}`, `0x${"g".repeat(40)}`, `0X${"a".repeat(40)}`,
    `0x${"a".repeat(39)}`, `0x${"ab".repeat(32)}`, `0x${"a".repeat(63)}`, `0x${"ab".repeat(4096)}`, `0x${"ab".repeat(4097)}`, "9".repeat(77), "9".repeat(78), String((1n << 256n) - 1n), String(1n << 256n), "9".repeat(79),
    "a".repeat(256), "a".repeat(257), "a".repeat(4096), "a".repeat(4097), {}, [], { url: "u" }, { url: 1 }, { url: "u", other: 1 }, { url: "u", description: null }, { url: "u", mimeType: "m".repeat(257) },
    JSON.parse('{"__proto__": {"x": 1}}'), { name: "n" },
  ];
  const FIELDS = ["scheme", "network", "asset", "payTo", "amount", "maxAmountRequired", "maxTimeoutSeconds", "extra", "resource", "description", "mimeType", "other"];
  const PATHS = [
    ...FIELDS.map((f) => ["paymentRequirements", f]),
    ...FIELDS.map((f) => ["paymentPayload", "accepted", f]),
    ...["scheme", "network", "accepted", "payload", "resource", "extensions", "other"].map((f) => ["paymentPayload", f]),
    ...["url", "description", "mimeType", "other"].map((f) => ["paymentPayload", "resource", f]),
  ];
  const mutate = (body: unknown, path: string[], value: unknown): unknown => {
    const copy = structuredClone(body) as Record<string, unknown>;
    let at = copy;
    for (const key of path.slice(0, -1)) at = at[key] as Record<string, unknown>;
    if (typeof at !== "object" || at === null) return undefined; // that shape has no such object
    if (value === undefined) delete at[path.at(-1)!];
    else at[path.at(-1)!] = value;
    return copy;
  };
  const outcome = (fn: () => unknown) => {
    try {
      return { ok: fn() };
    } catch (e) {
      if (e instanceof RequestError) return { error: e.body().error, status: e.status };
      throw e;
    }
  };

  it("takes the common shapes by hand", () => {
    expect(wellFormedPayload(standard.paymentPayload)).toBe(true);
    expect(wellFormedRequirements(standard.paymentRequirements)).toBe(true);
    expect(wellFormedPayload(service.paymentPayload)).toBe(true);
    expect(wellFormedRequirements(service.paymentRequirements)).toBe(true);
    expect(wellFormedEip3009(standard.paymentPayload.payload)).toBe(true);
  });

  it("gives the same request or the same error as the schemas alone, for every mutation of every field", () => {
    let refused = 0;
    for (const base of [standard, service]) {
      for (const path of PATHS) {
        for (const value of VALUES) {
          const body = mutate(base, path, value);
          if (body === undefined) continue;
          const byHand = outcome(() => normalizeRequest(body));
          expect(byHand, `${path.join(".")} = ${JSON.stringify(value)?.slice(0, 40)}`).toEqual(outcome(() => normalizeRequest(body, false)));
          if ("error" in byHand) refused++;
        }
      }
    }
    expect(refused).toBeGreaterThan(500); // the mutations really reach the schemas' refusals
  });

  it("accepts no EIP-3009 payload the schema refuses, and checkSchemePayload refuses with the schema's words", () => {
    const payload = standard.paymentPayload.payload;
    const paths = [["signature"], ["authorization"], ["other"], ...["from", "to", "value", "validAfter", "validBefore", "nonce", "other"].map((f) => ["authorization", f])];
    for (const path of paths) {
      for (const value of VALUES) {
        const p = mutate(payload, path, value);
        if (p === undefined) continue;
        const schema = eip3009Payload.safeParse(p);
        if (wellFormedEip3009(p)) expect(schema.success, `${path.join(".")} = ${JSON.stringify(value)?.slice(0, 40)}`).toBe(true);
        const checked = outcome(() => checkSchemePayload("exact", p));
        if (schema.success) expect(checked).toEqual({ ok: undefined });
        else expect(checked).toEqual(outcome(() => parseOrThrow(eip3009Payload, p, "paymentPayload.payload", "invalid_payload")));
      }
    }
    expect(outcome(() => checkSchemePayload("exact", { ...payload, authorization: { ...authorization, value: "-1" } }))).toEqual({
      error: "invalid_payload: paymentPayload.payload.authorization.value: expected a non-negative decimal integer string",
      status: 400,
    });
  });
});

describe("routeOf", () => {
  /** The pair routeOf returns, or the error it throws (code and detail). */
  function outcome(body: unknown, byHand: boolean): string {
    try {
      return JSON.stringify(routeOf(body, byHand));
    } catch (e) {
      if (e instanceof RequestError) return e.body().error;
      throw e;
    }
  }

  // Every value JSON can give these fields, edge lengths and near-misses of the CAIP-2 pattern.
  const values: unknown[] = [
    undefined, null, true, 0, 8453, "", "x", "exact", "a".repeat(64), "a".repeat(65), "é".repeat(64), "😀".repeat(32), "😀".repeat(33),
    "eip155:8453", "eip155:1", "eip155:0", "eip155:08453", "eip155:", "eip155:1234567890123456789", "eip155:12345678901234567890",
    "eip155:8453\n", " eip155:8453", "EIP155:8453", "solana:5eykt4UsFv8P8NJdTREpY1vzqKqZKvdp", "eip155:8453x", [], ["eip155:8453"], {}, { network: "eip155:8453" },
  ];

  it("takes and refuses exactly what its schema does, with the schema's error", () => {
    for (const scheme of values) {
      for (const network of values) {
        const body = { ...service, paymentRequirements: { ...serviceReq, scheme, network } };
        expect(outcome(body, true), JSON.stringify({ scheme, network })).toBe(outcome(body, false));
      }
    }
  });

  it("checks the envelope first", () => {
    expect(outcome({ paymentRequirements: serviceReq }, true)).toMatch(/^invalid_request: paymentPayload/);
    expect(outcome({ ...service, paymentPayload: { ...service.paymentPayload, x402Version: 1 } }, true)).toMatch(/^unsupported_version: /);
  });
});
