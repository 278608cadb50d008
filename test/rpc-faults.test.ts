// Trust under a failing RPC provider: a fault proxy in front of anvil injects every provider
// fault into every method the facilitator uses. The process never sees an unhandled rejection,
// no answer is a 500, and, judged on chain against anvil directly, every payment is settled
// exactly once or refused with its authorization unused.
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { resetAssetContractCache } from "@x402/evm";
import { startRig, type Rig } from "./helpers/settlement-rig.ts";
import { postJson, serviceShape, signEip3009, signPermit2, standardShape, type PaymentSpec } from "./helpers/payments.ts";
import { startRpcFaultProxy, type RpcFaultProxy } from "./helpers/rpc-fault-proxy.ts";
import type { RunningFacilitator } from "../services/facilitator/service.ts";

const unhandled: unknown[] = [];
const onUnhandled = (reason: unknown) => unhandled.push(reason);
beforeAll(() => void process.on("unhandledRejection", onUnhandled));
afterAll(() => void process.off("unhandledRejection", onUnhandled));

describe("the asset-code check under a rate-limited RPC (the crash of issue 13)", () => {
  let rig: Rig;
  let proxy: RpcFaultProxy;
  let facilitator: RunningFacilitator;
  beforeAll(async () => {
    rig = await startRig();
    proxy = await startRpcFaultProxy({ upstream: rig.anvil.rpcUrl });
    console.log(`rpc fault seed: ${proxy.seed} (RPC_FAULT_SEED=${proxy.seed} replays it)`);
    facilitator = await rig.facilitator({ rpcUrls: [proxy.url] });
  });
  afterAll(async () => {
    await rig?.stop();
    await proxy?.close();
  });
  beforeEach(() => {
    // Nothing cached from earlier requests: the check must go to the RPC.
    resetAssetContractCache();
    unhandled.length = 0;
  });
  afterEach(() => proxy.configure({}));

  const spec = (): PaymentSpec => ({ network: rig.network, chainId: rig.chainId, asset: rig.usdc, payerKey: rig.payerKey, payTo: rig.receiver, amount: 1000n });
  const badSignature = "0x" + "11".repeat(32) + "22".repeat(32) + "1b";

  it.each([
    ["EIP-3009, a 65-byte bad signature (fast path)", async () => serviceShape(spec(), await signEip3009({ ...spec(), signature: badSignature as `0x${string}` }))],
    ["EIP-3009, a 66-byte bad signature (reference mechanism)", async () => serviceShape(spec(), await signEip3009({ ...spec(), signature: `${badSignature}00` as `0x${string}` }))],
    ["Permit2, a bad signature (reference mechanism)", async () => standardShape(spec(), await signPermit2({ ...spec(), signature: badSignature as `0x${string}` }))],
  ])("%s: 429 to every eth_getCode and eth_call → a 503, no unhandled rejection", async (_name, body) => {
    proxy.configure({ rate: 1, kinds: ["http_429"], methods: ["eth_getCode", "eth_call"] });
    const before = proxy.injected.http_429;
    const r = await postJson(`${facilitator.url}/verify`, await body());
    // Every call the check or the mechanism started has been answered (the transport's retry included).
    await proxy.idle(1000);
    expect(proxy.injected.http_429).toBeGreaterThan(before);
    expect(unhandled).toEqual([]);
    expect(r.status).toBe(503);
    expect(r.json).toEqual({ error: expect.stringMatching(/^backend_unavailable: the RPC of eip155:8453 \(127\.0\.0\.1:\d+\) did not answer/) });
  });

  it("the reference mechanism's own asset check is served from the facilitator's read: a 429 on the mechanism's eth_getCode calls leaks nothing", async () => {
    // The facilitator's own read of the asset passes; every later eth_getCode is refused.
    proxy.configure({ schedule: { eth_getCode: ["ok", ...Array<"http_429">(50).fill("http_429")] } });
    const r = await postJson(`${facilitator.url}/verify`, serviceShape(spec(), await signEip3009({ ...spec(), signature: `${badSignature}00` as `0x${string}` })));
    await proxy.idle(1000);
    expect(proxy.injectedByMethod.eth_getCode?.http_429).toBeGreaterThan(0);
    expect(unhandled).toEqual([]);
    expect(r.status).toBe(503);
  });

  it("healed: the same bad payment gets its verdict", async () => {
    const r = await postJson(`${facilitator.url}/verify`, serviceShape(spec(), await signEip3009({ ...spec(), signature: badSignature as `0x${string}` })));
    expect(r.status).toBe(200);
    expect(r.json).toMatchObject({ isValid: false, invalidReason: "invalid_exact_evm_signature" });
  });
});
