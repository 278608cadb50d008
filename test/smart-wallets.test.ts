// Smart-wallet payers through the reference stack (@x402/fetch → @x402/express → our router),
// judged on chain: a deployed ERC-1271 wallet pays (exact EIP-3009, and upto over Permit2); an
// undeployed wallet pays with an ERC-6492 signature and is deployed by its settlement through the
// devnet's allowed factory; a factory off the allow-list is refused and nothing is sent; a forged
// ERC-6492 signature is refused before any deployment.
import type { Server } from "node:http";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import express from "express";
import { paymentMiddleware, setSettlementOverrides, x402ResourceServer } from "@x402/express";
import { HTTPFacilitatorClient } from "@x402/core/server";
import { ExactEvmScheme as ExactEvmServer } from "@x402/evm/exact/server";
import { ExactEvmScheme as ExactEvmClient } from "@x402/evm/exact/client";
import { UptoEvmScheme as UptoEvmServer } from "@x402/evm/upto/server";
import { UptoEvmScheme as UptoEvmClient } from "@x402/evm/upto/client";
import { decodePaymentResponseHeader, wrapFetchWithPayment, x402Client } from "@x402/fetch";
import { EXACT_PERMIT2_PROXY_ADDRESS } from "../services/x402/networks.ts";
import { createPublicClient, createTestClient, encodeFunctionData, getContractAddress, encodeAbiParameters, hashTypedData, http, pad, serializeErc6492Signature, type Address, type Hex } from "viem";
import { generatePrivateKey, privateKeyToAccount, type PrivateKeyAccount } from "viem/accounts";
import { compileDevnetContracts, devnetContract } from "../services/devnet/compile.ts";
import { DEVNET_MINTER_ADDRESS } from "../services/devnet/chain-setup.ts";
import type { RunningDevnet } from "../services/devnet/devnet.ts";
import { startTestDevnet } from "./helpers/devnet.ts";
import { balanceOf } from "./helpers/chain.ts";
import { postJson } from "./helpers/payments.ts";

const NETWORK = "eip155:8453" as const;
let devnet: RunningDevnet & { dir: string };
let server: Server;
let base: string;

beforeAll(async () => {
  devnet = await startTestDevnet([NETWORK], { hub: false, wallets: false });
  const payTo = devnet.info.receivers[0]!.address;
  const facilitator = new HTTPFacilitatorClient({ url: devnet.info.routerUrl });
  const resourceServer = new x402ResourceServer(facilitator).register(NETWORK, new ExactEvmServer()).register(NETWORK, new UptoEvmServer());
  const app = express();
  app.use(
    paymentMiddleware(
      {
        "GET /exact": { accepts: { scheme: "exact", price: "$0.01", network: NETWORK, payTo }, description: "exact" },
        "GET /upto": { accepts: { scheme: "upto", price: "$0.05", network: NETWORK, payTo }, description: "upto" },
        "GET /exact-permit2": {
          accepts: { scheme: "exact", network: NETWORK, payTo, price: { asset: usdcAsset().address, amount: "30000", extra: { assetTransferMethod: "permit2", name: usdcAsset().eip712!.name, version: usdcAsset().eip712!.version } } },
          description: "exact over Permit2",
        },
      },
      resourceServer,
    ),
  );
  app.get("/exact", (_req, res) => void res.json({ ok: true }));
  app.get("/exact-permit2", (_req, res) => void res.json({ ok: true }));
  app.get("/upto", (_req, res) => {
    setSettlementOverrides(res, { amount: "20000" }); // 0.02 of the 0.05 ceiling
    res.json({ ok: true });
  });
  server = await new Promise<Server>((resolve) => {
    const s = app.listen(0, "127.0.0.1", () => resolve(s));
  });
  base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});

afterAll(async () => {
  await new Promise((r) => server?.close(r));
  await devnet?.stop();
});

