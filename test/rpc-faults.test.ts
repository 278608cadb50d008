// Trust under a failing RPC provider: a fault proxy in front of anvil injects every provider
// fault into every method the facilitator uses. The process never sees an unhandled rejection,
// no answer is a 500, and, judged on chain against anvil directly, every payment is settled
// exactly once or refused with its authorization unused.
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { writeFile } from "node:fs/promises";
import { join } from "node:path";
import { pino } from "pino";
import { createPublicClient, erc20Abi, http, parseEventLogs, type Address, type Hex, type PublicClient } from "viem";
import { privateKeyToAccount } from "viem/accounts";
import { eip3009ABI, resetAssetContractCache } from "@x402/evm";
import { startRig, stopRig, type Rig } from "./helpers/settlement-rig.ts";
import { balanceOf } from "./helpers/chain.ts";
import { postJson, serviceShape, signEip3009, signPermit2, standardShape, type PaymentSpec } from "./helpers/payments.ts";
import { FAULT_KINDS, startRpcFaultProxy, type RpcFaultProxy } from "./helpers/rpc-fault-proxy.ts";
import type { RunningFacilitator } from "../services/facilitator/service.ts";
import { startRouterService, type RunningRouter } from "../services/router/service.ts";
import { PERMIT2_ADDRESS } from "../services/x402/networks.ts";

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

  it("the proxy faults a JSON-RPC batch call by call: an error object for the scheduled method, the node's answer for the rest", async () => {
    proxy.configure({ schedule: { eth_blockNumber: ["rpc_error"] } });
    const r = await postJson(proxy.url, [
      { jsonrpc: "2.0", id: 1, method: "eth_chainId", params: [] },
      { jsonrpc: "2.0", id: 2, method: "eth_blockNumber", params: [] },
    ]);
    expect(r.json).toEqual([
      { jsonrpc: "2.0", id: 1, result: `0x${rig.chainId.toString(16)}` },
      { jsonrpc: "2.0", id: 2, error: { code: expect.any(Number), message: expect.any(String) } },
    ]);
    proxy.configure({ schedule: { eth_blockNumber: ["http_503"] } });
    expect((await postJson(proxy.url, [{ jsonrpc: "2.0", id: 1, method: "eth_chainId", params: [] }, { jsonrpc: "2.0", id: 2, method: "eth_blockNumber", params: [] }])).status).toBe(503);
  });

  it("EIP-3009, a valid payment (fast path): 429 to every eth_call → a 503, not a failed simulation", async () => {
    // The fast path passes its RPC watch by hand: the simulation's and the diagnosis's failures must
    // reach it. (After the tests that need uncached account code: this one caches the payer's.)
    proxy.configure({ rate: 1, kinds: ["http_429"], methods: ["eth_call"] });
    const r = await postJson(`${facilitator.url}/verify`, serviceShape(spec(), await signEip3009(spec())));
    await proxy.idle(1000);
    expect(proxy.injectedByMethod.eth_call?.http_429).toBeGreaterThan(0);
    expect(unhandled).toEqual([]);
    expect(r.status).toBe(503);
  });

  it("healed: the same bad payment gets its verdict", async () => {
    const r = await postJson(`${facilitator.url}/verify`, serviceShape(spec(), await signEip3009({ ...spec(), signature: badSignature as `0x${string}` })));
    expect(r.status).toBe(200);
    expect(r.json).toMatchObject({ isValid: false, invalidReason: "invalid_exact_evm_signature" });
  });
});

