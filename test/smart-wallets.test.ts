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
import { EXACT_PERMIT2_PROXY_ADDRESS, PERMIT2_ADDRESS } from "../services/x402/networks.ts";
import { createPublicClient, createTestClient, encodeFunctionData, erc20Abi, getAddress, getContractAddress, encodeAbiParameters, hashTypedData, http, keccak256, maxUint256, pad, serializeErc6492Signature, type Address, type Hex } from "viem";
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
  const nonces = await Promise.all(net().signers.map((s) => chain().getTransactionCount({ address: s, blockTag: "pending" })));
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

  it("a factory off the allow-list is refused on the Permit2 paths too (upto, exact over Permit2), at /verify and straight at /settle: nothing sent, the wallet stays undeployed", async () => {
    // a second copy of our factory at an address the facilitator does not allow, and a funded wallet it
    // would deploy whose creation calls approve Permit2: payable in every other respect
    const contracts = await compileDevnetContracts();
    const rogue: Address = "0x000000000000000000000000000000000000bEEF";
    await createTestClient({ mode: "anvil", transport: http(net().rpcUrl) }).setCode({ address: rogue, bytecode: devnetContract(contracts, "DevnetSmartWalletFactory").deployedBytecode });
    const owner = privateKeyToAccount(generatePrivateKey());
    const w = await freshCounterfactual(owner.address, pad("0x08"), { factory: rogue, permit2: true });
    await mintUsdc(w.wallet, 1_000_000n);
    const signer = walletSigner(w.wallet, owner, { factory: rogue, calldata: w.calldata });
    const before = await state(w.wallet);
    expect(before.code).toBe("0x");

    for (const path of ["exact-permit2", "upto"] as const) {
      const { verifyBody, settleBody } = await permit2Bodies(signer, path);
      expect((await postJson(`${devnet.info.routerUrl}/verify`, verifyBody)).json, path).toMatchObject({ isValid: false, invalidReason: "eip6492_factory_not_allowed" });
      expect(await state(w.wallet), path).toEqual(before);
      // a hostile resource server skipping /verify
      expect((await postJson(`${devnet.info.routerUrl}/settle`, settleBody)).json, path).toMatchObject({ success: false, errorReason: "eip6492_factory_not_allowed", transaction: "" });
      expect(await state(w.wallet), path).toEqual(before); // not deployed, nothing paid, no signer nonce moved
      // and through the reference stack
      expect((await payingFetch(signer)(`${base}/${path}`)).status, path).toBe(402);
      expect(await state(w.wallet), path).toEqual(before);
    }
  });

  it("an undeployed wallet's upto straight at /settle: a charge above the ceiling is refused and a charge of 0 succeeds, neither deploys the wallet nor sends anything", async () => {
    const owner = privateKeyToAccount(devnet.info.smartWallets.ownerPrivateKey);
    const w = await freshCounterfactual(owner.address, pad("0x0c"), { permit2: true });
    await mintUsdc(w.wallet, 1_000_000n);
    const { verifyBody, settleBody } = await permit2Bodies(walletSigner(w.wallet, owner, { factory: devnet.info.smartWallets.factory, calldata: w.calldata }), "upto");
    expect((await postJson(`${devnet.info.routerUrl}/verify`, verifyBody)).json).toMatchObject({ isValid: true }); // payable: 50000 ceiling
    const before = await state(w.wallet);
    expect(before.code).toBe("0x");
    const over = await postJson(`${devnet.info.routerUrl}/settle`, { ...settleBody, paymentRequirements: { ...settleBody.paymentRequirements, amount: "50001" } });
    expect(over.json).toMatchObject({ success: false, errorReason: "invalid_upto_evm_payload_settlement_exceeds_amount", transaction: "" });
    expect(await state(w.wallet)).toEqual(before); // no deployment for a payment that cannot settle
    const free = await postJson(`${devnet.info.routerUrl}/settle`, { ...settleBody, paymentRequirements: { ...settleBody.paymentRequirements, amount: "0" } });
    expect(free.json).toMatchObject({ success: true, transaction: "", amount: "0" });
    expect(getAddress(free.json.payer as string)).toBe(w.wallet);
    expect(await state(w.wallet)).toEqual(before); // 0 moves nothing: no deployment either
    // a payment within its ceiling deploys the wallet and settles (the refusals above were about the charge)
    const paid = await postJson(`${devnet.info.routerUrl}/settle`, (await permit2Bodies(walletSigner(w.wallet, owner, { factory: devnet.info.smartWallets.factory, calldata: w.calldata }), "upto")).settleBody);
    expect(paid.json).toMatchObject({ success: true, amount: "20000" });
    const after = await state(w.wallet);
    expect(after.code).not.toBe("0x");
    expect(after).toMatchObject({ wallet: before.wallet - 20_000n, payTo: before.payTo + 20_000n, sent: before.sent + 2 }); // the deployment, then the settlement
  });

  it("an undeployed wallet's EIP-3009 payment that cannot settle (underfunded), straight at /settle, is refused before any deployment; funded, the same payment deploys and settles", async () => {
    const owner = privateKeyToAccount(devnet.info.smartWallets.ownerPrivateKey);
    const w = await freshCounterfactual(owner.address, pad("0x0d"));
    await mintUsdc(w.wallet, 500n);
    const { x402Client: Core } = await import("@x402/core/client");
    const exact = exactRequirements("1000");
    const paymentPayload = await Core.fromConfig({ schemes: [{ network: "eip155:*", client: new ExactEvmClient(walletSigner(w.wallet, owner, { factory: devnet.info.smartWallets.factory, calldata: w.calldata }) as never) }] }).createPaymentPayload({ x402Version: 2, resource: { url: "https://api.example.com/x" }, accepts: [exact] } as never);
    const b = { x402Version: 2, paymentPayload, paymentRequirements: exact };
    const before = await state(w.wallet);
    expect(before.code).toBe("0x");
    // a hostile resource server (or anyone) can make such wallets at will: each must not cost a deployment
    expect((await postJson(`${devnet.info.routerUrl}/settle`, b)).json).toMatchObject({ success: false, errorReason: "invalid_exact_evm_insufficient_balance", transaction: "" });
    expect(await state(w.wallet)).toEqual(before);
    await mintUsdc(w.wallet, 500n);
    expect((await postJson(`${devnet.info.routerUrl}/settle`, b)).json).toMatchObject({ success: true });
    const after = await state(w.wallet);
    expect(after.code).not.toBe("0x");
    expect(after).toMatchObject({ wallet: 0n, payTo: before.payTo + 1_000n, sent: before.sent + 2 }); // the deployment, then the transfer
  });

  it("a valid /verify of undeployed wallets is read-only (exact EIP-3009, exact over Permit2, upto): code stays empty, no signer nonce moves", async () => {
    const owner = privateKeyToAccount(devnet.info.smartWallets.ownerPrivateKey);
    const plain = await freshCounterfactual(owner.address, pad("0x09"));
    const viaPermit2 = await freshCounterfactual(owner.address, pad("0x0a"), { permit2: true });
    await mintUsdc(plain.wallet, 1_000_000n);
    await mintUsdc(viaPermit2.wallet, 1_000_000n);
    const factory = devnet.info.smartWallets.factory;
    const [beforePlain, beforePermit2] = [await state(plain.wallet), await state(viaPermit2.wallet)];
    expect([beforePlain.code, beforePermit2.code]).toEqual(["0x", "0x"]);

    const { x402Client: Core } = await import("@x402/core/client");
    const exact = exactRequirements("1000");
    const exactPayload = await Core.fromConfig({ schemes: [{ network: "eip155:*", client: new ExactEvmClient(walletSigner(plain.wallet, owner, { factory, calldata: plain.calldata }) as never) }] }).createPaymentPayload({ x402Version: 2, resource: { url: "https://api.example.com/x" }, accepts: [exact] } as never);
    const bodies: [string, unknown, Address][] = [["exact (EIP-3009)", { x402Version: 2, paymentPayload: exactPayload, paymentRequirements: exact }, plain.wallet]];
    for (const path of ["exact-permit2", "upto"] as const) bodies.push([path, (await permit2Bodies(walletSigner(viaPermit2.wallet, owner, { factory, calldata: viaPermit2.calldata }), path)).verifyBody, viaPermit2.wallet]);
    for (const [what, b, wallet] of bodies) {
      const r = await postJson(`${devnet.info.routerUrl}/verify`, b);
      expect(r.json, what).toMatchObject({ isValid: true });
      expect(getAddress(r.json.payer as string), what).toBe(wallet);
      expect(await chain().getCode({ address: wallet }), what).toBeUndefined();
    }
    expect(await state(plain.wallet)).toEqual(beforePlain);
    expect(await state(viaPermit2.wallet)).toEqual(beforePermit2);
  });

  it("an undeployed wallet pays exact over Permit2 as its first payment: its settlement deploys it through the allowed factory, then the exact Permit2 proxy moves the money", async () => {
    const owner = privateKeyToAccount(devnet.info.smartWallets.ownerPrivateKey);
    const w = await freshCounterfactual(owner.address, pad("0x0b"), { permit2: true });
    await mintUsdc(w.wallet, 1_000_000n);
    const before = await state(w.wallet);
    expect(before.code).toBe("0x");
    const res = await payingFetch(walletSigner(w.wallet, owner, { factory: devnet.info.smartWallets.factory, calldata: w.calldata }))(`${base}/exact-permit2`);
    expect(res.status).toBe(200);
    const settled = decodePaymentResponseHeader(res.headers.get("payment-response")!);
    expect(getAddress(settled.payer!)).toBe(w.wallet);
    const tx = await chain().getTransaction({ hash: settled.transaction as Hex });
    expect(getAddress(tx.to!)).toBe(getAddress(EXACT_PERMIT2_PROXY_ADDRESS)); // Permit2, not EIP-3009
    expect(net().signers.map((a) => getAddress(a))).toContain(getAddress(tx.from));
    expect((await chain().getTransactionReceipt({ hash: settled.transaction as Hex })).status).toBe("success");
    const after = await state(w.wallet);
    expect(after.code).not.toBe("0x"); // deployed by the settlement
    expect(after).toMatchObject({ wallet: before.wallet - 30_000n, payTo: before.payTo + 30_000n, sent: before.sent + 2 }); // the deployment, then the transfer
  });
});

