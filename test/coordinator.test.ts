// The exactly-once coordinator's bookkeeping without a chain: refusals and crashes before any
// transaction release the claim (a retry is judged afresh), a recorded outcome is final.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { PaymentPayload, PaymentRequirements, SettleResponse } from "@x402/core/types";
import { openDatabase, migrate, type Database } from "../services/platform/storage.ts";
import { cleanLine } from "../services/facilitator/settlement/reverts.ts";
import { ABANDONED_CLAIM_GRACE_MS, SETTLEMENT_MIGRATIONS, createSettlementStore } from "../services/facilitator/settlement/store.ts";
import { createSettlementCoordinator } from "../services/facilitator/settlement/coordinator.ts";
import { settlementContext } from "../services/facilitator/settlement/context.ts";
import { paymentIdentity } from "../services/facilitator/settlement/payment-id.ts";
import type { ChainClient } from "../services/facilitator/chain.ts";
import { eventually } from "./helpers/onchain.ts";

let db: Database;
beforeAll(async () => {
  db = await openDatabase();
  await migrate(db, SETTLEMENT_MIGRATIONS);
});
afterAll(() => db?.close());

const network = "eip155:8453";
const reusedReason = "invalid_exact_evm_nonce_already_used";
const requirements: PaymentRequirements = { scheme: "exact", network, asset: "0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913", amount: "1", payTo: "0x000000000000000000000000000000000000dEaD", maxTimeoutSeconds: 60, extra: {} };
const payload = (nonce: string): PaymentPayload => ({
  x402Version: 2,
  accepted: requirements,
  payload: { signature: "0x00", authorization: { from: "0x70997970C51812dc3A010C7d01b50e0d17dc79C8", to: requirements.payTo, value: "1", validAfter: "0", validBefore: "9999999999", nonce } },
});
// No transaction is ever sent in these cases, so the chain is never asked.
const coordinator = () => createSettlementCoordinator({ store: createSettlementStore(db, network), chain: {} as ChainClient, network, waitBoundMs: 2000, confirmations: 1 });

describe("settlement coordinator", () => {
  it("a refusal before any transaction releases the claim: the retry runs the mechanism again", async () => {
    const c = coordinator();
    const p = payload(`0x${"01".repeat(32)}`);
    let runs = 0;
    const refuse = async (): Promise<SettleResponse> => {
      runs++;
      return { success: false, errorReason: "invalid_exact_evm_signature", transaction: "", network };
    };
    expect((await c.settle({ payload: p, requirements, reusedReason, run: refuse })).errorReason).toBe("invalid_exact_evm_signature");
    expect((await c.settle({ payload: p, requirements, reusedReason, run: refuse })).errorReason).toBe("invalid_exact_evm_signature");
    expect(runs).toBe(2);
  });

  it("a mechanism that throws before any transaction does not leave the payment claimed", async () => {
    const c = coordinator();
    const p = payload(`0x${"02".repeat(32)}`);
    await expect(c.settle({ payload: p, requirements, reusedReason, run: async () => { throw new Error("node exploded"); } })).rejects.toThrow("node exploded");
    const ok: SettleResponse = { success: true, transaction: "", network };
    // With the claim left behind, this would wait out its bound and answer settlement_pending.
    expect(await c.settle({ payload: p, requirements, reusedReason, run: async () => ok })).toEqual(ok);
  });

  it("a recorded success is final: later callers get the stored answer without running anything", async () => {
    const c = coordinator();
    const p = payload(`0x${"03".repeat(32)}`);
    const ok: SettleResponse = { success: true, transaction: "", network, amount: "0" };
    expect(await c.settle({ payload: p, requirements, reusedReason, run: async () => ok })).toEqual(ok);
    expect(await coordinator().settle({ payload: p, requirements, reusedReason, run: async () => { throw new Error("must not run"); } })).toEqual(ok);
  });
});

