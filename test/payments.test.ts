// Real payments through the router on every devnet network, and the reference failure reasons.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { generatePrivateKey, privateKeyToAccount } from "viem/accounts";
import { createPublicClient, http, type Address } from "viem";
import type { PaymentRequirements } from "@x402/core/types";
import { toClientEvmSigner } from "@x402/evm";
import { ExactEvmScheme as ExactEvmClient } from "@x402/evm/exact/client";
import { startTestDevnet } from "./helpers/devnet.ts";
import { balanceOf, receiptStatus } from "./helpers/chain.ts";
import { postJson, serviceShape, signEip3009, signPermit2, standardShape, type PaymentSpec } from "./helpers/payments.ts";
import type { RunningDevnet } from "../services/devnet/devnet.ts";

let devnet: RunningDevnet;
beforeAll(async () => {
  devnet = await startTestDevnet();
});
afterAll(() => devnet?.stop());

const net = (network: string) => devnet.info.networks.find((n) => n.network === network)!;

function spec(network: string, method: "eip3009" | "permit2", overrides: Partial<PaymentSpec> = {}): PaymentSpec {
  const n = net(network);
  return {
    network,
    chainId: n.chainId,
    asset: n.assets.find((a) => a.transferMethods.includes(method) && (method === "permit2" ? !a.transferMethods.includes("eip3009") : true)) ?? n.assets.find((a) => a.transferMethods.includes(method))!,
    payerKey: devnet.info.payers[0]!.privateKey,
    payTo: devnet.info.receivers[0]!.address,
    amount: 12_345n,
    ...overrides,
  };
}

const router = (action: string, body: unknown) => postJson(`${devnet.info.routerUrl}/${action}`, body);

describe("exact EIP-3009 on each of the six networks (service request shape)", () => {
  it.each(["eip155:56", "eip155:97", "eip155:8453", "eip155:84532", "eip155:137", "eip155:42161"])("%s: verify, settle, and the receiver is paid", async (network) => {
    const s = spec(network, "eip3009");
    expect(s.asset.transferMethods).toContain("eip3009");
    const body = serviceShape(s, await signEip3009(s));
    const payer = devnet.info.payers[0]!.address;
    const before = await balanceOf(net(network).rpcUrl, s.asset.address, s.payTo);

    const v = await router("verify", body);
    expect(v.status).toBe(200);
    expect(v.json).toEqual({ isValid: true, payer });

    const st = await router("settle", body);
    expect(st.status).toBe(200);
    expect(st.json).toMatchObject({ success: true, network, payer });
    expect(st.json.transaction).toMatch(/^0x[0-9a-f]{64}$/);
    expect(await receiptStatus(net(network).rpcUrl, st.json.transaction as `0x${string}`)).toBe("success");
    expect(await balanceOf(net(network).rpcUrl, s.asset.address, s.payTo)).toBe(before + s.amount);
  });
});

describe("exact Permit2", () => {
  it("eip155:56 USDT (18 decimals, Permit2 only): verify, settle, the receiver is paid", async () => {
    const s = spec("eip155:56", "permit2", { amount: 2n * 10n ** 18n });
    expect(s.asset.symbol).toBe("USDT");
    const body = serviceShape(s, await signPermit2(s));
    const before = await balanceOf(net("eip155:56").rpcUrl, s.asset.address, s.payTo);
    const v = await router("verify", body);
    expect(v.json).toEqual({ isValid: true, payer: devnet.info.payers[0]!.address });
    const st = await router("settle", body);
    expect(st.json).toMatchObject({ success: true, network: "eip155:56" });
    expect(await balanceOf(net("eip155:56").rpcUrl, s.asset.address, s.payTo)).toBe(before + s.amount);
  });
});

describe("exact Permit2 with EIP-2612 gas sponsoring (advertised in /supported)", () => {
  it("a payer with no Permit2 allowance pays USDC on eip155:8453 through the router", async () => {
    const n = net("eip155:8453");
    const usdc = n.assets[0]!;
    const payer = privateKeyToAccount(devnet.info.payers[1]!.privateKey);
    expect(devnet.info.payers[1]!.permit2Approved).toBe(false);
    const req = { scheme: "exact", network: n.network, asset: usdc.address, amount: "25000", payTo: devnet.info.receivers[0]!.address, maxTimeoutSeconds: 60, extra: { ...usdc.eip712, assetTransferMethod: "permit2" } } as PaymentRequirements;
    const client = new ExactEvmClient(toClientEvmSigner(payer, createPublicClient({ transport: http(n.rpcUrl) })));
    const created = await client.createPaymentPayload(2, req, { extensions: { eip2612GasSponsoring: {} } } as never);
    expect(created.extensions).toHaveProperty("eip2612GasSponsoring");
    const body = { x402Version: 2, paymentPayload: { ...created, accepted: req }, paymentRequirements: req };
    const before = await balanceOf(n.rpcUrl, usdc.address, req.payTo as Address);
    expect((await router("verify", body)).json).toEqual({ isValid: true, payer: payer.address });
    expect((await router("settle", body)).json).toMatchObject({ success: true, network: n.network });
    expect(await balanceOf(n.rpcUrl, usdc.address, req.payTo as Address)).toBe(before + 25_000n);
  });
});

