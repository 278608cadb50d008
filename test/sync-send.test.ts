// eth_sendRawTransactionSync (EIP-7966): where the policy enables it and the node serves it, a
// settlement is sent and its receipt comes back in one round trip (no receipt polls); an endpoint
// that does not know the method, or refuses it, gets the plain send, and the settlement is the same on chain.
// Counted at an RPC proxy in front of a real anvil.
import { afterEach, describe, expect, it } from "vitest";
import type { Address, Hex } from "viem";
import { stopRig, startRig, type Rig } from "./helpers/settlement-rig.ts";
import { balanceOf } from "./helpers/chain.ts";
import { postJson } from "./helpers/payments.ts";
import { eventually, nonceOf, publicClient } from "./helpers/onchain.ts";
import { SYNC_SENDS_IN_FLIGHT } from "../services/facilitator/settlement/outbox-signer.ts";
import { callsDuring, startRpcFaultProxy, type RpcFaultProxy } from "./helpers/rpc-fault-proxy.ts";

let rig: Rig | undefined;
let proxy: RpcFaultProxy | undefined;
afterEach(() => stopRig(rig, proxy).finally(() => (rig = proxy = undefined)));

const callsOf = (p: RpcFaultProxy, fn: () => Promise<unknown>) => callsDuring(p, fn, 50);

