// Each network's policy on a devnet that runs the chain's rules: its block time, its base fee and,
// behind a small RPC proxy, its minimum tip (Polygon PoS 25 gwei, BNB Smart Chain's gas-price
// floor). Settlement succeeds under every chain's rules, the money moves, the settlement is answered
// only at the chain's confirmation depth, and a transaction under a chain's floor is never sent.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createPublicClient, createTestClient, http, parseAbi, parseGwei, type Address, type Hex } from "viem";
import { generatePrivateKey, privateKeyToAccount } from "viem/accounts";
import { pino } from "pino";
import { startTestDevnet } from "./helpers/devnet.ts";
import { balanceOf } from "./helpers/chain.ts";
import { postJson, serviceShape, signEip3009, type PaymentSpec } from "./helpers/payments.ts";
import type { DevnetNetwork, RunningDevnet } from "../services/devnet/devnet.ts";
import { resolveFacilitatorConfig, type FacilitatorConfigInput } from "../services/facilitator/config.ts";
import { startFacilitatorService, type RunningFacilitator } from "../services/facilitator/service.ts";
import { OP_GAS_PRICE_ORACLE, resolveNetworkPolicy } from "../services/facilitator/network-policy.ts";
import { openDatabase, type Database } from "../services/platform/storage.ts";
import { refuseWellKnownKeys } from "../services/facilitator/signer-networks.ts";

const NETWORKS = ["eip155:56", "eip155:97", "eip155:8453", "eip155:84532", "eip155:137", "eip155:42161"] as const;
const authorizationStateAbi = parseAbi(["function authorizationState(address, bytes32) view returns (bool)"]);

let devnet: RunningDevnet;
let db: Database;
const extra: RunningFacilitator[] = [];
beforeAll(async () => {
  devnet = await startTestDevnet([...NETWORKS], { blockTimes: true, hub: false, wallets: false });
  db = await openDatabase();
}, 120_000);
afterAll(async () => {
  await Promise.all(extra.map((f) => f.close()));
  await db?.close();
  await devnet?.stop();
});

const net = (network: string) => devnet.info.networks.find((n) => n.network === network)!;
const client = (n: DevnetNetwork) => createPublicClient({ transport: http(n.rpcUrl) });

function spec(n: DevnetNetwork, amount = 4_321n): PaymentSpec {
  return {
    network: n.network,
    chainId: n.chainId,
    asset: n.assets.find((a) => a.transferMethods.includes("eip3009"))!,
    payerKey: devnet.info.payers[0]!.privateKey,
    payTo: devnet.info.receivers[0]!.address,
    amount,
  };
}

/** A facilitator of our own on a devnet chain (through its fee-floor proxy), with a fresh funded key. */
async function ownFacilitator(n: DevnetNetwork, overrides: FacilitatorConfigInput): Promise<{ f: RunningFacilitator; signer: Address }> {
  const key = generatePrivateKey();
  const signer = privateKeyToAccount(key).address;
  await createTestClient({ mode: "anvil", transport: http(n.rpcUrl) }).setBalance({ address: signer, value: 10n ** 21n });
  const config = resolveFacilitatorConfig({ network: n.network, rpcUrls: [n.facilitatorRpcUrl], signerKeys: [key], assets: n.assets, confirmations: 1, port: 0, schemes: ["exact"], ...overrides });
  const f = await startFacilitatorService(config, pino({ level: "silent" }), { db });
  extra.push(f);
  return { f, signer };
}

describe("settlement under each chain's rules", () => {
  it.each(NETWORKS.map((n) => [n]))("%s: settles, the receiver is paid, at the chain's tip floor and confirmation depth", async (network) => {
    const n = net(network);
    const policy = resolveNetworkPolicy(network);
    expect(n.confirmations).toBe(policy.confirmations);
    const s = spec(n);
    const before = await balanceOf(n.rpcUrl, s.asset.address, s.payTo);
    const settled = await postJson(`${devnet.info.routerUrl}/settle`, serviceShape(s, await signEip3009(s)));
    expect(settled.json).toMatchObject({ success: true, network });
    const hash = settled.json.transaction as Hex;
    // On chain: the money moved, by this transaction, at a tip the chain accepts, as deep as the policy asks.
    const c = client(n);
    const [receipt, tx, head] = await Promise.all([c.getTransactionReceipt({ hash }), c.getTransaction({ hash }), c.getBlockNumber()]);
    expect(receipt.status).toBe("success");
    expect(await balanceOf(n.rpcUrl, s.asset.address, s.payTo)).toBe(before + s.amount);
    expect(tx.maxPriorityFeePerGas! >= policy.minPriorityFeePerGasWei).toBe(true);
    expect(head - receipt.blockNumber + 1n >= BigInt(policy.confirmations)).toBe(true);
    // Behind a floor, every transaction the facilitator sent was at or above it; none was refused.
    const proxy = devnet.feeFloorProxies[network];
    if (policy.minPriorityFeePerGasWei > 0n) {
      expect(proxy).toBeDefined();
      expect(proxy!.transactions.length).toBeGreaterThan(0);
      expect(proxy!.transactions.every((t) => !t.refused && t.tip >= policy.minPriorityFeePerGasWei)).toBe(true);
    } else expect(proxy).toBeUndefined();
  });
});

