// The chain client of one facilitator: viem over one or more RPC endpoints with fallback,
// short timeouts, and a chain-id check before anything is served.
import { createPublicClient, defineChain, fallback, http, type Chain, type PublicClient } from "viem";
import { endpointName } from "../platform/logger.ts";

export interface ChainClientOptions {
  chainId: number;
  rpcUrls: string[];
  /** How often receipts and blocks are polled, in ms. */
  pollingIntervalMs?: number;
  rpcTimeoutMs?: number;
}

export interface ChainClient {
  chain: Chain;
  client: PublicClient;
  /** Safe names of the endpoints (host:port), for logs and metrics. */
  endpoints: string[];
}

export function createChainClient(opts: ChainClientOptions): ChainClient {
  if (opts.rpcUrls.length === 0) throw new Error("at least one RPC URL is required");
  const chain = defineChain({
    id: opts.chainId,
    name: `eip155:${opts.chainId}`,
    nativeCurrency: { name: "Ether", symbol: "ETH", decimals: 18 },
    rpcUrls: { default: { http: [] } },
  });
  const transports = opts.rpcUrls.map((url) => http(url, { timeout: opts.rpcTimeoutMs ?? 10_000, retryCount: 1 }));
  const client = createPublicClient({
    chain,
    transport: transports.length === 1 ? transports[0]! : fallback(transports, { rank: false }),
    pollingInterval: opts.pollingIntervalMs ?? 250,
  }) as PublicClient;
  return { chain, client, endpoints: opts.rpcUrls.map(endpointName) };
}

/** Refuses to serve a network whose RPC reports another chain. */
export async function assertChainId(chain: ChainClient): Promise<void> {
  let reported: number;
  try {
    reported = await chain.client.getChainId();
  } catch (e) {
    throw new Error(`RPC ${chain.endpoints.join(", ")} did not answer eth_chainId: ${(e as Error).message.split("\n")[0]}`);
  }
  if (reported !== chain.chain.id) {
    throw new Error(`RPC ${chain.endpoints.join(", ")} reports chain id ${reported}, but this facilitator serves eip155:${chain.chain.id}`);
  }
}
