// A resource server that charges $0.01 (exact, USDC on eip155:8453) for GET /weather, with the
// devnet's router as its facilitator: something to pay from a custodial wallet (docs/wallets.md).
// `npm start` in one terminal, then `npx tsx examples/paid-weather-server.ts` (127.0.0.1:4402).
import { readFileSync } from "node:fs";
import express from "express";
import { paymentMiddleware, x402ResourceServer } from "@x402/express";
import { HTTPFacilitatorClient } from "@x402/core/server";
import { ExactEvmScheme } from "@x402/evm/exact/server";

const devnet = JSON.parse(readFileSync(".devnet/devnet.json", "utf8"));
const network = "eip155:8453";

const resourceServer = new x402ResourceServer(new HTTPFacilitatorClient({ url: devnet.routerUrl })).register(network, new ExactEvmScheme());
const app = express();
app.use(paymentMiddleware({ "GET /weather": { accepts: { scheme: "exact", price: "$0.01", network, payTo: devnet.receivers[0].address } } }, resourceServer));
app.get("/weather", (_req, res) => {
  res.json({ report: "sunny" });
});
app.listen(4402, "127.0.0.1");