describe("a transaction under a chain's floor is never sent", () => {
  it("eip155:137: a fee cap under Polygon's 25 gwei minimum tip refuses the settlement before signing; nothing is broadcast, nothing moves", async () => {
    const n = net("eip155:137");
    const proxy = devnet.feeFloorProxies["eip155:137"]!;
    const { f, signer } = await ownFacilitator(n, { maxFeePerGasWei: parseGwei("10").toString() });
    const s = spec(n, 777n);
    const payload = await signEip3009(s);
    const sent = proxy.transactions.length;
    const before = await balanceOf(n.rpcUrl, s.asset.address, s.payTo);
    const r = await postJson(`${f.url}/settle`, serviceShape(s, payload));
    expect(r.json.success).toBe(false);
    expect(r.json.errorMessage).toMatch(/below the chain's floor/);
    expect(proxy.transactions.length).toBe(sent); // not one eth_sendRawTransaction
    const c = client(n);
    expect(await c.getTransactionCount({ address: signer, blockTag: "pending" })).toBe(0);
    expect(await balanceOf(n.rpcUrl, s.asset.address, s.payTo)).toBe(before);
    const nonce = (payload as { authorization: { nonce: Hex } }).authorization.nonce;
    expect(await c.readContract({ address: s.asset.address, abi: authorizationStateAbi, functionName: "authorizationState", args: [privateKeyToAccount(s.payerKey).address, nonce] })).toBe(false);
  });

  it("the devnet's Polygon and BSC nodes refuse a below-floor transaction as the real ones do", async () => {
    for (const network of ["eip155:137", "eip155:56"] as const) {
      const n = net(network);
      const floor = resolveNetworkPolicy(network).minPriorityFeePerGasWei;
      const account = privateKeyToAccount(generatePrivateKey());
      await createTestClient({ mode: "anvil", transport: http(n.rpcUrl) }).setBalance({ address: account.address, value: 10n ** 20n });
      const raw = await account.signTransaction({ chainId: n.chainId, type: "eip1559", to: account.address, value: 0n, gas: 21_000n, nonce: 0, maxFeePerGas: parseGwei("100"), maxPriorityFeePerGas: floor - 1n });
      const r = await postJson(n.facilitatorRpcUrl, { jsonrpc: "2.0", id: 1, method: "eth_sendRawTransaction", params: [raw] });
      expect((r.json.error as { message: string }).message).toMatch(/transaction underpriced/);
      expect(await client(n).getTransactionCount({ address: account.address, blockTag: "pending" })).toBe(0);
    }
  });

  it("eip155:8453: an L1 data fee above its bound is never signed (the GasPriceOracle's quote)", async () => {
    const n = net("eip155:8453");
    const { f, signer } = await ownFacilitator(n, { policy: { dataFee: { kind: "op-l1-fee", oracle: OP_GAS_PRICE_ORACLE, maxFeeWei: "1000" } } });
    const s = spec(n, 555n);
    const before = await balanceOf(n.rpcUrl, s.asset.address, s.payTo);
    const r = await postJson(`${f.url}/settle`, serviceShape(s, await signEip3009(s)));
    expect(r.json.success).toBe(false);
    expect(r.json.errorMessage).toMatch(/L1 data fee of \d+ wei is above the bound of 1000/);
    expect(await client(n).getTransactionCount({ address: signer, blockTag: "pending" })).toBe(0);
    expect(await balanceOf(n.rpcUrl, s.asset.address, s.payTo)).toBe(before);
  });
});

describe("testnets and mainnets never mix", () => {
  it("a mainnet facilitator refuses an RPC on a testnet, and the reverse", async () => {
    await expect(ownFacilitator(net("eip155:84532"), { network: "eip155:8453" })).rejects.toThrow(/is on testnet eip155:84532, but this facilitator serves the mainnet eip155:8453: testnets and mainnets never mix/);
    await expect(ownFacilitator(net("eip155:56"), { network: "eip155:97" })).rejects.toThrow(/is on mainnet eip155:56, but this facilitator serves the testnet eip155:97/);
  });

  it("a signer key bound to one network is refused on another", async () => {
    const key = generatePrivateKey();
    const n97 = net("eip155:97");
    const first = resolveFacilitatorConfig({ network: n97.network, rpcUrls: [n97.facilitatorRpcUrl], signerKeys: [key], assets: n97.assets, confirmations: 1, port: 0 });
    extra.push(await startFacilitatorService(first, pino({ level: "silent" }), { db }));
    const n84532 = net("eip155:84532");
    const second = resolveFacilitatorConfig({ network: n84532.network, rpcUrls: [n84532.rpcUrl], signerKeys: [key], port: 0 });
    await expect(startFacilitatorService(second, pino({ level: "silent" }), { db })).rejects.toThrow(
      new RegExp(`${privateKeyToAccount(key).address.toLowerCase()} \\(bound to eip155:97\\) cannot sign for eip155:84532`),
    );
  });

  it("a mainnet served by a real node refuses anvil's public development keys; a local development node may use them", () => {
    const anvilKey0: Hex = "0xac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80";
    const base = { network: "eip155:8453", testnet: false };
    expect(() => refuseWellKnownKeys(base, [generatePrivateKey(), anvilKey0], "Geth/v1.101503.4-stable/linux-amd64/go1.23")).toThrow(/signer key 2 is a well-known development key .* mainnet eip155:8453/);
    expect(() => refuseWellKnownKeys(base, [anvilKey0], "anvil/v1.7.1")).not.toThrow();
    expect(() => refuseWellKnownKeys({ network: "eip155:84532", testnet: true }, [anvilKey0], "op-geth/v1.0")).not.toThrow();
    expect(() => refuseWellKnownKeys(base, [generatePrivateKey()], "op-geth/v1.0")).not.toThrow();
  });
});
