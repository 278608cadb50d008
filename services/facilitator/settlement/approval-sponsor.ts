// The erc20ApprovalGasSponsoring extension (specs/extensions/erc20_gas_sponsoring.md): a payer of
// a token without EIP-2612 (USDT on BNB Smart Chain) has no Permit2 allowance and maybe no gas.
// It signs a raw `approve(Permit2, …)` transaction; the facilitator funds its gas when it lacks
// some, relays the approval, then settles. The chains we serve offer no atomic bundle everywhere,
// so the steps run in order and each one is bounded:
// - nothing is sent before the approval's fields, chain, nonce, fees and gas limit are checked and
//   the whole sequence (funding, approval, settlement) is simulated with eth_simulateV1;
// - a payer that holds the Permit2 allowance already is neither funded nor relayed: the settlement
//   alone is sent;
// - the funding is the approval's worst cost (gas limit x fee) minus what the payer holds, at most
//   `maxFundingWei`, recorded before it is sent, under daily bounds per network and per payer;
// - one funding per (payer, approval nonce), a unique key in the store: every other payment that
//   carries the approval, on any replica, waits for that funding's receipt and never sends another
//   (a funding not yet mined counts as the payer's balance);
// - a payer whose funded approval did not land (the gas was spent on something else, the nonce
//   taken) is never funded again: the loss to a hostile payer is one funding, once;
// - the settlement is simulated again (estimateGas) after the approval landed, before it is signed.
// The reference mechanisms call `simulateTransactions` at /verify and `sendTransactions` at /settle.
import { AsyncLocalStorage } from "node:async_hooks";
import { decodeFunctionData, erc20Abi, getAddress, isAddressEqual, keccak256, parseTransaction, recoverTransactionAddress, type Address, type Hex, type TransactionReceipt } from "viem";
import { simulateBlocks } from "viem/actions";
import { extractErc20ApprovalGasSponsoringInfo, validateErc20ApprovalGasSponsoringInfo, type Erc20ApprovalGasSponsoringSigner, type TransactionRequest } from "@x402/extensions";
import type { PaymentPayload, PaymentRequirements } from "@x402/core/types";
import { PERMIT2_ADDRESS, x402ExactPermit2ProxyABI, x402UptoPermit2ProxyABI } from "@x402/evm";
import type { FundingBound } from "../config.ts";
import type { Logger } from "../../platform/logger.ts";
import type { Metrics } from "../../platform/metrics.ts";
import { noteRpcFailure, type ChainClient } from "../chain.ts";
import { classifySendError } from "./broadcast-errors.ts";
import { settlementContext } from "./context.ts";
import type { OutboxSigner } from "./outbox-signer.ts";
import { sleep } from "./receipts.ts";
import type { GasFunding, SettlementStore } from "./store.ts";

export interface ApprovalSponsorOptions {
  signer: OutboxSigner;
  chain: ChainClient;
  store: SettlementStore;
  network: string;
  logger: Logger;
  metrics?: Metrics;
  /** The most gas a payer's approval may take (its gas limit): it bounds the funding. */
  maxApprovalGas: bigint;
  /** The most one payer is funded with; default: maxApprovalGas x the current fee cap. */
  maxFundingWei?: bigint;
  /** The most the network's fundings may total per UTC day (every replica together). */
  dailyFunding: FundingBound;
  /** The most one payer's fundings may total per UTC day. */
  payerDailyFunding: FundingBound;
  /** The key settle calls are simulated from (upto's proxy accepts only the key its payment names). */
  simulateFrom: Address;
  /** How long an approval may take to be mined. */
  receiptTimeoutMs: number;
  pollIntervalMs?: number;
}

/** Why a sponsored approval is refused: a reason code (reference codes where one exists) and one line. */
export class SponsorRefusal extends Error {
  override name = "SponsorRefusal";
  constructor(
    readonly code: string,
    message: string,
  ) {
    super(message);
  }
}

/**
 * The refusal behind a `false` of simulateTransactions at /verify: the reference mechanism only
 * sees the boolean (and guesses a reason); the facilitator reads the real one here.
 */
