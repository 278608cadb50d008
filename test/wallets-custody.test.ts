// Key custody: envelope encryption (per-wallet data key under a master key), no plaintext key at
// rest (database files and rows searched for the key bytes), in logs or metrics; a wrong master key
// cannot decrypt; master key rotation re-wraps every data key while the service keeps signing.
import { afterEach, describe, expect, it } from "vitest";
import { randomBytes } from "node:crypto";
import { readdir, readFile, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { bytesToHex, keccak256, recoverAddress, type Address } from "viem";
import { privateKeyToAccount } from "viem/accounts";
import { openDatabase } from "../services/platform/storage.ts";
import { CustodyError, createSealedKey, rewrapSealedKey, signDigest, withPrivateKey, type SealedKey } from "../services/wallets/custody.ts";
import { KeyringError, masterKeyFrom, parseKeyring } from "../services/wallets/keyring.ts";
import { apiKeyIdOf, digestOf, matchesDigest, newApiKey } from "../services/wallets/credentials.ts";
import {
  ADMIN_TOKEN,
  DATABASE_URL,
  ENGINES,
  call,
  createPlatform,
  createWallet,
  errorCode,
  masterKeyLine,
  signerOfPayment,
  paymentRequired,
  startTestWallets,
  track,
  type TestWallets,
} from "./helpers/wallets.ts";

const POLICY = { assets: [{ network: "eip155:8453", asset: "USDC", maxPerPayment: "1000000" }] };

async function pay(w: { url: string }, apiKey: string, walletId: string) {
  return call<{ paymentSignature: string; record: { id: string } }>(w.url, apiKey, "POST", `/v1/wallets/${walletId}/pay`, { paymentRequired: paymentRequired() });
}

async function filesUnder(dir: string): Promise<string[]> {
  const out: string[] = [];
  for (const e of await readdir(dir, { withFileTypes: true })) {
    const p = join(dir, e.name);
    if (e.isDirectory()) out.push(...(await filesUnder(p)));
    else if (e.isFile()) out.push(p);
  }
  return out;
}

const WALLET_TABLES = ["wallet_platforms", "wallet_api_keys", "wallet_master_keys", "wallets", "wallet_keys", "wallet_policy_audit", "wallet_signatures"];

describe("envelope encryption", () => {
  const k1 = masterKeyFrom(randomBytes(32), "k1");
  const k2 = masterKeyFrom(randomBytes(32), "k2");

  const open = (walletId: string, address: Address, sealed: SealedKey, key = k1) => withPrivateKey(walletId, address, sealed, key, (pk) => Buffer.from(pk));

  it("seals a fresh key under a per-wallet data key; only the right master key, wallet and address open it", () => {
    const { address, sealed } = createSealedKey("wal_a", k1);
    const { sealed: other } = createSealedKey("wal_a", k1);
    expect(sealed.masterKeyId).toBe("k1");
    expect(Buffer.from(sealed.wrappedDataKey).equals(Buffer.from(other.wrappedDataKey))).toBe(false); // a data key per wallet
    const pk = open("wal_a", address, sealed);
    expect(privateKeyToAccount(bytesToHex(pk)).address).toBe(address);
    expect(Buffer.from(sealed.encryptedKey).includes(pk)).toBe(false);
    expect(Buffer.from(sealed.wrappedDataKey).includes(pk)).toBe(false);

    // a wrong master key under the same id, another id, another wallet's row, a flipped bit: all refused
    expect(() => open("wal_a", address, sealed, masterKeyFrom(randomBytes(32), "k1"))).toThrow(CustodyError);
    expect(() => open("wal_a", address, sealed, k2)).toThrow(CustodyError);
    expect(() => open("wal_b", address, sealed)).toThrow(CustodyError);
    expect(() => open("wal_a", privateKeyToAccount(bytesToHex(randomBytes(32))).address, sealed)).toThrow(CustodyError);
    const tampered = Buffer.from(sealed.encryptedKey);
    tampered[tampered.length - 1]! ^= 1;
    expect(() => open("wal_a", address, { ...sealed, encryptedKey: tampered })).toThrow(CustodyError);
    // the error names neither key
    try {
      open("wal_a", address, sealed, masterKeyFrom(randomBytes(32), "k1"));
    } catch (e) {
      expect((e as Error).message).not.toContain(pk.toString("hex"));
    }
  });

  it("re-wraps the data key under a new master key; the private key's ciphertext is unchanged", () => {
    const { address, sealed } = createSealedKey("wal_r", k1);
    const before = open("wal_r", address, sealed);
    const rewrapped = rewrapSealedKey("wal_r", sealed, k1, k2);
    expect(rewrapped.masterKeyId).toBe("k2");
    expect(Buffer.from(rewrapped.encryptedKey).equals(Buffer.from(sealed.encryptedKey))).toBe(true);
    expect(open("wal_r", address, rewrapped, k2).equals(before)).toBe(true);
    expect(() => open("wal_r", address, rewrapped, k1)).toThrow(CustodyError);
  });

  it("signs digests that recover to the wallet's address", async () => {
    const { address, sealed } = createSealedKey("wal_s", k1);
    const digest = keccak256(randomBytes(40));
    const signature = withPrivateKey("wal_s", address, sealed, k1, (pk) => signDigest(pk, digest));
    expect(await recoverAddress({ hash: digest, signature })).toBe(address);
  });
});

describe("master key file", () => {
  it("reads id:hex, id:base64 and bare keys, the first line primary; refuses bad lines without quoting them", () => {
    const hex = randomBytes(32).toString("hex");
    const b64 = randomBytes(32).toString("base64");
    const bare = randomBytes(32).toString("hex");
    const ring = parseKeyring(`# comment\n\nnew:${hex}\nold:0x${randomBytes(32).toString("hex")}\nb:${b64}\n${bare}\n`);
    expect(ring.primary.id).toBe("new");
    expect([...ring.keys.keys()].slice(0, 3)).toEqual(["new", "old", "b"]);
    expect([...ring.keys.keys()][3]).toMatch(/^mk-[0-9a-f]{12}$/);
    const short = randomBytes(16).toString("hex");
    expect(() => parseKeyring(`k:${short}`)).toThrow(KeyringError);
    try {
      parseKeyring(`k:${short}`);
    } catch (e) {
      expect((e as Error).message).not.toContain(short);
      expect((e as Error).message).toMatch(/line 1/);
    }
    expect(() => parseKeyring(`a:${hex}\na:${randomBytes(32).toString("hex")}`)).toThrow(/twice/);
    expect(() => parseKeyring(`a:${hex}\nb:${hex}`)).toThrow(/twice/);
    expect(() => parseKeyring("# nothing\n")).toThrow(/no master key/);
    expect(() => parseKeyring(`bad id!:${hex}`)).toThrow(/key id/);
  });
});

describe("API credentials", () => {
  it("are stored as digests and compared in constant time", () => {
    const k = newApiKey();
    expect(k.token).toMatch(/^x402w_[0-9a-f]{16}_[A-Za-z0-9_-]{43}$/);
    expect(apiKeyIdOf(k.token)).toBe(k.id);
    expect(k.digest).toBe(digestOf(k.token));
    expect(k.digest).not.toContain(k.token.slice("x402w_".length + 17)); // the secret (base64url may contain "_")
    expect(matchesDigest(k.token, k.digest)).toBe(true);
    expect(matchesDigest(`${k.token.slice(0, -1)}${k.token.endsWith("A") ? "B" : "A"}`, k.digest)).toBe(false);
    expect(matchesDigest(k.token, "not-a-digest")).toBe(false);
    expect(apiKeyIdOf("x402w_short")).toBeUndefined();
  });
});

describe.each(ENGINES)("custody in the service (%s engine)", (engine) => {
  let w: TestWallets | undefined;
  afterEach(async () => {
    await w?.stop();
    w = undefined;
  });

  it("no plaintext key in the database files, rows, logs or metrics (searched for the key bytes, raw and hex)", async () => {
    w = await startTestWallets(engine);
    const { apiKey } = await createPlatform(w);
    const wallets = await Promise.all([0, 1, 2].map(() => createWallet(w!, apiKey, { policy: POLICY })));
    for (const wallet of wallets) expect((await pay(w, apiKey, wallet.id)).status).toBe(200);
    const metrics = await (await fetch(`${w.adminUrl}/metrics`)).text();
    expect(metrics).toMatch(/x402_wallet_payments_total\{[^}]*result="signed"[^}]*\} 3/);
    await w.close();

    // Open the keys as the service would (the test holds the master key file), then search for them.
    const ring = parseKeyring(await readFile(w.keyFile, "utf8"));
    const db = await openDatabase(engine === "postgres" ? { url: DATABASE_URL } : { dataDir: w.dataDir });
    const keys: Buffer[] = [];
    const rowText: string[] = [];
    try {
      for (const wallet of wallets) {
        const [row] = await db.query<{ master_key_id: string; wrapped_data_key: Uint8Array; encrypted_key: Uint8Array }>(
          "SELECT master_key_id, wrapped_data_key, encrypted_key FROM wallet_keys WHERE wallet_id = $1",
          [wallet.id],
        );
        const sealed = { masterKeyId: row!.master_key_id, wrappedDataKey: row!.wrapped_data_key, encryptedKey: row!.encrypted_key };
        const pk = withPrivateKey(wallet.id, wallet.address, sealed, ring.keys.get(row!.master_key_id)!, (k) => Buffer.from(k));
        expect(privateKeyToAccount(bytesToHex(pk)).address).toBe(wallet.address);
        keys.push(pk);
      }
      for (const table of WALLET_TABLES) {
        for (const r of await db.query<{ t: string }>(`SELECT row_to_json(x)::text AS t FROM ${table} x`)) rowText.push(r.t);
      }
    } finally {
      await db.close();
    }
    const rows = rowText.join("\n").toLowerCase();
    expect(rows).toContain(wallets[0]!.id); // the search covers our rows
    const files = engine === "embedded" ? await Promise.all((await filesUnder(w.dataDir!)).map((f) => readFile(f))) : [];
    if (engine === "embedded") expect(files.length).toBeGreaterThan(10);
    const logs = w.logs();
    expect(logs).toContain("wallets listening");
    for (const pk of keys) {
      const hex = pk.toString("hex");
      expect(rows).not.toContain(hex);
      expect(logs.toLowerCase()).not.toContain(hex);
      expect(metrics.toLowerCase()).not.toContain(hex);
      for (const f of files) {
        expect(f.includes(pk)).toBe(false);
        expect(f.includes(Buffer.from(hex))).toBe(false);
        expect(f.includes(Buffer.from(hex.toUpperCase()))).toBe(false);
        expect(f.includes(Buffer.from(pk.toString("base64")))).toBe(false);
      }
    }
    // nor the master key, anywhere
    const masterHex = (await readFile(w.keyFile, "utf8")).split(":")[1]!.trim();
    expect(rows).not.toContain(masterHex);
    expect(logs).not.toContain(masterHex);
    for (const f of files) expect(f.includes(Buffer.from(masterHex, "hex"))).toBe(false);
  });

  it("a wrong master key cannot decrypt: refused at start under a known id, and nothing is signed under an unknown one", async () => {
    const first = await startTestWallets(engine);
    w = first;
    const { apiKey } = await createPlatform(w);
    const wallet = await createWallet(w, apiKey, { policy: POLICY });
    expect((await pay(w, apiKey, wallet.id)).status).toBe(200);
    await w.close();

    // the same id, other key material: the fingerprint on record refuses it before anything is served
    await writeFile(w.keyFile, `${first.masterKeyId}:${randomBytes(32).toString("hex")}\n`);
    await expect(w.restart()).rejects.toThrow(/fingerprint mismatch\): wrong master key file/);

    // another key only: the service runs, this wallet cannot sign (503, nothing recorded), new wallets can
    const other = masterKeyLine("other");
    track(w, { masterKeyIds: [other.id] });
    await writeFile(w.keyFile, `${other.line}\n`);
    w = await w.restart();
    const restarted = w;
    {
      const r = await pay(restarted, apiKey, wallet.id);
      expect(r.status).toBe(503);
      expect(errorCode(r)).toBe("master_key_unavailable");
      expect(JSON.stringify(r.json)).toContain(first.masterKeyId);
      const sigs = await call<{ signatures: unknown[] }>(restarted.url, apiKey, "GET", `/v1/wallets/${wallet.id}/signatures`);
      expect(sigs.json.signatures).toHaveLength(1);
      const status = await call<{ unreadable: number; primary: string }>(restarted.url, ADMIN_TOKEN, "GET", "/v1/admin/master-keys");
      expect(status.json.primary).toBe(other.id);
      expect(status.json.unreadable).toBeGreaterThanOrEqual(1);
      const fresh = await createWallet(restarted, apiKey, { policy: POLICY });
      expect((await pay(restarted, apiKey, fresh.id)).status).toBe(200);
    }
  });

  it("master key rotation keeps every wallet usable: live re-wrap while paying, then the old key removed", async () => {
    const first = await startTestWallets(engine);
    w = first;
    const oldId = first.masterKeyId;
    const { apiKey } = await createPlatform(w);
    const wallets = await Promise.all([0, 1, 2, 3, 4].map(() => createWallet(w!, apiKey, { policy: POLICY })));
    const countsOf = async (svc: { url: string }) => (await call<{ dataKeys: Record<string, number> }>(svc.url, ADMIN_TOKEN, "GET", "/v1/admin/master-keys")).json.dataKeys;
    expect((await countsOf(w))[oldId]).toBe(5);
    await w.close(); // the embedded engine has one user at a time: read the rows while the service is down
    const db0 = await snapshotKeys(w, wallets.map((x) => x.id));
    w = await w.restart();
    const svc = w;

    // Payments keep going during the rotation; none may fail.
    let paying = true;
    const failures: string[] = [];
    let paid = 0;
    const loop = (async () => {
      while (paying) {
        for (const wallet of wallets) {
          const r = await pay(svc, apiKey, wallet.id);
          if (r.status === 200) paid++;
          else failures.push(JSON.stringify(r.json));
        }
      }
    })();

    // The operator puts a new primary first and keeps the old key; the service notices the file.
    const next = masterKeyLine("next");
    track(w, { masterKeyIds: [next.id] });
    const oldLine = (await readFile(w.keyFile, "utf8")).trim();
    await writeFile(w.keyFile, `${next.line}\n${oldLine}\n`);
    const deadline = Date.now() + 20_000;
    for (;;) {
      const counts = await countsOf(svc);
      if (!counts[oldId] && counts[next.id] === 5) break;
      if (Date.now() > deadline) throw new Error(`not re-wrapped: ${JSON.stringify(counts)}`);
      await new Promise((r) => setTimeout(r, 100));
    }
    const created = await createWallet(svc, apiKey, { policy: POLICY }); // new wallets under the new primary
    await new Promise((r) => setTimeout(r, 200));
    paying = false;
    await loop;
    expect(failures).toEqual([]);
    expect(paid).toBeGreaterThan(5);
    // an explicit rotate is idempotent
    const again = await call<{ rewrapped: number; primary: string }>(svc.url, ADMIN_TOKEN, "POST", "/v1/admin/master-keys/rotate");
    expect(again.json).toMatchObject({ primary: next.id, rewrapped: 0 });
    await svc.close();

    const db1 = await snapshotKeys(w, wallets.map((x) => x.id));
    for (const id of Object.keys(db0)) {
      expect(db1[id]!.masterKeyId).toBe(next.id);
      expect(db1[id]!.encryptedKey).toBe(db0[id]!.encryptedKey); // the private key's ciphertext never changes
      expect(db1[id]!.wrapped).not.toBe(db0[id]!.wrapped);
    }

    // The old key leaves the file: every wallet still signs, as itself.
    await writeFile(w.keyFile, `${next.line}\n`);
    w = await w.restart();
    for (const wallet of [...wallets, created]) {
      const r = await pay(w, apiKey, wallet.id);
      expect(r.status, JSON.stringify(r.json)).toBe(200);
      expect(await signerOfPayment(r.json.paymentSignature)).toBe(wallet.address);
    }
  });
});

async function snapshotKeys(w: TestWallets, ids: string[]): Promise<Record<string, { masterKeyId: string; wrapped: string; encryptedKey: string }>> {
  const db = await openDatabase(w.engine === "postgres" ? { url: DATABASE_URL } : { dataDir: w.dataDir });
  try {
    const rows = await db.query<{ wallet_id: string; master_key_id: string; wrapped_data_key: Uint8Array; encrypted_key: Uint8Array }>(
      "SELECT wallet_id, master_key_id, wrapped_data_key, encrypted_key FROM wallet_keys WHERE wallet_id = ANY($1::text[])",
      [ids],
    );
    return Object.fromEntries(rows.map((r) => [r.wallet_id, { masterKeyId: r.master_key_id, wrapped: bytesToHex(r.wrapped_data_key), encryptedKey: bytesToHex(r.encrypted_key) }]));
  } finally {
    await db.close();
  }
}
