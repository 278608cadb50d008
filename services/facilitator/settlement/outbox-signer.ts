// The FacilitatorEvmSigner the reference mechanisms settle through. Every transaction gets its
// nonce from the settlement store (so processes sharing a key never collide), is checked against
// its kind's gas ceiling and the fee cap, signed and stored in the outbox before it is broadcast;
// a broadcast the node refuses for good gives its nonce back (or fills it) so the key never
// wedges. Receipt waits are bounded, shared and follow fee replacements. Reads go straight to the
// chain client.
import { randomBytes } from "node:crypto";
import {
  TransactionNotFoundError,
  encodeFunctionData,
  toHex,
  isAddressEqual,
  parseAbi,
  serializeTransaction,
  hashTypedData,
  type Abi,
  type Address,
  type Hex,
  type PrivateKeyAccount,
  type TransactionReceipt,
  type TypedDataDefinition,
} from "viem";
import { sendRawTransactionSync } from "viem/actions";
import type { FacilitatorEvmSigner } from "@x402/evm";
import { safeMessage, type Logger } from "../../platform/logger.ts";
import type { Metrics } from "../../platform/metrics.ts";
import { noteRpcFailure, type ChainClient } from "../chain.ts";
import { broadcastErrorLine, classifySendError, type BroadcastOutcome } from "./broadcast-errors.ts";
import { settlementContext } from "./context.ts";
import type { DataFeeModel } from "../network-policy.ts";
import { BelowFeeFloorError, DEFAULT_BASE_FEE_MULTIPLIER, GasCeilingExceededError, createGasPolicy, transactionKind, type Fees, type GasPolicy, type TransactionKind } from "./gas-policy.ts";
import { GAS_BUDGET_EXHAUSTED } from "./gas-meter.ts";
import { admit, TRANSACTION_NOT_PLANNED } from "../plan.ts";
import { createHeadTracker } from "./head.ts";
import { isCanonical, pollMined, receiptPoller, sleep } from "./receipts.ts";
import { recoverSigner } from "../crypto/secp256k1.ts";
import { keccak256 } from "../crypto/keccak.ts";
import { cleanLine, explainCallFailure, failureCodeOf } from "./reverts.ts";
import type { OutboxRow, SettlementStore } from "./store.ts";

export interface OutboxSignerOptions {
  chain: ChainClient;
  accounts: PrivateKeyAccount[];
  store: SettlementStore;
  /** Upper bound of a receipt wait in ms. */
  receiptTimeoutMs: number;
  confirmations: number;
  /** Gas ceilings per kind and the fee cap; nothing above them is signed (default: the documented defaults). */
  gasPolicy?: GasPolicy;
  /** Whether a key may be picked (its balance covers its next transaction). */
  isFunded: (signer: Address) => boolean;
  /** A node said the key cannot pay: take it out of rotation now, not at the next balance read. */
  onInsufficientFunds?: (signer: Address) => void;
  logger: Logger;
  metrics?: Metrics;
  network?: string;
  pollIntervalMs?: number;
  /** Fault injection for crash-recovery tests: SIGKILL this process at that point. */
  crashAt?: "after_store" | "after_broadcast";
  /** How the chain charges data (network-policy.ts); an OP Stack L1 fee above its bound is never signed. */
  dataFee?: DataFeeModel;
  /**
   * Send settlements with eth_sendRawTransactionSync (EIP-7966): the receipt comes in the send's
   * answer, one round trip instead of a send and receipt polls. An endpoint that does not know the
   * method gets the plain send (asked again after a while). The node holds the call for its own
   * timeout (nodes differ in how they read the optional timeout parameter, so none is sent); past
   * it, or past ours, the transaction is in the pool and the receipt wait polls for it.
   */
  syncSend?: boolean;
  /** ERC-6492 factories: a call to one deploys a payer's wallet (kind wallet_deployment, never a payment's outcome). */
  eip6492Factories?: readonly Address[];
  /** How often fees and the head block are read in the background (never on a settlement's path once warm). */
  feeRefreshMs?: number;
  /** The chain's guaranteed least block interval (network-policy.ts); 0: every settlement is simulated again. */
  minBlockIntervalMs?: number;
}

/** How long an endpoint that did not know eth_sendRawTransactionSync is not asked again. */
const SYNC_REPROBE_MS = 10 * 60_000;

/**
 * Synchronous sends in flight at once, at most. Each holds an RPC connection until its block (the
 * chain client's pool has 32): a burst of them would starve every read and run into the RPC
 * timeout while still queued, never sent, leaving a nonce gap its key's later transactions wait
 * behind. Past this, the plain send (answered at once) and the receipt wait.
 */
export const SYNC_SENDS_IN_FLIGHT = 16;

const getL1FeeAbi = parseAbi(["function getL1Fee(bytes) view returns (uint256)"]);

export class NoSignerAvailableError extends Error {
  override name = "NoSignerAvailableError";
}

