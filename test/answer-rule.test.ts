// The answer rule (docs/settlement.md): an answer is the chain's truth, or "retry". A store that
// fails right after the payment's transaction was stored must not turn into a failure verdict: the
// answer is read from the chain (success, or settlement_pending with the hash), and once the store
// is back the same payment settles with that transaction. A store that fails before anything is
// stored is a 503 with Retry-After, and nothing is sent. Judged on chain: the token's
// authorizationState, the receiver's balance, the signer's pending nonce.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { pino } from "pino";
import { createPublicClient, http, parseAbi, type Address, type Hex } from "viem";
import { privateKeyToAccount } from "viem/accounts";
import { DATABASE_URL, startRig, stopRig, type Rig } from "./helpers/settlement-rig.ts";
import { startTcpProxy } from "./helpers/tcp-proxy.ts";
import { until } from "./helpers/cluster.ts";
import { freePort } from "../services/devnet/anvil.ts";
import { balanceOf } from "./helpers/chain.ts";
import { postJson } from "./helpers/payments.ts";
import { openDatabase, type Database, type Queryable } from "../services/platform/storage.ts";
import { resolveFacilitatorConfig } from "../services/facilitator/config.ts";
import { startFacilitatorService, type RunningFacilitator } from "../services/facilitator/service.ts";

/** A database whose connection can be cut: "after-outbox" cuts it right after the next outbox row is stored. */
function breakable(db: Database) {
  const state = { mode: "ok" as "ok" | "after-outbox" | "down" };
  const refused = () => Object.assign(new Error("connect ECONNREFUSED 127.0.0.1:5432"), { code: "ECONNREFUSED" });
  const gated = (q: Queryable): Queryable => ({
    async query(sql, params) {
      if (state.mode === "down") throw refused();
      const rows = await q.query(sql, params);
      if (state.mode === "after-outbox" && /INSERT INTO settlement_outbox/.test(sql)) state.mode = "down";
      return rows as never;
    },
  });
  const wrapped: Database = {
    kind: db.kind,
    query: (sql, params) => gated(db).query(sql, params),
    transaction: (fn) => (state.mode === "down" ? Promise.reject(refused()) : db.transaction((tx) => fn(gated(tx)))),
    close: () => db.close(),
  };
  return { db: wrapped, state };
}

let rig: Rig;
let db: Database;
let store: ReturnType<typeof breakable>;
let facilitator: RunningFacilitator;
let signer: Address;

beforeAll(async () => {
  rig = await startRig();
  db = await openDatabase();
  store = breakable(db);
  signer = privateKeyToAccount(rig.signerKeys[0]!).address;
  const config = resolveFacilitatorConfig({ network: rig.network, rpcUrls: [rig.anvil.rpcUrl], signerKeyFile: rig.keyFile, port: 0, policy: { minBlockIntervalMs: 0 } });
  facilitator = await startFacilitatorService(config, pino({ level: "silent" }), { db: store.db });
});

afterAll(async () => {
  await facilitator?.close();
  await stopRig(rig);
  await db?.close();
});

const chain = () => createPublicClient({ transport: http(rig.anvil.rpcUrl) });
const pendingNonce = () => chain().getTransactionCount({ address: signer, blockTag: "pending" });
const used = (payment: { paymentPayload: { payload: unknown } }) => {
  const a = (payment.paymentPayload.payload as { authorization: { from: Address; nonce: Hex } }).authorization;
  return chain().readContract({ address: rig.usdc.address, abi: parseAbi(["function authorizationState(address, bytes32) view returns (bool)"]), functionName: "authorizationState", args: [a.from, a.nonce] });
};

describe("the answer rule when the settlement store fails", () => {
  it("after the payment's transaction is stored: answered from the chain, then settled with that transaction once the store is back; before: 503 and nothing sent", async () => {
    const first = await rig.payment(1000n);
    store.state.mode = "after-outbox";
    const cut = await postJson(`${facilitator.url}/settle`, first);
    expect(store.state.mode).toBe("down"); // the cut came after the outbox row
    expect(cut.status).toBe(200);
    // The chain's truth: success with the transaction, or pending with its hash. Never a failure.
    if (cut.json.success !== true) expect(cut.json).toMatchObject({ success: false, errorReason: "settlement_pending" });
    const hash = cut.json.transaction as Hex;
    expect(hash).toMatch(/^0x[0-9a-f]{64}$/);

    // Still down: a new payment is a 503 with Retry-After, and the signer sends nothing for it.
    const second = await rig.payment(2000n);
    const nonceBefore = await pendingNonce();
    const refused = await postJson(`${facilitator.url}/settle`, second);
    expect(refused.status).toBe(503);
    expect(refused.json.error).toMatch(/^backend_unavailable: /);
    expect(refused.headers.get("retry-after")).toBe("1");
    expect(await pendingNonce()).toBe(nonceBefore);
    expect(await used(second)).toBe(false);

    // The store is back: the first payment's stored transaction is driven to the chain and answered with it.
    store.state.mode = "ok";
    let settled = await postJson(`${facilitator.url}/settle`, first);
    for (let i = 0; i < 100 && settled.json.success !== true; i++) {
      expect(settled.json.errorReason).toBe("settlement_pending");
      await new Promise((r) => setTimeout(r, 200));
      settled = await postJson(`${facilitator.url}/settle`, first);
    }
    expect(settled.json).toMatchObject({ success: true, transaction: hash });
    expect((await chain().getTransactionReceipt({ hash })).status).toBe("success");
    expect(await used(first)).toBe(true);
    // The second payment, retried, settles once: the receiver holds exactly both.
    expect((await postJson(`${facilitator.url}/settle`, second)).json).toMatchObject({ success: true });
    expect(await balanceOf(rig.anvil.rpcUrl, rig.usdc.address, rig.receiver)).toBe(3000n);
  });
});

describe.runIf(DATABASE_URL)("a replica whose database is not up yet", () => {
  it("waits for it alive and unready (/healthz 200, /readyz 503 store:false), then serves once it can", async () => {
    const server = new URL(DATABASE_URL!);
    const proxy = await startTcpProxy(Number(server.port || 5432));
    await proxy.down(); // the database "is not up": nothing listens on its port
    const adminPort = await freePort();
    const config = resolveFacilitatorConfig({
      network: rig.network,
      rpcUrls: [rig.anvil.rpcUrl],
      signerKeyFile: rig.keyFile,
      port: 0,
      adminPort,
      databaseUrl: `postgres://${server.username}@127.0.0.1:${proxy.port}${server.pathname}`,
      policy: { minBlockIntervalMs: 0 },
    });
    const starting = startFacilitatorService(config, pino({ level: "silent" }));
    let started: RunningFacilitator | undefined;
    try {
      const admin = `http://127.0.0.1:${adminPort}`;
      await until(async () => (await fetch(`${admin}/healthz`).catch(() => undefined))?.status === 200, "the waiting replica's /healthz");
      const unready = await fetch(`${admin}/readyz`);
      expect(unready.status).toBe(503);
      expect(await unready.json()).toMatchObject({ status: "not_ready", checks: { store: false } });
      await proxy.up(); // the database comes up
      started = await starting;
      const ready = await fetch(`${started.adminUrl}/readyz`);
      expect(ready.status).toBe(200);
      const supported = await fetch(`${started.url}/supported`);
      expect(supported.status).toBe(200);
    } finally {
      await (started ?? (await starting.catch(() => undefined)))?.close();
      await proxy.close();
    }
  });
});