describe("settlement coordinator: one nonce, two payments", () => {
  const other: PaymentRequirements = { ...requirements, payTo: "0x000000000000000000000000000000000000bEEF" };

  it("a recorded payment's nonce refuses a different body, which is never answered from the record", async () => {
    const c = coordinator();
    const p = payload(`0x${"04".repeat(32)}`);
    const ok: SettleResponse = { success: true, transaction: "", network };
    expect(await c.settle({ payload: p, requirements, reusedReason, run: async () => ok })).toEqual(ok);
    const forged = { ...p, payload: { ...p.payload, signature: `0x${"00".repeat(65)}` } };
    for (const [body, reqs] of [[p, other], [forged, requirements]] as const) {
      const answer = await c.settle({ payload: body, requirements: reqs, reusedReason, run: async () => { throw new Error("must not run"); } });
      expect(answer).toMatchObject({ success: false, errorReason: reusedReason, transaction: "" });
    }
  });

  it("a forged body that claims first cannot lock the genuine one out: once refused, the genuine body runs", async () => {
    const c = coordinator();
    const p = payload(`0x${"05".repeat(32)}`);
    let releaseForged!: () => void;
    let forgedStarted!: () => void;
    const forgedRuns = new Promise<void>((r) => (releaseForged = r));
    const started = new Promise<void>((r) => (forgedStarted = r));
    const forged = c.settle({
      payload: { ...p, payload: { ...p.payload, signature: "0x01" } },
      requirements,
      reusedReason,
      run: async () => {
        forgedStarted();
        await forgedRuns;
        return { success: false, errorReason: "invalid_exact_evm_signature", transaction: "", network };
      },
    });
    await started; // the forged body holds the claim
    const ok: SettleResponse = { success: true, transaction: "", network };
    const genuine = c.settle({ payload: p, requirements, reusedReason, run: async () => ok });
    releaseForged();
    expect(await forged).toMatchObject({ success: false, errorReason: "invalid_exact_evm_signature" });
    expect(await genuine).toEqual(ok);
  });
});

describe("settlement coordinator: a run that outlives its lease", () => {
  const other: PaymentRequirements = { ...requirements, payTo: "0x000000000000000000000000000000000000bEEF" };

  it("loses the claim to the request that takes it over: it can sign nothing and never gets that request's answer", async () => {
    const store = createSettlementStore(db, network);
    const c = createSettlementCoordinator({ store, chain: {} as ChainClient, network, waitBoundMs: 5000, confirmations: 1, leaseMs: 100, pollIntervalMs: 10 });
    const p = payload(`0x${"06".repeat(32)}`);
    let resume!: () => void;
    let started!: () => void;
    const paused = new Promise<void>((r) => (resume = r));
    const running = new Promise<void>((r) => (started = r));
    let signed = 0;
    // A: slow before it sends (a slow RPC); when it finally tries to store its transaction, the fence must hold.
    const a = c.settle({
      payload: p,
      requirements,
      reusedReason,
      run: async () => {
        started();
        await paused;
        const ctx = settlementContext.getStore()!;
        await store.allocateAndStore(
          { paymentId: ctx.paymentId, claimOwner: ctx.owner, signer: "0x00000000000000000000000000000000000000A1", to: requirements.asset as `0x${string}`, data: "0x", gas: 21_000n, maxFeePerGas: 1n, maxPriorityFeePerGas: 1n },
          async () => 0,
          async () => {
            signed++;
            return { raw: "0x01", hash: `0x${"ab".repeat(32)}` };
          },
        );
        return { success: true, transaction: `0x${"ab".repeat(32)}`, network };
      },
    });
    await running;
    // B: another payment with the same nonce, once A's lease has run out (waits for that condition).
    const ok: SettleResponse = { success: true, transaction: "", network };
    let b: SettleResponse;
    for (;;) {
      b = await c.settle({ payload: p, requirements: other, reusedReason, run: async () => ok });
      if (b.success) break;
      await new Promise((r) => setTimeout(r, 20));
    }
    expect(b).toEqual(ok);
    resume();
    const answerA = await a.catch((e: Error) => ({ success: false, errorReason: e.name, transaction: "", network }));
    expect(answerA).toMatchObject({ success: false, transaction: "" });
    expect(answerA).not.toEqual(ok);
    expect(signed).toBe(0);
    // B's answer stays B's: a retry of B gets it again without running anything.
    expect(await c.settle({ payload: p, requirements: other, reusedReason, run: async () => { throw new Error("must not run"); } })).toEqual(ok);
  });
});

describe("settlement coordinator: reservations", () => {
  it("payments without an identity payer (batch deposits) still reserve against the payer they draw on", async () => {
    const store = createSettlementStore(db, network);
    const payer = "0x00000000000000000000000000000000000000B2" as const;
    let balanceReads = 0;
    // The payer holds 1000; the balance is the only chain read a reservation makes.
    const chain = { client: { readContract: async () => (balanceReads++, 1000n) } } as unknown as ChainClient;
    const c = createSettlementCoordinator({ store, chain, network, waitBoundMs: 2000, confirmations: 1 });
    let release!: () => void;
    let reserved!: () => void;
    const hold = new Promise<void>((r) => (release = r));
    const firstReserved = new Promise<void>((r) => (reserved = r));
    const deposit = (salt: string) => ({ x402Version: 2, accepted: requirements, payload: { type: "deposit", channelConfig: { payer, salt }, deposit: { amount: "600" } } }) as unknown as PaymentPayload;
    const job = (salt: string) => ({
      payload: deposit(salt),
      requirements: { ...requirements, scheme: "batch-settlement" },
      reusedReason,
      reservation: { asset: requirements.asset as `0x${string}`, payer, amount: 600n, insufficientReason: "invalid_batch_settlement_evm_insufficient_balance" },
      run: async (): Promise<SettleResponse> => {
        reserved(); // the mechanism runs only after the reservation
        await hold;
        return { success: false, errorReason: "invalid_batch_settlement_evm_channel_not_found", transaction: "", network };
      },
    });
    const first = c.settle(job("0x01"));
    await firstReserved;
    const second = await c.settle(job("0x02"));
    expect(second).toMatchObject({ success: false, errorReason: "invalid_batch_settlement_evm_insufficient_balance", transaction: "" });
    expect(balanceReads).toBe(1);
    release();
    await first;
  });
});

