// A resource server and a paying client, both the reference x402 packages, on the devnet:
// `npm start` in one terminal, then `npx tsx examples/exact.ts` in another.
import { readFileSync } from "node:fs";
import express from "express";
import { paymentMiddleware, x402ResourceServer } from "@x402/express";
import { HTTPFacilitatorClient } from "@x402/core/server";
import { ExactEvmScheme as ExactServer } from "@x402/evm/exact/server";
import { ExactEvmScheme as ExactClient } from "@x402/evm/exact/client";
import { decodePaymentResponseHeader, wrapFetchWithPayment, x402Client } from "@x402/fetch";
import { privateKeyToAccount } from "viem/accounts";

const devnet = JSON.parse(readFileSync(".devnet/devnet.json", "utf8"));
const network = "eip155:8453";

// Resource server: the reference middleware, with our router as its facilitator.
const facilitator = new HTTPFacilitatorClient({ url: devnet.routerUrl });
const resourceServer = new x402ResourceServer(facilitator).register(network, new ExactServer());
const app = express();
app.use(paymentMiddleware({ "GET /weather": { accepts: { scheme: "exact", price: "$0.01", network, payTo: devnet.receivers[0].address } } }, resourceServer));
app.get("/weather", (_req, res) => {
  res.json({ report: "sunny" });
});
const server = app.listen(4402, "127.0.0.1");
await new Promise((r) => server.once("listening", r));

// Client: a devnet payer with the reference fetch wrapper.
const payer = privateKeyToAccount(devnet.payers[0].privateKey);
const pay = wrapFetchWithPayment(fetch, x402Client.fromConfig({ schemes: [{ network, client: new ExactClient(payer) }] }));
const res = await pay("http://127.0.0.1:4402/weather");
console.log(res.status, JSON.stringify(await res.json()));
console.log(JSON.stringify(decodePaymentResponseHeader(res.headers.get("payment-response")!)));
server.close();
server.closeAllConnections();
