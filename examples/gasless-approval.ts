// A payer holding USDT on BNB Smart Chain (no EIP-2612, no EIP-3009) but no gas and no Permit2
// allowance pays on the devnet: the reference client signs a raw approve(Permit2) transaction
// beside the payment (the erc20ApprovalGasSponsoring extension); the facilitator funds exactly
// what that approval may cost, relays it, then settles. The payer never needed gas of its own.
// `npm start` in one terminal, then `npx tsx examples/gasless-approval.ts` in another.
import { readFileSync } from "node:fs";
import { PERMIT2_ADDRESS, toClientEvmSigner } from "@x402/evm";
import { ExactEvmScheme } from "@x402/evm/exact/client";
import { createPublicClient, createWalletClient, erc20Abi, http, maxUint256, type Address } from "viem";
import { generatePrivateKey, privateKeyToAccount } from "viem/accounts";

const devnet = JSON.parse(readFileSync(".devnet/devnet.json", "utf8"));
const net = devnet.networks.find((n: { network: string }) => n.network === "eip155:56");
const usdt = net.assets.find((a: { symbol: string }) => a.symbol === "USDT").address as Address;
const chain = createPublicClient({ transport: http(net.rpcUrl) });

// A new payer: 1 USDT from a devnet payer, and nothing else.
const payer = privateKeyToAccount(generatePrivateKey());
const sender = createWalletClient({ account: privateKeyToAccount(devnet.payers[0].privateKey), transport: http(net.rpcUrl) });
await chain.waitForTransactionReceipt({ hash: await sender.writeContract({ chain: null, address: usdt, abi: erc20Abi, functionName: "transfer", args: [payer.address, 10n ** 18n] }) });
console.log(`payer's gas before: ${await chain.getBalance({ address: payer.address })}`);

const requirements = { scheme: "exact", network: net.network, asset: usdt, amount: "10000000000000000", payTo: devnet.receivers[0].address, maxTimeoutSeconds: 60, extra: { assetTransferMethod: "permit2" } };
const created = await new ExactEvmScheme(toClientEvmSigner(payer, chain)).createPaymentPayload(2, requirements as never, { extensions: { erc20ApprovalGasSponsoring: {} } } as never);
const body = JSON.stringify({ x402Version: 2, paymentPayload: { ...created, accepted: requirements }, paymentRequirements: requirements });
const res = await fetch(`${devnet.routerUrl}/settle`, { method: "POST", headers: { "content-type": "application/json" }, body });
console.log(res.status, await res.text());
const allowance = await chain.readContract({ address: usdt, abi: erc20Abi, functionName: "allowance", args: [payer.address, PERMIT2_ADDRESS] });
console.log(`Permit2 allowance after: ${allowance === maxUint256 ? "max" : allowance}`);
