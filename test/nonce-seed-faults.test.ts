// A fresh key's first settlements share one read of its chain nonce (store.ts). When the provider
// does not answer that read, every settlement waiting on it is told so (503, nothing sent), never a
// failed payment; once the provider answers, each settles once, judged on chain.
import { afterEach, describe, expect, it } from "vitest";
import { stopRig, startRig, type Rig } from "./helpers/settlement-rig.ts";
import { balanceOf } from "./helpers/chain.ts";
import { postJson } from "./helpers/payments.ts";
import { startRpcFaultProxy, type RpcFaultProxy } from "./helpers/rpc-fault-proxy.ts";

let rig: Rig | undefined;
let proxy: RpcFaultProxy | undefined;
afterEach(() => stopRig(rig, proxy).finally(() => (rig = proxy = undefined)));

describe("the shared nonce-seed read", () => {
  it("a provider timeout on it answers every waiting settlement 503, none a failed payment; healed, each settles once", async () => {
    rig = await startRig();
    proxy = await startRpcFaultProxy({ upstream: rig.anvil.rpcUrl });
    const f = await rig.facilitator({ rpcUrls: [proxy.url], rpcTimeoutMs: 500 });
    // The seed read and the transport's retry of it both go unanswered.
    proxy.configure({ schedule: { eth_getTransactionCount: ["timeout", "timeout", "ok"] } });
    const bodies = await Promise.all(Array.from({ length: 6 }, (_, i) => rig!.payment(BigInt(i + 1))));
    const first = await Promise.all(bodies.map((b) => postJson(`${f.url}/settle`, b)));
    for (const r of first) {
      if (r.status === 200 && r.json.success !== true) expect(r.json.errorReason, r.text).toBe("settlement_pending");
      if (r.status !== 200) expect(r.status, r.text).toBe(503);
    }
    expect(first.some((r) => r.status === 503)).toBe(true);
    proxy.configure({});
    for (const b of bodies) {
      let r = await postJson(`${f.url}/settle`, b);
      for (let i = 0; i < 20 && r.json?.success !== true; i++) r = await postJson(`${f.url}/settle`, b);
      expect(r.json, r.text).toMatchObject({ success: true });
    }
    expect(await balanceOf(rig.anvil.rpcUrl, rig.usdc.address, rig.receiver)).toBe(21n);
  });
});
