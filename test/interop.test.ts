// Interop with the reference stack: an @x402/express resource server using HTTPFacilitatorClient
// pointed at our router, paid by an @x402/fetch client with the @x402/evm exact client scheme.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import express from "express";
import type { Server } from "node:http";
import type { AddressInfo } from "node:net";
import { paymentMiddleware, x402ResourceServer } from "@x402/express";
import { HTTPFacilitatorClient } from "@x402/core/server";
import { ExactEvmScheme as ExactEvmServer } from "@x402/evm/exact/server";
import { ExactEvmScheme as ExactEvmClient } from "@x402/evm/exact/client";
import { decodePaymentResponseHeader, wrapFetchWithPayment, x402Client } from "@x402/fetch";
import { privateKeyToAccount } from "viem/accounts";
import { startTestDevnet } from "./helpers/devnet.ts";
import { balanceOf, receiptStatus } from "./helpers/chain.ts";
import type { RunningDevnet } from "../services/devnet/devnet.ts";

let devnet: RunningDevnet;
let server: Server;
let resourceUrl: string;

beforeAll(async () => {
  devnet = await startTestDevnet(["eip155:8453", "eip155:56"]);
  const payTo = devnet.info.receivers[0]!.address;
  const usdt56 = devnet.info.networks.find((n) => n.network === "eip155:56")!.assets.find((a) => a.symbol === "USDT")!;
  const resourceServer = new x402ResourceServer(new HTTPFacilitatorClient({ url: devnet.info.routerUrl }))
    .register("eip155:8453", new ExactEvmServer())
    .register("eip155:56", new ExactEvmServer());
  const app = express();
  app.use(
    paymentMiddleware(
      {
        // Priced in dollars: the reference default asset (USDC at its real Base address) is our devnet token.
        "GET /weather": { accepts: { scheme: "exact", price: "$0.01", network: "eip155:8453", payTo }, description: "weather" },
        "GET /bsc": {
          accepts: { scheme: "exact", network: "eip155:56", payTo, price: { asset: usdt56.address, amount: (10n ** 16n).toString(), extra: { assetTransferMethod: "permit2" } } },
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

function payingFetch() {
  const account = privateKeyToAccount(devnet.info.payers[0]!.privateKey);
  const usdt56 = devnet.info.networks.find((n) => n.network === "eip155:56")!.assets.find((a) => a.symbol === "USDT")!;
  // Chain 56 has no reference default asset: the client opts in to our USDT explicitly.
  const client = x402Client.fromConfig({
    schemes: [{ network: "eip155:*", client: new ExactEvmClient(account) }],
    spendControls: { allowedAssets: [{ network: "eip155:56", asset: usdt56.address }] },
  });
  return wrapFetchWithPayment(fetch, client);
}

describe("reference client → reference resource server → our router", () => {
  it("answers 402 without payment", async () => {
    const r = await fetch(`${resourceUrl}/weather`);
    expect(r.status).toBe(402);
    expect(r.headers.get("payment-required")).toBeTruthy();
  });

  it("EIP-3009 on eip155:8453: the resource arrives and PAYMENT-RESPONSE carries the transaction", async () => {
    const net = devnet.info.networks.find((n) => n.network === "eip155:8453")!;
    const usdc = net.assets[0]!;
    const before = await balanceOf(net.rpcUrl, usdc.address, devnet.info.receivers[0]!.address);
    const r = await payingFetch()(`${resourceUrl}/weather`);
    expect(r.status).toBe(200);
    expect(await r.json()).toEqual({ report: "sunny" });
    const settled = decodePaymentResponseHeader(r.headers.get("payment-response")!);
    expect(settled).toMatchObject({ success: true, network: "eip155:8453" });
    expect(settled.transaction).toMatch(/^0x[0-9a-f]{64}$/);
    expect(await receiptStatus(net.rpcUrl, settled.transaction as `0x${string}`)).toBe("success");
    expect(await balanceOf(net.rpcUrl, usdc.address, devnet.info.receivers[0]!.address)).toBe(before + 10_000n); // $0.01 at 6 decimals
  });

  it("Permit2 on eip155:56: the resource arrives and PAYMENT-RESPONSE carries the transaction", async () => {
    const net = devnet.info.networks.find((n) => n.network === "eip155:56")!;
    const usdt = net.assets.find((a) => a.symbol === "USDT")!;
    const before = await balanceOf(net.rpcUrl, usdt.address, devnet.info.receivers[0]!.address);
    const r = await payingFetch()(`${resourceUrl}/bsc`);
    expect(r.status).toBe(200);
    expect(await r.json()).toEqual({ report: "paid with permit2" });
    const settled = decodePaymentResponseHeader(r.headers.get("payment-response")!);
    expect(settled).toMatchObject({ success: true, network: "eip155:56" });
    expect(await receiptStatus(net.rpcUrl, settled.transaction as `0x${string}`)).toBe("success");
    expect(await balanceOf(net.rpcUrl, usdt.address, devnet.info.receivers[0]!.address)).toBe(before + 10n ** 16n);
  });
});
