// batch-settlement on the devnet with the reference x402 packages: 20 paid requests over one
// channel, then one claim, one settle and a refund.
// `npm start` in one terminal, then `npx tsx examples/batch-settlement.ts` in another.
import { readFileSync } from "node:fs";
import express from "express";
import { paymentMiddleware, x402ResourceServer } from "@x402/express";
import { HTTPFacilitatorClient } from "@x402/core/server";
import { BatchSettlementEvmScheme as BatchServer, InMemoryChannelStorage } from "@x402/evm/batch-settlement/server";
import { BatchSettlementEvmScheme as BatchClient } from "@x402/evm/batch-settlement/client";
import { decodePaymentResponseHeader, wrapFetchWithPayment, x402Client } from "@x402/fetch";
import { generatePrivateKey, privateKeyToAccount } from "viem/accounts";

const devnet = JSON.parse(readFileSync(".devnet/devnet.json", "utf8"));
const network = "eip155:8453";
const usdc = devnet.networks.find((n: { network: string }) => n.network === network).assets[0].address;
const receiver = devnet.receivers[0].address;
const facilitator = new HTTPFacilitatorClient({ url: devnet.routerUrl });

// Resource server. It holds the receiver-authorizer key (every channel names it: keep it) and the
// channel state (use FileChannelStorage or the Redis storage beyond one process).
const authorizer = privateKeyToAccount(generatePrivateKey());
const scheme = new BatchServer(receiver, {
  storage: new InMemoryChannelStorage(),
  receiverAuthorizerSigner: { address: authorizer.address, signTypedData: (p) => authorizer.signTypedData(p) },
});
const resourceServer = new x402ResourceServer(facilitator).register(network, scheme);
const app = express();
app.use(paymentMiddleware({ "GET /api": { accepts: { scheme: "batch-settlement", price: "$0.001", network, payTo: receiver, extra: { minDeposit: "$0.05" } } } }, resourceServer));
app.get("/api", (_req, res) => {
  res.json({ ok: true });
});
const server = app.listen(4402, "127.0.0.1");
await new Promise((r) => server.once("listening", r));

// Client: the first request deposits $0.05 into the channel (one transaction), the next ones only sign vouchers.
const payer = privateKeyToAccount(devnet.payers[1].privateKey);
const client = new BatchClient(payer, { salt: generatePrivateKey() });
const pay = wrapFetchWithPayment(fetch, x402Client.fromConfig({ schemes: [{ network, client }] }));
const statuses: number[] = [];
for (let i = 1; i <= 20; i++) {
  const res = await pay("http://127.0.0.1:4402/api");
  const settled = decodePaymentResponseHeader(res.headers.get("payment-response")!);
  if (i === 1) console.log(`request 1: ${res.status}, transaction ${settled.transaction || "none"}`);
  else if (settled.transaction) console.log(`request ${i}: ${res.status}, unexpected transaction ${settled.transaction}`);
  statuses.push(res.status);
}
console.log(`requests 2-20: ${[...new Set(statuses.slice(1))].join(",")}, transaction none`);

// Later (on a timer in a real server): one claim transaction for all channels, one settle to the receiver.
const manager = scheme.createChannelManager(facilitator, network, usdc);
console.log("claim", JSON.stringify(await manager.claim()));
console.log("settle", JSON.stringify(await manager.settle()));
// The payer takes the unspent rest of its deposit back.
console.log("refund", JSON.stringify(await client.refund("http://127.0.0.1:4402/api")));
server.close();
server.closeAllConnections();