describe("settlement store: abandoned claims", () => {
  it("a claim whose process died (lease long over, nothing stored) stops holding its payer's balance, and its run can sign nothing after", async () => {
    const store = createSettlementStore(db, network);
    const payer = "0x00000000000000000000000000000000000000D4";
    const asset = requirements.asset;
    expect(await store.claim("abandoned", "d1", "exact", payer, {}, "dead-owner", 30_000)).toEqual({ claimed: true });
    expect(await store.reserve("abandoned", "dead-owner", asset, payer, 600n, 1000n)).toEqual({ reserved: true });
    // Still within its lease and grace: it holds the 600, so a second payment of 600 does not fit a balance of 1000.
    expect(await store.claim("second", "d2", "exact", payer, {}, "live-owner", 30_000)).toEqual({ claimed: true });
    expect(await store.reserve("second", "live-owner", asset, payer, 600n, 1000n)).toEqual({ reserved: false, inFlight: 600n });
    // The first process died long ago: its lease ran out more than the grace before now.
    await db.query(`UPDATE settlement_payments SET lease_until = now() - ($3 || ' milliseconds')::interval WHERE network = $1 AND payment_id = $2`, [network, "abandoned", String(ABANDONED_CLAIM_GRACE_MS + 1000)]);
    expect(await store.reserve("second", "live-owner", asset, payer, 600n, 1000n)).toEqual({ reserved: true });
    expect(await store.payment("abandoned")).toBeUndefined();
    // The dead run, if it were still alive, lost its claim: nothing is signed for it.
    let signed = 0;
    await expect(
      store.allocateAndStore({ paymentId: "abandoned", claimOwner: "dead-owner", signer: "0x00000000000000000000000000000000000000A9", to: asset as `0x${string}`, data: "0x", gas: 21_000n, maxFeePerGas: 1n, maxPriorityFeePerGas: 1n }, async () => 0, async () => {
        signed++;
        return { raw: "0x01", hash: `0x${"cd".repeat(32)}` };
      }),
    ).rejects.toThrow("the claim on this payment passed to another request");
    expect(signed).toBe(0);
  });
});

describe("settlement coordinator: a payer's burst", () => {
  it("twelve payments of 100 from a payer holding 1000, all at once: ten run, two are refused, decided together in fewer transactions than payments", async () => {
    let locks = 0;
    // The store's database, counting the reservation lock each transaction takes.
    const counting: Database = {
      ...db,
      transaction: (fn) =>
        db.transaction((tx) =>
          fn({
            query: (sql, params) => {
              if (sql.includes("pg_advisory_xact_lock")) locks++;
              return tx.query(sql, params);
            },
          }),
        ),
    };
    const store = createSettlementStore(counting, network);
    const payer = "0x00000000000000000000000000000000000000C3" as const;
    const chain = { client: { readContract: async () => 1000n } } as unknown as ChainClient;
    const c = createSettlementCoordinator({ store, chain, network, waitBoundMs: 5000, confirmations: 1 });
    let release!: () => void;
    const hold = new Promise<void>((r) => (release = r));
    let ran = 0;
    const deposit = (salt: string) => ({ x402Version: 2, accepted: requirements, payload: { type: "deposit", channelConfig: { payer, salt }, deposit: { amount: "100" } } }) as unknown as PaymentPayload;
    const answers = Array.from({ length: 12 }, (_, i) =>
      c.settle({
        payload: deposit(`0x${(i + 1).toString(16).padStart(2, "0")}`),
        requirements: { ...requirements, scheme: "batch-settlement" },
        reusedReason,
        reservation: { asset: requirements.asset as `0x${string}`, payer, amount: 100n, insufficientReason: "invalid_batch_settlement_evm_insufficient_balance" },
        run: async (): Promise<SettleResponse> => {
          ran++;
          await hold; // every reservation stays in flight until all are decided
          return { success: false, errorReason: "invalid_batch_settlement_evm_channel_not_found", transaction: "", network };
        },
      }),
    );
    let refused = 0;
    for (const a of answers) void a.then((r) => r.errorReason === "invalid_batch_settlement_evm_insufficient_balance" && refused++);
    // Ten held in their mechanism (their reservations in flight), two answered: all twelve decided.
    await eventually(async () => (ran + refused === 12 ? true : undefined), 400, 25);
    expect(ran).toBe(10);
    expect(refused).toBe(2);
    release();
    const all = await Promise.all(answers);
    expect(all.filter((a) => a.errorReason === "invalid_batch_settlement_evm_insufficient_balance")).toHaveLength(2);
    // Reservations queued together are decided in one transaction (here 2); one per payment without that.
    expect(locks).toBeLessThanOrEqual(6);
  });
});

