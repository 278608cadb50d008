// Screening, judged on chain: a facilitator with a deny-list file refuses a denied payer (and a
// denied payee) at /verify and at /settle with a clear reason, and sends nothing (its signer's nonce
// and the receiver's balance stay); the file is edited while it runs and the change applies
// without a restart; a broken edit keeps the last good list.
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
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
  const config = resolveFacilitatorConfig({ network: n.network, rpcUrls: [n.facilitatorRpcUrl], signerKeys: [key], assets: n.assets, confirmations: 1, port: 0, schemes: ["exact"], denyListFile: listFile });
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
