// The FacilitatorEvmSigner the reference mechanisms settle through. Every transaction gets its
// nonce from the settlement store (so processes sharing a key never collide), is signed and
// stored in the outbox before it is broadcast, and receipt waits are bounded and follow fee
// replacements. Reads go straight to the chain client.
import {
  encodeFunctionData,
  isAddressEqual,
  keccak256,
  recoverTypedDataAddress,
  type Abi,
  type Address,
  type Hex,
  type PrivateKeyAccount,
  type TypedDataDefinition,
} from "viem";
import type { FacilitatorEvmSigner } from "@x402/evm";
import type { Logger } from "../../platform/logger.ts";
import { isRpcUnavailable, noteRpcFailure, type ChainClient } from "../chain.ts";
import { settlementContext } from "./context.ts";
import { findMined, sleep } from "./receipts.ts";
import type { OutboxRow, SettlementStore } from "./store.ts";

export interface OutboxSignerOptions {
  chain: ChainClient;
  accounts: PrivateKeyAccount[];
  store: SettlementStore;
  /** Upper bound of a receipt wait in ms. */
  receiptTimeoutMs: number;
  confirmations: number;
  /** Fee cap in wei per gas; transactions are never signed above it. */
  maxFeePerGasWei?: bigint;
  /** Whether a key may be picked (its balance is above the configured minimum). */
  isFunded: (signer: Address) => boolean;
  logger: Logger;
  pollIntervalMs?: number;
  /** Fault injection for crash-recovery tests: SIGKILL this process at that point. */
  crashAt?: "after_store" | "after_broadcast";
}

export class NoSignerAvailableError extends Error {
  override name = "NoSignerAvailableError";
}

export interface OutboxSigner extends FacilitatorEvmSigner {
  /** Broadcasts a stored transaction (again); idempotent. */
  broadcast(row: Pick<OutboxRow, "id" | "raw_tx" | "hash">): Promise<void>;
  /** Signs the same transaction again with new fees (a replacement). */
  resign(row: OutboxRow, fees: { maxFeePerGas: bigint; maxPriorityFeePerGas: bigint }): Promise<{ raw: Hex; hash: Hex }>;
  inFlight(): Record<Address, number>;
  account(address: string): PrivateKeyAccount | undefined;
}

const message = (e: unknown) => String((e as Error)?.message ?? e).split("\n")[0]!.replace(/https?:\/\/\S+/g, "<rpc>");
const alreadyKnown = (e: unknown) => /already known|known transaction|already imported|AlreadyKnown/i.test(message(e));
const nonceTooLow = (e: unknown) => /nonce too low|nonce.*(already|has been) used|NONCE_EXPIRED|OldNonce/i.test(message(e));
/** Errors that say "this node is not reachable", as opposed to "this transaction is rejected". */
const transient = (e: unknown) => isRpcUnavailable(e) || /fetch failed|ECONNREFUSED|ECONNRESET|timed? ?out|socket|network|HTTP request failed|503|502|504/i.test(message(e));

function crash(point: string, at: string | undefined) {
  if (at === point) process.kill(process.pid, "SIGKILL");
}