describe("settlement coordinator: transactions that prepare a payment", () => {
  it("a mined gas funding or wallet deployment never answers for the payment: a crashed run's claim is taken over and the mechanism runs again", async () => {
    const store = createSettlementStore(db, network);
    const c = createSettlementCoordinator({ store, chain: {} as ChainClient, network, waitBoundMs: 3000, confirmations: 1, leaseMs: 100, pollIntervalMs: 10 });
    const p = payload(`0x${"08".repeat(32)}`);
    let nonce = 100;
    const prepare = async (kind: string, hashByte: string) => {
      const ctx = settlementContext.getStore()!;
      const row = await store.allocateAndStore(
        { paymentId: ctx.paymentId, claimOwner: ctx.owner, signer: "0x00000000000000000000000000000000000000A2", to: requirements.payTo as `0x${string}`, data: "0x", gas: 21_000n, maxFeePerGas: 1n, maxPriorityFeePerGas: 1n, value: 5n, kind },
        async () => nonce++,
        async () => ({ raw: "0x01", hash: `0x${hashByte.repeat(32)}` }),
      );
      // Mined successfully, as the reconciler would record it: the payment must not become a success.
      await store.recordMined(ctx.paymentId, row.id, row.hash, true);
      return row;
    };
    // The run funds the payer and deploys its wallet, then dies before the mechanism's own transaction.
    await expect(
      c.settle({
        payload: p,
        requirements,
        reusedReason,
        run: async () => {
          await prepare("gas_funding", "c1");
          await prepare("wallet_deployment", "c2");
          throw new Error("process died");
        },
      }),
    ).rejects.toThrow("process died");
    // The retry runs the mechanism (the preparations are not the payment's transaction) and gets its answer.
    let runs = 0;
    const retry = await c.settle({
      payload: p,
      requirements,
      reusedReason,
      run: async () => {
        runs++;
        return { success: false, errorReason: "invalid_exact_evm_signature", transaction: "", network };
      },
    });
    expect(runs).toBe(1);
    expect(retry).toMatchObject({ success: false, errorReason: "invalid_exact_evm_signature" });
  });
});

describe("storing transactions: one turn for every key", () => {
  it("transactions of several keys that queue while a store turn runs are stored in the next one together, each key numbered from its own counter", async () => {
    let transactions = 0;
    const counted: Database = { ...db, query: (sql, params) => db.query(sql, params), transaction: (fn) => (transactions++, db.transaction(fn)) };
    const store = createSettlementStore(counted, "eip155:31337");
    const [a, b, c] = ["0x00000000000000000000000000000000000000B1", "0x00000000000000000000000000000000000000B2", "0x00000000000000000000000000000000000000B3"] as const;
    const entry = (signer: `0x${string}`, paymentId: string) => ({ paymentId, signer, to: requirements.asset as `0x${string}`, data: "0x" as const, gas: 21_000n, maxFeePerGas: 1n, maxPriorityFeePerGas: 1n });
    let hash = 0;
    const sign = async () => ({ raw: "0x01" as const, hash: `0x${(++hash).toString(16).padStart(64, "b")}` as const });
    // Every key's counter made first (a fresh key reads the store before it queues): a at 5 after this, b at 8, c at 1.
    await Promise.all([store.allocateAndStore(entry(a, "turn-a0"), async () => 4, sign), store.allocateAndStore(entry(b, "turn-b0"), async () => 7, sign), store.allocateAndStore(entry(c, "turn-c0"), async () => 0, sign)]);
    transactions = 0;
    let release!: () => void;
    const held = new Promise<void>((r) => (release = r));
    const first = store.allocateAndStore(entry(a, "turn-a1"), async () => 0, async () => (await held, sign()));
    await eventually(async () => (transactions === 1 ? true : undefined), 50, 100); // the first turn is running
    const queued = [
      store.allocateAndStore(entry(b, "turn-b1"), async () => 0, sign),
      store.allocateAndStore(entry(a, "turn-a2"), async () => 0, sign),
      store.allocateAndStore(entry(c, "turn-c1"), async () => 0, sign),
      store.allocateAndStore(entry(c, "turn-c2"), async () => 0, async () => { throw new Error("signer down"); }),
      store.allocateAndStore(entry(b, "turn-b2"), async () => 0, sign),
      store.allocateAndStore(entry(c, "turn-c3"), async () => 0, sign),
    ].map((p) => p.then((row) => `${row.signer}:${row.nonce}`, (e: Error) => e.message));
    await new Promise((r) => setTimeout(r, 200)); // every one of them queued behind the held turn
    release();
    expect((await first).nonce).toBe("5");
    // each key numbered on from its own counter; a failed signing's nonce goes to that key's next
    expect(await Promise.all(queued)).toEqual([`${b}:8`, `${a}:6`, `${c}:1`, "signer down", `${b}:9`, `${c}:2`]);
    expect(transactions).toBe(2); // one turn per key would be four
    const counters = await db.query<{ signer: string; next: string }>(`SELECT signer, next_nonce::text AS next FROM settlement_nonces WHERE network = 'eip155:31337' ORDER BY signer`);
    expect(counters).toEqual([{ signer: a, next: "7" }, { signer: b, next: "10" }, { signer: c, next: "3" }]);
  });
});

