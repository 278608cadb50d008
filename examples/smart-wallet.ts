// Smart-wallet payers on the devnet: the deployed ERC-1271 wallet and the counterfactual one (an
// ERC-6492 signature; its first settlement deploys it through the devnet's factory) each pay the
// router with the reference x402 client. The owner key signs; the wallet is the payer.
// `npm start` in one terminal, then `npx tsx examples/smart-wallet.ts` in another.
import { readFileSync } from "node:fs";
import { x402Client } from "@x402/core/client";
import { ExactEvmScheme } from "@x402/evm/exact/client";
import { createPublicClient, hashTypedData, http, serializeErc6492Signature, type Address, type Hex } from "viem";
import { privateKeyToAccount } from "viem/accounts";

const devnet = JSON.parse(readFileSync(".devnet/devnet.json", "utf8"));
const net = devnet.networks.find((n: { network: string }) => n.network === "eip155:8453");
const usdc = net.assets.find((a: { transferMethods: string[] }) => a.transferMethods.includes("eip3009"));
const wallets = devnet.smartWallets;
const owner = privateKeyToAccount(wallets.ownerPrivateKey);

/** The wallet as a signer: typed data signed by its owner, wrapped for ERC-6492 while the wallet has no code. */
function walletSigner(address: Address, deployment?: { address: Address; data: Hex }) {
  return {
    address,
    async signTypedData(typed: Parameters<typeof hashTypedData>[0]): Promise<Hex> {
      const signature = await owner.sign({ hash: hashTypedData(typed) });
      return deployment ? serializeErc6492Signature({ ...deployment, signature }) : signature;
    },
  };
}

const requirements = { scheme: "exact", network: net.network, asset: usdc.address, amount: "10000", payTo: devnet.receivers[0].address, maxTimeoutSeconds: 300, extra: { name: usdc.eip712.name, version: usdc.eip712.version } };
const chain = createPublicClient({ transport: http(net.rpcUrl) });

for (const [kind, signer] of [
  ["deployed (ERC-1271)", walletSigner(wallets.deployed)],
  ["counterfactual (ERC-6492)", walletSigner(wallets.counterfactual, { address: wallets.factory, data: wallets.counterfactualFactoryCalldata })],
] as const) {
  const client = x402Client.fromConfig({ schemes: [{ network: "eip155:*", client: new ExactEvmScheme(signer as never) }] });
  const paymentPayload = await client.createPaymentPayload({ x402Version: 2, resource: { url: "https://api.example.com/report" }, accepts: [requirements] } as never);
  const body = JSON.stringify({ x402Version: 2, paymentPayload, paymentRequirements: requirements });
  const settle = await fetch(`${devnet.routerUrl}/settle`, { method: "POST", headers: { "content-type": "application/json" }, body });
  const code = await chain.getCode({ address: signer.address });
  console.log(`${kind} ${signer.address}: ${settle.status} ${await settle.text()}, wallet code ${code && code !== "0x" ? "present" : "none"}`);
}
