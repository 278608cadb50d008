// Screening, judged on chain: a facilitator with a deny-list file refuses a denied payer (and a
// denied payee) at /verify and at /settle with a clear reason, and sends nothing (its signer's nonce
// and the receiver's balance stay); the file is edited while it runs and the change applies
// without a restart; a broken edit keeps the last good list. An external screening service is
// asked within a time budget: its refusals are the same refusals, and when it does not answer a
// fail-closed facilitator refuses (503, nothing sent) while a fail-open one lets the payment through.
// Its verdicts answer only the question they were asked, unless the service vouches for a wider
// scope: a small verify's allow never lets a large settle of the same pair through unasked.
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createPublicClient, createTestClient, http, type Address } from "viem";
import { generatePrivateKey, privateKeyToAccount } from "viem/accounts";
import { pino } from "pino";
import { startTestDevnet } from "./helpers/devnet.ts";
import { balanceOf } from "./helpers/chain.ts";
import { postJson, serviceShape, signEip3009 } from "./helpers/payments.ts";
import { until } from "./helpers/cluster.ts";
import type { RunningDevnet } from "../services/devnet/devnet.ts";
import { resolveFacilitatorConfig } from "../services/facilitator/config.ts";
import { startFacilitatorService, type RunningFacilitator } from "../services/facilitator/service.ts";
import { parseDenyList } from "../services/facilitator/screening.ts";

let devnet: RunningDevnet & { dir: string };
let facilitator: RunningFacilitator;
let signer: Address;
let dir: string;
let listFile: string;

beforeAll(async () => {
  devnet = await startTestDevnet(["eip155:8453"], { hub: false, wallets: false });
  dir = mkdtempSync(join(tmpdir(), "x402-screening-"));
  listFile = join(dir, "deny-list.txt");
  writeFileSync(listFile, `# sanctioned\n${devnet.info.payers[1]!.address}\n`);
  const n = devnet.info.networks[0]!;
  const key = generatePrivateKey();
  signer = privateKeyToAccount(key).address;
  await createTestClient({ mode: "anvil", transport: http(n.rpcUrl) }).setBalance({ address: signer, value: 10n ** 21n });
  const config = resolveFacilitatorConfig({ network: n.network, rpcUrls: [n.facilitatorRpcUrl], signerKeys: [key], assets: n.assets, confirmations: 1, port: 0, schemes: ["exact"], denyListFile: listFile, dataDir: join(dir, "store") });
  facilitator = await startFacilitatorService(config, pino({ level: "silent" }));
});

afterAll(async () => {
  await facilitator?.close();
  await devnet?.stop();
  rmSync(dir, { recursive: true, force: true });
});

async function payment(payer: 0 | 1, amount: bigint) {
  const n = devnet.info.networks[0]!;
  const spec = { network: n.network, chainId: n.chainId, asset: n.assets.find((a) => a.transferMethods.includes("eip3009"))!, payerKey: devnet.info.payers[payer]!.privateKey, payTo: devnet.info.receivers[0]!.address, amount };
  return serviceShape(spec, await signEip3009(spec));
}

async function chainState() {
  const n = devnet.info.networks[0]!;
  const usdc = n.assets.find((a) => a.transferMethods.includes("eip3009"))!;
  return { received: await balanceOf(n.rpcUrl, usdc.address, devnet.info.receivers[0]!.address), nonce: await createPublicClient({ transport: http(n.rpcUrl) }).getTransactionCount({ address: signer }) };
}

