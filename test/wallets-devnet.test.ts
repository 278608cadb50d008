// The wallet service on the devnet: the devnet starts it and writes walletsUrl and a ready
// agent-platform credential (walletsApiKey) to devnet.json. An agent holding only that API key pays a
// reference @x402/express resource server (HTTPFacilitatorClient → our router) from a custodial
// wallet: the resource arrives, the balance moves; Permit2 after the wallet's own approval; upto
// verified and settled through the router; refusals before anything is signed.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import express from "express";
import { readFile } from "node:fs/promises";
import type { Server } from "node:http";
import type { AddressInfo } from "node:net";
import { paymentMiddleware, x402ResourceServer } from "@x402/express";
import { HTTPFacilitatorClient } from "@x402/core/server";
import { ExactEvmScheme as ExactEvmServer } from "@x402/evm/exact/server";
import { createPublicClient, encodeFunctionData, erc20Abi, http, numberToHex, type Address, type Hex } from "viem";
import type { RunningDevnet } from "../services/devnet/devnet.ts";
import { startTestDevnet } from "./helpers/devnet.ts";
import { balanceOf, receiptStatus } from "./helpers/chain.ts";
import { call, errorCode, signerOfPayment, type WalletView } from "./helpers/wallets.ts";

let devnet: RunningDevnet;
let server: Server;
let resourceUrl: string;
let walletsUrl: string;
let apiKey: string;

const net = (network: string) => devnet.info.networks.find((n) => n.network === network)!;
const usdcBase = () => net("eip155:8453").assets[0]!;
const usdtBsc = () => net("eip155:56").assets.find((a) => a.symbol === "USDT")!;
const receiver = () => devnet.info.receivers[0]!.address;

/** What a person funding the agent does on the devnet: a token transfer from an (unlocked) devnet payer. */
async function fundToken(rpcUrl: string, token: Address, to: Address, amount: bigint): Promise<void> {
  const rpc = async (method: string, params: unknown[]) => {
    const res = (await (await fetch(rpcUrl, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ jsonrpc: "2.0", id: 1, method, params }) })).json()) as { result?: unknown; error?: unknown };
    if (res.error) throw new Error(JSON.stringify(res.error));
    return res.result;
  };
  const hash = (await rpc("eth_sendTransaction", [{ from: devnet.info.payers[0]!.address, to: token, data: encodeFunctionData({ abi: erc20Abi, functionName: "transfer", args: [to, amount] }) }])) as Hex;
  await createPublicClient({ transport: http(rpcUrl) }).waitForTransactionReceipt({ hash, pollingInterval: 50 });
}

async function fundGas(rpcUrl: string, to: Address, wei: bigint): Promise<void> {
  await fetch(rpcUrl, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ jsonrpc: "2.0", id: 1, method: "anvil_setBalance", params: [to, numberToHex(wei)] }) });
}

const api = <T = Record<string, unknown>>(method: string, path: string, body?: unknown) => call<T>(walletsUrl, apiKey, method, path, body);

async function walletBalance(walletId: string, network: string, asset: Address): Promise<bigint> {
  const r = await api<{ networks: { network: string; assets: { asset: string; balance: string }[] }[] }>("GET", `/v1/wallets/${walletId}/balances?network=${network}`);
  return BigInt(r.json.networks[0]!.assets.find((a) => a.asset.toLowerCase() === asset.toLowerCase())!.balance);
}

interface FetchAnswer {
  response: { status: number; headers: Record<string, string>; body?: string };
  paid: boolean;
  payment?: { record: { id: string; outcome: { settled: boolean; transaction?: string } }; settlement: { success: boolean; transaction: string; network: string } | null };
}

