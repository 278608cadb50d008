// An idle facilitator does not poll its store: on the embedded engine (this process its only
// writer) the reconciler stops its passes once a pass found nothing open or watched, and starts
// again as soon as a transaction is stored. With a shared PostgreSQL other replicas add rows, so
// the passes go on. Passes are counted by the store's query for open transactions.
import { afterEach, describe, expect, it } from "vitest";
import { pino } from "pino";
import { join } from "node:path";
import { ENGINES, DATABASE_URL, startRig, type Rig } from "./helpers/settlement-rig.ts";
import { balanceOf } from "./helpers/chain.ts";
import { postJson } from "./helpers/payments.ts";
import { openDatabase, type Database } from "../services/platform/storage.ts";
import { resolveFacilitatorConfig } from "../services/facilitator/config.ts";
import { startFacilitatorService, type RunningFacilitator } from "../services/facilitator/service.ts";

let rig: Rig | undefined;
let facilitator: RunningFacilitator | undefined;
let db: Database | undefined;
afterEach(async () => {
  await facilitator?.close();
  await db?.close();
  await rig?.stop();
  rig = facilitator = db = undefined;
});

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** The database, with the reconciler's query for open transactions (one per pass) counted. */
function countingPasses(inner: Database): { db: Database; passes: () => number } {
  let passes = 0;
  const db = new Proxy(inner, {
    get(target, prop) {
      if (prop === "query") {
        return (sql: string, params?: unknown[]) => {
          if (sql.includes("PARTITION BY signer")) passes++;
          return target.query(sql, params);
        };
      }
      const value = Reflect.get(target, prop) as unknown;
      return typeof value === "function" ? (value as (...a: unknown[]) => unknown).bind(target) : value;
    },
  });
  return { db, passes: () => passes };
}

describe.each(ENGINES)("reconciler while idle (%s store)", (engine) => {
  it(engine === "embedded" ? "stops passing over an empty store, and passes again once a transaction is stored" : "keeps passing: other replicas add transactions", async () => {
    rig = await startRig({ engine });
    const counted = countingPasses((db = await openDatabase(engine === "postgres" ? { url: DATABASE_URL } : { dataDir: join(rig.dir, "db") })));
    const config = resolveFacilitatorConfig({ network: rig.network, rpcUrls: [rig.anvil.rpcUrl], signerKeyFile: rig.keyFile, port: 0, policy: { minBlockIntervalMs: 0 } });
    facilitator = await startFacilitatorService(config, pino({ level: "silent" }), { db: counted.db });
    // The first pass counts every gauge; from then on an empty store is quiet.
    await sleep(2500);
    const before = counted.passes();
    await sleep(3000);
    const idle = counted.passes() - before;
    if (engine === "postgres") {
      expect(idle).toBeGreaterThanOrEqual(2);
      return;
    }
    expect(before).toBeGreaterThanOrEqual(1);
    expect(idle).toBe(0);

    // A payment stores a transaction: the passes resume (and the payment moves money, judged on-chain).
    const answer = await postJson(`${facilitator.url}/settle`, await rig.payment(700n));
    expect(answer.json.success).toBe(true);
    expect(await balanceOf(rig.anvil.rpcUrl, rig.usdc.address, rig.receiver)).toBe(700n);
    const stored = counted.passes();
    await sleep(2500);
    expect(counted.passes() - stored).toBeGreaterThanOrEqual(1);
  });
});