/** exact (EIP-3009) requirements for the devnet USDC. */
function exactRequirements(amount: string) {
  return { scheme: "exact", network: NETWORK, asset: usdc().address, amount, payTo: devnet.info.receivers[0]!.address, maxTimeoutSeconds: 300, extra: { name: usdc().eip712!.name, version: usdc().eip712!.version } };
}

/**
 * Signed Permit2 payments of `signer` (reference clients), standard v2 shape: exact over Permit2 for
 * 30000; upto with a 50000 ceiling (verified at the ceiling, settled for 20000).
 */
async function permit2Bodies(signer: ReturnType<typeof walletSigner>, path: "exact-permit2" | "upto") {
  const { x402Client: Core } = await import("@x402/core/client");
  const payTo = devnet.info.receivers[0]!.address;
  const eip712 = { name: usdc().eip712!.name, version: usdc().eip712!.version };
  let requirements: Record<string, unknown>;
  if (path === "upto") {
    const supported = (await (await fetch(`${devnet.info.routerUrl}/supported`)).json()) as { kinds: { scheme: string; network: string; extra?: Record<string, unknown> }[] };
    const facilitatorAddress = supported.kinds.find((k) => k.scheme === "upto" && k.network === NETWORK)!.extra!.facilitatorAddress;
    requirements = { scheme: "upto", network: NETWORK, asset: usdc().address, amount: "50000", payTo, maxTimeoutSeconds: 300, extra: { ...eip712, facilitatorAddress, assetTransferMethod: "permit2" } };
  } else {
    requirements = { scheme: "exact", network: NETWORK, asset: usdc().address, amount: "30000", payTo, maxTimeoutSeconds: 300, extra: { ...eip712, assetTransferMethod: "permit2" } };
  }
  const client = Core.fromConfig({ schemes: [{ network: "eip155:*", client: path === "upto" ? new UptoEvmClient(signer as never) : new ExactEvmClient(signer as never) }] });
  const paymentPayload = await client.createPaymentPayload({ x402Version: 2, resource: { url: "https://api.example.com/x" }, accepts: [requirements] } as never);
  return {
    verifyBody: { x402Version: 2, paymentPayload, paymentRequirements: requirements },
    settleBody: { x402Version: 2, paymentPayload, paymentRequirements: path === "upto" ? { ...requirements, amount: "20000" } : requirements },
  };
}