beforeAll(async () => {
  devnet = await startTestDevnet(["eip155:8453", "eip155:56"]);
  const info = JSON.parse(await readFile(devnet.infoPath, "utf8")) as { walletsUrl: string; walletsApiKey: string };
  walletsUrl = info.walletsUrl;
  apiKey = info.walletsApiKey;

  const resourceServer = new x402ResourceServer(new HTTPFacilitatorClient({ url: devnet.info.routerUrl })).register("eip155:8453", new ExactEvmServer()).register("eip155:56", new ExactEvmServer());
  const app = express();
  app.use(
    paymentMiddleware(
      {
        "GET /weather": { accepts: { scheme: "exact", price: "$0.01", network: "eip155:8453", payTo: receiver() }, description: "weather" },
        "GET /bsc": {
          accepts: { scheme: "exact", network: "eip155:56", payTo: receiver(), price: { asset: usdtBsc().address, amount: (10n ** 16n).toString(), extra: { assetTransferMethod: "permit2" } } },
          description: "permit2",
        },
      },
      resourceServer,
    ),
  );
  app.get("/weather", (_req, res) => {
    res.json({ report: "sunny" });
  });
  app.get("/bsc", (_req, res) => {
    res.json({ report: "paid with permit2" });
  });
  server = await new Promise<Server>((resolve) => {
    const s = app.listen(0, "127.0.0.1", () => resolve(s));
  });
  resourceUrl = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});

afterAll(async () => {
  await new Promise((r) => server?.close(r));
  await devnet?.stop();
});

