// Settle-time reverts are decoded with the contracts' ABIs and answered with a reference reason
// code and one clean line (no calldata, no URL): at gas estimation (the payer moved its balance
// away or used its authorization between verify and settle) and on chain (a transfer that
// front-ran the mined settlement). Judged on chain: nothing sent, or a reverted receipt.
import { afterEach, describe, expect, it } from "vitest";
import { parseGwei, type Address, type Hex } from "viem";
import { privateKeyToAccount } from "viem/accounts";
import { eip3009ABI } from "@x402/evm";
import { startRig, type Rig } from "./helpers/settlement-rig.ts";
import { balanceOf } from "./helpers/chain.ts";
import { postJson, serviceShape, signEip3009, signPermit2, type PaymentSpec } from "./helpers/payments.ts";
import { eventually, nonceOf, publicClient, transferToken } from "./helpers/onchain.ts";
import { createWalletClient, defineChain, http, parseSignature } from "viem";

let rig: Rig | undefined;
afterEach(async () => {
  await rig?.stop();
  rig = undefined;
});

/** errorReason a bare code; errorMessage one line with no calldata (hex longer than a hash) and no URL. */
function expectClean(answer: Record<string, unknown>, code: string) {
  expect(answer).toMatchObject({ success: false, errorReason: code });
  const message = String(answer.errorMessage ?? "");
  expect(message).not.toMatch(/0x[0-9a-fA-F]{65,}/);
  expect(message).not.toMatch(/https?:\/\//);
  expect(message).not.toContain("\n");
}

const sink = privateKeyToAccount("0x1111111111111111111111111111111111111111111111111111111111111111").address;

describe("settle-time reverts", () => {
  it("EIP-3009: the payer moved its balance away after verify: insufficient balance, nothing sent", async () => {
    rig = await startRig();
    const f = await rig.facilitator();
    const body = await rig.payment(700n);
    expect((await postJson(`${f.url}/verify`, body)).json).toMatchObject({ isValid: true });
    const payer = privateKeyToAccount(rig.payerKey).address;
    const all = await balanceOf(rig.anvil.rpcUrl, rig.usdc.address, payer);
    await publicClient(rig.anvil.rpcUrl).waitForTransactionReceipt({ hash: await transferToken(rig.anvil.rpcUrl, rig.chainId, rig.payerKey, rig.usdc.address, sink, all), pollingInterval: 50 });
    const answer = (await postJson(`${f.url}/settle`, body)).json;
    expectClean(answer, "invalid_exact_evm_insufficient_balance");
    expect(String(answer.errorMessage)).toMatch(/exceeds balance/);
    expect(answer.transaction).toBe("");
    expect(await nonceOf(rig.anvil.rpcUrl, f.signers[0] as Address, "pending")).toBe(0);
    expect(await balanceOf(rig.anvil.rpcUrl, rig.usdc.address, rig.receiver)).toBe(0n);
  });

  it("EIP-3009: the authorization was used on chain directly: nonce already used, nothing sent", async () => {
    rig = await startRig();
    const f = await rig.facilitator();
    const spec: PaymentSpec = { network: rig.network, chainId: rig.chainId, asset: rig.usdc, payerKey: rig.payerKey, payTo: rig.receiver, amount: 300n };
    const payload = await signEip3009(spec);
    const a = payload.authorization;
    const { v, r, s } = parseSignature(payload.signature as Hex);
    const chain = defineChain({ id: rig.chainId, name: "t", nativeCurrency: { name: "E", symbol: "E", decimals: 18 }, rpcUrls: { default: { http: [rig.anvil.rpcUrl] } } });
    const payerWallet = createWalletClient({ account: privateKeyToAccount(rig.payerKey), chain, transport: http(rig.anvil.rpcUrl) });
    const direct = await payerWallet.writeContract({
      address: rig.usdc.address,
      abi: eip3009ABI,
      functionName: "transferWithAuthorization",
      args: [a.from as Address, a.to as Address, BigInt(a.value), BigInt(a.validAfter), BigInt(a.validBefore), a.nonce as Hex, Number(v), r, s],
    });
    await publicClient(rig.anvil.rpcUrl).waitForTransactionReceipt({ hash: direct, pollingInterval: 50 });
    const answer = (await postJson(`${f.url}/settle`, serviceShape(spec, payload))).json;
    expectClean(answer, "invalid_exact_evm_nonce_already_used");
    expect(await nonceOf(rig.anvil.rpcUrl, f.signers[0] as Address, "pending")).toBe(0);
    expect(await balanceOf(rig.anvil.rpcUrl, rig.usdc.address, rig.receiver)).toBe(300n); // paid once, by the payer's own call
  });

  it("Permit2: the payer moved its balance away: permit2_insufficient_balance as a bare code, nothing sent", async () => {
    rig = await startRig();
    const f = await rig.facilitator();
    const spec: PaymentSpec = { network: rig.network, chainId: rig.chainId, asset: rig.usdc, payerKey: rig.payerKey, payTo: rig.receiver, amount: 400n };
    const body = serviceShape(spec, await signPermit2(spec));
    expect((await postJson(`${f.url}/verify`, body)).json).toMatchObject({ isValid: true });
    const payer = privateKeyToAccount(rig.payerKey).address;
    const all = await balanceOf(rig.anvil.rpcUrl, rig.usdc.address, payer);
    await publicClient(rig.anvil.rpcUrl).waitForTransactionReceipt({ hash: await transferToken(rig.anvil.rpcUrl, rig.chainId, rig.payerKey, rig.usdc.address, sink, all), pollingInterval: 50 });
    const answer = (await postJson(`${f.url}/settle`, body)).json;
    expectClean(answer, "permit2_insufficient_balance");
    expect(String(answer.errorMessage)).toMatch(/TRANSFER_FROM_FAILED/); // Permit2's own revert, decoded and then diagnosed
    expect(await nonceOf(rig.anvil.rpcUrl, f.signers[0] as Address, "pending")).toBe(0);
    expect(await balanceOf(rig.anvil.rpcUrl, rig.usdc.address, rig.receiver)).toBe(0n);
  });

  it("a transfer front-runs the mined settlement: the reverted receipt is explained as insufficient balance", async () => {
    rig = await startRig();
    const f = await rig.facilitator();
    const signer = f.signers[0] as Address;
    const body = await rig.payment(800n);
    await rig.test.setAutomine(false);
    const pending = postJson(`${f.url}/settle`, body);
    await eventually(async () => ((await nonceOf(rig!.anvil.rpcUrl, signer, "pending")) === 1 ? true : undefined));
    const payer = privateKeyToAccount(rig.payerKey).address;
    const all = await balanceOf(rig.anvil.rpcUrl, rig.usdc.address, payer);
    // A higher tip: ordered before the settlement in the same block.
    await transferToken(rig.anvil.rpcUrl, rig.chainId, rig.payerKey, rig.usdc.address, sink, all, parseGwei("100"));
    await rig.test.mine({ blocks: 1 });
    await rig.test.setAutomine(true);
    const answer = (await pending).json;
    expectClean(answer, "invalid_exact_evm_insufficient_balance");
    const hash = answer.transaction as Hex;
    expect(hash).toMatch(/^0x[0-9a-f]{64}$/);
    expect((await publicClient(rig.anvil.rpcUrl).getTransactionReceipt({ hash })).status).toBe("reverted");
    expect(await balanceOf(rig.anvil.rpcUrl, rig.usdc.address, rig.receiver)).toBe(0n);
    // The recorded answer is the same on retry.
    expect((await postJson(`${f.url}/settle`, body)).json).toEqual(answer);
  });
});