/**
 * A counterfactual wallet of `owner` under `salt`, through the devnet's allowed factory unless
 * another is named, and the call that deploys it; with `permit2`, its creation calls approve Permit2
 * for the devnet USDC (as the devnet's own Permit2 wallet does), so it can pay over Permit2.
 */
async function freshCounterfactual(owner: Address, salt: Hex, opts: { factory?: Address; permit2?: boolean } = {}): Promise<{ wallet: Address; calldata: Hex }> {
  const contracts = await compileDevnetContracts();
  const factory = opts.factory ?? devnet.info.smartWallets.factory;
  const factoryAbi = devnetContract(contracts, "DevnetSmartWalletFactory").abi;
  const initCode = `${devnetContract(contracts, "DevnetSmartWallet").bytecode}${encodeAbiParameters([{ type: "address" }], [owner]).slice(2)}` as Hex;
  if (!opts.permit2) {
    return {
      wallet: getContractAddress({ opcode: "CREATE2", from: factory, salt, bytecode: initCode }),
      calldata: encodeFunctionData({ abi: factoryAbi, functionName: "createWallet", args: [owner, salt] }),
    };
  }
  const calls = [{ to: usdc().address, data: encodeFunctionData({ abi: erc20Abi, functionName: "approve", args: [PERMIT2_ADDRESS, maxUint256] }) }];
  const committed = keccak256(encodeAbiParameters([{ type: "bytes32" }, { type: "tuple[]", components: [{ name: "to", type: "address" }, { name: "data", type: "bytes" }] }], [salt, calls]));
  return {
    wallet: getContractAddress({ opcode: "CREATE2", from: factory, salt: committed, bytecode: initCode }),
    calldata: encodeFunctionData({ abi: factoryAbi, functionName: "createWalletWithCalls", args: [owner, salt, calls] }),
  };
}

/** Mints devnet USDC to `to` (the devnet minter is an unlocked anvil account). */
async function mintUsdc(to: Address, amount: bigint) {
  const contracts = await compileDevnetContracts();
  const data = encodeFunctionData({ abi: devnetContract(contracts, "DevnetStablecoin").abi, functionName: "mint", args: [to, amount] });
  const hash = (await chain().request({ method: "eth_sendTransaction", params: [{ from: DEVNET_MINTER_ADDRESS, to: usdc().address, data }] } as never)) as Hex;
  expect((await chain().waitForTransactionReceipt({ hash })).status).toBe("success");
}
