// Contract wallets (ERC-1271): a deployed wallet's signed write is accepted through the RPC, a
// signature its owner did not make is refused, and an unreachable RPC is a 503, not a 401 or 500.
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createWalletClient, createPublicClient, http, type Abi, type Address, type Hex } from "viem";
import { generatePrivateKey, mnemonicToAccount, privateKeyToAccount } from "viem/accounts";
import { startAnvil, type AnvilNode } from "../services/devnet/anvil.ts";
import { DEVNET_MNEMONIC } from "../services/devnet/devnet.ts";
import { createHubClient } from "../services/hub/client.ts";
import { ENGINES, JSON_TYPE, errorCode, send, signedHeaders, startTestHub, type TestHub } from "./helpers/hub.ts";

// A minimal ERC-1271 wallet: valid when the hash was signed (plain ECDSA) by its owner key.
const WALLET_SOURCE = `
// SPDX-License-Identifier: MIT
pragma solidity ^0.8.20;
contract TestContractWallet {
    address public immutable owner;
    constructor(address owner_) { owner = owner_; }
    function isValidSignature(bytes32 hash, bytes calldata signature) external view returns (bytes4) {
        if (signature.length != 65) return 0xffffffff;
        bytes32 r = bytes32(signature[0:32]);
        bytes32 s = bytes32(signature[32:64]);
        uint8 v = uint8(signature[64]);
        address signer = ecrecover(hash, v, r, s);
        return signer != address(0) && signer == owner ? bytes4(0x1626ba7e) : bytes4(0xffffffff);
    }
}`;

async function compileWallet(): Promise<{ abi: Abi; bytecode: Hex }> {
  const solc = (await import("solc")).default as { compile(input: string): string };
  const out = JSON.parse(
    solc.compile(
      JSON.stringify({
        language: "Solidity",
        sources: { "TestContractWallet.sol": { content: WALLET_SOURCE } },
        settings: { evmVersion: "cancun", outputSelection: { "*": { "*": ["abi", "evm.bytecode.object"] } } },
      }),
    ),
  ) as { errors?: { severity: string; formattedMessage: string }[]; contracts: Record<string, Record<string, { abi: Abi; evm: { bytecode: { object: string } } }>> };
  const errors = (out.errors ?? []).filter((e) => e.severity === "error");
  if (errors.length) throw new Error(errors.map((e) => e.formattedMessage).join("\n"));
  const c = out.contracts["TestContractWallet.sol"]!["TestContractWallet"]!;
  return { abi: c.abi, bytecode: `0x${c.evm.bytecode.object}` };
}

let anvil: AnvilNode;
let walletAddress: Address;
const walletKey = generatePrivateKey();
const walletOwner = privateKeyToAccount(walletKey);

beforeAll(async () => {
  anvil = await startAnvil({ chainId: 84532 });
  const { abi, bytecode } = await compileWallet();
  const deployer = mnemonicToAccount(DEVNET_MNEMONIC, { addressIndex: 0 });
  const wallet = createWalletClient({ account: deployer, transport: http(anvil.rpcUrl) });
  const client = createPublicClient({ transport: http(anvil.rpcUrl) });
  const chain = { id: 84532, name: "anvil", nativeCurrency: { name: "Ether", symbol: "ETH", decimals: 18 }, rpcUrls: { default: { http: [anvil.rpcUrl] } } };
  const hash = await wallet.deployContract({ abi, bytecode, args: [walletOwner.address], chain });
  const receipt = await client.waitForTransactionReceipt({ hash, pollingInterval: 50 });
  walletAddress = receipt.contractAddress!;
});
afterAll(() => anvil?.stop());

describe.each(ENGINES)("ERC-1271 contract wallets on the %s engine", (engine) => {
  let hub: TestHub;
  beforeAll(async () => {
    hub = await startTestHub(engine, { rpcUrl: anvil.rpcUrl });
    hub.track(walletAddress);
  });
  afterAll(() => hub?.stop());

  it("takes the chain id of its RPC into the signing domain", () => {
    expect(hub.domain.chainId).toBe(84532);
  });

  it("accepts a write signed for the contract wallet by the key it trusts", async () => {
    const id = `w_${engine}_0`;
    const fields = { owner: walletAddress, bucket: "wallet", id, message: "from a contract wallet" };
    const res = await send(`${hub.url}/api/upload`, { headers: { ...JSON_TYPE, ...(await signedHeaders(walletOwner, hub.domain, fields)) }, body: JSON.stringify(fields) });
    expect(res.status, res.text).toBe(200);
    expect(res.json).toMatchObject({ owner: walletAddress.toLowerCase(), id, version: 1 });
    expect((await send(`${hub.url}/api/download?owner=${walletAddress}&id=${id}`)).text).toBe("from a contract wallet");

    // the same through the TypeScript client: owner = the wallet, signer = its key
    const client = createHubClient({ url: hub.url, signer: walletOwner, owner: walletAddress });
    expect(await client.upload({ id, message: "second version", bucket: "wallet" })).toMatchObject({ version: 2 });
    expect(await client.download({ id })).toBe("second version");
  });

  it("refuses a signature by a key the wallet does not trust, and a tampered message", async () => {
    const stranger = privateKeyToAccount(generatePrivateKey());
    const fields = { owner: walletAddress, bucket: "wallet", id: `x_${engine}`, message: "forged" };
    const res = await send(`${hub.url}/api/upload`, { headers: { ...JSON_TYPE, ...(await signedHeaders(stranger, hub.domain, fields)) }, body: JSON.stringify(fields) });
    expect(res.status).toBe(401);
    expect(errorCode(res)).toBe("invalid_signature");

    const headers = { ...JSON_TYPE, ...(await signedHeaders(walletOwner, hub.domain, fields)) };
    const tampered = await send(`${hub.url}/api/upload`, { headers, body: JSON.stringify({ ...fields, message: "changed" }) });
    expect(errorCode(tampered)).toBe("invalid_signature");
    expect((await send(`${hub.url}/api/download?owner=${walletAddress}&id=x_${engine}`)).status).toBe(404);
  });
});

