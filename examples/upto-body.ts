// Signs one `upto` ceiling as the devnet payer and writes two request bodies for curl: the same
// payload with the ceiling for /verify and the actual charge for /settle.
// `npm start` in one terminal, then `npx tsx examples/upto-body.ts`.
import { readFileSync, writeFileSync } from "node:fs";
import { UptoEvmScheme } from "@x402/evm/upto/client";
import { privateKeyToAccount } from "viem/accounts";

const devnet = JSON.parse(readFileSync(".devnet/devnet.json", "utf8"));
const network = "eip155:8453";
const usdc = devnet.networks.find((n: { network: string }) => n.network === network).assets[0];
const payTo = devnet.receivers[0].address;
const supported = await (await fetch(`${devnet.routerUrl}/supported`)).json();
const { facilitatorAddress } = supported.kinds.find((k: { scheme: string; network: string }) => k.scheme === "upto" && k.network === network).extra;

// The payer signs a Permit2 ceiling of 50000 (0.05 USDC) to payTo, settleable only by facilitatorAddress.
const payer = new UptoEvmScheme(privateKeyToAccount(devnet.payers[0].privateKey));
const { payload } = await payer.createPaymentPayload(2, {
  scheme: "upto", network, asset: usdc.address, amount: "50000", payTo, maxTimeoutSeconds: 300,
  extra: { facilitatorAddress, assetTransferMethod: "permit2" },
});
const body = (maxAmountRequired: string) => JSON.stringify({
  paymentPayload: { x402Version: 2, scheme: "upto", network, payload },
  paymentRequirements: { scheme: "upto", network, asset: usdc.address, payTo, maxAmountRequired, resource: "https://api.example.com/generate", maxTimeoutSeconds: 300 },
});
writeFileSync("/tmp/upto-verify.json", body("50000")); // /verify: the ceiling
writeFileSync("/tmp/upto-settle.json", body("12340")); // /settle: the actual charge
console.log("wrote /tmp/upto-verify.json and /tmp/upto-settle.json");