describe("the settlement record: claimed → sent → succeeded | failed", () => {
  const signer = "0x00000000000000000000000000000000000000A3" as const;
  const entry = (paymentId: string, claimOwner: string, kind?: string) =>
    ({ paymentId, claimOwner, signer, to: requirements.asset as `0x${string}`, data: "0x" as const, gas: 21_000n, maxFeePerGas: 1n, maxPriorityFeePerGas: 1n, kind });
  const stateOf = async (id: string) => (await db.query<{ state: string; response: unknown; lease_until: unknown }>(`SELECT state, response, lease_until FROM settlement_payments WHERE network = $1 AND payment_id = $2`, [network, id]))[0];
  let hashes = 0;
  const sign = async () => ({ raw: "0x01" as const, hash: `0x${(++hashes).toString(16).padStart(64, "0")}` as const });

  it("a payment becomes sent in the transaction that stores its first decisive transaction, never before and never without it", async () => {
    const store = createSettlementStore(db, network);
    const id = "record-1";
    expect(await store.claim(id, "d1", "exact", null, {}, "owner-1", 60_000)).toEqual({ claimed: true });
    // A funding prepares the payment: still claimed, still leased (a crashed run's claim may be taken over).
    await store.allocateAndStore(entry(id, "owner-1", "gas_funding"), async () => 0, sign);
    expect(await stateOf(id)).toMatchObject({ state: "claimed", response: null });
    expect((await stateOf(id))!.lease_until).not.toBeNull();
    // A signing that fails rolls the whole transaction back: nothing stored, still claimed.
    await expect(store.allocateAndStore(entry(id, "owner-1"), async () => 0, async () => { throw new Error("signer down"); })).rejects.toThrow("signer down");
    expect((await store.outboxForPayment(id)).length).toBe(1);
    expect((await stateOf(id))!.state).toBe("claimed");
    // The payment's own transaction: sent, the lease ends, and no other request can take it over or release it.
    await store.allocateAndStore(entry(id, "owner-1"), async () => 0, sign);
    expect(await stateOf(id)).toMatchObject({ state: "sent", response: null, lease_until: null });
    expect(await store.takeOver(id, "d2", {}, "owner-2", 1)).toBe(false);
    await store.release(id, "owner-1");
    expect((await stateOf(id))!.state).toBe("sent");
    // The run may re-send on another nonce (a foreign transaction took its nonce); another owner may not.
    await store.allocateAndStore(entry(id, "owner-1"), async () => 0, sign);
    await expect(store.allocateAndStore(entry(id, "owner-2"), async () => 0, sign)).rejects.toThrow(/claim/);
    expect((await store.outboxForPayment(id)).length).toBe(3);
  });

  it("a payment whose transaction was mined but never recorded (its recorder died) is found and recorded, as a retry would", async () => {
    const store = createSettlementStore(db, network);
    const id = "record-unrecorded";
    expect(await store.claim(id, "d1", "exact", null, {}, "owner-u", 60_000)).toEqual({ claimed: true });
    const row = await store.allocateAndStore(entry(id, "owner-u"), async () => 0, sign);
    // Marked mined, then the process stopped before recording the payment.
    await store.markMined(row.id, row.hash, true);
    expect(await stateOf(id)).toMatchObject({ state: "sent" });
    expect((await store.unrecordedMined()).map((r) => r.payment_id)).not.toContain(id); // touched just now: the request may still record it
    await db.query(`UPDATE settlement_payments SET updated_at = now() - interval '1 minute' WHERE network = $1 AND payment_id = $2`, [network, id]);
    const found = (await store.unrecordedMined()).find((r) => r.payment_id === id);
    expect(found).toMatchObject({ id: row.id, mined_hash: row.hash, confirmed: true });
    await store.recordMined(found!.payment_id, found!.id, found!.mined_hash, found!.confirmed);
    expect(await stateOf(id)).toMatchObject({ state: "succeeded", response: { success: true, transaction: row.hash } });
    expect((await store.unrecordedMined()).map((r) => r.payment_id)).not.toContain(id);
  });

  it("a revert whose reason carries control characters (a NUL from a hostile wallet) is recorded as a failure, not left pending for ever", async () => {
    // The reason is the contract's bytes; explainMinedRevert passes it through cleanLine, as here.
    const store = createSettlementStore(db, network, { explainRevert: async () => ({ code: "permit2_invalid_signature", message: cleanLine("execution reverted: a\u0000b\u0007c") }) });
    const id = "record-nul";
    expect(await store.claim(id, "d1", "exact", null, {}, "owner-n", 60_000)).toEqual({ claimed: true });
    const row = await store.allocateAndStore(entry(id, "owner-n"), async () => 0, sign);
    await store.recordMined(id, row.id, row.hash, false);
    expect(await stateOf(id)).toMatchObject({ state: "failed", response: { success: false, errorReason: "permit2_invalid_signature", errorMessage: "execution reverted: a b c", transaction: row.hash } });
  });

  it("the database refuses a final state without its answer, and an answer on a payment in flight", async () => {
    const store = createSettlementStore(db, network);
    await store.claim("record-2", "d", "exact", null, {}, "o", 60_000);
    await expect(db.query(`UPDATE settlement_payments SET state = 'succeeded' WHERE network = $1 AND payment_id = 'record-2'`, [network])).rejects.toThrow(/settlement_payments_answered/);
    await expect(db.query(`UPDATE settlement_payments SET response = '{}' WHERE network = $1 AND payment_id = 'record-2'`, [network])).rejects.toThrow(/settlement_payments_answered/);
    await expect(db.query(`UPDATE settlement_payments SET state = 'dropped' WHERE network = $1 AND payment_id = 'record-2'`, [network])).rejects.toThrow(/settlement_payments_state_check/);
  });

  it("a pending answer is built on read: past the bound the record stays sent, with no stored answer", async () => {
    const store = createSettlementStore(db, network);
    const never = { getTransactionReceipt: async () => { throw new Error("not mined"); }, getBlockNumber: async () => 1n };
    const chain = { client: never, pollClient: never } as unknown as ChainClient;
    const c = createSettlementCoordinator({ store, chain, network, waitBoundMs: 300, confirmations: 1, pollIntervalMs: 20 });
    const p = payload(`0x${"09".repeat(32)}`);
    let hash = "";
    const answer = await c.settle({
      payload: p,
      requirements,
      reusedReason,
      run: async () => {
        const ctx = settlementContext.getStore()!;
        hash = (await store.allocateAndStore(entry(ctx.paymentId, ctx.owner!), async () => 0, sign)).hash;
        return { success: false, errorReason: "settlement_pending", transaction: hash, network };
      },
    });
    expect(answer).toMatchObject({ success: false, errorReason: "settlement_pending", transaction: hash });
    expect(await stateOf(paymentIdentity(p, requirements).id)).toMatchObject({ state: "sent", response: null });
  });

  it("migration 007 carries rows of the old record over: pending and claimed-with-a-transaction become sent, stored pending answers go", async () => {
    const old = await openDatabase();
    try {
      await migrate(old, SETTLEMENT_MIGRATIONS.slice(0, 6));
      const insert = (id: string, state: string, response: string | null) =>
        old.query(`INSERT INTO settlement_payments (network, payment_id, scheme, state, owner, response) VALUES ($1, $2, 'exact', $3, 'o', $4)`, [network, id, state, response]);
      await insert("was-pending", "pending", JSON.stringify({ success: false, errorReason: "settlement_pending" }));
      await insert("claimed-sent", "claimed", null);
      await insert("claimed-funded", "claimed", null);
      await insert("claimed-idle", "claimed", null);
      await insert("done", "succeeded", JSON.stringify({ success: true }));
      const tx = (id: string, nonce: number, kind: string | null) =>
        old.query(`INSERT INTO settlement_outbox (network, payment_id, signer, nonce, to_address, data, gas, max_fee_per_gas, max_priority_fee_per_gas, raw_tx, hash, hashes, state, kind) VALUES ($1, $2, $3, $4, $3, '0x', 1, 1, 1, '0x', '0x', ARRAY['0x'], 'broadcast', $5)`, [network, id, signer, nonce, kind]);
      await tx("claimed-sent", 1, "eip3009_transfer");
      await tx("claimed-funded", 2, "gas_funding");
      await migrate(old, SETTLEMENT_MIGRATIONS);
      const rows = await old.query<{ payment_id: string; state: string; has_answer: boolean }>(`SELECT payment_id, state, response IS NOT NULL AS has_answer FROM settlement_payments ORDER BY payment_id`);
      expect(Object.fromEntries(rows.map((r) => [r.payment_id, [r.state, r.has_answer]]))).toEqual({
        "was-pending": ["sent", false],
        "claimed-sent": ["sent", false],
        "claimed-funded": ["claimed", false],
        "claimed-idle": ["claimed", false],
        done: ["succeeded", true],
      });
    } finally {
      await old.close();
    }
  });
});

