// A metered resource server and a paying client (the reference x402 packages) on the devnet:
// `npm start` in one terminal, then `npx tsx examples/upto.ts` in another.
import { readFileSync } from "node:fs";
import express from "express";
import { paymentMiddleware, setSettlementOverrides, x402ResourceServer } from "@x402/express";
import { HTTPFacilitatorClient } from "@x402/core/server";
import { UptoEvmScheme as UptoServer } from "@x402/evm/upto/server";
import { UptoEvmScheme as UptoClient } from "@x402/evm/upto/client";
import { decodePaymentResponseHeader, wrapFetchWithPayment, x402Client } from "@x402/fetch";
import { privateKeyToAccount } from "viem/accounts";

const devnet = JSON.parse(readFileSync(".devnet/devnet.json", "utf8"));
const network = "eip155:8453";

// Resource server: asks for a ceiling of $0.05, charges what the request actually used.
const resourceServer = new x402ResourceServer(new HTTPFacilitatorClient({ url: devnet.routerUrl })).register(network, new UptoServer());
const app = express();
app.use(paymentMiddleware({ "GET /generate": { accepts: { scheme: "upto", price: "$0.05", network, payTo: devnet.receivers[0].address } } }, resourceServer));
app.get("/generate", (_req, res) => {
  const tokens = 1234; // the work actually done
  setSettlementOverrides(res, { amount: String(tokens * 10) }); // 12340 atomic USDC of the 50000 ceiling
  res.json({ tokens });
});
const server = app.listen(4402, "127.0.0.1");
await new Promise((r) => server.once("listening", r));

// Client: the devnet payer (already approved Permit2) signs the ceiling.
const payer = privateKeyToAccount(devnet.payers[0].privateKey);
const pay = wrapFetchWithPayment(fetch, x402Client.fromConfig({ schemes: [{ network, client: new UptoClient(payer) }] }));
const res = await pay("http://127.0.0.1:4402/generate");
console.log(res.status, JSON.stringify(await res.json()));
console.log(JSON.stringify(decodePaymentResponseHeader(res.headers.get("payment-response")!)));
server.close();
server.closeAllConnections();
