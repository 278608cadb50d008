// Waiting costs little: every waiter on one pending payment in a process shares one receipt
// poller with a budget, so N concurrent /settle calls of one payment while blocks are not mined
// cost O(1) eth_getTransactionReceipt calls, not O(N). Counted by the chain client's RPC metric.
import { afterEach, describe, expect, it } from "vitest";
import { ENGINES, startRig, type Rig } from "./helpers/settlement-rig.ts";
import { balanceOf } from "./helpers/chain.ts";
import { postJson } from "./helpers/payments.ts";
import { metricSum } from "./helpers/onchain.ts";

let rig: Rig | undefined;
afterEach(async () => {
  await rig?.stop();
  rig = undefined;
});

const receiptCalls = (adminUrl: string) => metricSum(adminUrl, "x402_rpc_requests_total", { method: "eth_getTransactionReceipt" });

describe.each(ENGINES)("shared receipt waits (%s store)", (engine) => {
  it("50 concurrent settles of one unmined payment: receipt calls stay within one wait's budget", async () => {
    rig = await startRig({ engine });
    const budget = 10;
    const f = await rig.facilitator({ receiptTimeoutMs: 2000, receiptPollBudget: budget });
    await rig.test.setAutomine(false);
    const body = await rig.payment(99n);
    const before = await receiptCalls(f.adminUrl);
    const answers = await Promise.all(Array.from({ length: 50 }, () => postJson(`${f.url}/settle`, body)));
    const calls = (await receiptCalls(f.adminUrl)) - before;
    expect(new Set(answers.map((a) => a.json.errorReason))).toEqual(new Set(["settlement_pending"]));
    expect(new Set(answers.map((a) => a.json.transaction)).size).toBe(1);
    // One shared wait (at most `budget` calls) plus the reconciler's one lookup per second of the
    // ~2 s window. Unshared (each waiter polling on its own) this measured 65 calls, shared 12.
    expect(calls).toBeLessThanOrEqual(budget + 6);
    await rig.test.mine({ blocks: 1 });
    await rig.test.setAutomine(true);
    let final: Record<string, unknown> | undefined;
    for (let i = 0; i < 50 && !final?.success; i++) final = (await postJson(`${f.url}/settle`, body)).json;
    expect(final).toMatchObject({ success: true, transaction: answers[0]!.json.transaction });
    expect(await balanceOf(rig.anvil.rpcUrl, rig.usdc.address, rig.receiver)).toBe(99n);
  });
});