/** A settlement transaction that was not sent; the message is one clean line, fit for an answer. */
export class SettlementNotSentError extends Error {
  override name = "SettlementNotSentError";
}

export interface MarketFees extends Fees {
  baseFeePerGas: bigint;
  /** The highest maxFeePerGas signed right now (relative and absolute caps). */
  cap: bigint;
  /** The absolute cap alone (X402_MAX_FEE_PER_GAS_WEI), where one is set: no fee is ever signed above it. */
  absoluteCap?: bigint;
  /** The capped fees are under the chain's floor (base fee + minimum tip): nothing is signed at them. */
  belowFloor?: boolean;
}

export type SendOutcome = "sent" | BroadcastOutcome;

export interface OutboxSigner extends FacilitatorEvmSigner {
  /** Signs, stores and broadcasts a transaction (an explicit gas limit is checked against its kind's ceiling too). */
  sendTransaction(args: { to: Address; data: Hex; gas?: bigint; value?: bigint }): Promise<Hex>;
  /** Broadcasts a stored transaction (again); idempotent; throws when it was not accepted. */
  broadcast(row: Pick<OutboxRow, "id" | "raw_tx" | "hash" | "hashes">): Promise<void>;
  /** Broadcasts a stored transaction and says how the node took it (never throws for a node's answer). */
  send(row: Pick<OutboxRow, "id" | "raw_tx" | "hash" | "hashes">): Promise<SendOutcome>;
  /** Signs the same transaction again with new fees (a replacement). */
  resign(row: OutboxRow, fees: Fees): Promise<{ raw: Hex; hash: Hex }>;
  /** Gives up a refused transaction's nonce (reused by the next transaction, or filled). */
  retire(row: OutboxRow, reason: BroadcastOutcome, error: string): Promise<void>;
  /** Current fees, clamped to the cap, with the cap itself. */
  marketFees(): Promise<MarketFees>;
  /** The most one transaction of these kinds may cost right now: the highest ceiling x the fee cap. */
  worstCase(kinds: readonly TransactionKind[]): Promise<bigint>;
  inFlight(): Record<Address, number>;
  /** An address just got code (a wallet we deployed): its cached "no code" must not outlive that. */
  forgetCode(address: Address): void;
  /** The block that is provably still the head (settlement/head.ts), or undefined. */
  head(): bigint | undefined;
  /**
   * A verification simulated exactly this call at block `block` and it needed `gas`: a settlement of
   * the same call while that block is provably still the head reuses it instead of simulating again
   * (the chain state it would simulate against is the same).
   */
  noteSimulated(to: Address, data: Hex, block: bigint, gas: bigint): void;
  /** Whether a receipt wait of this process is watching this transaction right now. */
  awaited(hash: Hex): boolean;
  /** Stops the background fee reads. */
  stop(): void;
  account(address: string): PrivateKeyAccount | undefined;
}

/** The JSON-RPC error code anywhere in a viem error's cause chain. */
function rpcErrorCode(e: unknown): number | undefined {
  for (let c = e as { code?: unknown; cause?: unknown } | undefined, i = 0; c && i < 8; c = c.cause as typeof c, i++) if (typeof c.code === "number") return c.code;
  return undefined;
}


/** Whether an error (anywhere in its cause chain) answers a call that was posted more than once (chain.ts rpc). */
function repeatedCall(e: unknown): boolean {
  for (let c = e as { repeatedCall?: boolean; cause?: unknown } | undefined, i = 0; c && i < 8; c = c.cause as typeof c, i++) if (c.repeatedCall) return true;
  return false;
}

/** Outcomes that say nothing about the transaction: the node was not reached. */
const RETRY_LATER = new Set<SendOutcome>(["unreachable"]);

function crash(point: string, at: string | undefined) {
  if (at === point) process.kill(process.pid, "SIGKILL");
}