export const sponsorVerdict = new AsyncLocalStorage<{ refusal?: SponsorRefusal }>();

interface Approval {
  raw: Hex;
  hash: Hex;
  payer: Address;
  token: Address;
  data: Hex;
  gas: bigint;
  /** maxFeePerGas, or gasPrice of a legacy transaction. */
  feePerGas: bigint;
  nonce: number;
}

interface Plan {
  approval: Approval;
  /** What the payer's balance on chain lacks for its approval's worst cost (0: it can pay itself). */
  need: bigint;
  /** The funding recorded for the approval's nonce (by any payment, in any process): waited for, never sent again. */
  funding?: GasFunding;
  /** The node has the approval already (a retry after it was relayed). */
  relayed: boolean;
  /** The payer holds the Permit2 allowance already: nothing is funded or relayed, the settlement alone is sent. */
  allowanceHeld?: boolean;
}

/** What a Permit2 proxy's settle call moves (upto: the settled amount; exact: the permitted one); undefined for any other call. */
function settledAmount(data: Hex): bigint | undefined {
  for (const abi of [x402ExactPermit2ProxyABI, x402UptoPermit2ProxyABI]) {
    try {
      const call = decodeFunctionData({ abi, data });
      if (call.functionName !== "settle") continue;
      const args = call.args as readonly unknown[];
      return typeof args[1] === "bigint" ? args[1] : (args[0] as { permitted: { amount: bigint } }).permitted.amount;
    } catch {
      // not this proxy's settle
    }
  }
  return undefined;
}

/** Why a funding was not recorded: the answer's reason code and line. */
const FUNDING_REFUSALS = {
  abused: ["erc20_approval_payer_refused", "this payer once spent the gas it was funded with on something else than its approval"],
  daily_bound: ["erc20_approval_daily_bound_reached", "the network's gas fundings for today reached their bound; retry tomorrow"],
  payer_daily_bound: ["erc20_approval_daily_bound_reached", "this payer's gas fundings for today reached their bound; retry tomorrow"],
} as const;

function refuse(code: string, message: string): never {
  throw new SponsorRefusal(code, message);
}

export type ApprovalSponsor = Erc20ApprovalGasSponsoringSigner & {
  simulateTransactions(txs: TransactionRequest[]): Promise<boolean>;
  /** The extension's fields against the payment (who signed the approval, for which token), before any RPC call. */
  refusalFor(payload: PaymentPayload, requirements: PaymentRequirements): Promise<SponsorRefusal | undefined>;
  /** The most one sponsored payment may send to its payer right now (for gas budgets). */
  fundingBound(): Promise<bigint>;
};