describe("the settlement record: recovery from a process that stopped halfway", () => {
  const signer = "0x00000000000000000000000000000000000000A4" as const;
  let nonce = 0;
  const store = () => createSettlementStore(db, network);
  const stored = async (s: ReturnType<typeof store>, id: string, owner: string) =>
    s.allocateAndStore({ paymentId: id, claimOwner: owner, signer, to: requirements.asset as `0x${string}`, data: "0x", gas: 21_000n, maxFeePerGas: 1n, maxPriorityFeePerGas: 1n }, async () => nonce, async (n) => ({ raw: "0x01", hash: `0x${(1000n + n).toString(16).padStart(64, "0")}` }));

  it("a transaction inserted by a writer that does not know `sent` (an older version during a rolling upgrade) still makes its payment sent", async () => {
    const s = store();
    await s.claim("upgrade-1", "d", "exact", null, {}, "old-pod", 60_000);
    await db.query(
      `INSERT INTO settlement_outbox (network, payment_id, signer, nonce, to_address, data, gas, max_fee_per_gas, max_priority_fee_per_gas, raw_tx, hash, hashes, state, kind) VALUES ($1, 'upgrade-1', $2, 900, $2, '0x', 1, 1, 1, '0x', '0x', ARRAY['0x'], 'signed', 'eip3009_transfer')`,
      [network, signer],
    );
    expect((await s.payment("upgrade-1"))!.state).toBe("sent");
    expect(await s.takeOver("upgrade-1", "d2", {}, "new-pod", 1)).toBe(false);
    // Its bounded wait ends by storing a pending answer, as that version did: the record stays sent, with no answer.
    await db.query(`UPDATE settlement_payments SET state = 'pending', response = '{"success":false}' WHERE network = $1 AND payment_id = 'upgrade-1'`, [network]);
    expect(await s.payment("upgrade-1")).toMatchObject({ state: "sent", response: null });
  });

  it("every transaction dropped and no run left to replace it: the payment is answered failed, nothing moved, and its reservation ends", async () => {
    const s = store();
    const c = createSettlementCoordinator({ store: s, chain: {} as ChainClient, network, waitBoundMs: 2000, confirmations: 1, leaseMs: 100, pollIntervalMs: 10 });
    const p = payload(`0x${"0a".repeat(32)}`);
    // The run stores its transaction, the nonce turns out used outside the fleet (dropped), and the process dies before taking the next one.
    await expect(
      c.settle({
        payload: p,
        requirements,
        reusedReason,
        run: async () => {
          const ctx = settlementContext.getStore()!;
          const row = await stored(s, ctx.paymentId, ctx.owner!);
          await s.markDropped(row.id, "nonce used outside the fleet", "nonce_too_low");
          throw new Error("process died");
        },
      }),
    ).rejects.toThrow("process died");
    await new Promise((r) => setTimeout(r, 150)); // past the lease: no run can still be replacing it
    const answer = await c.settle({ payload: p, requirements, reusedReason, run: async () => { throw new Error("must not run"); } });
    expect(answer).toMatchObject({ success: false, errorReason: "invalid_transaction_state", transaction: "" });
    expect((await s.payment(paymentIdentity(p, requirements).id))!.state).toBe("failed");
  });

  it("a reorged success mined again as a revert is corrected even when the process that marked it mined stopped before correcting", async () => {
    const reversed: string[] = [];
    const s = createSettlementStore(db, network, { onReversed: (id) => reversed.push(id) });
    await s.claim("reorg-1", "d", "exact", "0x70997970C51812dc3A010C7d01b50e0d17dc79C8", {}, "o", 60_000);
    const row = await stored(s, "reorg-1", "o");
    nonce++;
    await s.recordMined("reorg-1", row.id, row.hash, true, undefined, { blockNumber: 10n, blockHash: "0xaa" });
    expect((await s.payment("reorg-1"))!.response).toMatchObject({ success: true });
    expect(await s.reorged(row.id, "0xaa")).toBeDefined(); // left the canonical chain: back on its way
    // Process A marks it mined again, as a revert, and dies before it records the payment.
    await s.markMined(row.id, row.hash, false, undefined, { blockNumber: 11n, blockHash: "0xbb" });
    // Process B finds it marked and records from the stored facts: the canonical chain's outcome wins.
    const s2 = createSettlementStore(db, network, { onReversed: (id) => reversed.push(id) });
    await s2.recordMined("reorg-1", row.id, row.hash, false);
    expect((await s.payment("reorg-1"))!.response).toMatchObject({ success: false, transaction: row.hash });
    expect((await s.payment("reorg-1"))!.state).toBe("failed");
    expect(reversed).toEqual(["reorg-1"]); // said once, by the process that corrected it
  });
});