const net = () => devnet.info.networks[0]!;
const usdcAsset = () => devnet.info.networks[0]!.assets.find((a) => a.transferMethods.includes("eip3009"))!;
const usdc = () => net().assets.find((a) => a.transferMethods.includes("eip3009"))!;
const chain = () => createPublicClient({ transport: http(net().rpcUrl) });

/** A wallet as the reference client sees a signer: its address, and typed data signed by its owner key (wrapped for ERC-6492 when undeployed). */
function walletSigner(address: Address, owner: PrivateKeyAccount, deployment?: { factory: Address; calldata: Hex }) {
  return {
    address,
    async signTypedData(typed: Parameters<typeof hashTypedData>[0]): Promise<Hex> {
      const inner = await owner.sign({ hash: hashTypedData(typed) });
      return deployment ? serializeErc6492Signature({ address: deployment.factory, data: deployment.calldata, signature: inner }) : inner;
    },
  };
}

const payingFetch = (signer: ReturnType<typeof walletSigner>) =>
  wrapFetchWithPayment(fetch, x402Client.fromConfig({ schemes: [{ network: "eip155:*", client: new ExactEvmClient(signer as never) }, { network: "eip155:*", client: new UptoEvmClient(signer as never) }] }));

async function state(wallet: Address) {
  const nonces = await Promise.all(net().signers.map((s) => chain().getTransactionCount({ address: s })));
  return {
    wallet: await balanceOf(net().rpcUrl, usdc().address, wallet),
    payTo: await balanceOf(net().rpcUrl, usdc().address, devnet.info.receivers[0]!.address),
    sent: nonces.reduce((a, b) => a + b, 0),
    code: (await chain().getCode({ address: wallet })) ?? "0x",
  };
}

