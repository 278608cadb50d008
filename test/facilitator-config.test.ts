// Facilitator configuration that changes what is accepted: the asset allow-list (X402_ASSETS,
// set by the operator from spec.assets) and the signer sources.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { writeFile } from "node:fs/promises";
import { join } from "node:path";
import { mnemonicToAccount } from "viem/accounts";
import { startRig, type Rig } from "./helpers/settlement-rig.ts";
import { postJson } from "./helpers/payments.ts";
import { facilitatorConfigFromEnv, resolveFacilitatorConfig } from "../services/facilitator/config.ts";

let rig: Rig;
beforeAll(async () => {
  rig = await startRig();
});
afterAll(() => rig?.stop());

describe("asset allow-list", () => {
  it("refuses an asset outside X402_ASSETS with 400 unsupported_asset, accepts one inside", async () => {
    const other = "0x1111111111111111111111111111111111111111";
    const env = facilitatorConfigFromEnv({ X402_ASSETS: `${other}, ${rig.usdc.address.toLowerCase()}` });
    const onlyOther = await rig.facilitator({ allowedAssets: [other] });
    const body = await rig.payment(10n);
    const refused = await postJson(`${onlyOther.url}/verify`, body);
    expect(refused.status).toBe(400);
    expect(refused.json.error).toMatch(/^unsupported_asset: 0x[0-9a-fA-F]{40} is not accepted on eip155:8453; accepted assets: 0x1111111111111111111111111111111111111111$/);
    const both = await rig.facilitator({ allowedAssets: env.allowedAssets });
    expect((await postJson(`${both.url}/verify`, body)).json.isValid).toBe(true);
  });
});

describe("signer sources", () => {
  it("derives keys from a BIP-39 mnemonic file without echoing it on error", async () => {
    const mnemonic = "test test test test test test test test test test test junk";
    const file = join(rig.dir, "mnemonic");
    await writeFile(file, `${mnemonic}\n`);
    const c = resolveFacilitatorConfig({ network: "eip155:8453", rpcUrls: [rig.anvil.rpcUrl], signerMnemonicFile: file, signerCount: 3 });
    expect(c.signerKeys).toHaveLength(3);
    expect(c.uptoFacilitatorAddress).toBe(mnemonicToAccount(mnemonic, { addressIndex: 0 }).address);
    await writeFile(file, "not a valid mnemonic phrase at all\n");
    expect(() => resolveFacilitatorConfig({ network: "eip155:8453", rpcUrls: [rig.anvil.rpcUrl], signerMnemonicFile: file })).toThrow(/^signer mnemonic file: not a valid BIP-39 mnemonic$/);
  });

  it("refuses an upto facilitator address that is not one of the keys", () => {
    expect(() => resolveFacilitatorConfig({ network: "eip155:8453", rpcUrls: [rig.anvil.rpcUrl], signerKeyFile: rig.keyFile, uptoFacilitatorAddress: "0x1111111111111111111111111111111111111111" })).toThrow(/is not one of the signer keys/);
  });

  it("batches RPC reads by X402_RPC_MAX_BATCH (10 by default), refusing a size that is not 1 to 1000 by name", () => {
    const base = { network: "eip155:8453", rpcUrls: [rig.anvil.rpcUrl], signerKeyFile: rig.keyFile };
    expect(resolveFacilitatorConfig(base).rpcMaxBatch).toBe(10);
    expect(resolveFacilitatorConfig(base, facilitatorConfigFromEnv({ X402_RPC_MAX_BATCH: "1" })).rpcMaxBatch).toBe(1);
    expect(() => resolveFacilitatorConfig(base, facilitatorConfigFromEnv({ X402_RPC_MAX_BATCH: "0" }))).toThrow(/rpcMaxBatch/);
    expect(() => facilitatorConfigFromEnv({ X402_RPC_MAX_BATCH: "ten" })).toThrow(/X402_RPC_MAX_BATCH/);
  });
});