describe("outbox gauges", () => {
  it("open rows are counted on every call; settled ones (the network's history) only when asked for", async () => {
    const store = createSettlementStore(db, "eip155:424242");
    const signer = "0x00000000000000000000000000000000000000a1" as const;
    const row = (i: number) =>
      store.allocateAndStore(
        { paymentId: `gauges-${i}`, signer, to: signer, data: "0x", gas: 21_000n, maxFeePerGas: 1n, maxPriorityFeePerGas: 1n },
        async () => 0,
        async () => ({ raw: `0x0${i}`, hash: `0x${String(i).padStart(64, "0")}` }),
      );
    const [a, b] = [await row(1), await row(2), await row(3)];
    await store.markBroadcast(b!.id);
    await store.markMined(a!.id, a!.hash, true);
    const quick = await store.stats(false);
    expect(quick.states).toEqual({ signed: 1, broadcast: 1 });
    expect(quick.pendingBySigner).toEqual({ [signer]: 2 });
    expect(quick.oldestOpenSeconds).toBeGreaterThanOrEqual(0);
    expect((await store.stats(true)).states).toEqual({ signed: 1, broadcast: 1, confirmed: 1 });
  });
});

describe("nonce counter", () => {
  it("a fresh key's first burst reads its chain nonce once and takes contiguous nonces from it", async () => {
    const store = createSettlementStore(db, "eip155:434343");
    const signer = "0x00000000000000000000000000000000000000b2" as const;
    let reads = 0;
    const chainNonce = async () => {
      reads++;
      await new Promise((r) => setTimeout(r, 50)); // an RPC round trip: the burst arrives meanwhile
      return 7;
    };
    const rows = await Promise.all(
      Array.from({ length: 40 }, (_, i) =>
        store.allocateAndStore({ paymentId: `seed-${i}`, signer, to: signer, data: "0x", gas: 21_000n, maxFeePerGas: 1n, maxPriorityFeePerGas: 1n }, chainNonce, async (n) => ({
          raw: `0x${n.toString(16).padStart(2, "0")}`,
          hash: `0x${(1000n + n).toString(16).padStart(64, "0")}`,
        })),
      ),
    );
    expect(reads).toBe(1);
    expect(rows.map((r) => Number(r.nonce)).sort((a, b) => a - b)).toEqual(Array.from({ length: 40 }, (_, i) => 7 + i));
  });
});