describe("custodial wallets on the devnet", () => {
  it("the devnet writes walletsUrl and a working agent-platform credential to devnet.json", async () => {
    expect(walletsUrl).toMatch(/^http:\/\/127\.0\.0\.1:\d+$/);
    expect(apiKey).toMatch(/^x402w_[0-9a-f]{16}_/);
    expect((await api<{ platform: { name: string } }>("GET", "/v1/platform")).json.platform.name).toBe("devnet");
    const info = (await call<{ networks: string[] }>(walletsUrl, undefined, "GET", "/v1/info")).json;
    expect(info.networks.sort()).toEqual(["eip155:56", "eip155:8453"]);
  });

  it("an agent with only an API key pays a reference @x402/express server through our router: the resource arrives, the balance moves", async () => {
    const wallet = (
      await api<WalletView>("POST", "/v1/wallets", {
        label: "weather agent",
        policy: { assets: [{ network: "eip155:8453", asset: "USDC", maxPerPayment: "50000", maxPerDay: "1000000" }], hosts: ["127.0.0.1"] },
      })
    ).json;
    const base = net("eip155:8453");
    const usdc = usdcBase().address;

    // unfunded: refused before signing
    const broke = await api("POST", `/v1/wallets/${wallet.id}/fetch`, { url: `${resourceUrl}/weather` });
    expect(broke.status).toBe(409);
    expect(errorCode(broke)).toBe("insufficient_funds");
    expect((await api<{ signatures: unknown[] }>("GET", `/v1/wallets/${wallet.id}/signatures`)).json.signatures).toHaveLength(0);

    await fundToken(base.rpcUrl, usdc, wallet.address, 1_000_000n);
    expect(await walletBalance(wallet.id, "eip155:8453", usdc)).toBe(1_000_000n);
    const receiverBefore = await balanceOf(base.rpcUrl, usdc, receiver());

    // 1. the service does the whole request: fetch, 402, pay, retry
    const r = await api<FetchAnswer>("POST", `/v1/wallets/${wallet.id}/fetch`, { url: `${resourceUrl}/weather` });
    expect(r.status, JSON.stringify(r.json)).toBe(200);
    expect(r.json.paid).toBe(true);
    expect(r.json.response.status).toBe(200);
    expect(JSON.parse(r.json.response.body!)).toEqual({ report: "sunny" });
    expect(r.json.payment!.settlement).toMatchObject({ success: true, network: "eip155:8453" });
    const tx = r.json.payment!.settlement!.transaction as Hex;
    expect(await receiptStatus(base.rpcUrl, tx)).toBe("success");
    expect(r.json.payment!.record.outcome).toMatchObject({ settled: true, transaction: tx });
    expect(await walletBalance(wallet.id, "eip155:8453", usdc)).toBe(990_000n);
    expect(await balanceOf(base.rpcUrl, usdc, receiver())).toBe(receiverBefore + 10_000n);

    // 2. the agent makes the requests itself and asks the service only for the PAYMENT-SIGNATURE value
    const unpaid = await fetch(`${resourceUrl}/weather`);
    expect(unpaid.status).toBe(402);
    const signed = await api<{ paymentSignature: string }>("POST", `/v1/wallets/${wallet.id}/pay`, { paymentRequiredHeader: unpaid.headers.get("payment-required"), url: `${resourceUrl}/weather` });
    expect(signed.status, JSON.stringify(signed.json)).toBe(200);
    expect(await signerOfPayment(signed.json.paymentSignature)).toBe(wallet.address);
    const paid = await fetch(`${resourceUrl}/weather`, { headers: { "PAYMENT-SIGNATURE": signed.json.paymentSignature } });
    expect(paid.status).toBe(200);
    expect(await paid.json()).toEqual({ report: "sunny" });
    expect(await walletBalance(wallet.id, "eip155:8453", usdc)).toBe(980_000n);
    expect(await balanceOf(base.rpcUrl, usdc, receiver())).toBe(receiverBefore + 20_000n);

    // 3. the policy refuses: nothing signed, nothing paid
    await api("PUT", `/v1/wallets/${wallet.id}/policy`, { assets: [{ network: "eip155:8453", asset: "USDC", maxPerPayment: "5000" }], hosts: ["127.0.0.1"] });
    const capped = await api("POST", `/v1/wallets/${wallet.id}/fetch`, { url: `${resourceUrl}/weather` });
    expect(capped.status).toBe(403);
    expect(errorCode(capped)).toBe("amount_over_cap");
    await api("PUT", `/v1/wallets/${wallet.id}/policy`, { assets: [{ network: "eip155:8453", asset: "USDC" }], hosts: ["api.example.com"] });
    expect(errorCode(await api("POST", `/v1/wallets/${wallet.id}/fetch`, { url: `${resourceUrl}/weather` }))).toBe("host_not_allowed");
    expect(await walletBalance(wallet.id, "eip155:8453", usdc)).toBe(980_000n);

    // a resource that does not ask for payment passes through unpaid
    const free = await api<FetchAnswer>("POST", `/v1/wallets/${wallet.id}/fetch`, { url: `${resourceUrl}/nothing-here` });
    expect(free.json).toMatchObject({ paid: false, response: { status: 404 } });

    const sigs = await api<{ signatures: { kind: string; outcome: { settled?: boolean } | null; resource: string }[] }>("GET", `/v1/wallets/${wallet.id}/signatures`);
    expect(sigs.json.signatures).toHaveLength(2);
    expect(sigs.json.signatures.every((s) => s.kind === "payment" && s.resource.endsWith("/weather"))).toBe(true);
    expect(sigs.json.signatures[1]!.outcome).toMatchObject({ settled: true });
  });

  it("Permit2 (USDT on eip155:56): the wallet approves Permit2 itself, then pays the resource", async () => {
    const bsc = net("eip155:56");
    const usdt = usdtBsc().address;
    const wallet = (await api<WalletView>("POST", "/v1/wallets", { policy: { assets: [{ network: "eip155:56", asset: "USDT" }] } })).json;
    await fundToken(bsc.rpcUrl, usdt, wallet.address, 10n ** 18n);

    const first = await api("POST", `/v1/wallets/${wallet.id}/fetch`, { url: `${resourceUrl}/bsc` });
    expect(first.status).toBe(409);
    expect(errorCode(first)).toBe("permit2_allowance_required");
    const noGas = await api("POST", `/v1/wallets/${wallet.id}/permit2-approval`, { network: "eip155:56", asset: "USDT" });
    expect(errorCode(noGas)).toBe("insufficient_gas");

    await fundGas(bsc.rpcUrl, wallet.address, 10n ** 17n);
    const approval = await api<{ approval: { status: string; transaction: Hex }; record: { kind: string } }>("POST", `/v1/wallets/${wallet.id}/permit2-approval`, { network: "eip155:56", asset: "USDT" });
    expect(approval.status, JSON.stringify(approval.json)).toBe(200);
    expect(approval.json.approval.status).toBe("success");
    expect(approval.json.record.kind).toBe("permit2_approval");
    expect(await receiptStatus(bsc.rpcUrl, approval.json.approval.transaction)).toBe("success");

    const before = await balanceOf(bsc.rpcUrl, usdt, receiver());
    const r = await api<FetchAnswer>("POST", `/v1/wallets/${wallet.id}/fetch`, { url: `${resourceUrl}/bsc` });
    expect(r.status, JSON.stringify(r.json)).toBe(200);
    expect(JSON.parse(r.json.response.body!)).toEqual({ report: "paid with permit2" });
    expect(r.json.payment!.settlement).toMatchObject({ success: true, network: "eip155:56" });
    expect(await balanceOf(bsc.rpcUrl, usdt, receiver())).toBe(before + 10n ** 16n);
    expect(await walletBalance(wallet.id, "eip155:56", usdt)).toBe(10n ** 18n - 10n ** 16n);
  });

  it("upto: the signed ceiling verifies at our router and settles the actual charge", async () => {
    const base = net("eip155:8453");
    const usdc = usdcBase().address;
    const wallet = (await api<WalletView>("POST", "/v1/wallets", { policy: { assets: [{ network: "eip155:8453", asset: "USDC", maxPerPayment: "100000" }] } })).json;
    await fundToken(base.rpcUrl, usdc, wallet.address, 500_000n);
    await fundGas(base.rpcUrl, wallet.address, 10n ** 17n);
    expect((await api("POST", `/v1/wallets/${wallet.id}/permit2-approval`, { network: "eip155:8453", asset: usdc })).status).toBe(200);

    const supported = (await (await fetch(`${devnet.info.routerUrl}/supported`)).json()) as { kinds: { scheme: string; network: string; extra?: { facilitatorAddress: Address } }[] };
    const facilitatorAddress = supported.kinds.find((k) => k.scheme === "upto" && k.network === "eip155:8453")!.extra!.facilitatorAddress;
    const requirement = { scheme: "upto", network: "eip155:8453", asset: usdc, amount: "100000", payTo: receiver(), maxTimeoutSeconds: 120, extra: { facilitatorAddress } };
    const signed = await api<{ paymentPayload: Record<string, unknown> }>("POST", `/v1/wallets/${wallet.id}/pay`, {
      paymentRequired: { x402Version: 2, resource: { url: "https://llm.example/completions" }, accepts: [requirement] },
    });
    expect(signed.status, JSON.stringify(signed.json)).toBe(200);

    const post = async (action: string, amount: string) =>
      (await (await fetch(`${devnet.info.routerUrl}/${action}`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ x402Version: 2, paymentPayload: signed.json.paymentPayload, paymentRequirements: { ...requirement, amount } }) })).json()) as Record<string, unknown>;
    expect(await post("verify", "100000")).toMatchObject({ isValid: true, payer: wallet.address });
    const before = await balanceOf(base.rpcUrl, usdc, receiver());
    const settled = await post("settle", "42000");
    expect(settled).toMatchObject({ success: true, network: "eip155:8453", amount: "42000" });
    expect(await balanceOf(base.rpcUrl, usdc, receiver())).toBe(before + 42_000n);
    expect(await walletBalance(wallet.id, "eip155:8453", usdc)).toBe(500_000n - 42_000n);
  });
});