describe("a simulation the provider could not judge is no verdict (issue 32, 7a)", () => {
  let rig: Rig;
  let proxy: RpcFaultProxy;
  beforeAll(async () => {
    rig = await startRig();
    proxy = await startRpcFaultProxy({ upstream: rig.anvil.rpcUrl });
  });
  afterAll(() => stopRig(rig, proxy));
  afterEach(() => proxy.configure({}));

  const spec = (): PaymentSpec => ({ network: rig.network, chainId: rig.chainId, asset: rig.usdc, payerKey: rig.payerKey, payTo: rig.receiver, amount: 1000n });
  const chain = () => createPublicClient({ transport: http(rig.anvil.rpcUrl) });
  /** What the signer sent and the payee received, read from anvil directly. */
  const onChain = async () => ({
    nonce: await chain().getTransactionCount({ address: privateKeyToAccount(rig.signerKeys[0]!).address, blockTag: "pending" }),
    received: await balanceOf(rig.anvil.rpcUrl, rig.usdc.address, rig.receiver),
  });

  it("a fresh facilitator on anvil whose head is behind the clock (an idle automining node): 503, not a failed simulation; the payment settles", async () => {
    const facilitator = await rig.facilitator();
    // Valid by our clock, not yet at the head's timestamp: what every payment looks like once an
    // automining node has been idle longer than the client's validAfter margin.
    const validAfter = (await chain().getBlock()).timestamp;
    const before = await onChain();
    const eip3009 = serviceShape(spec(), await signEip3009({ ...spec(), auth: { validAfter } }));
    const r = await postJson(`${facilitator.url}/verify`, eip3009);
    expect(r.status, r.text).toBe(503);
    expect(r.json).toEqual({ error: expect.stringMatching(/^backend_unavailable: /) });
    expect(await onChain()).toEqual(before);
    // Not a bad payment: settled, it is mined in a later block and pays the payee.
    expect((await postJson(`${facilitator.url}/settle`, eip3009)).json).toMatchObject({ success: true });
    expect((await onChain()).received).toBe(before.received + 1000n);
  });

  /**
   * The node executes the send (automine) but its answer is lost; the retry is told the nonce is
   * used; every lookup of our hash answers `lookup` (fails, or `null` as a lagging node would).
   * Taking that for "not ours" would send the same transfer again on the next nonce: executed twice,
   * the second reverting, the payment told failed. Whatever the first answer (success, or pending),
   * the payment settles once: paid once, one transaction.
   */
  async function settlesOnceAfterLostSend(lookup: "http_503" | "null_result") {
    const facilitator = await rig.facilitator({ rpcUrls: [proxy.url] });
    const before = await onChain();
    proxy.configure({ schedule: { eth_sendRawTransaction: ["drop", "ok", "ok", "ok"], eth_getTransactionByHash: [lookup] } });
    const body = standardShape(spec(), await signEip3009(spec()));
    const r = await postJson(`${facilitator.url}/settle`, body);
    await proxy.idle(500);
    expect(proxy.injectedByMethod.eth_sendRawTransaction?.drop).toBeGreaterThan(0);
    expect(proxy.injectedByMethod.eth_getTransactionByHash?.[lookup]).toBeGreaterThan(0);
    proxy.configure({});
    let answer = r.json as { success?: boolean; errorReason?: string };
    for (let i = 0; i < 40 && !answer.success && (r.status !== 200 || answer.errorReason === "settlement_pending"); i++) {
      await new Promise((resolve) => setTimeout(resolve, 250));
      answer = (await postJson(`${facilitator.url}/settle`, body)).json as typeof answer;
    }
    expect(answer).toMatchObject({ success: true });
    const after = await onChain();
    expect(after.received - before.received).toBe(1000n);
    expect(after.nonce - before.nonce).toBe(1);
  }

  it("a send whose answer is lost and whose retry hears 'nonce too low', while lookups by hash fail: never sent again on another nonce (executed once, answered success)", () => settlesOnceAfterLostSend("http_503"));

  it("the same, with a lagging node answering 'not found' for our mined transaction: not taken for another's nonce (executed once, answered success)", () => settlesOnceAfterLostSend("null_result"));

  it("a provider without eth_call (method not found): 503, not eip3009_not_supported", async () => {
    const facilitator = await rig.facilitator({ rpcUrls: [proxy.url] });
    const before = await onChain();
    proxy.configure({ schedule: { eth_call: ["method_not_found"] } });
    const r = await postJson(`${facilitator.url}/verify`, serviceShape(spec(), await signEip3009(spec())));
    await proxy.idle(500);
    expect(proxy.injectedByMethod.eth_call?.method_not_found).toBeGreaterThan(0);
    expect(r.status, r.text).toBe(503);
    expect(await onChain()).toEqual(before);
  });
});

// Every JSON-RPC method the facilitator calls while verifying and settling exact payments.
const METHODS = [
  "eth_getCode", "eth_call", "eth_estimateGas", "eth_getTransactionCount", "eth_sendRawTransaction", "eth_getTransactionReceipt",
  "eth_getTransactionByHash", "eth_getBlockByNumber", "eth_maxPriorityFeePerGas", "eth_blockNumber", "eth_getBalance", "eth_chainId",
];

