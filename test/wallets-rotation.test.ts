// Master key rotation across replicas: two wallet services share one database (PostgreSQL when
// DATABASE_URL is set, the embedded engine otherwise). Replica A rotates to a new key while
// replica B has not seen the new file yet and keeps creating wallets under the old one. The old
// key is retired (safe to drop) only once every data key is re-wrapped and no live replica wraps
// under it; a wallet created on B during the rotation stays decryptable after the old key is
// gone; and once retired, no replica can wrap a new wallet under the old key again.
import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { openDatabase, type Database } from "../services/platform/storage.ts";
import { ADMIN_TOKEN, ENGINES, call, createPlatform, createWallet, errorCode, masterKeyLine, paymentRequired, signerOfPayment, startTestWallets, track, type TestWallets } from "./helpers/wallets.ts";

const POLICY = { assets: [{ network: "eip155:8453", asset: "USDC", maxPerPayment: "1000000" }] };

interface Status {
  primary: string;
  dataKeys: Record<string, number>;
  retired: string[];
  retiring: string[];
}

const status = async (w: { url: string }) => (await call<Status>(w.url, ADMIN_TOKEN, "GET", "/v1/admin/master-keys")).json;
const pay = (w: { url: string }, apiKey: string, walletId: string) =>
  call<{ paymentSignature: string }>(w.url, apiKey, "POST", `/v1/wallets/${walletId}/pay`, { paymentRequired: paymentRequired() });

async function until<T>(what: string, probe: () => Promise<T | undefined>, ms = 20_000): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = await probe();
    if (v !== undefined) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

describe.each(ENGINES)("master key rotation with two replicas on one %s database", (engine) => {
  const running: TestWallets[] = [];
  let shared: { db: Database; dir: string } | undefined;

  afterEach(async () => {
    for (const w of running.splice(0).reverse()) await w.stop().catch(() => undefined);
    if (shared) {
      await shared.db.close();
      await rm(shared.dir, { recursive: true, force: true });
      shared = undefined;
    }
  });

  /** A replica with its own master key file; on the embedded engine all replicas share one engine instance. */
  const replica = async (keyLines: string[]) => {
    const w = await startTestWallets(engine, {
      keyLines,
      ...(shared ? { db: shared.db } : {}),
      // Beats far apart: the test drives rotation itself, and a beat stays live for the whole test.
      replicaHeartbeatMs: 120_000,
    });
    running.push(w);
    return w;
  };

  it("a wallet created on B during A's rotation stays decryptable; the old key retires only when safe, then nothing wraps under it", async () => {
    if (engine === "embedded") {
      const dir = await mkdtemp(join(tmpdir(), "x402-wallets-shared-"));
      shared = { db: await openDatabase({ dataDir: dir }), dir };
    }
    const old = masterKeyLine("old");
    const next = masterKeyLine("next");
    const a = await replica([old.line]);
    const b = await replica([old.line]);
    track(a, { masterKeyIds: [old.id, next.id] });
    const { apiKey } = await createPlatform(a);
    const before = await createWallet(a, apiKey, { policy: POLICY });

    // A gets the new file and rotates; B has not seen it yet.
    await writeFile(a.keyFile, `${next.line}\n${old.line}\n`);
    const first = await a.rotate();
    expect(first.primary).toBe(next.id);
    expect((await status(a)).dataKeys[old.id] ?? 0).toBe(0); // every data key re-wrapped: the old signal said "safe to drop"...
    expect(first.retired).not.toContain(old.id); // ...but B still wraps under the old key
    expect(first.pending[old.id]).toMatchObject({ dataKeys: 0 });
    expect(first.pending[old.id]!.replicas).toHaveLength(1);
    expect((await status(a)).retiring).toContain(old.id);

    // B creates a wallet under the old key, mid-rotation.
    const during = await createWallet(b, apiKey, { policy: POLICY });
    expect((await status(a)).dataKeys[old.id]).toBe(1);
    expect((await a.rotate()).retired).not.toContain(old.id);

    // B's Secret volume catches up: it moves to the new primary (polled file) and re-wraps what is left.
    await writeFile(b.keyFile, `${next.line}\n${old.line}\n`);
    await until("B on the new primary", async () => ((await status(b)).primary === next.id ? true : undefined));
    const done = await until("the old key retired", async () => {
      const r = await a.rotate();
      return r.retired.includes(old.id) ? r : undefined;
    });
    expect(done.pending).toEqual({});
    const s = await status(a);
    expect(s.retired).toContain(old.id);
    expect(s.dataKeys[old.id] ?? 0).toBe(0);
    expect(s.dataKeys[next.id]).toBe(2);

    // A replica that never saw the new file cannot wrap under the retired key any more.
    const stale = await replica([old.line]);
    const refused = await call(stale.url, apiKey, "POST", "/v1/wallets", { policy: POLICY });
    expect(refused.status).toBe(503);
    expect(errorCode(refused)).toBe("master_key_unavailable");
    expect((await status(a)).dataKeys[old.id] ?? 0).toBe(0);

    // The old key leaves every file: both wallets still sign, as themselves.
    await stale.close();
    await b.close();
    await writeFile(a.keyFile, `${next.line}\n`);
    await a.close();
    const after = await a.restart();
    running.push(after);
    for (const w of [before, during]) {
      const r = await pay(after, apiKey, w.id);
      expect(r.status, JSON.stringify(r.json)).toBe(200);
      expect(await signerOfPayment(r.json.paymentSignature)).toBe(w.address);
    }
  });
});