export function createOutboxSigner(opts: OutboxSignerOptions): OutboxSigner {
  const { client, chain } = opts.chain;
  const policy = opts.gasPolicy ?? createGasPolicy({ baseFeeMultiplier: DEFAULT_BASE_FEE_MULTIPLIER });
  const network = opts.network ?? `eip155:${chain.id}`;
  const accounts = new Map(opts.accounts.map((a) => [a.address.toLowerCase(), a]));
  const busy = new Map<Address, number>(opts.accounts.map((a) => [a.address, 0]));
  const release = (address: Address) => busy.set(address, Math.max(0, busy.get(address)! - 1));
  let rotation = -1;
  const poll = opts.pollIntervalMs ?? 100;
  // Hashes this process sent, so receipt waits need not ask the store on every poll.
  const sent = new Map<string, Pick<OutboxRow, "id" | "hashes"> & { signer?: Address; transfer?: string; until: number }>();
  // The same entries by outbox row: a fee replacement sent from this process adds its hash to the
  // wait that follows the row, which otherwise would watch only the hashes it started with.
  const sentById = new Map<string, Pick<OutboxRow, "hashes">>();
  // Account classification (code or none) changes rarely: read it once per short window, and once
  // for all the requests that ask while the read is in flight (a burst from one payer asks at once).
  const codeCache = new Map<string, { code: Promise<Hex | undefined>; until: number }>();
  const CODE_TTL_MS = 10_000;
  // Calls a verification simulated, by target and calldata: the block and the gas it needed.
  const simulated = new Map<string, { block: bigint; gas: bigint }>();
  // EIP-3009 transfers of this process not yet mined, by token and payer: a verification at the head
  // does not see them, so another transfer of that payer is simulated again (a shared balance).
  const unminedTransfers = new Map<string, number>();
  const transferKey = (to: Address, data: Hex) => `${to.toLowerCase()}:${data.slice(34, 74).toLowerCase()}`;
  // Receipts that came with a synchronous send, taken by the receipt wait of the same transaction.
  const syncReceipts = new Map<string, { receipt: TransactionReceipt; sentAt: number }>();
  let syncUnservedUntil = 0;
  let syncInFlight = 0;

  function pick(): PrivateKeyAccount {
    const required = settlementContext.getStore()?.signer;
    if (required) {
      const account = accounts.get(required.toLowerCase());
      if (!account) throw new NoSignerAvailableError(`the payment names signer ${required}, which this facilitator does not hold`);
      return account;
    }
    const funded = opts.accounts.filter((a) => opts.isFunded(a.address));
    if (funded.length === 0) throw new NoSignerAvailableError("no signer key holds enough to pay its next transaction; fund the facilitator's keys");
    // Least busy (sending or awaiting a receipt); ties rotate so equal keys share the load.
    rotation = (rotation + 1) % funded.length;
    let best = funded[rotation]!;
    for (const a of funded) if (busy.get(a.address)! < busy.get(best.address)!) best = a;
    return best;
  }

  /** Says why a settlement failed without sending, in the payment's context and as the error. */
  function fail(kind: TransactionKind, code: string | undefined, line: string): never {
    const ctx = settlementContext.getStore();
    if (ctx) ctx.failure = { code: code ?? failureCodeOf(kind), message: cleanLine(line) };
    throw new SettlementNotSentError(cleanLine(line));
  }

  // Fee estimates change per block at most. They are read in the background with the head block
  // (a few times per block where the chain keeps a schedule, so the head stays provable), and a
  // settlement takes them from memory; a cache older than a few refreshes (the background read
  // failing) is refreshed on the request path.
  // Several endpoints behind a fallback: a lagging one's head would stretch a proof, so none is made.
  const minBlockIntervalMs = opts.chain.endpoints.length > 1 ? 0 : (opts.minBlockIntervalMs ?? 0);
  const refreshMs = opts.feeRefreshMs ?? (minBlockIntervalMs > 0 ? Math.min(1000, Math.max(100, minBlockIntervalMs / 4)) : 1000);
  const head = createHeadTracker(minBlockIntervalMs);
  let offScheduleLogged = false;
  let feeCache: { at: number; value: Promise<MarketFees> } | undefined;
  function refreshFees(): Promise<MarketFees> {
    const value = (async () => {
      const startedAt = performance.now();
      const block = await client.getBlock({ blockTag: "latest" });
      head.observe(block.number!, startedAt, block.timestamp);
      if (head.offSchedule() && !offScheduleLogged) {
        offScheduleLogged = true;
        opts.logger.warn({ network, minBlockIntervalMs }, "the chain makes blocks faster than its policy's minBlockIntervalMs: every settlement is simulated again");
      }
      const baseFeePerGas = block.baseFeePerGas ?? 0n;
      // The market's tip, never under the chain's floor (Polygon's 25 gwei, BSC's minimum gas price).
      const tip = policy.tip(await client.estimateMaxPriorityFeePerGas({ block } as never));
      const cap = policy.feeCap(baseFeePerGas, tip);
      // viem's default: 1.2 x base fee + tip leaves room for base-fee rises over a few blocks.
      const fees = policy.clamp({ maxFeePerGas: (baseFeePerGas * 12n) / 10n + tip, maxPriorityFeePerGas: tip }, cap);
      // A cap under the chain's tip floor: fees its nodes refuse by rule. Flagged, and never signed.
      // (Without a floor, a cap under a spiking base fee is the node's call: refused, the nonce reused.)
      const belowFloor = policy.minPriorityFeePerGas > 0n && (fees.maxPriorityFeePerGas < policy.minPriorityFeePerGas || fees.maxFeePerGas < baseFeePerGas + policy.minPriorityFeePerGas);
      return { baseFeePerGas, cap, absoluteCap: policy.maxFeePerGasWei, belowFloor, ...fees };
    })();
    // The previous value serves until the new one is in: a refresh never makes a settlement wait.
    value.then(
      () => (feeCache = { at: Date.now(), value }),
      () => undefined,
    );
    return value;
  }
  // Only while payments come in (and a few seconds after the last): a facilitator with sparse
  // traffic reads fees when it needs them, rather than polling its provider (calls cost money).
  let lastUse = 0;
  const background = setInterval(() => {
    if (Date.now() - lastUse < 5000) void refreshFees().catch(() => undefined);
  }, refreshMs);
  background.unref();
  async function marketFees(): Promise<MarketFees> {
    lastUse = Date.now();
    // Older than two refreshes (idle, or the background read failing): read on the path.
    if (!feeCache || Date.now() - feeCache.at > Math.max(1000, refreshMs * 2)) {
      const value = refreshFees();
      feeCache = { at: Date.now(), value };
      value.catch(() => (feeCache = undefined));
    }
    // Shared by concurrent settlements: a failure counts against each of them (see chain.ts watchRpc).
    return feeCache.value.catch((e: unknown) => {
      noteRpcFailure(e);
      throw e;
    });
  }

  async function sign(account: PrivateKeyAccount, tx: { to: Hex; data: Hex; gas: bigint; nonce: bigint; maxFeePerGas: bigint; maxPriorityFeePerGas: bigint; value?: bigint }) {
    const raw = await account.signTransaction({ chainId: chain.id, type: "eip1559", to: tx.to, data: tx.data, gas: tx.gas, nonce: Number(tx.nonce), maxFeePerGas: tx.maxFeePerGas, maxPriorityFeePerGas: tx.maxPriorityFeePerGas, ...(tx.value ? { value: tx.value } : {}) });
    return { raw, hash: keccak256(Buffer.from(raw.slice(2), "hex")) };
  }

  /**
   * Whether the node knows one of our hashes for this row (so a "nonce used" is about us); undefined
   * when a lookup got no answer. Only "not found" is a no: a lookup the provider failed says nothing,
   * and taken for a no it would send the same call again on the next nonce (executed twice, the
   * second reverting: an RPC fault test found it).
   */
  async function knownToNode(hashes: readonly Hex[]): Promise<boolean | undefined> {
    const found = await Promise.all(hashes.map((hash) => client.getTransaction({ hash }).then(() => true, (e: unknown) => (e instanceof TransactionNotFoundError ? false : undefined))));
    if (found.includes(true)) return true;
    return found.includes(undefined) ? undefined : false;
  }

  /** eth_sendRawTransactionSync where the endpoint serves it: the receipt on record, or false to send the plain way. */
  async function sendSync(row: Pick<OutboxRow, "id" | "raw_tx" | "hash">): Promise<boolean> {
    if (!opts.syncSend || Date.now() < syncUnservedUntil || syncInFlight >= SYNC_SENDS_IN_FLIGHT) return false;
    syncInFlight++;
    try {
      const startedAt = performance.now();
      const receipt = await sendRawTransactionSync(client, { serializedTransaction: row.raw_tx });
      if (syncReceipts.size > 10_000) syncReceipts.clear(); // taken by the receipt wait; this bounds the rare leftovers
      syncReceipts.set(row.hash, { receipt, sentAt: startedAt });
      return true;
    } catch (e) {
      const code = rpcErrorCode(e);
      // EIP-7966: accepted into the pool, not mined within the timeout. The receipt wait polls for it.
      if (code === 4) return true;
      // "Method not found", or a refusal that says nothing about the transaction (providers word an
      // unserved or disallowed method in many ways): the same transaction goes the plain way, whose
      // answer is the node's verdict (a repeat of one it has is "already known": as good as sent).
      const methodRefused = code === -32601 || /method|does not exist|not (allowed|whitelisted|enabled)/i.test(`${safeMessage(e)} ${broadcastErrorLine(e)}`);
      if (methodRefused || classifySendError(e) === "rejected") {
        // Only a refusal of the method turns it off for a while: a verdict about this transaction
        // (the plain send hears it again) says nothing about the endpoint.
        if (methodRefused) {
          syncUnservedUntil = Date.now() + SYNC_REPROBE_MS;
          opts.logger.info({ network, err: broadcastErrorLine(e) }, "the RPC endpoint does not serve eth_sendRawTransactionSync; sending the plain way");
        }
        return false;
      }
      throw e;
    } finally {
      syncInFlight--;
    }
  }

  async function send(row: Pick<OutboxRow, "id" | "raw_tx" | "hash" | "hashes">, sync = false): Promise<SendOutcome> {
    try {
      if (!(sync && (await sendSync(row)))) await client.sendRawTransaction({ serializedTransaction: row.raw_tx });
      // A receipt that came with the send is recorded by the receipt wait straight away (signed → confirmed).
      if (!syncReceipts.has(row.hash)) await opts.store.markBroadcast(row.id);
      const waiting = sentById.get(row.id);
      if (waiting && row.hashes && row.hashes.length > waiting.hashes.length) waiting.hashes = row.hashes;
      return "sent";
    } catch (e) {
      const outcome = classifySendError(e);
      // "Nonce too low" or "replacement underpriced" for a transaction the node already has (anvil
      // answers a repeated send with the latter) means it is on its way or mined: as good as sent.
      const nonceUsed = outcome === "nonce_too_low" || outcome === "replacement_underpriced";
      const known = nonceUsed ? await knownToNode(row.hashes ?? [row.hash]) : false;
      if (outcome === "already_known" || known) {
        await opts.store.markBroadcast(row.id);
        return "sent";
      }
      // Whose transaction holds the nonce is not known: nothing is concluded (the row is sent again
      // later, and the reconciler gives the nonce up only once blocks passed with no receipt of ours).
      // Not known either when this answer came to a repeat of the send: the first may have reached a
      // node and been mined, and a lagging node can answer "not found" for it.
      if (known === undefined || (nonceUsed && repeatedCall(e))) {
        await opts.store.noteRejection(row.id, "unreachable", broadcastErrorLine(e));
        return "unreachable";
      }
      await opts.store.noteRejection(row.id, outcome, broadcastErrorLine(e));
      if (!RETRY_LATER.has(outcome)) opts.metrics?.broadcastRejected.inc({ network, reason: outcome });
      return outcome;
    }
  }

  async function broadcast(row: Pick<OutboxRow, "id" | "raw_tx" | "hash" | "hashes">): Promise<void> {
    const outcome = await send(row);
    if (outcome !== "sent") throw new Error(`broadcast not accepted: ${outcome}`);
  }

  async function retire(row: OutboxRow, reason: BroadcastOutcome, error: string): Promise<void> {
    const account = accounts.get(row.signer.toLowerCase());
    if (!account) return;
    const fee = await marketFees().catch(() => ({ maxFeePerGas: BigInt(row.max_fee_per_gas), maxPriorityFeePerGas: BigInt(row.max_priority_fee_per_gas) }));
    const filler = { maxFeePerGas: fee.maxFeePerGas, maxPriorityFeePerGas: fee.maxPriorityFeePerGas };
    const retired = await opts.store.retire(row.id, reason, error, async (nonce) => ({
      // 21k, plus Arbitrum's poster-gas allowance (a bare 21k is refused there).
      ...(await sign(account, { to: account.address, data: "0x", gas: policy.ceiling("nonce_filler"), nonce, ...filler })),
      ...filler,
    }));
    if (!retired) return;
    if (retired.reused) {
      opts.logger.warn({ signer: row.signer, nonce: row.nonce, reason }, "transaction refused by the node; its nonce goes to the next transaction of the key");
      return;
    }
    opts.logger.warn({ signer: row.signer, nonce: row.nonce, reason, filler: retired.filler.hash }, "transaction refused by the node; its nonce is filled by a zero-value self-transfer");
    // Best effort now; the reconciler keeps sending it (and repricing it) until it is mined.
    await send(retired.filler).catch(() => undefined);
  }

  /** The chain is ahead of our counter (the key was used outside the fleet): skip forward. */
  async function skipForeignNonce(row: OutboxRow, reason: BroadcastOutcome): Promise<void> {
    await opts.store.markDropped(row.id, "nonce used outside the fleet", reason);
    await opts.store.advanceNonce(row.signer, await client.getTransactionCount({ address: row.signer, blockTag: "pending" }));
  }

  /**
   * OP Stack: the L1 data fee comes out of the key's balance on top of gas x price. Quoted by the
   * chain's GasPriceOracle; above the bound (or unquotable) the transaction is not signed. The fee
   * depends on the L1 fees and on how well the transaction compresses, which a payer can shape: so
   * the quote is of a transaction of the same kind and size whose calldata is random non-zero bytes
   * (incompressible: the most any content of that size can cost), served for a minute raised by the
   * most L1 fees can rise meanwhile (EIP-1559 and EIP-4844: 12.5% per L1 block of 12 s), and
   * re-quoted in the background after one L1 block: never a round trip on a settlement's path once warm.
   */
  const l1Quotes = new Map<string, { at: number; quote: Promise<bigint> }>();
  const L1_BLOCK_MS = 12_000;
  const L1_QUOTE_TTL_MS = 60_000;
  function quoteL1Fee(model: { oracle: Address }, kind: TransactionKind, args: { to: Address; data: Hex }, gas: bigint, fee: Fees): Promise<bigint> {
    const key = `${kind}:${args.data.length}`;
    const cached = l1Quotes.get(key);
    const fresh = () => {
      const filler = toHex(randomBytes((args.data.length - 2) / 2).map((b) => b || 0xff));
      const unsigned = serializeTransaction({ chainId: chain.id, type: "eip1559", to: args.to, data: filler, gas, nonce: 0, maxFeePerGas: fee.maxFeePerGas, maxPriorityFeePerGas: fee.maxPriorityFeePerGas });
      const quote = client.readContract({ address: model.oracle, abi: getL1FeeAbi, functionName: "getL1Fee", args: [unsigned] });
      const at = Date.now();
      quote.then(
        () => l1Quotes.set(key, { at, quote }),
        () => l1Quotes.delete(key),
      );
      return quote;
    };
    const age = cached ? Date.now() - cached.at : Infinity;
    if (!cached || age >= L1_QUOTE_TTL_MS) return fresh();
    if (age > L1_BLOCK_MS) void fresh().catch(() => undefined);
    // The most the fee can have grown since the quote: 9/8 per L1 block begun since.
    const blocks = BigInt(1 + Math.floor(age / L1_BLOCK_MS));
    return cached.quote.then((q) => (q * 9n ** blocks) / 8n ** blocks);
  }

  /** The L1 data fee the transaction may cost (0 where the chain charges none); above its bound it is never signed. */
  async function checkDataFee(kind: TransactionKind, args: { to: Address; data: Hex }, gas: bigint, fee: Fees): Promise<bigint> {
    const model = opts.dataFee;
    if (model?.kind !== "op-l1-fee") return 0n;
    let quote: bigint;
    try {
      quote = await quoteL1Fee(model, kind, args, gas, fee);
    } catch (e) {
      noteRpcFailure(e);
      fail(kind, undefined, `the L1 data fee of the ${kind} transaction could not be quoted (GasPriceOracle ${model.oracle}); it was not signed`);
    }
    if (quote > model.maxFeeWei) {
      opts.logger.warn({ kind, l1Fee: quote.toString(), bound: model.maxFeeWei.toString() }, "L1 data fee above its bound: not signed");
      fail(kind, undefined, `the ${kind} transaction's L1 data fee of ${quote} wei is above the bound of ${model.maxFeeWei}; it was not signed`);
    }
    return quote;
  }

  async function sendTransaction(args: { to: Address; data: Hex; gas?: bigint; value?: bigint }): Promise<Hex> {
    const ctx = settlementContext.getStore();
    const paymentId = ctx?.paymentId ?? `untracked:${Date.now()}:${Math.random()}`;
    const account = pick();
    const value = args.value ?? 0n;
    const kind = transactionKind(account.address, args.to, args.data, { value, factories: opts.eip6492Factories });
    // One place decides what a payment sends (plan.ts): a transaction its plan does not name, or that
    // pays an address the plan did not screen, is never signed.
    const outsidePlan = ctx?.plan && admit(ctx.plan, { kind, to: args.to, data: args.data, value });
    if (outsidePlan) {
      opts.logger.warn({ kind, why: outsidePlan }, "transaction outside the payment's plan: not signed");
      fail(kind, TRANSACTION_NOT_PLANNED, `${outsidePlan}; nothing was sent`);
    }
    busy.set(account.address, busy.get(account.address)! + 1);
    let awaitingReceipt = false;
    try {
      const fees = marketFees();
      // The L1 data fee is quoted beside the simulation, not after it: quoted at the kind's gas
      // ceiling, the transaction's size (all the quote depends on) is never under the one signed.
      const dataFee = fees.then((fee) => checkDataFee(kind, args, args.gas ?? policy.ceiling(kind), fee));
      // A payment verified in the current head block needs no second simulation: the state it would
      // run against is the one its verification ran against (EIP-3009 transfers do not depend on the sender).
      const verified = args.gas === undefined && kind === "eip3009_transfer" ? takeSimulation(args.to, args.data) : undefined;
      const [estimate, fee, l1Fee] = await Promise.all([
        args.gas ??
          verified ??
          client.estimateGas({ account: account.address, to: args.to, data: args.data, ...(value ? { value } : {}) }).catch(async (e) => {
            // The call would revert now: say why, in a reason code and a line without calldata.
            const why = await explainCallFailure(opts.chain, kind, args.to, args.data, e);
            if (why) fail(kind, why.code, why.message);
            throw new SettlementNotSentError(`gas estimation failed: ${cleanLine(safeMessage(e))}`);
          }),
        fees,
        dataFee,
      ]);
      if (fee.belowFloor) {
        // The chain's nodes would refuse it (Polygon's minimum tip, BSC's gas-price floor): never signed, never sent.
        const e = new BelowFeeFloorError(fee, { baseFeePerGas: fee.baseFeePerGas, minPriorityFeePerGas: policy.minPriorityFeePerGas });
        opts.logger.warn({ signer: account.address, kind, maxFeePerGas: fee.maxFeePerGas.toString(), tip: fee.maxPriorityFeePerGas.toString(), floor: policy.minPriorityFeePerGas.toString() }, "fee cap below the chain's floor: not signed");
        fail(kind, undefined, e.message);
      }
      try {
        policy.checkGas(kind, estimate);
      } catch (e) {
        if (!(e instanceof GasCeilingExceededError)) throw e;
        opts.metrics?.gasCeilingRefused.inc({ network, kind });
        opts.logger.warn({ signer: account.address, kind, gas: estimate.toString(), ceiling: e.ceiling.toString() }, "gas above the ceiling: not signed");
        fail(kind, undefined, e.message);
      }
      // Headroom over the estimate, never past the ceiling.
      const padded = args.gas ?? (estimate * 12n) / 10n;
      const gas = padded > policy.ceiling(kind) ? policy.ceiling(kind) : padded;
      // A tenant's gas budget (gas-meter.ts): the worst this transaction can cost must fit what is left
      // (a gas funding's value is spent too, and on OP Stack chains the L1 data fee).
      const worst = gas * fee.maxFeePerGas + value + l1Fee;
      if (ctx?.gas && !ctx.gas.commit(worst)) {
        opts.logger.warn({ kind, worst: worst.toString(), remaining: String(ctx.gas.remaining()) }, "gas allowance of the caller exhausted: not signed");
        fail(kind, GAS_BUDGET_EXHAUSTED, `the ${kind} transaction may cost up to ${worst} wei, more than the ${ctx.gas.remaining()} wei left of the API key's gas budget for today; nothing was sent`);
      }
      const entry = { paymentId, claimOwner: ctx?.owner, signer: account.address, to: args.to, data: args.data, gas, kind, value, maxFeePerGas: fee.maxFeePerGas, maxPriorityFeePerGas: fee.maxPriorityFeePerGas };
      // A fresh key's seed read is shared by the settlements waiting on it (store.ts): a provider
      // failure there counts against each of them, so each answers 503, not a failed payment.
      let row = await opts.store
        .allocateAndStore(entry, () => client.getTransactionCount({ address: account.address, blockTag: "pending" }), (nonce) => sign(account, { ...entry, nonce }))
        .catch((e: unknown) => {
          noteRpcFailure(e);
          throw e;
        });
      ctx?.stored?.push({ hash: row.hash, kind });
      // On a chain that keeps a block schedule the transaction cannot be mined before the next block:
      // its wait looks it up when a followed block holds it, not right after the send.
      if (minBlockIntervalMs > 0) receiptPoller(opts.chain).expect([row.hash]);
      crash("after_store", opts.crashAt);
      for (let attempt = 0; ; attempt++) {
        const outcome = await send(row, true);
        if (outcome === "sent" || RETRY_LATER.has(outcome)) break; // unreachable: the row stays "signed" and the reconciler sends it
        if ((outcome === "nonce_too_low" || outcome === "replacement_underpriced") && attempt < 3) {
          // Another transaction of this key (sent outside the fleet) holds the nonce: take the next one.
          await skipForeignNonce(row, outcome);
          row = await opts.store.allocateAndStore(entry, async () => 0, (nonce) => sign(account, { ...entry, nonce }));
          ctx?.stored?.push({ hash: row.hash, kind });
          continue;
        }
        if (outcome === "insufficient_funds") opts.onInsufficientFunds?.(account.address);
        // Refused for good: the nonce must still be used, or every later transaction of this key would wait behind the gap.
        await retire(row, outcome, outcome);
        fail(kind, undefined, `the node refused the ${kind} transaction (${outcome}); nothing was sent`);
      }
      ctx?.gas?.noteSent(row.id, value);
      crash("after_broadcast", opts.crashAt);
      if (sent.size > 10_000) {
        // Entries are removed by the receipt wait; this bounds the rare leftovers.
        sent.clear();
        sentById.clear();
        unminedTransfers.clear();
      }
      const transfer = kind === "eip3009_transfer" ? transferKey(args.to, args.data) : undefined;
      if (transfer) unminedTransfers.set(transfer, (unminedTransfers.get(transfer) ?? 0) + 1);
      const watched = { id: row.id, hashes: row.hashes, signer: account.address, transfer, until: Date.now() + opts.receiptTimeoutMs };
      sent.set(row.hash, watched);
      sentById.set(row.id, watched);
      awaitingReceipt = true; // the key stays busy until its receipt wait ends
      return row.hash;
    } finally {
      if (!awaitingReceipt) release(account.address);
    }
  }

  /** The gas a verification's simulation of this very call needed, if it ran at the block that is provably still the head. */
  function takeSimulation(to: Address, data: Hex): bigint | undefined {
    const key = `${to.toLowerCase()}:${data}`;
    const hit = simulated.get(key);
    simulated.delete(key);
    if ((unminedTransfers.get(transferKey(to, data)) ?? 0) > 0) return undefined;
    return hit && hit.block === head.current() ? hit.gas : undefined;
  }

  /**
   * The receipt a synchronous send brought, when one block is final enough and that block is the
   * canonical one at its height (the endpoint's word alone is not the chain's); else the receipt wait polls.
   */
  async function takeSyncReceipt(hash: Hex): Promise<{ hash: Hex; receipt: TransactionReceipt } | undefined> {
    const taken = syncReceipts.get(hash);
    syncReceipts.delete(hash);
    if (!taken || opts.confirmations > 1 || !(await isCanonical(opts.chain, taken.receipt))) return undefined;
    // The block holding our transaction was made after we sent it: a head we saw, for free.
    head.observe(taken.receipt.blockNumber, taken.sentAt);
    return { hash, receipt: taken.receipt };
  }

  /** A mined revert's decoded reason (the store explained it when marking it) into the payment's context. */
  async function noteMinedRevert(hash: Hex): Promise<void> {
    const ctx = settlementContext.getStore();
    const row = ctx ? await opts.store.outboxByHash(hash) : undefined;
    if (ctx && row?.revert_reason) ctx.failure = { code: row.revert_reason, message: row.revert_message ?? "the settlement transaction reverted" };
  }

  return {
    getAddresses: () => opts.accounts.map((a) => a.address),
    inFlight: () => Object.fromEntries(busy),
    forgetCode: (address) => void codeCache.delete(address.toLowerCase()),
    head: () => {
      // Verifications keep the head read in the background only where a head can be proven.
      if (minBlockIntervalMs > 0) lastUse = Date.now();
      return head.current();
    },
    noteSimulated(to, data, block, gas) {
      if (simulated.size > 10_000) simulated.clear(); // taken by the settlement; this bounds the ones never settled
      simulated.set(`${to.toLowerCase()}:${data}`, { block, gas });
    },
    awaited: (hash) => (sent.get(hash)?.until ?? 0) > Date.now(),
    stop: () => clearInterval(background),
    account: (address) => accounts.get(address.toLowerCase()),
    broadcast,
    send,
    retire,
    marketFees,
    async worstCase(kinds) {
      const ceiling = kinds.reduce((max, k) => (policy.ceiling(k) > max ? policy.ceiling(k) : max), 0n);
      return ceiling * (await marketFees()).cap;
    },
    resign: (row, fee) => sign(accounts.get(row.signer.toLowerCase())!, { to: row.to_address, data: row.data, gas: BigInt(row.gas), nonce: BigInt(row.nonce), value: BigInt(row.value ?? "0"), ...fee }),

    // `account` (an eth_call's from) is passed through: upto simulates its settle call as the facilitator.
    readContract: (args) => client.readContract(args as Parameters<typeof client.readContract>[0]),

    async verifyTypedData(args) {
      // An ECDSA signature by the address itself needs no RPC; anything else (ERC-1271 contract
      // wallets, ERC-6492 wrappers) is checked on chain by viem.
      if (/^0x[0-9a-fA-F]{130}$/.test(args.signature)) {
        try {
          // The mechanisms check the payer's signature again when they settle: native recovery (crypto/secp256k1.ts).
          const recovered = await recoverSigner(hashTypedData(args as unknown as TypedDataDefinition), args.signature);
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

    sendTransaction: (args) => sendTransaction(args as Parameters<typeof sendTransaction>[0]),

    async waitForTransactionReceipt(args) {
      const deadline = Date.now() + Math.min(args.timeout ?? opts.receiptTimeoutMs, opts.receiptTimeoutMs);
      const row = sent.get(args.hash) ?? (await opts.store.outboxByHash(args.hash));
      try {
        for (;;) {
          // Shared with every other waiter of this transaction in the process, and budgeted.
          const mined = (await takeSyncReceipt(args.hash)) ?? (await pollMined(opts.chain, row?.hashes ?? [args.hash], opts.confirmations));
          if (mined) {
            const { receipt } = mined;
            if (row) {
              await opts.store.markMined(row.id, mined.hash, receipt.status === "success", receipt.gasUsed * receipt.effectiveGasPrice, { blockNumber: receipt.blockNumber, blockHash: receipt.blockHash });
              settlementContext.getStore()?.gas?.noteMined(row.id, receipt);
            }
            if (receipt.status !== "success") await noteMinedRevert(mined.hash);
            return receipt;
          }
          if (Date.now() >= deadline) throw new Error(`no receipt for ${args.hash} within ${opts.receiptTimeoutMs} ms`);
          await sleep(poll);
        }
      } finally {
        const mine = sent.get(args.hash);
        if (mine?.signer) release(mine.signer);
        if (mine?.transfer) {
          const left = (unminedTransfers.get(mine.transfer) ?? 1) - 1;
          if (left > 0) unminedTransfers.set(mine.transfer, left);
          else unminedTransfers.delete(mine.transfer);
        }
        sent.delete(args.hash);
        if (mine) sentById.delete(mine.id);
      }
    },

    async getCode(args) {
      const key = args.address.toLowerCase();
      let entry = codeCache.get(key);
      if (!entry || entry.until <= Date.now()) {
        if (codeCache.size > 50_000) codeCache.clear();
        const read = { code: client.getCode(args), until: Infinity };
        codeCache.set(key, (entry = read));
        // The window starts when the answer comes; a failed read is not kept.
        read.code.then(
          () => (read.until = Date.now() + CODE_TTL_MS),
          () => codeCache.get(key) === read && codeCache.delete(key),
        );
      }
      // Shared by the requests that asked meanwhile: a failure counts against each of them (chain.ts
      // watchRpc), so each answers "the RPC did not answer", never a verdict.
      return entry.code.catch((e: unknown) => {
        noteRpcFailure(e, undefined, "eth_getCode"); // by method: a required method "not found" is no answer either
        throw e;
      });
    },
  };
}