describe("the deny-list", () => {
  it("refuses a denied payer at verify and at settle, and sends nothing", async () => {
    const denied = devnet.info.payers[1]!.address;
    const before = await chainState();
    const body = await payment(1, 5000n);
    const verify = await postJson(`${facilitator.url}/verify`, body);
    expect(verify.json).toEqual({ isValid: false, invalidReason: "payer_denied", invalidMessage: `the payer ${denied} is on this facilitator's deny-list`, payer: denied });
    const settle = await postJson(`${facilitator.url}/settle`, body);
    expect(settle.json).toMatchObject({ success: false, errorReason: "payer_denied", transaction: "" });
    expect(await chainState()).toEqual(before);
    // another payer is served
    expect((await postJson(`${facilitator.url}/settle`, await payment(0, 5000n))).json).toMatchObject({ success: true });
    const after = await chainState();
    expect(after).toEqual({ received: before.received + 5000n, nonce: before.nonce + 1 });
  });

  it("applies an edited file without a restart: a denied payee; a broken edit keeps the last good list", async () => {
    const payee = devnet.info.receivers[0]!.address;
    writeFileSync(listFile, `${payee.toLowerCase()}  # a payee, any case\n`);
    const body = await payment(0, 6000n);
    const refused = await until(async () => {
      const r = await postJson(`${facilitator.url}/verify`, body);
      return r.json.invalidReason === "payee_denied" ? r.json : undefined;
    }, "the edited list in force", 10_000);
    expect(refused.invalidMessage).toBe(`the payee ${payee} is on this facilitator's deny-list`);
    // payer 1 is no longer listed (the payer is checked first): only the payee refuses its payment now
    expect((await postJson(`${facilitator.url}/verify`, await payment(1, 6000n))).json.invalidReason).toBe("payee_denied");
    const before = await chainState();
    expect((await postJson(`${facilitator.url}/settle`, body)).json).toMatchObject({ success: false, errorReason: "payee_denied" });
    writeFileSync(listFile, "not an address\n");
    await new Promise((r) => setTimeout(r, 2500)); // two polls of the file
    expect((await postJson(`${facilitator.url}/verify`, body)).json.invalidReason).toBe("payee_denied"); // still the last good list
    expect(await chainState()).toEqual(before);
  });

  it("reads addresses in any case with comments, and refuses anything else by line", () => {
    const a = privateKeyToAccount(generatePrivateKey()).address;
    expect([...parseDenyList(`# header\n\n${a.toLowerCase()} # why\n`)]).toEqual([a]);
    expect(() => parseDenyList(`${a}\n0x1234\n`)).toThrow("deny-list line 2 is not a 0x address");
  });
});