describe("open outbox", () => {
  it("keys take turns: one key's backlog never hides another key's lowest nonces past the limit; each key's unsent rows come first", async () => {
    const store = createSettlementStore(db, "eip155:454545");
    const [old, fresh] = ["0x00000000000000000000000000000000000000c1", "0x00000000000000000000000000000000000000c2"] as const;
    const add = (signer: `0x${string}`, i: number, seed: number) =>
      store.allocateAndStore({ paymentId: `turns-${signer}-${i}`, signer, to: signer, data: "0x", gas: 21_000n, maxFeePerGas: 1n, maxPriorityFeePerGas: 1n }, async () => seed, async (n) => ({
        raw: `0x${n.toString(16).padStart(2, "0")}`,
        hash: `0x${signer.slice(-2)}${n.toString(16).padStart(62, "0")}`,
      }));
    const oldRows = [await add(old, 0, 50_000), await add(old, 1, 50_000)];
    await store.markBroadcast(oldRows[0]!.id); // the old key: 50000 broadcast, 50001 unsent
    for (let i = 0; i < 5; i++) await store.markBroadcast((await add(fresh, i, 0)).id); // the new key: 0..4 broadcast
    const listed = await store.openOutbox([old, fresh], 4);
    expect(listed.map((r) => [r.signer, r.nonce, r.state])).toEqual([
      [old, "50001", "signed"],
      [fresh, "0", "broadcast"],
      [old, "50000", "broadcast"],
      [fresh, "1", "broadcast"],
    ]);
    // Listed without their bytes; the reconciler reads in full only the rows it acts on, while still open.
    expect(listed.every((r) => !("raw_tx" in r) && !("raw_txs" in r) && !("data" in r) && r.hashes.length === 1)).toBe(true);
    const full = await store.openTransaction(listed[0]!.id);
    const raw = `0x${(50_001).toString(16)}`;
    expect(full).toMatchObject({ id: listed[0]!.id, hash: listed[0]!.hash, raw_tx: raw, raw_txs: [raw], data: "0x" });
    await store.markMined(listed[0]!.id, listed[0]!.hash, true);
    expect(await store.openTransaction(listed[0]!.id)).toBeUndefined();
  });
});