describe("smart-wallet payers", () => {
  it("a deployed ERC-1271 wallet pays exact (EIP-3009 and Permit2) and upto (Permit2)", async () => {
    const w = devnet.info.smartWallets;
    const owner = privateKeyToAccount(w.ownerPrivateKey);
    const before = await state(w.deployed);
    expect(before.code).not.toBe("0x");
    const pay = payingFetch(walletSigner(w.deployed, owner));
    expect((await pay(`${base}/exact`)).status).toBe(200);
    const afterExact = await state(w.deployed);
    expect(afterExact).toMatchObject({ wallet: before.wallet - 10_000n, payTo: before.payTo + 10_000n, sent: before.sent + 1 });
    expect((await pay(`${base}/upto`)).status).toBe(200);
    const afterUpto = await state(w.deployed);
    expect(afterUpto).toMatchObject({ wallet: afterExact.wallet - 20_000n, payTo: afterExact.payTo + 20_000n, sent: afterExact.sent + 1 });
    const viaPermit2 = await pay(`${base}/exact-permit2`);
    expect(viaPermit2.status).toBe(200);
    const settled = decodePaymentResponseHeader(viaPermit2.headers.get("payment-response")!);
    expect((await chain().getTransaction({ hash: settled.transaction as Hex })).to?.toLowerCase()).toBe(EXACT_PERMIT2_PROXY_ADDRESS.toLowerCase()); // Permit2, not EIP-3009
    expect(await state(w.deployed)).toMatchObject({ wallet: afterUpto.wallet - 30_000n, payTo: afterUpto.payTo + 30_000n, sent: afterUpto.sent + 1 });
  });

  it("an undeployed wallet pays with an ERC-6492 signature; its settlement deploys it through the allowed factory", async () => {
    const w = devnet.info.smartWallets;
    const owner = privateKeyToAccount(w.ownerPrivateKey);
    const before = await state(w.counterfactual);
    expect(before.code).toBe("0x");
    expect(before.wallet).toBeGreaterThan(0n);
    const res = await payingFetch(walletSigner(w.counterfactual, owner, { factory: w.factory, calldata: w.counterfactualFactoryCalldata }))(`${base}/exact`);
    expect(res.status).toBe(200);
    const after = await state(w.counterfactual);
    expect(after.code).not.toBe("0x"); // deployed by the settlement
    expect(after).toMatchObject({ wallet: before.wallet - 10_000n, payTo: before.payTo + 10_000n, sent: before.sent + 2 }); // the deployment, then the transfer
  });

  it("an undeployed wallet pays upto and exact over Permit2 with ERC-6492 signatures: verified as if deployed, deployed by its first settlement; a forged one deploys nothing", async () => {
    const w = devnet.info.smartWallets;
    const owner = privateKeyToAccount(w.ownerPrivateKey);
    const deployment = { factory: w.factory, calldata: w.counterfactualPermit2FactoryCalldata };
    const before = await state(w.counterfactualPermit2);
    expect(before.code).toBe("0x");
    expect(before.wallet).toBeGreaterThan(0n);
    // Signed by a key that does not own the wallet: refused (the simulation as if deployed asks the wallet, ERC-1271), nothing deployed.
    const forgedPay = payingFetch(walletSigner(w.counterfactualPermit2, privateKeyToAccount(generatePrivateKey()), deployment));
    expect((await forgedPay(`${base}/upto`)).status).toBe(402);
    // ... and sent straight to /settle (a hostile resource server): verified as if deployed before the deployment is sent.
    const { x402Client: Core } = await import("@x402/core/client");
    const required = JSON.parse(Buffer.from((await fetch(`${base}/upto`)).headers.get("payment-required")!, "base64").toString());
    const forgedPayload = await Core.fromConfig({ schemes: [{ network: "eip155:*", client: new UptoEvmClient(walletSigner(w.counterfactualPermit2, privateKeyToAccount(generatePrivateKey()), deployment) as never) }] }).createPaymentPayload(required);
    const forgedSettle = await postJson(`${devnet.info.routerUrl}/settle`, { x402Version: 2, paymentPayload: forgedPayload, paymentRequirements: { ...forgedPayload.accepted, amount: "20000" } });
    expect(forgedSettle.json).toMatchObject({ success: false, errorReason: "invalid_permit2_signature", transaction: "" });
    expect(await state(w.counterfactualPermit2)).toEqual(before);
    // The owner's signature: upto settles 0.02 of its 0.05 ceiling, after the deployment (whose creation calls approve Permit2).
    const pay = payingFetch(walletSigner(w.counterfactualPermit2, owner, deployment));
    expect((await pay(`${base}/upto`)).status).toBe(200);
    const afterUpto = await state(w.counterfactualPermit2);
    expect(afterUpto.code).not.toBe("0x");
    expect(afterUpto).toMatchObject({ wallet: before.wallet - 20_000n, payTo: before.payTo + 20_000n, sent: before.sent + 2 }); // the deployment, then the settlement
    // Now deployed: exact over Permit2 is one transaction (the wrapper's factory call is not repeated).
    const viaPermit2 = await pay(`${base}/exact-permit2`);
    expect(viaPermit2.status).toBe(200);
    expect(await state(w.counterfactualPermit2)).toMatchObject({ wallet: afterUpto.wallet - 30_000n, payTo: afterUpto.payTo + 30_000n, sent: afterUpto.sent + 1 });
  });

  it("a factory off the allow-list is refused, and a forged ERC-6492 signature is refused before any deployment: nothing is sent", async () => {
    // a second copy of our factory, at an address the facilitator does not allow, and a wallet it would deploy
    const contracts = await compileDevnetContracts();
    const factoryCode = devnetContract(contracts, "DevnetSmartWalletFactory").deployedBytecode;
    const walletCode = devnetContract(contracts, "DevnetSmartWallet").bytecode;
    const rogue: Address = "0x000000000000000000000000000000000000f00d";
    const test = createTestClient({ mode: "anvil", transport: http(net().rpcUrl) });
    await test.setCode({ address: rogue, bytecode: factoryCode });
    const owner = privateKeyToAccount(generatePrivateKey());
    const salt = pad("0x07");
    const wallet = getContractAddress({ opcode: "CREATE2", from: rogue, salt, bytecode: `${walletCode}${encodeAbiParameters([{ type: "address" }], [owner.address]).slice(2)}` as Hex });
    const factoryAbi = devnetContract(contracts, "DevnetSmartWalletFactory").abi;
    const calldata = encodeFunctionData({ abi: factoryAbi, functionName: "createWallet", args: [owner.address, salt] });
    const mint = encodeFunctionData({ abi: devnetContract(contracts, "DevnetStablecoin").abi, functionName: "mint", args: [wallet, 1_000_000n] });
    await chain().request({ method: "eth_sendTransaction", params: [{ from: DEVNET_MINTER_ADDRESS, to: usdc().address, data: mint }] } as never);

    const before = await state(wallet);
    const refused = await payingFetch(walletSigner(wallet, owner, { factory: rogue, calldata }))(`${base}/exact`);
    expect(refused.status).toBe(402);
    expect(await state(wallet)).toEqual(before); // not deployed, nothing paid, no transaction

    // the same refusal in the facilitator's words
    const { x402Client: Core } = await import("@x402/core/client");
    const requirements = { scheme: "exact", network: NETWORK, asset: usdc().address, amount: "1000", payTo: devnet.info.receivers[0]!.address, maxTimeoutSeconds: 300, extra: { name: usdc().eip712!.name, version: usdc().eip712!.version } };
    const bodyFor = async (signer: ReturnType<typeof walletSigner>) => {
      const client = Core.fromConfig({ schemes: [{ network: "eip155:*", client: new ExactEvmClient(signer as never) }] });
      const paymentPayload = await client.createPaymentPayload({ x402Version: 2, resource: { url: "https://api.example.com/x" }, accepts: [requirements] } as never);
      return { x402Version: 2, paymentPayload, paymentRequirements: requirements };
    };
    expect((await postJson(`${devnet.info.routerUrl}/verify`, await bodyFor(walletSigner(wallet, owner, { factory: rogue, calldata })))).json).toMatchObject({ isValid: false, invalidReason: "eip6492_factory_not_allowed" });

    // an allowed factory, but signed by a key that does not own the wallet: refused before the deployment
    const fresh = await freshCounterfactual(devnet.info.smartWallets.owner, pad("0x2a"));
    const forged = await bodyFor(walletSigner(fresh.wallet, privateKeyToAccount(generatePrivateKey()), { factory: devnet.info.smartWallets.factory, calldata: fresh.calldata }));
    const beforeForged = await state(fresh.wallet);
    expect(beforeForged.code).toBe("0x");
    expect((await postJson(`${devnet.info.routerUrl}/verify`, forged)).json).toMatchObject({ isValid: false, invalidReason: "invalid_exact_evm_signature" });
    expect((await postJson(`${devnet.info.routerUrl}/settle`, forged)).json).toMatchObject({ success: false, errorReason: "invalid_exact_evm_signature", transaction: "" });
    expect(await state(fresh.wallet)).toEqual(beforeForged); // no deployment, no transaction
  });
});

/** A counterfactual wallet of `owner` through the devnet's allowed factory, under `salt`, and the call that deploys it. */
async function freshCounterfactual(owner: Address, salt: Hex): Promise<{ wallet: Address; calldata: Hex }> {
  const contracts = await compileDevnetContracts();
  const factory = devnet.info.smartWallets.factory;
  const walletCode = devnetContract(contracts, "DevnetSmartWallet").bytecode;
  return {
    wallet: getContractAddress({ opcode: "CREATE2", from: factory, salt, bytecode: `${walletCode}${encodeAbiParameters([{ type: "address" }], [owner]).slice(2)}` as Hex }),
    calldata: encodeFunctionData({ abi: devnetContract(contracts, "DevnetSmartWalletFactory").abi, functionName: "createWallet", args: [owner, salt] }),
  };
}
