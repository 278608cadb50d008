// Small on-chain and metrics probes for the signer-trust tests: raw JSON-RPC calls, transactions
// sent straight from a key (outside the facilitator), signer nonces, and counters read from /metrics.
import { createPublicClient, createWalletClient, defineChain, erc20Abi, http, parseGwei, type Address, type Hex } from "viem";
import { privateKeyToAccount } from "viem/accounts";

export async function rpc<T = unknown>(url: string, method: string, params: unknown[] = []): Promise<T> {
  const res = await fetch(url, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ jsonrpc: "2.0", id: 1, method, params }) });
  const body = (await res.json()) as { result?: T; error?: { message: string } };
  if (body.error) throw new Error(body.error.message);
  return body.result as T;
}

export const publicClient = (url: string) => createPublicClient({ transport: http(url) });

/** The key's transaction count on chain ("latest": mined only; "pending": the pool included). */
export const nonceOf = (url: string, address: Address, blockTag: "latest" | "pending" = "latest") => publicClient(url).getTransactionCount({ address, blockTag });

function wallet(url: string, chainId: number, key: Hex) {
  const chain = defineChain({ id: chainId, name: "test", nativeCurrency: { name: "Ether", symbol: "ETH", decimals: 18 }, rpcUrls: { default: { http: [url] } } });
  return createWalletClient({ account: privateKeyToAccount(key), chain, transport: http(url) });
}

/** A transaction sent by the key itself, not through the facilitator (a key used outside the fleet). */
export function sendFrom(url: string, chainId: number, key: Hex, tx: { to: Address; nonce?: number; tip?: bigint; maxFee?: bigint }): Promise<Hex> {
  return wallet(url, chainId, key).sendTransaction({
    to: tx.to,
    value: 0n,
    gas: 21_000n,
    ...(tx.nonce !== undefined ? { nonce: tx.nonce } : {}),
    maxPriorityFeePerGas: tx.tip ?? parseGwei("1"),
    maxFeePerGas: tx.maxFee ?? parseGwei("200"),
  });
}

/** An ERC-20 transfer sent by the holder itself (a payer moving its balance away). */
export function transferToken(url: string, chainId: number, key: Hex, token: Address, to: Address, amount: bigint, tip = parseGwei("1")): Promise<Hex> {
  return wallet(url, chainId, key).writeContract({ address: token, abi: erc20Abi, functionName: "transfer", args: [to, amount], gas: 100_000n, maxPriorityFeePerGas: tip, maxFeePerGas: parseGwei("500") });
}

/** Sum of a Prometheus series on a /metrics page, over every label set matching `labels`. */
export async function metricSum(adminUrl: string, name: string, labels: Record<string, string> = {}): Promise<number> {
  const text = await (await fetch(`${adminUrl}/metrics`)).text();
  let sum = 0;
  for (const line of text.split("\n")) {
    if (!line.startsWith(`${name}{`) && !line.startsWith(`${name} `)) continue;
    if (Object.entries(labels).every(([k, v]) => line.includes(`${k}="${v}"`))) sum += Number(line.slice(line.lastIndexOf(" ") + 1));
  }
  return sum;
}

/** Retries `probe` until it returns a value (not undefined), up to `tries` times. */
export async function eventually<T>(probe: () => Promise<T | undefined>, tries = 100, pauseMs = 100): Promise<T> {
  for (let i = 0; i < tries; i++) {
    const v = await probe();
    if (v !== undefined) return v;
    await new Promise((r) => setTimeout(r, pauseMs));
  }
  throw new Error("condition not reached");
}
