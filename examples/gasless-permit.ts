// A payer without gas and without a Permit2 allowance pays on the devnet: its token has EIP-2612,
// so the reference client signs a permit for Permit2 beside the payment (the eip2612GasSponsoring
// extension) and the facilitator submits both in one transaction. The payer spends no gas.
// `npm start` in one terminal, then `npx tsx examples/gasless-permit.ts` in another.
import { readFileSync } from "node:fs";
import { toClientEvmSigner } from "@x402/evm";
import { ExactEvmScheme } from "@x402/evm/exact/client";
import { createPublicClient, http, type Address } from "viem";
import { privateKeyToAccount } from "viem/accounts";

const devnet = JSON.parse(readFileSync(".devnet/devnet.json", "utf8"));
const net = devnet.networks.find((n: { network: string }) => n.network === "eip155:8453");
const usdc = net.assets.find((a: { transferMethods: string[] }) => a.transferMethods.includes("eip3009"));
const payer = privateKeyToAccount(devnet.payers[1].privateKey); // never approved Permit2
const chain = createPublicClient({ transport: http(net.rpcUrl) });

const requirements = { scheme: "exact", network: net.network, asset: usdc.address, amount: "25000", payTo: devnet.receivers[0].address, maxTimeoutSeconds: 60, extra: { ...usdc.eip712, assetTransferMethod: "permit2" } };
const created = await new ExactEvmScheme(toClientEvmSigner(payer, chain)).createPaymentPayload(2, requirements as never, { extensions: { eip2612GasSponsoring: {} } } as never);
const body = JSON.stringify({ x402Version: 2, paymentPayload: { ...created, accepted: requirements }, paymentRequirements: requirements });

const gasBefore = await chain.getBalance({ address: payer.address as Address });
const res = await fetch(`${devnet.routerUrl}/settle`, { method: "POST", headers: { "content-type": "application/json" }, body });
console.log(res.status, await res.text());
console.log(`payer's gas balance unchanged: ${(await chain.getBalance({ address: payer.address as Address })) === gasBefore}`);