export function createOutboxSigner(opts: OutboxSignerOptions): OutboxSigner {
  const { client, chain } = opts.chain;
  const accounts = new Map(opts.accounts.map((a) => [a.address.toLowerCase(), a]));
  const busy = new Map<Address, number>(opts.accounts.map((a) => [a.address, 0]));
  const release = (address: Address) => busy.set(address, Math.max(0, busy.get(address)! - 1));
  let rotation = -1;
  const poll = opts.pollIntervalMs ?? 100;
  // Hashes this process sent, so receipt waits need not ask the store on every poll.
  const sent = new Map<string, Pick<OutboxRow, "id" | "hashes"> & { signer?: Address }>();
  // Account classification (code or none) changes rarely: read it once per short window.
  const codeCache = new Map<string, { code: Hex | undefined; until: number }>();
  const CODE_TTL_MS = 10_000;

  function pick(): PrivateKeyAccount {
    const required = settlementContext.getStore()?.signer;
    if (required) {
      const account = accounts.get(required.toLowerCase());
      if (!account) throw new NoSignerAvailableError(`the payment names signer ${required}, which this facilitator does not hold`);
      return account;
    }
    const funded = opts.accounts.filter((a) => opts.isFunded(a.address));
    if (funded.length === 0) throw new NoSignerAvailableError("no signer key holds more than the minimum balance; fund the facilitator's keys");
    // Least busy (sending or awaiting a receipt); ties rotate so equal keys share the load.
    rotation = (rotation + 1) % funded.length;
    let best = funded[rotation]!;
    for (const a of funded) if (busy.get(a.address)! < busy.get(best.address)!) best = a;
    return best;
  }

  // Fee estimates change per block at most: one estimate serves every settlement of the next second.
  let feeCache: { at: number; value: Promise<{ maxFeePerGas: bigint; maxPriorityFeePerGas: bigint }> } | undefined;
  async function fees(): Promise<{ maxFeePerGas: bigint; maxPriorityFeePerGas: bigint }> {
    if (!feeCache || Date.now() - feeCache.at > 1000) {
      const value = client.estimateFeesPerGas();
      feeCache = { at: Date.now(), value };
      value.catch(() => (feeCache = undefined));
    }
    // Shared by concurrent settlements: a failure counts against each of them (see chain.ts watchRpc).
    const f = await feeCache.value.catch((e: unknown) => {
      noteRpcFailure(e);
      throw e;
    });
    const cap = opts.maxFeePerGasWei;
    if (cap !== undefined && f.maxFeePerGas > cap) return { maxFeePerGas: cap, maxPriorityFeePerGas: f.maxPriorityFeePerGas > cap ? cap : f.maxPriorityFeePerGas };
    return f;
  }

  async function sign(account: PrivateKeyAccount, tx: { to: Hex; data: Hex; gas: bigint; nonce: bigint; maxFeePerGas: bigint; maxPriorityFeePerGas: bigint }) {
    const raw = await account.signTransaction({ chainId: chain.id, type: "eip1559", to: tx.to, data: tx.data, gas: tx.gas, nonce: Number(tx.nonce), maxFeePerGas: tx.maxFeePerGas, maxPriorityFeePerGas: tx.maxPriorityFeePerGas });
    return { raw, hash: keccak256(raw) };
  }

  async function broadcast(row: Pick<OutboxRow, "id" | "raw_tx" | "hash">): Promise<void> {
    try {
      await client.sendRawTransaction({ serializedTransaction: row.raw_tx });
      await opts.store.markBroadcast(row.id);
    } catch (e) {
      if (alreadyKnown(e)) return opts.store.markBroadcast(row.id);
      // "nonce too low" for a transaction of ours that the node has seen means it was mined.
      if (nonceTooLow(e) && (await client.getTransaction({ hash: row.hash }).catch(() => undefined))) return opts.store.markBroadcast(row.id);
      await opts.store.noteError(row.id, message(e));
      throw e;
    }
  }

  async function sendTransaction(args: { to: Address; data: Hex; gas?: bigint }): Promise<Hex> {
    const ctx = settlementContext.getStore();
    const paymentId = ctx?.paymentId ?? `untracked:${Date.now()}:${Math.random()}`;
    const account = pick();
    busy.set(account.address, busy.get(account.address)! + 1);
    let awaitingReceipt = false;
    try {
      const [gas, fee] = await Promise.all([
        args.gas ?? client.estimateGas({ account: account.address, to: args.to, data: args.data }).then((g) => (g * 12n) / 10n),
        fees(),
      ]);
      const entry = { paymentId, signer: account.address, to: args.to, data: args.data, gas, ...fee };
      let row = await opts.store.allocateAndStore(entry, () => client.getTransactionCount({ address: account.address, blockTag: "pending" }), (nonce) => sign(account, { ...entry, nonce }));
      crash("after_store", opts.crashAt);
      try {
        await broadcast(row);
      } catch (e) {
        if (nonceTooLow(e)) {
          // The chain is ahead of our counter (the key was used outside the fleet): skip forward once.
          await opts.store.markDropped(row.id, "nonce consumed outside the fleet");
          await opts.store.advanceNonce(account.address, await client.getTransactionCount({ address: account.address, blockTag: "pending" }));
          row = await opts.store.allocateAndStore(entry, async () => 0, (nonce) => sign(account, { ...entry, nonce }));
          await broadcast(row);
        } else if (!transient(e)) {
          // Rejected outright: the nonce must still be used, or every later transaction of this key would wait behind the gap.
          await fillNonce(account, row, message(e));
          throw e;
        }
        // A node that cannot be reached: the row stays "signed" and the reconciler broadcasts it.
      }
      crash("after_broadcast", opts.crashAt);
      if (sent.size > 10_000) sent.clear(); // entries are removed by the receipt wait; this bounds the rare leftovers
      sent.set(row.hash, { id: row.id, hashes: row.hashes, signer: account.address });
      awaitingReceipt = true; // the key stays busy until its receipt wait ends
      return row.hash;
    } finally {
      if (!awaitingReceipt) release(account.address);
    }
  }

  /** Uses a nonce whose transaction was rejected with a zero-value self-transfer. */
  async function fillNonce(account: PrivateKeyAccount, row: OutboxRow, reason: string): Promise<void> {
    opts.logger.warn({ signer: account.address, nonce: row.nonce, reason }, "transaction rejected by the node; filling its nonce");
    const fee = await fees();
    const filler = await sign(account, { to: account.address, data: "0x", gas: 21_000n, nonce: BigInt(row.nonce), ...fee });
    await opts.store.markDropped(row.id, reason);
    await client.sendRawTransaction({ serializedTransaction: filler.raw }).catch((e) => opts.logger.error({ signer: account.address, nonce: row.nonce, err: message(e) }, "nonce filler failed"));
  }

  return {
    getAddresses: () => opts.accounts.map((a) => a.address),
    inFlight: () => Object.fromEntries(busy),
    account: (address) => accounts.get(address.toLowerCase()),
    broadcast,
    resign: (row, fee) => sign(accounts.get(row.signer.toLowerCase())!, { to: row.to_address, data: row.data, gas: BigInt(row.gas), nonce: BigInt(row.nonce), ...fee }),

    // `account` (an eth_call's from) is passed through: upto simulates its settle call as the facilitator.
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
      const deadline = Date.now() + Math.min(args.timeout ?? opts.receiptTimeoutMs, opts.receiptTimeoutMs);
      const row = sent.get(args.hash) ?? (await opts.store.outboxByHash(args.hash));
      try {
        for (;;) {
          const mined = await findMined(opts.chain, row?.hashes ?? [args.hash], opts.confirmations);
          if (mined) {
            if (row) await opts.store.markMined(row.id, mined.hash, mined.receipt.status === "success", mined.receipt.gasUsed * mined.receipt.effectiveGasPrice);
            return mined.receipt;
          }
          if (Date.now() >= deadline) throw new Error(`no receipt for ${args.hash} within ${opts.receiptTimeoutMs} ms`);
          await sleep(poll);
        }
      } finally {
        const mine = sent.get(args.hash);
        if (mine?.signer) release(mine.signer);
        sent.delete(args.hash);
      }
    },

    async getCode(args) {
      const key = args.address.toLowerCase();
      const hit = codeCache.get(key);
      if (hit && hit.until > Date.now()) return hit.code;
      const code = await client.getCode(args);
      if (codeCache.size > 50_000) codeCache.clear();
      codeCache.set(key, { code, until: Date.now() + CODE_TTL_MS });
      return code;
    },
  };
}
