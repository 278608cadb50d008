// The settlement engine on a real chain, against the embedded store and (when DATABASE_URL is
// set, as in CI) PostgreSQL: nonces under concurrency, exactly-once, bounded waits, replacement,
// RPC fallback.
import { afterEach, describe, expect, it } from "vitest";
import { createPublicClient, http, type Hex } from "viem";
import { privateKeyToAccount } from "viem/accounts";
import { ENGINES, startRig, type Rig } from "./helpers/settlement-rig.ts";
import { balanceOf } from "./helpers/chain.ts";
import { postJson } from "./helpers/payments.ts";
import { startTcpProxy } from "./helpers/tcp-proxy.ts";

let rig: Rig | undefined;
afterEach(async () => {
  await rig?.stop();
  rig = undefined;
});

async function nonceOf(rpcUrl: string, hash: Hex): Promise<{ from: string; nonce: number }> {
  const tx = await createPublicClient({ transport: http(rpcUrl) }).getTransaction({ hash });
  return { from: tx.from.toLowerCase(), nonce: tx.nonce };
}

describe.each(ENGINES)("settlement engine (%s store)", (engine) => {
  it.each([1, 4])("200 concurrent settles of distinct payments with %i key(s): all succeed, contiguous nonces per key", async (keys) => {
    rig = await startRig({ keys, engine });
    const f = await rig.facilitator();
    const bodies = await Promise.all(Array.from({ length: 200 }, () => rig!.payment(10n)));
    const results = await Promise.all(bodies.map((b) => postJson(`${f.url}/settle`, b)));
    const failures = results.filter((r) => r.json.success !== true).map((r) => r.json);
    expect(failures).toEqual([]);
    const txs = await Promise.all(results.map((r) => nonceOf(rig!.anvil.rpcUrl, r.json.transaction as Hex)));
    const byKey = new Map<string, number[]>();
    for (const t of txs) byKey.set(t.from, [...(byKey.get(t.from) ?? []), t.nonce]);
    expect(byKey.size).toBe(keys);
    for (const nonces of byKey.values()) {
      nonces.sort((a, b) => a - b);
      expect(nonces).toEqual(nonces.map((_, i) => i)); // 0..n-1: contiguous, no duplicate, no gap
      if (keys > 1) expect(nonces.length).toBeGreaterThan(10); // spread across the keys
    }
    expect(await balanceOf(rig.anvil.rpcUrl, rig.usdc.address, rig.receiver)).toBe(2000n);
  });

  it("a retry after success returns success with the original transaction; concurrent duplicates settle once", async () => {
    rig = await startRig({ engine });
    const f = await rig.facilitator();
    const body = await rig.payment(777n);
    const answers = await Promise.all(Array.from({ length: 20 }, () => postJson(`${f.url}/settle`, body)));
    expect(new Set(answers.map((a) => a.text)).size).toBe(1);
    expect(answers[0]!.json).toMatchObject({ success: true });
    const again = await postJson(`${f.url}/settle`, body);
    expect(again.text).toBe(answers[0]!.text);
    const signer = privateKeyToAccount(rig.signerKeys[0]!).address;
    expect(await createPublicClient({ transport: http(rig.anvil.rpcUrl) }).getTransactionCount({ address: signer })).toBe(1);
    expect(await balanceOf(rig.anvil.rpcUrl, rig.usdc.address, rig.receiver)).toBe(777n);
  });

  it("mining paused: settlement_pending within the bound, then the retry reports success with the same hash", async () => {
    rig = await startRig({ engine });
    const f = await rig.facilitator({ receiptTimeoutMs: 1000 });
    await rig.test.setAutomine(false);
    const body = await rig.payment(55n);
    const first = await postJson(`${f.url}/settle`, body);
    expect(first.json).toMatchObject({ success: false, errorReason: "settlement_pending", network: rig.network });
    expect(first.json.transaction).toMatch(/^0x[0-9a-f]{64}$/);
    const retryWhilePaused = await postJson(`${f.url}/settle`, body);
    expect(retryWhilePaused.json).toMatchObject({ errorReason: "settlement_pending", transaction: first.json.transaction });
    await rig.test.mine({ blocks: 1 });
    await rig.test.setAutomine(true);
    const after = await postJson(`${f.url}/settle`, body);
    expect(after.json).toMatchObject({ success: true, transaction: first.json.transaction });
    expect(await balanceOf(rig.anvil.rpcUrl, rig.usdc.address, rig.receiver)).toBe(55n);
  });

  it("a stuck low-fee transaction is replaced with higher fees and mines", async () => {
    rig = await startRig({ engine });
    const f = await rig.facilitator({ receiptTimeoutMs: 500, replaceAfterMs: 300 });
    await rig.test.setAutomine(false);
    const body = await rig.payment(66n);
    const first = await postJson(`${f.url}/settle`, body);
    expect(first.json.errorReason).toBe("settlement_pending");
    const stuck = first.json.transaction as Hex;
    let final: Record<string, unknown> | undefined;
    for (let i = 0; i < 60 && !final; i++) {
      // Every block is priced above the first attempt's fee cap: only a replacement can be included.
      await rig.test.setNextBlockBaseFeePerGas({ baseFeePerGas: 1000n * 10n ** 9n });
      await rig.test.mine({ blocks: 1 });
      const r = await postJson(`${f.url}/settle`, body);
      if (r.json.success) final = r.json;
      else await new Promise((res) => setTimeout(res, 100));
    }
    expect(final).toMatchObject({ success: true });
    expect(final!.transaction).not.toBe(stuck);
    const client = createPublicClient({ transport: http(rig.anvil.rpcUrl) });
    expect((await client.getTransactionReceipt({ hash: final!.transaction as Hex })).status).toBe("success");
    await expect(client.getTransactionReceipt({ hash: stuck })).rejects.toThrow();
    expect(await balanceOf(rig.anvil.rpcUrl, rig.usdc.address, rig.receiver)).toBe(66n);
  });

  it("the primary RPC down: settlement continues through the fallback", async () => {
    rig = await startRig({ engine });
    const proxy = await startTcpProxy(rig.anvil.port);
    try {
      const f = await rig.facilitator({ rpcUrls: [proxy.url, rig.anvil.rpcUrl] });
      await proxy.down();
      const r = await postJson(`${f.url}/settle`, await rig.payment(88n));
      expect(r.json).toMatchObject({ success: true });
      expect(await balanceOf(rig.anvil.rpcUrl, rig.usdc.address, rig.receiver)).toBe(88n);
    } finally {
      await proxy.close();
    }
  });
});
