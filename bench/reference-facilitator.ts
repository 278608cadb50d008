// The facilitator most teams would run instead: the reference @x402/core x402Facilitator with the
// @x402/evm exact mechanism on toFacilitatorEvmSigner(viem wallet client), on express, in the
// style of the x402 example facilitator server. Written here from the packages' public APIs.
// Its account has viem's nonce manager, as a team running several settlements at once would add.
// Env: RPC_URL, PRIVATE_KEY, NETWORK (eip155:<id>), PORT.
import express from "express";
import { x402Facilitator } from "@x402/core/facilitator";
import { registerExactEvmScheme } from "@x402/evm/exact/facilitator";
import { toFacilitatorEvmSigner } from "@x402/evm";
import { createWalletClient, defineChain, http, publicActions } from "viem";
import { nonceManager, privateKeyToAccount } from "viem/accounts";

const network = process.env.NETWORK as `eip155:${number}`;
const chain = defineChain({ id: Number(network.split(":")[1]), name: network, nativeCurrency: { name: "Ether", symbol: "ETH", decimals: 18 }, rpcUrls: { default: { http: [process.env.RPC_URL!] } } });
const client = createWalletClient({ account: privateKeyToAccount(process.env.PRIVATE_KEY as `0x${string}`, { nonceManager }), chain, transport: http(process.env.RPC_URL) }).extend(publicActions);
const signer = toFacilitatorEvmSigner({ ...client, address: client.account.address } as unknown as Parameters<typeof toFacilitatorEvmSigner>[0]);
const facilitator = registerExactEvmScheme(new x402Facilitator(), { signer, networks: network });

const app = express();
app.use(express.json());
app.post("/verify", async (req, res) => {
  try {
    res.json(await facilitator.verify(req.body.paymentPayload, req.body.paymentRequirements));
  } catch (e) {
    res.status(500).json({ error: String((e as Error).message) });
  }
});
app.post("/settle", async (req, res) => {
  try {
    res.json(await facilitator.settle(req.body.paymentPayload, req.body.paymentRequirements));
  } catch (e) {
    res.status(500).json({ error: String((e as Error).message) });
  }
});
app.get("/supported", (_req, res) => {
  res.json(facilitator.getSupported());
});
const server = app.listen(Number(process.env.PORT ?? 0), "127.0.0.1", () => {
  console.log(JSON.stringify({ url: `http://127.0.0.1:${(server.address() as { port: number }).port}` }));
});
