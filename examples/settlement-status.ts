// What became of a payment: a reference resource server that, when a settle does not say success
// while the payment is in flight, waits for its outcome through the settlement status API
// (recoverPendingSettlements); then the payment's status asked by its transaction hash.
// `npm start` in one terminal, then `npx tsx examples/settlement-status.ts` in another.
import { readFileSync } from "node:fs";
import express from "express";
import { paymentMiddleware, x402ResourceServer } from "@x402/express";
import { HTTPFacilitatorClient } from "@x402/core/server";
import { ExactEvmScheme as ExactServer } from "@x402/evm/exact/server";
import { ExactEvmScheme as ExactClient } from "@x402/evm/exact/client";
import { decodePaymentResponseHeader, wrapFetchWithPayment, x402Client } from "@x402/fetch";
import { privateKeyToAccount } from "viem/accounts";
import { recoverPendingSettlements } from "../services/x402/settlement-status.ts";

const devnet = JSON.parse(readFileSync(".devnet/devnet.json", "utf8"));
const network = "eip155:8453";

const resourceServer = new x402ResourceServer(new HTTPFacilitatorClient({ url: devnet.routerUrl }))
  .register(network, new ExactServer())
  .onSettleFailure(recoverPendingSettlements({ url: devnet.routerUrl, waitMs: 30_000 }));
const app = express();
app.use(paymentMiddleware({ "GET /weather": { accepts: { scheme: "exact", price: "$0.01", network, payTo: devnet.receivers[0].address } } }, resourceServer));
app.get("/weather", (_req, res) => {
  res.json({ report: "sunny" });
});
const server = app.listen(4406, "127.0.0.1");
await new Promise((r) => server.once("listening", r));

const payer = privateKeyToAccount(devnet.payers[0].privateKey);
const pay = wrapFetchWithPayment(fetch, x402Client.fromConfig({ schemes: [{ network, client: new ExactClient(payer) }] }));
const res = await pay("http://127.0.0.1:4406/weather");
console.log(res.status, JSON.stringify(await res.json()));
const { transaction } = decodePaymentResponseHeader(res.headers.get("payment-response")!);

// Anyone who holds the hash (or the payment) can ask; with API keys, only the key that settled it.
const status = await (await fetch(`${devnet.routerUrl}/settlements/status?network=${network}&transaction=${transaction}`)).json();
const { state, terminal, confirmations, finality } = status;
console.log(JSON.stringify({ status: status.status, terminal, state, transaction: status.transaction, confirmations, finality }));
server.close();
server.closeAllConnections();
