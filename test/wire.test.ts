import { describe, expect, it } from "vitest";
import { normalizeRequest, routeOf } from "../services/x402/wire.ts";
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
