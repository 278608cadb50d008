// The exactly-once coordinator's bookkeeping without a chain: refusals and crashes before any
// transaction release the claim (a retry is judged afresh), a recorded outcome is final.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { PaymentPayload, PaymentRequirements, SettleResponse } from "@x402/core/types";
import { openDatabase, migrate, type Database } from "../services/platform/storage.ts";
import { SETTLEMENT_MIGRATIONS, createSettlementStore } from "../services/facilitator/settlement/store.ts";
import { createSettlementCoordinator } from "../services/facilitator/settlement/coordinator.ts";
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