describe("failure reasons (reference codes)", () => {
  const N = "eip155:8453";
  const verifyReason = async (body: unknown) => {
    const r = await router("verify", body);
    expect(r.status).toBe(200);
    expect(r.json.isValid).toBe(false);
    return r.json.invalidReason;
  };
  const now = () => BigInt(Math.floor(Date.now() / 1000));

  it("wrong recipient", async () => {
    const s = spec(N, "eip3009");
    const other = devnet.info.payers[1]!.address;
    expect(await verifyReason(serviceShape(s, await signEip3009({ ...s, auth: { to: other } })))).toBe("invalid_exact_evm_recipient_mismatch");
  });

  it("expired", async () => {
    const s = spec(N, "eip3009");
    expect(await verifyReason(serviceShape(s, await signEip3009({ ...s, auth: { validBefore: now() - 10n } })))).toBe("invalid_exact_evm_payload_authorization_valid_before");
  });

  it("not yet valid", async () => {
    const s = spec(N, "eip3009");
    expect(await verifyReason(serviceShape(s, await signEip3009({ ...s, auth: { validAfter: now() + 3600n } })))).toBe("invalid_exact_evm_payload_authorization_valid_after");
  });

  it("value mismatch", async () => {
    const s = spec(N, "eip3009");
    expect(await verifyReason(serviceShape(s, await signEip3009({ ...s, auth: { value: s.amount - 1n } })))).toBe("invalid_exact_evm_payload_authorization_value_mismatch");
  });

  it("bad signature: signed by someone else, and tampered after signing", async () => {
    const s = spec(N, "eip3009");
    const payer = devnet.info.payers[0]!.address as Address;
    const forged = await signEip3009({ ...s, payerKey: generatePrivateKey(), auth: { from: payer } });
    expect(await verifyReason(serviceShape(s, forged))).toBe("invalid_exact_evm_signature");
    const signed = await signEip3009(s);
    const tampered = { ...signed, authorization: { ...signed.authorization, nonce: `0x${"ab".repeat(32)}` } };
    expect(await verifyReason(serviceShape(s, tampered))).toBe("invalid_exact_evm_signature");
    const settle = await router("settle", serviceShape(s, tampered));
    expect(settle.json).toMatchObject({ success: false, errorReason: "invalid_exact_evm_signature", transaction: "", network: N });
  });

  it("insufficient balance", async () => {
    const s = spec(N, "eip3009", { payerKey: generatePrivateKey() });
    expect(await verifyReason(serviceShape(s, await signEip3009(s)))).toBe("invalid_exact_evm_insufficient_balance");
  });

  it("nonce already used", async () => {
    const s = spec(N, "eip3009");
    const body = serviceShape(s, await signEip3009(s));
    expect((await router("settle", body)).json.success).toBe(true);
    expect(await verifyReason(body)).toBe("invalid_exact_evm_nonce_already_used");
  });

  it("Permit2 without allowance", async () => {
    const s = spec("eip155:56", "permit2", { payerKey: devnet.info.payers[1]!.privateKey, amount: 10n ** 18n });
    expect(devnet.info.payers[1]!.permit2Approved).toBe(false);
    expect(await verifyReason(serviceShape(s, await signPermit2(s)))).toBe("permit2_allowance_required");
  });

  it("an asset the facilitator does not accept (here no contract at all) is refused before any mechanism runs", async () => {
    const s = spec(N, "eip3009");
    const ghost = { ...s, asset: { ...s.asset, address: "0x00000000000000000000000000000000000b0b0b" as Address } };
    const body = standardShape(ghost, await signEip3009(ghost));
    for (const action of ["verify", "settle"]) {
      const r = await router(action, body);
      expect(r.status).toBe(400);
      expect(r.json.error).toMatch(/^unsupported_asset: 0x00000000000000000000000000000000000b0B0b is not accepted on eip155:8453; accepted assets: /);
    }
  });

  it("a payload for another network than the requirements is refused at payment level", async () => {
    const s = spec(N, "eip3009");
    const body = serviceShape(s, await signEip3009(s));
    const r = await router("verify", { ...body, paymentPayload: { ...body.paymentPayload, network: "eip155:137" } });
    expect(r.status).toBe(200);
    expect(r.json).toMatchObject({ isValid: false, invalidReason: "invalid_exact_evm_network_mismatch" });
  });
});
