// Waiting costs little: every waiter on one pending payment in a process shares one receipt
// poller with a budget, so N concurrent /settle calls of one payment while blocks are not mined
// cost O(1) eth_getTransactionReceipt calls, not O(N). Counted by the chain client's RPC metric.
import { afterEach, describe, expect, it } from "vitest";
import { ENGINES, startRig, type Rig } from "./helpers/settlement-rig.ts";
import { balanceOf } from "./helpers/chain.ts";
import { postJson } from "./helpers/payments.ts";
import { eventually, metricSum, publicClient, rpc } from "./helpers/onchain.ts";

let rig: Rig | undefined;
afterEach(async () => {
  await rig?.stop();
  rig = undefined;
});

const receiptCalls = (adminUrl: string) => metricSum(adminUrl, "x402_rpc_calls_total", { method: "eth_getTransactionReceipt" });
const lookups = (adminUrl: string) => metricSum(adminUrl, "x402_rpc_calls_total", { method: "eth_getTransactionByHash" });

describe.each(ENGINES)("shared receipt waits (%s store)", (engine) => {
  it("50 concurrent settles of one unmined payment: receipt calls stay within one wait's budget", async () => {
    rig = await startRig({ engine });
    const budget = 10;
    const f = await rig.facilitator({ receiptTimeoutMs: 2000, receiptPollBudget: budget });
    await rig.test.setAutomine(false);
    const body = await rig.payment(99n);
    const before = await receiptCalls(f.adminUrl);
    // Careful clients: a waiter whose bound ended before the claim holder stored its transaction (a
    // loaded machine) hears 503 "another request is settling this payment" and asks again.
    let retried = false;
    const careful = async () => {
      for (let attempt = 0; ; attempt++) {
        const a = await postJson(`${f.url}/settle`, body);
        if (a.status !== 503 || attempt >= 3) return a;
        retried = true;
      }
    };
    const answers = await Promise.all(Array.from({ length: 50 }, careful));
    const calls = (await receiptCalls(f.adminUrl)) - before;
    expect(new Set(answers.map((a) => a.json.errorReason))).toEqual(new Set(["settlement_pending"]));
    expect(new Set(answers.map((a) => a.json.transaction)).size).toBe(1);
    // One shared wait (at most `budget` calls; a second one for callers who came back after a 503)
    // plus the reconciler's one lookup per second of the ~2 s window. Unshared (each waiter polling
    // on its own) this measured 65 calls, shared 12.
    expect(calls).toBeLessThanOrEqual(budget * (retried ? 2 : 1) + 6);
    await rig.test.mine({ blocks: 1 });
    await rig.test.setAutomine(true);
    let final: Record<string, unknown> | undefined;
    for (let i = 0; i < 50 && !final?.success; i++) final = (await postJson(`${f.url}/settle`, body)).json;
    expect(final).toMatchObject({ success: true, transaction: answers[0]!.json.transaction });
    expect(await balanceOf(rig.anvil.rpcUrl, rig.usdc.address, rig.receiver)).toBe(99n);
  });

  it("the reconciler leaves a transaction to the receipt wait watching it, and takes it over when the wait ends", async () => {
    rig = await startRig({ engine });
    const f = await rig.facilitator({ receiptTimeoutMs: 4500 });
    await rig.test.setAutomine(false);
    const answer = postJson(`${f.url}/settle`, await rig.payment(42n));
    await eventually(async () => ((await rig!.test.getTxpoolStatus()).pending === 1 ? true : undefined), 200, 25);
    // While the wait runs, passes make no lookup of their own (the node's copy, the receipt).
    const before = await lookups(f.adminUrl);
    await f.reconciler.pass();
    expect((await lookups(f.adminUrl)) - before).toBe(0);
    expect((await answer).json).toMatchObject({ success: false, errorReason: "settlement_pending" });
    // The wait gave up: the reconciler checks the node still has it.
    await f.reconciler.pass();
    expect((await lookups(f.adminUrl)) - before).toBeGreaterThanOrEqual(1);
    await rig.test.mine({ blocks: 1 });
    await rig.test.setAutomine(true);
    await f.reconciler.pass();
    expect(await balanceOf(rig.anvil.rpcUrl, rig.usdc.address, rig.receiver)).toBe(42n);
  });

  it("payments waiting for the next block share the head reads: a receipt lookup when sent and one when their block comes, not a poll each", async () => {
    rig = await startRig({ engine });
    const f = await rig.facilitator({ receiptTimeoutMs: 20_000 });
    const bodies = await Promise.all(Array.from({ length: 10 }, (_, i) => rig!.payment(BigInt(i + 1))));
    await rig.test.setAutomine(false);
    const before = await receiptCalls(f.adminUrl);
    const answers = Promise.all(bodies.map(async (b) => (await postJson(`${f.url}/settle`, b)).json));
    await eventually(async () => ((await rig!.test.getTxpoolStatus()).pending === bodies.length ? true : undefined), 400, 25);
    await new Promise((r) => setTimeout(r, 2000)); // a block time: polling on their own, ten waits would ask ~5 times each
    await rig.test.mine({ blocks: 1 });
    await rig.test.setAutomine(true);
    for (const a of await answers) expect(a).toMatchObject({ success: true });
    const calls = (await receiptCalls(f.adminUrl)) - before;
    expect(calls).toBeGreaterThanOrEqual(bodies.length);
    expect(calls).toBeLessThanOrEqual(bodies.length * 2 + 4);
    expect(await balanceOf(rig.anvil.rpcUrl, rig.usdc.address, rig.receiver)).toBe(55n);
  });

  it("on a chain that keeps a block schedule, a payment's wait makes one receipt lookup, when a followed block holds it (none right after the send)", async () => {
    rig = await startRig({ engine });
    const f = await rig.facilitator({ receiptTimeoutMs: 20_000, policy: { minBlockIntervalMs: 2000 } });
    const bodies = await Promise.all(Array.from({ length: 10 }, (_, i) => rig!.payment(BigInt(i + 1))));
    await rig.test.setAutomine(false);
    const before = await receiptCalls(f.adminUrl);
    const answers = Promise.all(bodies.map(async (b) => (await postJson(`${f.url}/settle`, b)).json));
    await eventually(async () => ((await rig!.test.getTxpoolStatus()).pending === bodies.length ? true : undefined), 400, 25);
    await new Promise((r) => setTimeout(r, 1000));
    await rig.test.mine({ blocks: 1 });
    await rig.test.setAutomine(true);
    for (const a of await answers) expect(a).toMatchObject({ success: true });
    const calls = (await receiptCalls(f.adminUrl)) - before;
    expect(calls).toBeGreaterThanOrEqual(bodies.length);
    expect(calls).toBeLessThanOrEqual(bodies.length + 4); // two per payment without the announcement
    expect(await balanceOf(rig.anvil.rpcUrl, rig.usdc.address, rig.receiver)).toBe(55n);
  });

  it("a backlog in the node's pool: one pending-nonce read per pass, not a lookup per transaction; behind the key's lowest, nothing priced at the market is replaced; a gap of several lost transactions is filled with the stored bytes", async () => {
    rig = await startRig({ engine });
    // Due a replacement after 1 s, and checked against the pool after 5 s: both happen while the backlog waits.
    const f = await rig.facilitator({ receiptTimeoutMs: 60_000, replaceAfterMs: 1000 });
    await rig.test.setAutomine(false);
    const n = 10;
    const bodies = [];
    for (let i = 1; i <= n; i++) bodies.push(await rig.payment(BigInt(i)));
    const answers = bodies.map((b) => postJson(`${f.url}/settle`, b));
    // The node's pool, ready and queued behind a gap alike: nonce → hash.
    const pooled = async () => {
      const pool = await rig!.test.getTxpoolContent();
      return Object.fromEntries([...Object.values(pool.pending), ...Object.values(pool.queued)].flatMap((byNonce) => Object.entries(byNonce).map(([nonce, t]) => [nonce, t.hash])));
    };
    await eventually(async () => (Object.keys(await pooled()).length === n ? true : undefined), 400, 25);
    const sent = await pooled();
    // Only the lowest (nonce 0, the one the rest wait on) may be replaced on the bump schedule.
    const behind = (pool: Record<string, string>) => Object.fromEntries(Object.entries(pool).filter(([nonce]) => nonce !== "0"));
    // The node loses the transaction at nonce 3, and anvil drops every later one of the key with it:
    // seven lost in a row, as a node restart or a balancer's other backend would lose them.
    await rpc(rig.anvil.rpcUrl, "anvil_dropTransaction", [sent["3"]]);
    expect(Object.keys(await pooled()).sort()).toEqual(["0", "1", "2"]);
    const counts0 = await metricSum(f.adminUrl, "x402_rpc_calls_total", { method: "eth_getTransactionCount" });
    // Passes run once a second; the gap is found once the transactions are 5 s old, and filled.
    await eventually(async () => (Object.keys(await pooled()).length === n ? true : undefined), 200, 100);
    expect(behind(await pooled())).toEqual(behind(sent)); // the very bytes stored: same hashes, nothing re-signed
    await new Promise((r) => setTimeout(r, 2500)); // more passes over the backlog, each past its replacement time
    expect(behind(await pooled())).toEqual(behind(sent));
    // One read per pass for the key, not one per transaction (10 here): a bound that holds at any machine speed.
    const passes = (await metricSum(f.adminUrl, "x402_rpc_calls_total", { method: "eth_getTransactionCount" })) - counts0;
    expect(passes).toBeGreaterThan(0);
    expect(passes).toBeLessThan(20);
    await rig.test.mine({ blocks: 1 });
    await rig.test.setAutomine(true);
    const results = await Promise.all(answers);
    for (const r of results) expect(r.json, r.text).toMatchObject({ success: true });
    const minedUnder = new Set(results.map((r) => r.json.transaction));
    for (const hash of Object.values(behind(sent))) expect(minedUnder.has(hash)).toBe(true);
    expect(await balanceOf(rig.anvil.rpcUrl, rig.usdc.address, rig.receiver)).toBe(BigInt((n * (n + 1)) / 2));
  });

  it("a receipt wait follows a fee replacement sent from its process: the request that sent the payment answers with the replacement's hash once it mines, well before its bound", async () => {
    rig = await startRig({ engine });
    const f = await rig.facilitator({ receiptTimeoutMs: 40_000, replaceAfterMs: 300 });
    await rig.test.setAutomine(false);
    const started = Date.now();
    const answer = postJson(`${f.url}/settle`, await rig.payment(23n));
    const pooled = async () => { const p = await rig!.test.getTxpoolContent(); return [...Object.values(p.pending), ...Object.values(p.queued)].flatMap((byNonce) => Object.values(byNonce).map((t) => t.hash)); };
    const [first] = await eventually(async () => ((await pooled()).length === 1 ? await pooled() : undefined), 400, 25);
    // Blocks priced above the first attempt: only a replacement (same nonce, higher fees) can be
    // included, and once one is, the pool is empty.
    await eventually(async () => {
      await rig!.test.setNextBlockBaseFeePerGas({ baseFeePerGas: 1000n * 10n ** 9n });
      await rig!.test.mine({ blocks: 1 });
      return (await pooled()).length === 0 ? true : undefined;
    }, 100, 100);
    await rig.test.setAutomine(true);
    const r = await answer;
    expect(r.json, r.text).toMatchObject({ success: true });
    const mined = r.json.transaction as `0x${string}`;
    expect(mined).not.toBe(first);
    const receipt = await publicClient(rig.anvil.rpcUrl).getTransactionReceipt({ hash: mined });
    expect(receipt.status).toBe("success");
    // Answered by the wait itself, not from the record once the wait's 40 s bound ran out.
    expect(Date.now() - started).toBeLessThan(25_000);
    expect(await balanceOf(rig.anvil.rpcUrl, rig.usdc.address, rig.receiver)).toBe(23n);
  });

  it("a transaction left to its receipt wait that the node lost is sent again while the wait still runs", async () => {
    rig = await startRig({ engine });
    const f = await rig.facilitator({ receiptTimeoutMs: 30_000 });
    await rig.test.setAutomine(false);
    const answer = postJson(`${f.url}/settle`, await rig.payment(17n));
    await eventually(async () => ((await rig!.test.getTxpoolStatus()).pending === 1 ? true : undefined), 400, 25);
    const [hash] = Object.values((await rig.test.getTxpoolContent()).pending).flatMap((byNonce) => Object.values(byNonce).map((t) => t.hash));
    await rpc(rig.anvil.rpcUrl, "anvil_dropTransaction", [hash]);
    expect((await rig.test.getTxpoolStatus()).pending).toBe(0);
    // The reconciler's own passes put it back (the same bytes) well before the wait's bound.
    await eventually(async () => ((await rig!.test.getTxpoolStatus()).pending === 1 ? true : undefined), 200, 100);
    await rig.test.mine({ blocks: 1 });
    await rig.test.setAutomine(true);
    expect((await answer).json).toMatchObject({ success: true, transaction: hash });
    expect(await balanceOf(rig.anvil.rpcUrl, rig.usdc.address, rig.receiver)).toBe(17n);
  });
});
