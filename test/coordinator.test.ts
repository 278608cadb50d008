// The exactly-once coordinator's bookkeeping without a chain: refusals and crashes before any
// transaction release the claim (a retry is judged afresh), a recorded outcome is final.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { PaymentPayload, PaymentRequirements, SettleResponse } from "@x402/core/types";
import { openDatabase, migrate, type Database } from "../services/platform/storage.ts";
import { SETTLEMENT_MIGRATIONS, createSettlementStore } from "../services/facilitator/settlement/store.ts";
import { createSettlementCoordinator } from "../services/facilitator/settlement/coordinator.ts";
import { settlementContext } from "../services/facilitator/settlement/context.ts";
import type { ChainClient } from "../services/facilitator/chain.ts";

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
