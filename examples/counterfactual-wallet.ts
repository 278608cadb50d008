// A counterfactual smart wallet pays on the devnet: not deployed yet, it signs with ERC-6492 (the
// owner's signature wrapped with the factory call that deploys it); the router's facilitator
// deploys it through the allowed factory, then settles. The reference x402 client builds the payment.
// `npm start` in one terminal, then `npx tsx examples/counterfactual-wallet.ts` in another.
import { readFileSync } from "node:fs";
import { x402Client } from "@x402/core/client";
import { ExactEvmScheme } from "@x402/evm/exact/client";
import { createPublicClient, hashTypedData, http, serializeErc6492Signature, type Hex } from "viem";
import { privateKeyToAccount } from "viem/accounts";

const devnet = JSON.parse(readFileSync(".devnet/devnet.json", "utf8"));
const net = devnet.networks.find((n: { network: string }) => n.network === "eip155:8453");
const usdc = net.assets.find((a: { transferMethods: string[] }) => a.transferMethods.includes("eip3009"));
const wallets = devnet.smartWallets;
const owner = privateKeyToAccount(wallets.ownerPrivateKey);
const chain = createPublicClient({ transport: http(net.rpcUrl) });

// The wallet as a signer: its owner signs; while the wallet has no code the signature carries its deployment.
const signer = {
  address: wallets.counterfactual,
  async signTypedData(typed: Parameters<typeof hashTypedData>[0]): Promise<Hex> {
    const signature = await owner.sign({ hash: hashTypedData(typed) });
    return serializeErc6492Signature({ address: wallets.factory, data: wallets.counterfactualFactoryCalldata, signature });
  },
};

const requirements = { scheme: "exact", network: net.network, asset: usdc.address, amount: "10000", payTo: devnet.receivers[0].address, maxTimeoutSeconds: 300, extra: { name: usdc.eip712.name, version: usdc.eip712.version } };
const client = x402Client.fromConfig({ schemes: [{ network: "eip155:*", client: new ExactEvmScheme(signer as never) }] });
const paymentPayload = await client.createPaymentPayload({ x402Version: 2, resource: { url: "https://api.example.com/report" }, accepts: [requirements] } as never);
const body = JSON.stringify({ x402Version: 2, paymentPayload, paymentRequirements: requirements });

const hasCode = async () => ((await chain.getCode({ address: signer.address })) ?? "0x") !== "0x";
console.log(`wallet code before: ${await hasCode()}`);
const settle = await fetch(`${devnet.routerUrl}/settle`, { method: "POST", headers: { "content-type": "application/json" }, body });
console.log(settle.status, await settle.text());
console.log(`wallet code after: ${await hasCode()}`);