export function createApprovalSponsor(opts: ApprovalSponsorOptions): ApprovalSponsor {
  const { client, chain } = opts.chain;
  const poll = opts.pollIntervalMs ?? 250;

  /** The payer's signed transaction, decoded and held to the rules that bound what it can cost us. */
  async function decode(raw: Hex): Promise<Approval> {
    let tx: ReturnType<typeof parseTransaction>;
    let payer: Address;
    try {
      tx = parseTransaction(raw);
      payer = getAddress(await recoverTransactionAddress({ serializedTransaction: raw as never }));
    } catch {
      return refuse("erc20_approval_tx_parse_failed", "the approval is not a signed transaction this chain accepts");
    }
    if (tx.type !== "eip1559" && tx.type !== "eip2930" && tx.type !== "legacy") refuse("erc20_approval_tx_parse_failed", `an approval of type ${tx.type} is not relayed (only legacy, EIP-2930 and EIP-1559 transactions)`);
    if (tx.chainId !== chain.id) refuse("erc20_approval_tx_wrong_chain", `the approval is signed for chain ${tx.chainId ?? "(none: replayable on any chain)"}, not ${chain.id}`);
    if ((tx.value ?? 0n) !== 0n) refuse("erc20_approval_tx_has_value", "the approval sends native value: only a plain approve() is relayed");
    if (!tx.to) refuse("erc20_approval_tx_wrong_target", "the approval creates a contract");
    const feePerGas = tx.type === "legacy" || tx.type === "eip2930" ? tx.gasPrice : tx.maxFeePerGas;
    if (tx.gas === undefined || feePerGas === undefined || tx.nonce === undefined) return refuse("erc20_approval_tx_parse_failed", "the approval lacks a gas limit, fee or nonce");
    if (tx.gas > opts.maxApprovalGas) refuse("erc20_approval_tx_gas_too_high", `the approval's gas limit of ${tx.gas} is above the ${opts.maxApprovalGas} this facilitator funds`);
    let spender: Address | undefined;
    try {
      const call = decodeFunctionData({ abi: erc20Abi, data: tx.data ?? "0x" });
      if (call.functionName === "approve") spender = call.args[0];
    } catch {
      // not an approve call
    }
    if (!spender) refuse("erc20_approval_tx_wrong_selector", "the approval does not call approve(spender, amount)");
    if (!isAddressEqual(spender!, PERMIT2_ADDRESS)) refuse("erc20_approval_tx_wrong_spender", `the approval's spender is ${spender}, not Permit2`);
    return { raw, hash: keccak256(raw), payer, token: getAddress(tx.to!), data: tx.data!, gas: tx.gas, feePerGas, nonce: tx.nonce };
  }

  /** Everything checked and simulated; what would be sent. Throws SponsorRefusal. */
  async function plan(raw: Hex, settle: { to: Address; data: Hex }): Promise<Plan> {
    const approval = await decode(raw);
    const amount = settledAmount(settle.data);
    const [allowance, known, pendingNonce, balance, fees, abused, funding] = await Promise.all([
      amount === undefined ? 0n : client.readContract({ address: approval.token, abi: erc20Abi, functionName: "allowance", args: [approval.payer, PERMIT2_ADDRESS] }),
      client.getTransaction({ hash: approval.hash }).then(
        () => true,
        () => false,
      ),
      client.getTransactionCount({ address: approval.payer, blockTag: "pending" }),
      client.getBalance({ address: approval.payer }),
      opts.signer.marketFees(),
      opts.store.fundingAbused(approval.payer),
      opts.store.gasFunding(approval.payer, approval.nonce),
    ]);
    if (amount !== undefined && allowance >= amount) {
      // It can pay without its approval (which stays unused): funding or relaying it would only give it gas.
      await simulate([{ account: opts.simulateFrom, to: settle.to, data: settle.data }]);
      return { approval, need: 0n, relayed: false, allowanceHeld: true };
    }
    if (abused) refuse("erc20_approval_payer_refused", "this payer once spent the gas it was funded with on something else than its approval: it is not funded again");
    if (known) {
      // Relayed before (a retried settlement): only the settlement is left to check.
      await simulate([{ account: opts.simulateFrom, to: settle.to, data: settle.data }]);
      return { approval, need: 0n, relayed: true };
    }
    if (approval.nonce !== pendingNonce) refuse("erc20_approval_tx_nonce_mismatch", `the approval's nonce is ${approval.nonce}, the payer's next nonce is ${pendingNonce}`);
    if (funding && funding.approvalHash.toLowerCase() !== approval.hash.toLowerCase()) refuse("erc20_approval_tx_nonce_mismatch", `another approval with the payer's nonce ${approval.nonce} was funded already; sign a new one once it is mined`);
    // Includable now, and at no more than we would pay ourselves: the funding is bounded by it.
    if (approval.feePerGas < fees.baseFeePerGas) refuse("erc20_approval_tx_fee_too_low", `the approval's fee of ${approval.feePerGas} wei per gas is under the current base fee of ${fees.baseFeePerGas}`);
    if (approval.feePerGas > fees.cap) refuse("erc20_approval_tx_fee_too_high", `the approval's fee of ${approval.feePerGas} wei per gas is above the ${fees.cap} this facilitator pays`);
    const cost = approval.gas * approval.feePerGas;
    const need = cost > balance ? cost - balance : 0n;
    // The nonce's funding, mined or not, is the payer's balance too: it is never sent twice.
    if (funding && balance + (funding.mined ? 0n : funding.fundedWei) < cost) refuse("erc20_approval_funding_above_bound", `the approval was funded already with ${funding.fundedWei} wei, short of what it may cost now; it is not funded twice`);
    const bound = opts.maxFundingWei ?? opts.maxApprovalGas * fees.cap;
    if (need > bound) refuse("erc20_approval_funding_above_bound", `funding the approval would take ${need} wei, above the bound of ${bound}`);
    const funder = opts.signer.getAddresses()[0]!;
    await simulate([
      ...(need > 0n ? [{ account: funder, to: approval.payer, value: need }] : []),
      { account: approval.payer, to: approval.token, data: approval.data, gas: approval.gas },
      { account: opts.simulateFrom, to: settle.to, data: settle.data },
    ]);
    return { approval, need, funding, relayed: false };
  }

  /** The sequence in one simulated block (eth_simulateV1): every call must succeed. Unserved: refused, nothing sent. */
  async function simulate(calls: { account: Address; to: Address; data?: Hex; value?: bigint; gas?: bigint }[]): Promise<void> {
    let results: Awaited<ReturnType<typeof simulateBlocks>>;
    try {
      results = await simulateBlocks(client, { blocks: [{ calls: calls as never }] });
    } catch (e) {
      noteRpcFailure(e);
      return refuse("erc20_approval_simulation_unavailable", "the approval and settlement could not be simulated together (the RPC endpoint must serve eth_simulateV1); nothing was sent");
    }
    const failed = results[0]?.calls.findIndex((c) => c.status !== "success") ?? 0;
    if (failed >= 0) {
      const step = calls.length - failed === 1 ? "settlement" : calls.length - failed === 2 ? "approval" : "funding";
      refuse(step === "settlement" ? "permit2_simulation_failed" : "erc20_approval_tx_failed", `the ${step} fails when simulated after the approval; nothing was sent`);
    }
  }

  /** Waits (bounded) for the relayed approval; undefined when the payer's nonce moved on without it. */
  async function approvalReceipt(approval: Approval): Promise<TransactionReceipt | undefined> {
    const deadline = Date.now() + opts.receiptTimeoutMs;
    for (;;) {
      const receipt = await client.getTransactionReceipt({ hash: approval.hash }).catch(() => undefined);
      if (receipt) return receipt;
      const mined = await client.getTransactionCount({ address: approval.payer, blockTag: "latest" }).catch(() => undefined);
      if (mined !== undefined && mined > approval.nonce) {
        // Its nonce is used: by it (the receipt is one poll away) or by another transaction.
        const again = await client.getTransactionReceipt({ hash: approval.hash }).catch(() => undefined);
        return again;
      }
      if (Date.now() >= deadline) throw new SponsorRefusal("erc20_approval_tx_failed", `the approval ${approval.hash} was not mined within ${opts.receiptTimeoutMs} ms; retry /settle`);
      await sleep(poll);
    }
  }

  /** Today's bounds of the network's fundings and of one payer's, in wei. */
  async function dailyBounds(): Promise<{ network: bigint; payer: bigint }> {
    const perFunding = await fundingBound();
    const wei = (b: FundingBound) => ("wei" in b ? b.wei : b.fundings * perFunding);
    return { network: wei(opts.dailyFunding), payer: wei(opts.payerDailyFunding) };
  }

  async function fundingBound(): Promise<bigint> {
    return opts.maxFundingWei ?? opts.maxApprovalGas * (await opts.signer.marketFees()).cap;
  }

  /**
   * The one funding of the approval's nonce: recorded and sent by the first payment that needs it,
   * waited for (its receipt) by every other, in any process. A recorded funding that was never
   * stored as a transaction is sent by its own payment's run (taken over after a crash), or by
   * another payment once that run is over.
   */
  async function fundOnce(p: Plan, paymentId: string): Promise<void> {
    const { approval } = p;
    const deadline = Date.now() + opts.receiptTimeoutMs;
    let funding = p.funding;
    for (;;) {
      if (!funding) {
        const bounds = await dailyBounds();
        const recorded = await opts.store.recordGasFunding({ approvalHash: approval.hash, approvalNonce: approval.nonce, payer: approval.payer, paymentId, fundedWei: p.need, dailyBoundWei: bounds.network, payerDailyBoundWei: bounds.payer });
        if (recorded.recorded) return sendFunding(approval, p.need, paymentId);
        if (recorded.why !== "funded") return refuse(FUNDING_REFUSALS[recorded.why][0], FUNDING_REFUSALS[recorded.why][1]);
        funding = recorded.funding;
      }
      if (funding.approvalHash.toLowerCase() !== approval.hash.toLowerCase()) refuse("erc20_approval_tx_nonce_mismatch", `another approval with the payer's nonce ${approval.nonce} was funded already; sign a new one once it is mined`);
      if (funding.hash) return awaitFunding(funding.hash);
      if (funding.paymentId === paymentId || (await opts.store.adoptGasFunding(approval.payer, approval.nonce, paymentId))) return sendFunding(approval, funding.fundedWei, paymentId);
      if (Date.now() >= deadline) refuse("erc20_approval_tx_failed", "the approval's funding, recorded by another payment, was not sent in time; nothing was sent for this one; retry /settle");
      await sleep(poll);
      funding = await opts.store.gasFunding(approval.payer, approval.nonce);
      if (!funding && p.need === 0n) return; // given up by its payment: the payer needs none
    }
  }

  async function sendFunding(approval: Approval, value: bigint, paymentId: string): Promise<void> {
    let hash: Hex;
    try {
      hash = await opts.signer.sendTransaction({ to: approval.payer, data: "0x", value });
    } catch (e) {
      // Not stored, or refused for good: the record goes, so it holds neither the nonce nor a bound.
      await opts.store.forgetGasFunding(approval.payer, approval.nonce, paymentId).catch(() => undefined);
      throw e;
    }
    opts.metrics?.gasFunded.inc({ network: opts.network }, Number(value));
    return awaitFunding(hash);
  }

  async function awaitFunding(hash: Hex): Promise<void> {
    const receipt = await opts.signer.waitForTransactionReceipt({ hash });
    if (receipt.status !== "success") refuse("erc20_approval_broadcast_failed", "the gas funding of the payer failed; the approval was not relayed");
  }

  /** At /settle: fund (once per approval nonce, bounded, recorded), relay, wait, then hand the settlement to the outbox. */
  async function send(txs: TransactionRequest[]): Promise<Hex[]> {
    const [raw, settle] = txs;
    if (typeof raw !== "string" || !settle || typeof settle === "string") return refuse("erc20_approval_tx_parse_failed", "expected the payer's signed approval and a settlement call");
    const p = await plan(raw, settle);
    if (p.allowanceHeld) return [await opts.signer.sendTransaction({ to: settle.to, data: settle.data })];
    const { approval } = p;
    if (p.funding || p.need > 0n) await fundOnce(p, settlementContext.getStore()?.paymentId ?? approval.hash);
    if (!p.relayed) {
      try {
        await client.sendRawTransaction({ serializedTransaction: approval.raw });
      } catch (e) {
        const outcome = classifySendError(e);
        // Relayed meanwhile by another payment that carries it (and maybe mined): not a refusal.
        const relayed = outcome === "already_known" || (await client.getTransaction({ hash: approval.hash }).then(() => true, () => false));
        if (!relayed) {
          if (outcome === "unreachable") noteRpcFailure(e);
          // Checked a moment ago; refused now: the payer used its nonce or its (funded) gas elsewhere.
          if (outcome === "nonce_too_low" || outcome === "insufficient_funds" || outcome === "replacement_underpriced") await abused(approval);
          refuse("erc20_approval_broadcast_failed", `the node refused the payer's approval (${outcome}); the settlement was not sent`);
        }
      }
    }
    const receipt = await approvalReceipt(approval);
    if (!receipt || receipt.status !== "success") {
      await abused(approval);
      refuse("erc20_approval_tx_failed", receipt ? "the payer's approval reverted; the settlement was not sent" : "the payer's nonce was used by another transaction than its approval; the settlement was not sent");
    }
    // No gas limit: estimated (simulated) again now that the approval is on chain. A revert now
    // means the payer moved its tokens (or used its Permit2 nonce) after being funded.
    let settlement: Hex;
    try {
      settlement = await opts.signer.sendTransaction({ to: settle.to, data: settle.data });
    } catch (e) {
      if (/^permit2_|^upto_|^invalid_(exact|upto)_evm_/.test(settlementContext.getStore()?.failure?.code ?? "")) await abused(approval);
      throw e;
    }
    await opts.store.settleGasFunding(approval.hash, "approved");
    return [approval.hash, settlement];
  }

  /** The payer's funded approval did not lead to its payment: it is never funded again (a no-op when it was not funded). */
  async function abused(approval: Approval): Promise<void> {
    if (await opts.store.settleGasFunding(approval.hash, "abused")) {
      opts.logger.warn({ payer: approval.payer, approval: approval.hash }, "a funded payer's approval did not lead to its payment: the payer is not funded again");
    }
  }

  /** A refusal at /settle becomes the answer's reason (withDecodedReverts reads the context). */
  function noted<T>(run: () => Promise<T>): Promise<T> {
    return run().catch((e: unknown) => {
      const ctx = settlementContext.getStore();
      if (e instanceof SponsorRefusal && ctx && !ctx.failure) ctx.failure = { code: e.code, message: e.message };
      opts.metrics?.approvalSponsorings.inc({ network: opts.network, result: e instanceof SponsorRefusal ? e.code : "error" });
      throw e;
    });
  }

  return {
    ...opts.signer,
    async refusalFor(payload, requirements) {
      const info = extractErc20ApprovalGasSponsoringInfo(payload);
      if (!info) return undefined;
      if (!validateErc20ApprovalGasSponsoringInfo(info)) return new SponsorRefusal("invalid_erc20_approval_extension_format", "extensions.erc20ApprovalGasSponsoring.info does not match its schema");
      const from = (payload.payload as { permit2Authorization?: { from?: string } }).permit2Authorization?.from;
      if (!from || !/^0x[0-9a-fA-F]{40}$/.test(from) || !isAddressEqual(info.from, from as Address)) return new SponsorRefusal("erc20_approval_from_mismatch", "the approval's from is not the payment's payer");
      if (!isAddressEqual(info.asset, requirements.asset as Address)) return new SponsorRefusal("erc20_approval_asset_mismatch", "the approval's asset is not the payment's token");
      if (!isAddressEqual(info.spender, PERMIT2_ADDRESS)) return new SponsorRefusal("erc20_approval_spender_not_permit2", "the approval's spender is not Permit2");
      try {
        const approval = await decode(info.signedTransaction);
        if (!isAddressEqual(approval.payer, from as Address)) return new SponsorRefusal("erc20_approval_tx_signer_mismatch", `the approval is signed by ${approval.payer}, not the payer`);
        if (!isAddressEqual(approval.token, requirements.asset as Address)) return new SponsorRefusal("erc20_approval_tx_wrong_target", `the approval calls ${approval.token}, not the payment's token`);
      } catch (e) {
        if (e instanceof SponsorRefusal) return e;
        throw e;
      }
      return undefined;
    },
    fundingBound,
    async simulateTransactions(txs) {
      const [raw, settle] = txs;
      if (typeof raw !== "string" || !settle || typeof settle === "string") return false;
      try {
        await plan(raw, settle);
        return true;
      } catch (e) {
        const verdict = sponsorVerdict.getStore();
        if (verdict) verdict.refusal = e instanceof SponsorRefusal ? e : new SponsorRefusal("erc20_approval_tx_failed", "the approval could not be checked");
        if (!(e instanceof SponsorRefusal)) noteRpcFailure(e);
        return false;
      }
    },
    sendTransactions: (txs) =>
      noted(async () => {
        const hashes = await send(txs);
        opts.metrics?.approvalSponsorings.inc({ network: opts.network, result: "settled" });
        return hashes;
      }),
  };
}
