// A deployed smart wallet (ERC-1271) pays on the devnet: the owner key signs, the wallet is the
// payer, and the token asks the wallet whether the signature is its own. The reference x402 client
// builds the payment; the router's facilitator verifies and settles it.
// `npm start` in one terminal, then `npx tsx examples/smart-wallet.ts` in another.
import { readFileSync } from "node:fs";
import { x402Client } from "@x402/core/client";
import { ExactEvmScheme } from "@x402/evm/exact/client";
import { hashTypedData, type Hex } from "viem";
import { privateKeyToAccount } from "viem/accounts";

const devnet = JSON.parse(readFileSync(".devnet/devnet.json", "utf8"));
const net = devnet.networks.find((n: { network: string }) => n.network === "eip155:8453");
const usdc = net.assets.find((a: { transferMethods: string[] }) => a.transferMethods.includes("eip3009"));
const owner = privateKeyToAccount(devnet.smartWallets.ownerPrivateKey);

// The wallet as a signer: its address, and typed data signed by its owner (what its isValidSignature accepts).
const signer = {
  address: devnet.smartWallets.deployed,
  signTypedData: async (typed: Parameters<typeof hashTypedData>[0]): Promise<Hex> => owner.sign({ hash: hashTypedData(typed) }),
};

const requirements = { scheme: "exact", network: net.network, asset: usdc.address, amount: "10000", payTo: devnet.receivers[0].address, maxTimeoutSeconds: 300, extra: { name: usdc.eip712.name, version: usdc.eip712.version } };
const client = x402Client.fromConfig({ schemes: [{ network: "eip155:*", client: new ExactEvmScheme(signer as never) }] });
const paymentPayload = await client.createPaymentPayload({ x402Version: 2, resource: { url: "https://api.example.com/report" }, accepts: [requirements] } as never);
const body = JSON.stringify({ x402Version: 2, paymentPayload, paymentRequirements: requirements });

for (const action of ["verify", "settle"]) {
  const res = await fetch(`${devnet.routerUrl}/${action}`, { method: "POST", headers: { "content-type": "application/json" }, body });
  console.log(action, res.status, await res.text());
}
