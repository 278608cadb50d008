// `x402-fleet doctor` against the running devnet (healthy) and against broken set-ups, each named
// in plain words: wrong chain id, missing contract code, wrong token decimals or EIP-712 domain, an
// unfunded signer, a nonce gap, a lagging endpoint, a routing table without the network.
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { spawn } from "node:child_process";
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { createTestClient, http, parseGwei } from "viem";
import { generatePrivateKey, privateKeyToAccount } from "viem/accounts";
import { startTestDevnet } from "./helpers/devnet.ts";
import { startAnvil, type AnvilNode } from "../services/devnet/anvil.ts";
import type { DevnetNetwork, RunningDevnet } from "../services/devnet/devnet.ts";
import { resolveFacilitatorConfig, type FacilitatorConfigInput } from "../services/facilitator/config.ts";
import { formatDoctorReport, runDoctor, type DoctorReport } from "../services/facilitator/doctor.ts";
import { parseRoutingTable, type RoutingTable } from "../services/router/routing-table.ts";

let devnet: RunningDevnet & { dir: string };
let table: RoutingTable;
let bare: AnvilNode; // a chain 84532 with nothing deployed
beforeAll(async () => {
  [devnet, bare] = await Promise.all([startTestDevnet(["eip155:84532", "eip155:137"], { hub: false, wallets: false }), startAnvil({ chainId: 84532 })]);
  table = parseRoutingTable(await readFile(join(devnet.dir, "routing.json"), "utf8"));
}, 120_000);
afterAll(async () => {
  await bare?.stop();
  await devnet?.stop();
});

const net = (network: string) => devnet.info.networks.find((n) => n.network === network)!;

/** The configuration the devnet runs this network's facilitator with, and overrides. */
function configOf(n: DevnetNetwork, overrides: FacilitatorConfigInput = {}) {
  return resolveFacilitatorConfig({
    network: n.network,
    rpcUrls: [n.facilitatorRpcUrl],
    signerKeyFile: join(devnet.dir, "keys", `${n.chainId}.key`),
    schemes: ["exact", "upto", "batch-settlement"],
    assets: n.assets,
    confirmations: 1,
    ...overrides,
  });
}

const problems = (r: DoctorReport) => r.findings.filter((f) => !f.ok).map((f) => f.message);

describe("doctor against the running devnet", () => {
  it.each([["eip155:84532"], ["eip155:137"]])("%s: healthy, every check named", async (network) => {
    const report = await runDoctor({ config: configOf(net(network)), routingTable: table, routerUrl: devnet.info.routerUrl });
    expect(problems(report)).toEqual([]);
    expect(report.ok).toBe(true);
    const text = formatDoctorReport(report);
    expect(text).toContain(`${network}: healthy`);
    for (const part of ["Permit2 has code", "x402 exact Permit2 proxy has code", "x402 upto Permit2 proxy has code", "x402 batch-settlement contract has code", "decimals", "EIP-712 domain", "no nonce gap", "the routing table lists", "the router at"]) expect(text).toContain(part);
  });

  it("the CLI: exit 0 and 'healthy' on the devnet; exit 1 and the problem on a wrong chain", async () => {
    const n = net("eip155:84532");
    const run = (args: string[]) =>
      new Promise<{ code: number | null; out: string }>((resolve) => {
        const child = spawn(process.execPath, ["bin/x402-fleet.js", "doctor", ...args], { stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, X402_NETWORK: "", X402_RPC_URLS: "" } });
        let out = "";
        child.stdout.on("data", (d: Buffer) => (out += d.toString()));
        child.stderr.on("data", (d: Buffer) => (out += d.toString()));
        child.once("exit", (code) => resolve({ code, out }));
      });
    const common = ["--network", n.network, "--signer-key-file", join(devnet.dir, "keys", `${n.chainId}.key`), "--routing-table", join(devnet.dir, "routing.json"), "--router-url", devnet.info.routerUrl];
    const healthy = await run([...common, "--rpc-url", n.facilitatorRpcUrl]);
    expect(healthy.out).toContain("eip155:84532: healthy");
    expect(healthy.code).toBe(0);
    const wrong = await run([...common, "--rpc-url", net("eip155:137").rpcUrl]);
    expect(wrong.out).toMatch(/PROBLEM {2}rpc: RPC 127\.0\.0\.1:\d+ reports chain id 137, but this facilitator serves eip155:84532 \(chain id 84532\): it is a mainnet, and testnets and mainnets never mix/);
    expect(wrong.code).toBe(1);
  }, 60_000);
});