describe("synchronous sends", () => {
  it("a settlement is sent and confirmed in one call, with no receipt polls; mined on chain", async () => {
    rig = await startRig();
    proxy = await startRpcFaultProxy({ upstream: rig.anvil.rpcUrl });
    const f = await rig.facilitator({ rpcUrls: [proxy.url], policy: { sendRawTransactionSync: true } });
    await postJson(`${f.url}/settle`, await rig.payment(1n)); // warms the per-second fee cache
    // Every receipt lookup fails from here on: a settlement that needed a receipt poll could not
    // answer success (the reconciler's background reorg watch may still ask, and retries later).
    proxy.configure({ rate: 1, kinds: ["http_503"], methods: ["eth_getTransactionReceipt"] });
    let answer: Record<string, unknown> = {};
    const calls = await callsOf(proxy, async () => (answer = (await postJson(`${f.url}/settle`, await rig!.payment(250n))).json));
    expect(answer, JSON.stringify(answer)).toMatchObject({ success: true });
    expect(calls.eth_sendRawTransactionSync).toBe(1);
    expect(calls.eth_sendRawTransaction ?? 0).toBe(0);
    const receipt = await publicClient(rig.anvil.rpcUrl).getTransactionReceipt({ hash: answer.transaction as Hex });
    expect(receipt.status).toBe("success");
    expect(await balanceOf(rig.anvil.rpcUrl, rig.usdc.address, rig.receiver)).toBe(251n);
  });

  it("an endpoint without the method gets the plain send (asked once), and the payment settles the same", async () => {
    rig = await startRig();
    proxy = await startRpcFaultProxy({ upstream: rig.anvil.rpcUrl });
    // The proxy answers the method with a JSON-RPC error, as a node that does not know it would.
    proxy.configure({ schedule: { eth_sendRawTransactionSync: ["method_not_found"] } });
    const f = await rig.facilitator({ rpcUrls: [proxy.url], policy: { sendRawTransactionSync: true } });
    const answers: Record<string, unknown>[] = [];
    const calls = await callsOf(proxy, async () => {
      for (const amount of [3n, 4n]) answers.push((await postJson(`${f.url}/settle`, await rig!.payment(amount))).json);
    });
    for (const a of answers) expect(a).toMatchObject({ success: true });
    expect(calls.eth_sendRawTransactionSync).toBe(1);
    expect(calls.eth_sendRawTransaction).toBe(2);
    expect(await balanceOf(rig.anvil.rpcUrl, rig.usdc.address, rig.receiver)).toBe(7n);
  });

  it("a burst holds at most SYNC_SENDS_IN_FLIGHT connections in synchronous sends; the rest are sent the plain way, and every payment is mined", async () => {
    rig = await startRig();
    proxy = await startRpcFaultProxy({ upstream: rig.anvil.rpcUrl });
    const f = await rig.facilitator({ rpcUrls: [proxy.url], policy: { sendRawTransactionSync: true } });
    const signer = f.signers[0] as Address;
    expect((await postJson(`${f.url}/settle`, await rig.payment(1n))).json).toMatchObject({ success: true }); // warm caches
    const extra = 6;
    const bodies = await Promise.all(Array.from({ length: SYNC_SENDS_IN_FLIGHT + extra }, () => rig!.payment(10n)));
    const nonce = await nonceOf(rig.anvil.rpcUrl, signer);
    // No block until every transaction is out: each synchronous send is held by the node meanwhile.
    await rig.test.setAutomine(false);
    const before = { ...proxy.calls };
    const sent = (method: string) => (proxy!.calls[method] ?? 0) - (before[method] ?? 0);
    const answers = Promise.all(bodies.map(async (b) => (await postJson(`${f.url}/settle`, b)).json));
    await eventually(async () => (sent("eth_sendRawTransactionSync") + sent("eth_sendRawTransaction") >= bodies.length ? true : undefined), 400, 50);
    expect(sent("eth_sendRawTransactionSync")).toBe(SYNC_SENDS_IN_FLIGHT);
    expect(sent("eth_sendRawTransaction")).toBe(extra);
    await rig.test.mine({ blocks: 1 });
    await rig.test.setAutomine(true);
    for (const a of await answers) expect(a, JSON.stringify(a)).toMatchObject({ success: true });
    expect(await nonceOf(rig.anvil.rpcUrl, signer)).toBe(nonce + bodies.length);
    expect(await balanceOf(rig.anvil.rpcUrl, rig.usdc.address, rig.receiver)).toBe(1n + 10n * BigInt(bodies.length));
  });

  it("a provider that refuses the method in its own words (not -32601): the same transaction goes the plain way and settles; the method is not asked again", async () => {
    rig = await startRig();
    proxy = await startRpcFaultProxy({ upstream: rig.anvil.rpcUrl });
    proxy.configure({ schedule: { eth_sendRawTransactionSync: ["method_disallowed"] } });
    const f = await rig.facilitator({ rpcUrls: [proxy.url], policy: { sendRawTransactionSync: true } });
    const signer = f.signers[0] as Address;
    const nonce = await nonceOf(rig.anvil.rpcUrl, signer);
    const answers: Record<string, unknown>[] = [];
    const calls = await callsOf(proxy, async () => {
      for (const amount of [5n, 6n]) answers.push((await postJson(`${f.url}/settle`, await rig!.payment(amount))).json);
    });
    for (const a of answers) expect(a).toMatchObject({ success: true });
    expect(calls.eth_sendRawTransactionSync).toBe(1);
    expect(calls.eth_sendRawTransaction).toBe(2);
    expect(await nonceOf(rig.anvil.rpcUrl, signer)).toBe(nonce + 2);
    expect(await balanceOf(rig.anvil.rpcUrl, rig.usdc.address, rig.receiver)).toBe(11n);
  });

  it("off by default: the plain send and a receipt poll", async () => {
    rig = await startRig();
    proxy = await startRpcFaultProxy({ upstream: rig.anvil.rpcUrl });
    const f = await rig.facilitator({ rpcUrls: [proxy.url] });
    let answer: Record<string, unknown> = {};
    const calls = await callsOf(proxy, async () => (answer = (await postJson(`${f.url}/settle`, await rig!.payment(9n))).json));
    expect(answer).toMatchObject({ success: true });
    expect(calls.eth_sendRawTransactionSync ?? 0).toBe(0);
    expect(calls.eth_sendRawTransaction).toBe(1);
    expect(calls.eth_getTransactionReceipt).toBeGreaterThanOrEqual(1);
  });
});
