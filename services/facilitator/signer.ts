// Our FacilitatorEvmSigner (the interface the @x402/evm mechanisms need) over viem local accounts.
// Transactions are signed locally with nonces we allocate per key, so concurrent settlements
// from one key never collide; fee and gas estimation happen outside the per-key critical section.
import {
  encodeFunctionData,
  recoverTypedDataAddress,
  isAddressEqual,
  type Abi,
  type Address,
  type Hex,
  type PrivateKeyAccount,
  type TypedDataDefinition,
} from "viem";
import type { FacilitatorEvmSigner } from "@x402/evm";
import type { ChainClient } from "./chain.ts";

export interface SignerOptions {
  chain: ChainClient;
  accounts: PrivateKeyAccount[];
  /** Upper bound of a receipt wait in ms. */
  receiptTimeoutMs: number;
  /** Told whenever a key's count of transactions in flight changes (for the pending gauge). */
  onPendingChange?: (signer: Address, inFlight: number) => void;
}

interface KeyState {
  account: PrivateKeyAccount;
  nextNonce?: number;
  inFlight: number;
  queue: Promise<unknown>;
}

export interface FleetSigner extends FacilitatorEvmSigner {
  /** Number of transactions each key is currently sending. */
  pending(): Record<Address, number>;
}

const isNonceError = (e: unknown) => /nonce too low|nonce.*already|replacement transaction underpriced|NONCE_EXPIRED/i.test(String((e as Error)?.message ?? e));

export function createFleetSigner(opts: SignerOptions): FleetSigner {
  if (opts.accounts.length === 0) throw new Error("at least one signer key is required");
  const { client, chain } = opts.chain;
  const keys: KeyState[] = opts.accounts.map((account) => ({ account, inFlight: 0, queue: Promise.resolve() }));

  const leastBusy = () => keys.reduce((best, k) => (k.inFlight < best.inFlight ? k : best));

  /** Runs fn with the key's next nonce, one at a time per key. */
  function withNonce<T>(key: KeyState, fn: (nonce: number) => Promise<T>): Promise<T> {
    const run = async () => {
      if (key.nextNonce === undefined) {
        key.nextNonce = await client.getTransactionCount({ address: key.account.address, blockTag: "pending" });
      }
      const nonce = key.nextNonce;
      try {
        const result = await fn(nonce);
        key.nextNonce = nonce + 1;
        return result;
      } catch (e) {
        key.nextNonce = undefined; // resynchronise from the node on the next send
        throw e;
      }
    };
    const next = key.queue.then(run, run);
    key.queue = next.catch(() => undefined);
    return next;
  }

  async function sendTransaction(args: { to: Address; data: Hex; gas?: bigint }): Promise<Hex> {
    const key = leastBusy();
    key.inFlight++;
    opts.onPendingChange?.(key.account.address, key.inFlight);
    try {
      const [gas, fees] = await Promise.all([
        args.gas ?? client.estimateGas({ account: key.account.address, to: args.to, data: args.data }).then((g) => (g * 12n) / 10n),
        client.estimateFeesPerGas(),
      ]);
      const send = () =>
        withNonce(key, async (nonce) => {
          const raw = await key.account.signTransaction({
            chainId: chain.id,
            type: "eip1559",
            to: args.to,
            data: args.data,
            gas,
            nonce,
            maxFeePerGas: fees.maxFeePerGas,
            maxPriorityFeePerGas: fees.maxPriorityFeePerGas,
          });
          return client.sendRawTransaction({ serializedTransaction: raw });
        });
      try {
        return await send();
      } catch (e) {
        if (!isNonceError(e)) throw e;
        return await send(); // the nonce was resynchronised from the node
      }
    } finally {
      key.inFlight--;
      opts.onPendingChange?.(key.account.address, key.inFlight);
    }
  }

  return {
    getAddresses: () => keys.map((k) => k.account.address),
    pending: () => Object.fromEntries(keys.map((k) => [k.account.address, k.inFlight])),

    readContract: (args) => client.readContract(args as Parameters<typeof client.readContract>[0]),

    async verifyTypedData(args) {
      // An ECDSA signature by the address itself needs no RPC; anything else (ERC-1271 contract
      // wallets, ERC-6492 wrappers) is checked on chain by viem.
      if (/^0x[0-9a-fA-F]{130}$/.test(args.signature)) {
        try {
          const recovered = await recoverTypedDataAddress(args as unknown as TypedDataDefinition & { signature: Hex });
          if (isAddressEqual(recovered, args.address)) return true;
        } catch {
          // malformed signature: fall through to the on-chain check, which answers false
        }
      }
      try {
        return await client.verifyTypedData(args as Parameters<typeof client.verifyTypedData>[0]);
      } catch {
        return false;
      }
    },

    writeContract(args) {
      const data = encodeFunctionData({ abi: args.abi as Abi, functionName: args.functionName, args: args.args as unknown[] });
      const suffix = args.dataSuffix ? args.dataSuffix.slice(2) : "";
      return sendTransaction({ to: args.address, data: `${data}${suffix}` as Hex, gas: args.gas });
    },

    sendTransaction: (args) => sendTransaction(args),

    async waitForTransactionReceipt(args) {
      return client.waitForTransactionReceipt({ hash: args.hash, timeout: Math.min(args.timeout ?? opts.receiptTimeoutMs, opts.receiptTimeoutMs) });
    },

    getCode: (args) => client.getCode(args),
  };
}
