// Reads on-chain facts for assertions.
import { createPublicClient, erc20Abi, http, type Address } from "viem";

export function balanceOf(rpcUrl: string, token: Address, owner: Address): Promise<bigint> {
  const client = createPublicClient({ transport: http(rpcUrl) });
  return client.readContract({ address: token, abi: erc20Abi, functionName: "balanceOf", args: [owner] });
}

export async function receiptStatus(rpcUrl: string, hash: `0x${string}`): Promise<string> {
  const client = createPublicClient({ transport: http(rpcUrl) });
  return (await client.getTransactionReceipt({ hash })).status;
}