describe("a facilitator behind the router, its RPC injecting every fault into every method, under concurrent load", () => {
  let rig: Rig;
  let proxy: RpcFaultProxy;
  let facilitator: RunningFacilitator;
  let router: RunningRouter;
  beforeAll(async () => {
    rig = await startRig({ keys: 2 });
    proxy = await startRpcFaultProxy({ upstream: rig.anvil.rpcUrl, holdMs: 3000 });
    console.log(`rpc fault seed: ${proxy.seed} (RPC_FAULT_SEED=${proxy.seed} replays it)`);
    // Short bounds keep a timeout fault cheap; fee replacement is out of the picture.
    facilitator = await rig.facilitator({ rpcUrls: [proxy.url], rpcTimeoutMs: 1000, receiptTimeoutMs: 3000, replaceAfterMs: 600_000 });
    const table = join(rig.dir, "routing.json");
    const kinds = facilitator.facilitator.supported().kinds;
    await writeFile(table, JSON.stringify({ backends: [{ network: rig.network, url: facilitator.url, kinds, signers: facilitator.signers }] }));
    router = await startRouterService({ routingTablePath: table, host: "127.0.0.1", port: 0 }, pino({ level: "silent" }));
  });
  afterAll(async () => {
    await router?.close();
    await rig?.stop();
    await proxy?.close();
  });

  it("64 payments (EIP-3009, Permit2, forged): no 500, no unhandled rejection, each settled exactly once on chain or refused with its authorization unused", async () => {
    unhandled.length = 0;
    resetAssetContractCache();
    const chain = createPublicClient({ transport: http(rig.anvil.rpcUrl) }); // the truth, not through the proxy
    const signers = rig.signerKeys.map((k) => privateKeyToAccount(k).address);
    const payer = privateKeyToAccount(rig.payerKey).address;
    const nonceBefore = await Promise.all(signers.map((address) => chain.getTransactionCount({ address, blockTag: "latest" })));
    const balanceBefore = await balanceOf(rig.anvil.rpcUrl, rig.usdc.address, rig.receiver);

    type Payment = { kind: "eip3009" | "permit2" | "forged"; amount: bigint; body: unknown; nonce: Hex | bigint };
    const base = (amount: bigint): PaymentSpec => ({ network: rig.network, chainId: rig.chainId, asset: rig.usdc, payerKey: rig.payerKey, payTo: rig.receiver, amount });
    const payments: Payment[] = [];
    for (let i = 0; i < 64; i++) {
      const amount = BigInt(1000 + i);
      if (i % 8 === 7) {
        const signed = await signEip3009({ ...base(amount), signature: `0x${"11".repeat(32)}${"22".repeat(32)}1b` });
        payments.push({ kind: "forged", amount, body: serviceShape(base(amount), signed), nonce: signed.authorization.nonce });
      } else if (i % 4 === 1) {
        const signed = await signPermit2(base(amount));
        payments.push({ kind: "permit2", amount, body: standardShape(base(amount), signed), nonce: BigInt(signed.permit2Authorization.nonce) });
      } else {
        const signed = await signEip3009(base(amount));
        payments.push({ kind: "eip3009", amount, body: serviceShape(base(amount), signed), nonce: signed.authorization.nonce });
      }
    }

    // Every method: each fault kind in turn every fourth call, and the seeded draw on the others.
    const rotation = FAULT_KINDS.flatMap((k) => [k, "ok", "ok", "ok"] as const);
    proxy.configure({ rate: 0.1, schedule: Object.fromEntries(METHODS.map((m) => [m, rotation])) });

    const statuses = new Map<number, number>();
    const falseVerdicts: unknown[] = [];
    const answer = async (action: "verify" | "settle", p: Payment) => {
      const r = await postJson(`${router.url}/${action}`, p.body);
      statuses.set(r.status, (statuses.get(r.status) ?? 0) + 1);
      wellFormed(action, r);
      if (r.status === 200 && p.kind !== "forged" && (action === "verify" ? r.json.isValid !== true : r.json.success !== true && r.json.errorReason !== "settlement_pending")) falseVerdicts.push({ action, kind: p.kind, ...r.json });
      if (r.status === 200 && p.kind === "forged") expect(r.json).toMatchObject(action === "verify" ? { isValid: false } : { success: false, transaction: "" });
      return r;
    };
    const wellFormed = (action: string, r: Awaited<ReturnType<typeof postJson>>) => {
      expect([200, 503, 504], r.text).toContain(r.status);
      if (r.status !== 200) return expect(r.json).toEqual({ error: expect.stringMatching(/^backend_(unavailable|timeout): /) });
      if (action === "verify") {
        expect(typeof r.json.isValid).toBe("boolean");
        if (!r.json.isValid) expect(typeof r.json.invalidReason).toBe("string");
        return;
      }
      expect(r.json).toMatchObject({ success: expect.any(Boolean), transaction: expect.any(String), network: rig.network });
      if (r.json.success || r.json.errorReason === "settlement_pending") expect(r.json.transaction).toMatch(/^0x[0-9a-f]{64}$/);
      else expect(r.json.errorReason).toEqual(expect.any(String));
    };

    // Under faults: every payment verified, then settled, all at once.
    await Promise.all(payments.map(async (p) => {
      await answer("verify", p);
      await answer("settle", p);
    }));
    const faults = { ...proxy.injected };
    const steps = { ...proxy.scheduled }; // (healing below starts the schedules afresh)
    if (falseVerdicts.length) console.log(JSON.stringify(falseVerdicts));

    // Healed: /settle again until each payment has a final answer.
    proxy.configure({});
    const finals = await Promise.all(payments.map(async (p) => {
      for (let attempt = 0; ; attempt++) {
        const r = await answer("settle", p);
        if (r.status === 200 && r.json.errorReason !== "settlement_pending") return r.json;
        if (attempt > 60) throw new Error(`no final answer: ${r.text}`);
        await new Promise((resolve) => setTimeout(resolve, 250));
      }
    }));

    // On chain, read from anvil directly.
    const settled = payments.filter((_, i) => finals[i]!.success === true);
    for (const [i, p] of payments.entries()) {
      const final = finals[i]!;
      if (final.success) {
        expect(p.kind).not.toBe("forged");
        const receipt = await chain.getTransactionReceipt({ hash: final.transaction as Hex });
        expect(receipt.status).toBe("success");
        const transfers = parseEventLogs({ abi: erc20Abi, eventName: "Transfer", logs: receipt.logs }).filter((l) => l.address.toLowerCase() === rig.usdc.address.toLowerCase());
        expect(transfers.map((t) => t.args)).toContainEqual({ from: payer, to: rig.receiver, value: p.amount });
      } else {
        expect(await authorizationUsed(chain, rig.usdc.address, payer, p)).toBe(false);
      }
    }
    // Exactly once: distinct transactions, and the payee got exactly the sum of the successes.
    expect(new Set(settled.map((_, i) => finals[payments.indexOf(settled[i]!)]!.transaction)).size).toBe(settled.length);
    expect((await balanceOf(rig.anvil.rpcUrl, rig.usdc.address, rig.receiver)) - balanceBefore).toBe(settled.reduce((sum, p) => sum + p.amount, 0n));
    // Every valid payment settles once the provider heals; the forged ones never do.
    expect(settled.length).toBe(payments.filter((p) => p.kind !== "forged").length);

    // Nothing sent beyond the settlements (and a bounded number of nonce fillers), nothing left pending.
    await proxy.idle(500);
    const sent = (await Promise.all(signers.map((address) => chain.getTransactionCount({ address, blockTag: "latest" })))).reduce((a, n, i) => a + n - nonceBefore[i]!, 0);
    const pending = (await Promise.all(signers.map((address) => chain.getTransactionCount({ address, blockTag: "pending" })))).reduce((a, n, i) => a + n - nonceBefore[i]!, 0);
    console.log(JSON.stringify({ faults, onSend: proxy.injectedByMethod.eth_sendRawTransaction, calls: proxy.calls, statuses: Object.fromEntries(statuses), settled: settled.length, refused: payments.length - settled.length, transactions: sent, falseVerdicts: falseVerdicts.length }));
    expect(sent).toBeGreaterThanOrEqual(settled.length);
    expect(sent - settled.length).toBeLessThanOrEqual(4);
    expect(pending).toBe(sent);

    // The faults really happened: every kind, and every kind on the methods called often enough to cycle through them all.
    for (const kind of FAULT_KINDS) expect(faults[kind], kind).toBeGreaterThan(0);
    // (A method's schedule moves on by its calls, except a fault deferred behind another call's in one batch.)
    const cycled = METHODS.filter((m) => (steps[m] ?? 0) >= rotation.length);
    // The check below covers at least the simulations: an eth_call, or an eth_estimateGas where the
    // head was provable and the simulation pinned to it (which of the two depends on timing).
    expect(cycled.filter((m) => m === "eth_call" || m === "eth_estimateGas"), JSON.stringify(steps)).not.toEqual([]);
    for (const m of cycled) {
      for (const kind of FAULT_KINDS) expect(proxy.injectedByMethod[m]?.[kind], `${kind} on ${m}`).toBeGreaterThan(0);
    }
    expect(statuses.get(500)).toBeUndefined();
    expect(falseVerdicts).toEqual([]);
    expect(unhandled).toEqual([]);
  });
});

const PERMIT2_NONCE_BITMAP = [{ type: "function", name: "nonceBitmap", stateMutability: "view", inputs: [{ type: "address" }, { type: "uint256" }], outputs: [{ type: "uint256" }] }] as const;

/** Whether the payment's authorization was consumed on chain (EIP-3009 authorizationState, Permit2 nonce bitmap). */
async function authorizationUsed(chain: PublicClient, asset: Address, payer: Address, p: { kind: string; nonce: Hex | bigint }): Promise<boolean> {
  if (p.kind === "permit2") {
    const nonce = p.nonce as bigint;
    const word = await chain.readContract({ address: PERMIT2_ADDRESS, abi: PERMIT2_NONCE_BITMAP, functionName: "nonceBitmap", args: [payer, nonce >> 8n] });
    return ((word >> (nonce & 0xffn)) & 1n) === 1n;
  }
  return chain.readContract({ address: asset, abi: eip3009ABI, functionName: "authorizationState", args: [payer, p.nonce as Hex] }) as Promise<boolean>;
}