describe("an external screening service", () => {
  type Seen = { network: string; scheme: string; asset: string; amount: string; payer: string; payee: string; step: string };
  const seen: Seen[] = [];
  let mode: "judge" | "limit" | "pair" | "slow" | "broken" | "huge" = "judge";
  let hook: Server;
  let hookUrl: string;
  const started: RunningFacilitator[] = [];

  beforeAll(async () => {
    hook = createServer((req, res) => {
      let text = "";
      req.on("data", (c) => (text += c));
      req.on("end", () => {
        const body = JSON.parse(text) as Seen;
        seen.push(body);
        if (mode === "broken") return void res.writeHead(500).end("oops");
        if (mode === "huge") return void res.writeHead(200, { "content-type": "application/json" }).end(`{"allow":true,"pad":"${"x".repeat(1_000_000)}"}`);
        // A risk rule: payments up to 1,000 pass, larger ones are refused (a verdict about this payment only).
        if (mode === "limit") return void res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify(BigInt(body.amount) <= 1000n ? { allow: true } : { allow: false, denied: "payer", reason: "above the payer's limit" }));
        if (mode === "pair") return void res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ allow: true, scope: "pair" }));
        const answer = () => {
          const denied = body.payer.toLowerCase() === devnet.info.payers[1]!.address.toLowerCase();
          // A sanctions list: a listed payer is refused whatever it pays, and the service says so.
          res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify(denied ? { allow: false, denied: "payer", reason: "on the OFAC list\u0007", scope: "address" } : { allow: true }));
        };
        if (mode === "slow") setTimeout(answer, 3000);
        else answer();
      });
    });
    await new Promise<void>((r) => hook.listen(0, "127.0.0.1", r));
    hookUrl = `http://127.0.0.1:${(hook.address() as AddressInfo).port}/screen`;
  });

  afterAll(async () => {
    for (const f of started) await f.close();
    hook.closeAllConnections();
    await new Promise((r) => hook.close(r));
  });

  /** A facilitator asking the hook, with its own funded key (its nonce says whether anything was sent). */
  async function withHook(failure: "closed" | "open", cacheMs: number) {
    const n = devnet.info.networks[0]!;
    const key = generatePrivateKey();
    const address = privateKeyToAccount(key).address;
    await createTestClient({ mode: "anvil", transport: http(n.rpcUrl) }).setBalance({ address, value: 10n ** 21n });
    const config = resolveFacilitatorConfig({ network: n.network, rpcUrls: [n.facilitatorRpcUrl], signerKeys: [key], assets: n.assets, confirmations: 1, port: 0, schemes: ["exact"], screeningUrl: hookUrl, screeningTimeoutMs: 200, screeningFailure: failure, screeningCacheMs: cacheMs, dataDir: join(dir, `store-${started.length}`) });
    const f = await startFacilitatorService(config, pino({ level: "silent" }));
    started.push(f);
    const state = async () => ({
      received: await balanceOf(n.rpcUrl, n.assets.find((a) => a.transferMethods.includes("eip3009"))!.address, devnet.info.receivers[0]!.address),
      nonce: await createPublicClient({ transport: http(n.rpcUrl) }).getTransactionCount({ address }),
    });
    return { url: f.url, adminUrl: f.adminUrl, state };
  }

  it("its refusal is a refusal at verify and settle (nothing sent); it is told the payment; a refusal of an address is reused for it", async () => {
    writeFileSync(listFile, ""); // the deny-list of the first facilitator plays no part here
    mode = "judge";
    const f = await withHook("closed", 60_000);
    const denied = devnet.info.payers[1]!.address;
    const before = await f.state();
    const body = await payment(1, 7000n);
    const verify = await postJson(`${f.url}/verify`, body);
    expect(verify.json).toEqual({ isValid: false, invalidReason: "payer_denied", invalidMessage: `the payer ${denied} was refused by the screening service: on the OFAC list`, payer: denied });
    expect((await postJson(`${f.url}/settle`, body)).json).toMatchObject({ success: false, errorReason: "payer_denied", transaction: "" });
    expect(await f.state()).toEqual(before);
    const asked = seen.length;
    expect(seen.at(-1)).toEqual({ network: "eip155:8453", scheme: "exact", asset: expect.stringMatching(/^0x/), amount: "7000", payer: denied, payee: devnet.info.receivers[0]!.address, step: "verify" });
    expect(asked).toBe(1); // settle reused the refusal the service said holds for the payer (scope "address")
    const allowed = await postJson(`${f.url}/settle`, await payment(0, 7000n));
    expect(allowed.json).toMatchObject({ success: true });
    expect(await f.state()).toEqual({ received: before.received + 7000n, nonce: before.nonce + 1 });
    expect(seen.at(-1)).toMatchObject({ payer: devnet.info.payers[0]!.address, step: "settle" });
    const metrics = await (await fetch(`${f.adminUrl}/metrics`)).text();
    expect(metrics).toMatch(/^x402_screening_checks_total\{[^}]*source="hook",result="denied"[^}]*\} 2$/m);
  });

  it("a verdict answers only its own question: a small verify's allow never settles a large payment of the same pair", async () => {
    mode = "limit";
    const f = await withHook("closed", 60_000);
    const before = await f.state();
    const asked = seen.length;
    expect((await postJson(`${f.url}/verify`, await payment(0, 1000n))).json).toMatchObject({ isValid: true });
    const big = await postJson(`${f.url}/settle`, await payment(0, 5_000_000n));
    expect(big.json).toMatchObject({ success: false, errorReason: "payer_denied", errorMessage: expect.stringContaining("above the payer's limit"), transaction: "" });
    // Judged on chain: the payee received nothing, the signer sent nothing.
    expect(await f.state()).toEqual(before);
    expect(seen.slice(asked).map((q) => [q.amount, q.step])).toEqual([["1000", "verify"], ["5000000", "settle"]]);
  });

  it("a verdict the service vouches for a pair answers that pair's other payments without asking", async () => {
    mode = "pair";
    const f = await withHook("closed", 60_000);
    const before = await f.state();
    const asked = seen.length;
    expect((await postJson(`${f.url}/verify`, await payment(0, 1000n))).json).toMatchObject({ isValid: true });
    expect((await postJson(`${f.url}/settle`, await payment(0, 2000n))).json).toMatchObject({ success: true });
    expect(await f.state()).toEqual({ received: before.received + 2000n, nonce: before.nonce + 1 });
    expect(seen.length - asked).toBe(1);
  });

  it("no verdict within the budget: fail-closed refuses with 503 and sends nothing; fail-open lets the payment through", async () => {
    mode = "slow";
    const closed = await withHook("closed", 0);
    const before = await closed.state();
    const body = await payment(0, 8000n);
    for (const step of ["verify", "settle"]) {
      const r = await postJson(`${closed.url}/${step}`, body);
      expect(r.status, step).toBe(503);
      expect(r.json.error).toMatch(/^backend_unavailable: the screening service gave no verdict \(no answer within 200 ms\); retry later$/);
      expect(JSON.stringify(r.json)).not.toContain(hookUrl);
    }
    mode = "broken";
    expect((await postJson(`${closed.url}/verify`, body)).json.error).toContain("answered HTTP 500");
    mode = "huge"; // never read whole
    expect((await postJson(`${closed.url}/verify`, body)).json.error).toContain("answered more than 16384 bytes");
    expect(await closed.state()).toEqual(before);

    mode = "slow";
    const open = await withHook("open", 0);
    const paid = await postJson(`${open.url}/settle`, body);
    expect(paid.json).toMatchObject({ success: true });
    expect((await open.state()).received).toBe(before.received + 8000n);
    expect(await (await fetch(`${open.adminUrl}/metrics`)).text()).toMatch(/^x402_screening_checks_total\{[^}]*source="hook",result="unavailable_open"[^}]*\} 1$/m);
  });
});
