// Bad input never yields a 500 or a hang: every leaf of a valid request replaced by hostile values.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startTestDevnet } from "./helpers/devnet.ts";
import { postJson, serviceShape, signEip3009, signPermit2, standardShape } from "./helpers/payments.ts";
import type { RunningDevnet } from "../services/devnet/devnet.ts";

let devnet: RunningDevnet;
beforeAll(async () => {
  devnet = await startTestDevnet(["eip155:56"]);
});
afterAll(() => devnet?.stop());

const HOSTILE: unknown[] = [null, 0, -1, 1e308, "", "x", "0x", "-5", "1e3", "0x" + "f".repeat(200), "9".repeat(400), true, [], {}, { $ne: 1 }, "__proto__"];

function leaves(value: unknown, path: string[] = []): string[][] {
  if (value && typeof value === "object" && !Array.isArray(value)) {
    return Object.entries(value).flatMap(([k, v]) => [[...path, k], ...leaves(v, [...path, k])]);
  }
  return [];
}

function replaced(body: unknown, path: string[], value: unknown): unknown {
  const copy = structuredClone(body) as Record<string, unknown>;
  let node = copy;
  for (const key of path.slice(0, -1)) node = node[key] as Record<string, unknown>;
  node[path[path.length - 1]!] = value;
  return copy;
}

describe("hostile input", () => {
  it("each field replaced by hostile values: only 200 or 4xx, always a well-formed body", async () => {
    const net = devnet.info.networks[0]!;
    const usdc = net.assets.find((a) => a.transferMethods.includes("eip3009"))!;
    const usdt = net.assets.find((a) => a.symbol === "USDT")!;
    const base = { network: net.network, chainId: net.chainId, payerKey: devnet.info.payers[0]!.privateKey, payTo: devnet.info.receivers[0]!.address, amount: 5n };
    const bodies = [
      serviceShape({ ...base, asset: usdc }, await signEip3009({ ...base, asset: usdc })),
      standardShape({ ...base, asset: usdt }, await signPermit2({ ...base, asset: usdt })),
    ];
    const statuses = new Map<number, number>();
    for (const body of bodies) {
      const requests = leaves(body).flatMap((path) => HOSTILE.map((v) => replaced(body, path, v)));
      // Bounded concurrency keeps the run short without flooding the node.
      for (let i = 0; i < requests.length; i += 16) {
        const batch = requests.slice(i, i + 16);
        const results = await Promise.all(batch.map((b) => postJson(`${devnet.info.routerUrl}/verify`, b)));
        for (const [j, r] of results.entries()) {
          statuses.set(r.status, (statuses.get(r.status) ?? 0) + 1);
          expect([200, 400], JSON.stringify(batch[j]).slice(0, 400)).toContain(r.status);
          if (r.status === 200) expect(typeof r.json.isValid).toBe("boolean");
          else expect(Object.keys(r.json)).toEqual(["error"]);
        }
      }
    }
    // Both outcomes occur: the mutations reach the mechanisms as well as the validators.
    expect(statuses.get(200)).toBeGreaterThan(0);
    expect(statuses.get(400)).toBeGreaterThan(0);
  });

  it("malformed batch-settlement payloads are a 400 with a code at /verify and /settle, never a mechanism's exception", async () => {
    const net = devnet.info.networks[0]!;
    const usdc = net.assets.find((a) => a.transferMethods.includes("eip3009"))!;
    const requirements = { scheme: "batch-settlement", network: net.network, asset: usdc.address, amount: "5", payTo: devnet.info.receivers[0]!.address, maxTimeoutSeconds: 60, extra: {} };
    const address = devnet.info.receivers[0]!.address;
    const payloads = [
      { type: "claim", claims: [null] },
      { type: "claim", claims: "x" },
      { type: "claim", claims: [] },
      { type: "settle", receiver: "0x", token: usdc.address },
      { type: "settle", receiver: address },
      { type: "deposit", channelConfig: { payer: address }, deposit: { amount: "1e5" } },
      { type: "refund", channelConfig: null },
      { type: "voucher" },
    ];
    for (const payload of payloads) {
      for (const action of ["verify", "settle"]) {
        const r = await postJson(`${devnet.info.routerUrl}/${action}`, { x402Version: 2, paymentPayload: { x402Version: 2, accepted: requirements, payload }, paymentRequirements: requirements });
        expect(r.status, `${action} ${JSON.stringify(payload)}`).toBe(400);
        expect(String(r.json.error)).toMatch(/^invalid_payload: paymentPayload\.payload/);
      }
    }
  });

  it("settle with a hostile payload answers a payment-level failure or a 400, never a 500", async () => {
    const net = devnet.info.networks[0]!;
    const usdt = net.assets.find((a) => a.symbol === "USDT")!;
    const base = { network: net.network, chainId: net.chainId, asset: usdt, payerKey: devnet.info.payers[0]!.privateKey, payTo: devnet.info.receivers[0]!.address, amount: 5n };
    const body = standardShape(base, await signPermit2(base));
    for (const path of leaves(body.paymentPayload.payload).map((p) => ["paymentPayload", "payload", ...p])) {
      for (const v of ["0x" + "00".repeat(20), "0", "115792089237316195423570985008687907853269984665640564039457584007913129639935"]) {
        const r = await postJson(`${devnet.info.routerUrl}/settle`, replaced(body, path, v));
        expect([200, 400]).toContain(r.status);
        if (r.status === 200) {
          expect(r.json.success).toBe(false);
          expect(r.json.transaction).toBe("");
        }
      }
    }
  });
});