describe("doctor names each problem of a broken set-up", () => {
  it("wrong chain id: the endpoint and both chain ids", async () => {
    const report = await runDoctor({ config: configOf(net("eip155:137"), { rpcUrls: [net("eip155:84532").rpcUrl] }) });
    expect(report.ok).toBe(false);
    expect(problems(report)).toEqual([
      expect.stringMatching(/^RPC 127\.0\.0\.1:\d+ reports chain id 84532, but this facilitator serves eip155:137 \(chain id 137\): it is a testnet, and testnets and mainnets never mix$/),
      "no RPC endpoint answers for this network: nothing else could be checked",
    ]);
  });

  it("missing contract code, an asset that is no token, an unfunded signer, a nonce gap", async () => {
    const n = net("eip155:84532");
    const test = createTestClient({ mode: "anvil", transport: http(bare.rpcUrl) });
    const key = generatePrivateKey();
    const account = privateKeyToAccount(key);
    // A key with just enough for one transfer, one of its transactions waiting in the pool: a nonce gap.
    await test.setBalance({ address: account.address, value: parseGwei("1") * 21_000n * 3n });
    await test.setAutomine(false);
    await account.signTransaction({ chainId: 84532, type: "eip1559", to: account.address, gas: 21_000n, nonce: 0, maxFeePerGas: parseGwei("2"), maxPriorityFeePerGas: 1n }).then((raw) => test.request({ method: "eth_sendRawTransaction" as never, params: [raw] as never }));
    const report = await runDoctor({ config: configOf(n, { rpcUrls: [bare.rpcUrl], signerKeys: [key], signerKeyFile: undefined }) });
    await test.setAutomine(true);
    const found = problems(report).join("\n");
    expect(report.ok).toBe(false);
    expect(found).toContain("Permit2 has no code at 0x000000000022D473030F116dDEE9F6B43aC78BA3");
    expect(found).toContain("x402 exact Permit2 proxy has no code");
    expect(found).toContain("x402 batch-settlement contract has no code");
    expect(found).toContain(`asset USDC ${n.assets[0]!.address} has no code: it is not a token on this chain`);
    expect(found).toMatch(new RegExp(`signer ${account.address} holds 0\\.000063 \\(native\\), at or below the minimum [0-9.]+ its costliest transaction may cost: fund it`));
    expect(found).toContain(`signer ${account.address} has 1 transaction(s) between latest (nonce 0) and pending (nonce 1): stuck or still in flight`);
  });

  it("wrong token decimals and a wrong EIP-712 domain", async () => {
    const n = net("eip155:137");
    const usdc = n.assets[0]!;
    const report = await runDoctor({ config: configOf(n, { assets: [{ ...usdc, decimals: 18, eip712: { name: "USDC", version: "2" } }] }) });
    expect(problems(report)).toEqual([
      `asset USDC ${usdc.address} has 6 decimals, but 18 are configured: amounts would be off by a factor of 10^12`,
      `asset USDC ${usdc.address}: its EIP-712 domain is not "USDC"/"2" (the token's name() is "USD Coin"): every signature made for the configured domain would be refused`,
    ]);
  });

  it("an unfunded signer among funded ones", async () => {
    const n = net("eip155:137");
    const devnetKey = (await readFile(join(devnet.dir, "keys", `${n.chainId}.key`), "utf8")).trim() as `0x${string}`;
    const poorKey = generatePrivateKey();
    const report = await runDoctor({ config: configOf(n, { signerKeyFile: undefined, signerKeys: [devnetKey, poorKey] }) });
    expect(problems(report)).toEqual([expect.stringMatching(new RegExp(`^signer ${privateKeyToAccount(poorKey).address} holds 0 \\(native\\), at or below the minimum [0-9.]+ its costliest transaction may cost: fund it$`))]);
  });

  it("a lagging endpoint: named with how far behind it is", async () => {
    const n = net("eip155:84532");
    const lagging = await startAnvil({ chainId: 84532 });
    try {
      await createTestClient({ mode: "anvil", transport: http(n.rpcUrl) }).mine({ blocks: 20 });
      const report = await runDoctor({ config: configOf(n, { rpcUrls: [n.rpcUrl, lagging.rpcUrl] }) });
      expect(problems(report)).toEqual([expect.stringMatching(new RegExp(`^RPC 127\\.0\\.0\\.1:${lagging.port} is \\d+ blocks behind 127\\.0\\.0\\.1:\\d+ \\(head 0 vs \\d+\\); more than 5 blocks \\(~10 s at 2000 ms blocks\\) is lagging$`))]);
    } finally {
      await lagging.stop();
    }
  });

  it("a routing table or router that does not list the network", async () => {
    const n = net("eip155:84532");
    const without = { backends: table.backends.filter((b) => b.network !== n.network) };
    const report = await runDoctor({ config: configOf(n), routingTable: without });
    expect(problems(report)).toEqual([`the routing table lists no backend for ${n.network}: the router would answer it unsupported`]);
    const partial = { backends: table.backends.map((b) => (b.network === n.network ? { ...b, kinds: b.kinds.filter((k) => k.scheme === "exact"), signers: [] } : b)) };
    const two = problems(await runDoctor({ config: configOf(n), routingTable: partial }));
    expect(two[0]).toBe(`the routing table's ${n.network} backend lacks the scheme(s) upto, batch-settlement this facilitator serves`);
    expect(two[1]).toMatch(/^the routing table's eip155:84532 backend does not list signer\(s\) 0x[0-9a-fA-F]{40}$/);
  });
});
