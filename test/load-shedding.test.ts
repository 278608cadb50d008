// Load shedding: a process holds at most X402_MAX_SETTLE_IN_FLIGHT settlements at once; past it a
// request is answered 503 with Retry-After before any work. Judged on chain: the shed payment's
// authorization stays unused and the signer signs nothing for it, and a retry once the load has
// passed settles it. A router in front passes the facilitator's Retry-After on, and sheds past its
// own cap in the same way.
import { afterEach, describe, expect, it } from "vitest";
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseAbi, type Hex } from "viem";
import { privateKeyToAccount } from "viem/accounts";
import { pino } from "pino";
import { startRig, type Rig } from "./helpers/settlement-rig.ts";
import { balanceOf } from "./helpers/chain.ts";
import { postJson } from "./helpers/payments.ts";
import { eventually, metricSum, nonceOf, publicClient } from "./helpers/onchain.ts";
import { startRouterService, type RunningRouter } from "../services/router/service.ts";
import { routerOptionsFrom } from "../services/router/config.ts";
import { facilitatorConfigFromEnv } from "../services/facilitator/config.ts";

const authorizationState = parseAbi(["function authorizationState(address, bytes32) view returns (bool)"]);

let rig: Rig | undefined;
let router: RunningRouter | undefined;
let dir: string | undefined;
afterEach(async () => {
  await rig?.test.setAutomine(true).catch(() => undefined);
  await router?.close();
  await rig?.stop();
  if (dir) await rm(dir, { recursive: true, force: true });
  rig = router = dir = undefined;
});

describe("load shedding", () => {
  it("past its settle cap a facilitator answers 503 with Retry-After and signs nothing; a router sheds past its own cap and passes a facilitator's Retry-After on; a retry settles", async () => {
    rig = await startRig();
    const f = await rig.facilitator({ maxSettleInFlight: 2, receiptTimeoutMs: 60_000 });
    const signer = privateKeyToAccount(rig.signerKeys[0]!).address;
    dir = await mkdtemp(join(tmpdir(), "x402-shed-"));
    const table = join(dir, "routing.json");
    await writeFile(table, JSON.stringify({ backends: [{ network: rig.network, url: f.url, kinds: [{ x402Version: 2, scheme: "exact", network: rig.network }] }] }));
    const startRouter = (settle: number) => startRouterService({ routingTablePath: table, host: "127.0.0.1", port: 0, adminPort: 0, maxInFlight: { verify: 64, settle } }, pino({ level: "silent" }));
    const capped = await startRouter(2);
    router = await startRouter(64);

    // Two settlements through the capped router, sent and waiting for a block that does not come:
    // both the router's cap and the facilitator's are full.
    await rig.test.setAutomine(false);
    const held = [postJson(`${capped.url}/settle`, await rig.payment(10n)), postJson(`${capped.url}/settle`, await rig.payment(20n))];
    await eventually(async () => ((await nonceOf(rig!.anvil.rpcUrl, signer, "pending")) === 2 ? true : undefined));

    const shed = await rig.payment(40n);
    const nonce = (shed.paymentPayload.payload as { authorization: { nonce: Hex } }).authorization.nonce;
    // At the facilitator, and through a router with room (which passes Retry-After on)…
    for (const url of [f.url, router.url]) {
      const r = await postJson(`${url}/settle`, shed);
      expect(r.status, r.text).toBe(503);
      expect(r.headers.get("retry-after")).toBe("1");
      expect(String(r.json.error)).toMatch(/^backend_unavailable: this facilitator is already handling 2 settle requests/);
      // The facilitator tells a router that nothing was spent (a tenant's reservation is not charged); a router never passes it on.
      expect(r.headers.get("x402-fleet-gas-spent-wei")).toBe(url === f.url ? "0" : null);
    }
    // …and at the full router, which sheds it itself.
    const atRouter = await postJson(`${capped.url}/settle`, shed);
    expect(atRouter.status).toBe(503);
    expect(atRouter.headers.get("retry-after")).toBe("1");
    expect(String(atRouter.json.error)).toMatch(/^backend_unavailable: this router is already handling 2 settle requests/);
    expect(await metricSum(f.adminUrl, "x402_http_requests_shed_total", { route: "/v2/settle" })).toBe(2);
    expect(await metricSum(f.adminUrl, "x402_http_requests_in_flight", { route: "/v2/settle" })).toBe(2);
    expect(await metricSum(capped.adminUrl!, "x402_http_requests_shed_total", { route: "/v2/settle" })).toBe(1);
    // Verification has its own cap and goes on.
    expect((await postJson(`${capped.url}/verify`, shed)).json).toMatchObject({ isValid: true });

    // On chain: nothing was signed for the shed payment, and its authorization is unused.
    expect(await nonceOf(rig.anvil.rpcUrl, signer, "pending")).toBe(2);
    const payer = privateKeyToAccount(rig.payerKey).address;
    expect(await publicClient(rig.anvil.rpcUrl).readContract({ address: rig.usdc.address, abi: authorizationState, functionName: "authorizationState", args: [payer, nonce] })).toBe(false);

    // The block comes: the held ones settle, and the shed one, retried, settles.
    await rig.test.setAutomine(true);
    await rig.test.mine({ blocks: 1 });
    for (const a of await Promise.all(held)) expect(a.json, a.text).toMatchObject({ success: true });
    expect((await postJson(`${capped.url}/settle`, shed)).json).toMatchObject({ success: true });
    expect(await metricSum(f.adminUrl, "x402_http_requests_in_flight", { route: "/v2/settle" })).toBe(0);
    expect(await balanceOf(rig.anvil.rpcUrl, rig.usdc.address, rig.receiver)).toBe(70n);
    expect(await nonceOf(rig.anvil.rpcUrl, signer)).toBe(3);
    await capped.close();
  });

  it("the caps come from X402_MAX_VERIFY_IN_FLIGHT and X402_MAX_SETTLE_IN_FLIGHT, and a cap that is not a positive integer is refused by name", () => {
    expect(routerOptionsFrom({ "routing-table": "t.json" }, { X402_MAX_SETTLE_IN_FLIGHT: "7" }).maxInFlight).toEqual({ verify: 16_384, settle: 7 });
    expect(() => routerOptionsFrom({ "routing-table": "t.json" }, { X402_MAX_VERIFY_IN_FLIGHT: "0" })).toThrow("X402_MAX_VERIFY_IN_FLIGHT must be at least 1");
    expect(() => routerOptionsFrom({ "routing-table": "t.json" }, { X402_MAX_SETTLE_IN_FLIGHT: "many" })).toThrow(/X402_MAX_SETTLE_IN_FLIGHT must be a non-negative integer/);
    expect(facilitatorConfigFromEnv({ X402_MAX_VERIFY_IN_FLIGHT: "12", X402_MAX_SETTLE_IN_FLIGHT: "3" })).toMatchObject({ maxVerifyInFlight: 12, maxSettleInFlight: 3 });
  });
});