describe("contract wallets without a usable RPC", () => {
  it("a hub without an RPC accepts EOAs only: a contract wallet's write is 401", async () => {
    const hub = await startTestHub("embedded", { chainId: 84532 });
    try {
      const fields = { owner: walletAddress, bucket: "wallet", id: "k", message: "m" };
      const res = await send(`${hub.url}/api/upload`, { headers: { ...JSON_TYPE, ...(await signedHeaders(walletOwner, hub.domain, fields)) }, body: JSON.stringify(fields) });
      expect(errorCode(res)).toBe("invalid_signature");
      expect((await send(`${hub.url}/api/info`)).json).toMatchObject({ contractWallets: false, domain: { chainId: 84532 } });
    } finally {
      await hub.stop();
    }
  });

  it("an RPC that stops answering is a 503 for contract wallets, while EOA writes go on", async () => {
    const node = await startAnvil({ chainId: 84532 });
    const hub = await startTestHub("embedded", { rpcUrl: node.rpcUrl });
    try {
      await node.stop();
      const fields = { owner: walletAddress, bucket: "wallet", id: "k", message: "m" };
      const res = await send(`${hub.url}/api/upload`, { headers: { ...JSON_TYPE, ...(await signedHeaders(walletOwner, hub.domain, fields)) }, body: JSON.stringify(fields) });
      expect(res.status, res.text).toBe(503);
      expect(errorCode(res)).toBe("backend_unavailable");
      const eoa = privateKeyToAccount(generatePrivateKey());
      const own = { ...fields, owner: eoa.address };
      const ok = await send(`${hub.url}/api/upload`, { headers: { ...JSON_TYPE, ...(await signedHeaders(eoa, hub.domain, own)) }, body: JSON.stringify(own) });
      expect(ok.status, ok.text).toBe(200);
    } finally {
      await hub.stop();
      await node.stop();
    }
  });

  it("refuses to start when the configured chain id differs from the RPC's", async () => {
    await expect(startTestHub("embedded", { rpcUrl: anvil.rpcUrl, chainId: 8453 })).rejects.toThrow(/reports chain id 84532, but the hub is configured for chain id 8453/);
  });
});

describe("ERC-1271 checks come after the rate limits", () => {
  // A JSON-RPC proxy in front of anvil that counts the calls a signature check makes.
  let proxy: Server;
  let proxyUrl = "";
  let checks = 0;
  beforeAll(async () => {
    proxy = createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on("data", (c: Buffer) => chunks.push(c));
      req.on("end", () => {
        const body = Buffer.concat(chunks).toString();
        const calls = ([] as { method?: string }[]).concat(JSON.parse(body) as { method?: string });
        checks += calls.filter((c) => c.method === "eth_getCode" || c.method === "eth_call").length;
        fetch(anvil.rpcUrl, { method: "POST", headers: { "content-type": "application/json" }, body })
          .then(async (r) => res.writeHead(r.status, { "content-type": "application/json" }).end(await r.text()))
          .catch(() => res.writeHead(502).end());
      });
    });
    await new Promise<void>((resolve) => proxy.listen(0, "127.0.0.1", resolve));
    proxyUrl = `http://127.0.0.1:${(proxy.address() as AddressInfo).port}`;
  });
  afterAll(() => new Promise<void>((resolve) => proxy?.close(() => resolve())));

  const clock = Date.UTC(2030, 0, 1); // frozen: no bucket refills during the test
  const forge = async (hub: TestHub, i: number) => {
    const fields = { owner: walletAddress, bucket: "wallet", id: `forged_${i}`, message: "m" };
    const stranger = privateKeyToAccount(generatePrivateKey());
    return send(`${hub.url}/api/upload`, { headers: { ...JSON_TYPE, ...(await signedHeaders(stranger, hub.domain, fields, { now: clock })) }, body: JSON.stringify(fields) });
  };

  it("an anonymous caller cannot make the hub spend RPC calls past its write-attempt limit", async () => {
    const hub = await startTestHub("embedded", { rpcUrl: proxyUrl, now: () => clock, writeAttemptRateLimit: { burst: 2, perSecond: 1 } });
    try {
      checks = 0;
      for (const i of [0, 1]) expect(errorCode(await forge(hub, i))).toBe("invalid_signature");
      const spent = checks;
      expect(spent).toBeGreaterThan(0); // the two allowed attempts did ask the chain
      for (const i of [2, 3, 4, 5, 6, 7]) expect(errorCode(await forge(hub, i))).toBe("rate_limited");
      expect(checks).toBe(spent);
    } finally {
      await hub.stop();
    }
  });

  it("an owner at its write limit is refused before its contract is asked", async () => {
    const hub = await startTestHub("embedded", { rpcUrl: proxyUrl, now: () => clock, writeRateLimit: { burst: 1, perSecond: 1 } });
    hub.track(walletAddress);
    try {
      const fields = { owner: walletAddress, bucket: "wallet", id: "limited", message: "m" };
      const ok = await send(`${hub.url}/api/upload`, { headers: { ...JSON_TYPE, ...(await signedHeaders(walletOwner, hub.domain, fields, { now: clock })) }, body: JSON.stringify(fields) });
      expect(ok.status, ok.text).toBe(200);
      checks = 0;
      for (const i of [0, 1, 2]) expect(errorCode(await forge(hub, i))).toBe("rate_limited");
      expect(checks).toBe(0);
    } finally {
      await hub.stop();
    }
  });
});
