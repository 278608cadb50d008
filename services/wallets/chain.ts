// The chains the wallet service reads (balances, Permit2 allowances) and, for one action only,
// writes to: the wallet's own `approve(Permit2, amount)` transaction, signed here with its key.
// One RPC URL per network; URLs are logged by host only (they can embed provider API keys).
import {
  createPublicClient,
  encodeFunctionData,
  erc20Abi,
  http,
  keccak256,
  serializeTransaction,
  type Address,
  type Hex,
  type PublicClient,
  type TransactionSerializableEIP1559,
} from "viem";
import { chainIdOf, PERMIT2_ADDRESS, type Caip2 } from "../x402/networks.ts";
import { endpointName, safeMessage } from "../platform/logger.ts";
import { WalletError } from "./errors.ts";

export type TxSigner = (digest: Hex) => { r: Hex; s: Hex; yParity: number };

export interface ApprovalResult {
  transaction: Hex;
  status: "success" | "reverted";
  gasUsed: string;
}

export interface ChainAccess {
  networks(): Caip2[];
  has(network: string): boolean;
  nativeBalance(network: Caip2, owner: Address): Promise<bigint>;
  tokenBalance(network: Caip2, token: Address, owner: Address): Promise<bigint>;
  permit2Allowance(network: Caip2, token: Address, owner: Address): Promise<bigint>;
  tokenDecimals(network: Caip2, token: Address): Promise<number>;
  /** Sends `token.approve(Permit2, amount)` from owner, signed by `sign`; waits for the receipt (bounded). */
  approvePermit2(network: Caip2, token: Address, owner: Address, amount: bigint, sign: TxSigner): Promise<ApprovalResult>;
}

export interface ChainOptions {
  rpcUrls: Partial<Record<Caip2, string>>;
  timeoutMs?: number;
  receiptTimeoutMs?: number;
}

/** A failed RPC call as a request error that names the endpoint by host only. */
function rpcFailure(network: string, url: string, e: unknown): WalletError {
  if (e instanceof WalletError) return e;
  const short = (e as { shortMessage?: string }).shortMessage ?? "request failed";
  return new WalletError("rpc_unavailable", `the RPC of ${network} (${endpointName(url)}) failed: ${safeMessage(short)}`);
}

export function createChainAccess(opts: ChainOptions): ChainAccess {
  const clients = new Map<Caip2, { client: PublicClient; url: string }>();
  for (const [network, url] of Object.entries(opts.rpcUrls) as [Caip2, string][]) {
    chainIdOf(network);
    clients.set(network, {
      url,
      client: createPublicClient({ transport: http(url, { timeout: opts.timeoutMs ?? 10_000, retryCount: 1, batch: { wait: 0 } }) }) as PublicClient,
    });
  }
  const get = (network: string) => {
    const c = clients.get(network as Caip2);
    if (!c) throw new WalletError("network_not_configured", `the wallet service has no RPC for ${network} (configured: ${[...clients.keys()].join(", ") || "none"})`);
    return c;
  };
  const call = async <T>(network: string, fn: (client: PublicClient) => Promise<T>): Promise<T> => {
    const { client, url } = get(network);
    try {
      return await fn(client);
    } catch (e) {
      throw rpcFailure(network, url, e);
    }
  };
  // Approvals of one owner go out one at a time: each takes the owner's next nonce.
  const queues = new Map<string, Promise<unknown>>();
  const serial = <T>(key: string, fn: () => Promise<T>): Promise<T> => {
    const prev = queues.get(key) ?? Promise.resolve();
    const next = prev.then(fn, fn);
    const tail = next.catch(() => undefined);
    queues.set(key, tail);
    void tail.then(() => queues.get(key) === tail && queues.delete(key));
    return next;
  };

  return {
    networks: () => [...clients.keys()],
    has: (network) => clients.has(network as Caip2),
    nativeBalance: (network, owner) => call(network, (c) => c.getBalance({ address: owner })),
    tokenBalance: (network, token, owner) => call(network, (c) => c.readContract({ address: token, abi: erc20Abi, functionName: "balanceOf", args: [owner] })),
    permit2Allowance: (network, token, owner) => call(network, (c) => c.readContract({ address: token, abi: erc20Abi, functionName: "allowance", args: [owner, PERMIT2_ADDRESS] })),
    tokenDecimals: (network, token) => call(network, (c) => c.readContract({ address: token, abi: erc20Abi, functionName: "decimals" })),
    approvePermit2: (network, token, owner, amount, sign) =>
      serial(`${network}|${owner.toLowerCase()}`, () =>
        call(network, async (c) => {
          const data = encodeFunctionData({ abi: erc20Abi, functionName: "approve", args: [PERMIT2_ADDRESS, amount] });
          const [nonce, fees, estimated, balance] = await Promise.all([
            c.getTransactionCount({ address: owner, blockTag: "pending" }),
            c.estimateFeesPerGas(),
            c.estimateGas({ account: owner, to: token, data }),
            c.getBalance({ address: owner }),
          ]);
          const gas = (estimated * 12n) / 10n;
          const maxCost = gas * fees.maxFeePerGas;
          if (balance < maxCost) {
            throw new WalletError("insufficient_gas", `the wallet holds ${balance} wei on ${network}; the approval may cost up to ${maxCost} wei of gas: send it some native currency first`);
          }
          const tx: TransactionSerializableEIP1559 = {
            type: "eip1559",
            chainId: chainIdOf(network),
            nonce,
            to: token,
            data,
            gas,
            maxFeePerGas: fees.maxFeePerGas,
            maxPriorityFeePerGas: fees.maxPriorityFeePerGas,
            value: 0n,
          };
          const signed = serializeTransaction(tx, sign(keccak256(serializeTransaction(tx))));
          const hash = await c.sendRawTransaction({ serializedTransaction: signed });
          const receipt = await c.waitForTransactionReceipt({ hash, timeout: opts.receiptTimeoutMs ?? 30_000, pollingInterval: 250 });
          return { transaction: hash, status: receipt.status, gasUsed: receipt.gasUsed.toString() };
        }),
      ),
  };
}
