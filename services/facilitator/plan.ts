// A payment's plan: before anything is signed, every transaction the payment may make the signer
// send (its steps, in order, each a set of kinds of which at most one is sent) and every flow of
// money those transactions move (who pays, who is paid). The facilitator screens every flow of the
// plan and checks its worst case against the caller's gas allowance before the mechanism runs; the
// outbox signer admits a transaction of a settlement only if its plan names it and every address its
// calldata pays, refunds or debits is one the plan screened (admit). So no mechanism, extension or
// payer kind can make the signer send something nobody screened or budgeted.
import type { PaymentPayload, PaymentRequirements } from "@x402/core/types";
import { x402ExactPermit2ProxyABI, x402UptoPermit2ProxyABI } from "@x402/evm";
import { decodeFunctionData, getAddress, isErc6492Signature, parseAbi, type Address, type Hex } from "viem";
import type { TransactionKind } from "./settlement/gas-policy.ts";

/** Money one transaction of the plan moves (or may move): from `payer` (undefined: a channel's pooled funds) to `payee`. */
export interface Flow {
  payer: Address | undefined;
  payee: Address;
  asset: Address;
  amount: string;
}

/** One step: the kinds of transaction that may carry it (at most one is sent). */
export interface PlanStep {
  kinds: readonly TransactionKind[];
  /** Why the step is there, for messages. */
  purpose: string;
}

export interface PaymentPlan {
  network: string;
  scheme: string;
  /** Whose money the payment takes (undefined for a channel sweep). */
  payer: Address | undefined;
  flows: Flow[];
  steps: PlanStep[];
  /** Every address a transaction of the plan may pay, refund or debit (lower case). */
  parties: ReadonlySet<string>;
  /** Steps already admitted (by index): each is sent at most once per settlement run. */
  admitted: Set<number>;
}

export interface PlanFeatures {
  /** ERC-6492 factories are configured: a counterfactual payer's wallet may be deployed first. */
  walletDeployment: boolean;
  /** ERC-20 approval gas sponsoring is served: a payer may be funded before its approval is relayed. */
  gasFunding: boolean;
}

/** The reason code of a transaction refused because its payment's plan does not admit it. */
export const TRANSACTION_NOT_PLANNED = "transaction_not_planned";

const ADDRESS = /^0x[0-9a-fA-F]{40}$/;
const address = (a: unknown): Address | undefined => (typeof a === "string" && ADDRESS.test(a) ? getAddress(a) : undefined);

interface ChannelConfigFields {
  payer?: unknown;
  receiver?: unknown;
  token?: unknown;
}
interface PayloadFields {
  type?: string;
  signature?: unknown;
  authorization?: { from?: unknown; to?: unknown };
  permit2Authorization?: { from?: unknown; witness?: { to?: unknown } };
  channelConfig?: ChannelConfigFields;
  deposit?: { amount?: unknown };
  receiver?: unknown;
  token?: unknown;
  amount?: unknown;
  claims?: { voucher?: { channel?: ChannelConfigFields }; totalClaimed?: unknown }[];
}

/**
 * The plan of a payment as the request describes it (the payload is only read: a malformed one has
 * been refused by checkSchemePayload before). Flows name every party of every transaction; a party
 * the request does not name cannot be paid, because admit checks the calldata against them.
 */
export function planPayment(payload: PaymentPayload, requirements: PaymentRequirements, features: PlanFeatures): PaymentPlan {
  const p = payload.payload as PayloadFields;
  const asset = getAddress(requirements.asset);
  const payTo = getAddress(requirements.payTo);
  const flows: Flow[] = [];
  const steps: PlanStep[] = [];
  const flow = (payer: unknown, payee: unknown, amount: unknown, token: unknown = asset) => {
    const to = address(payee);
    if (to) flows.push({ payer: address(payer), payee: to, asset: address(token) ?? asset, amount: String(amount ?? requirements.amount) });
  };
  let payer: Address | undefined;
  if (requirements.scheme === "batch-settlement") {
    const channel = p.channelConfig;
    payer = address(channel?.payer);
    if (p.type === "deposit") {
      flow(channel?.payer, channel?.receiver, p.deposit?.amount, channel?.token);
      steps.push({ kinds: ["batch_deposit", "batch_multicall"], purpose: "the channel deposit" });
    } else if (p.type === "voucher") {
      flow(channel?.payer, channel?.receiver, requirements.amount, channel?.token);
    } else if (p.type === "settle") {
      flow(undefined, p.receiver, requirements.amount, p.token);
      steps.push({ kinds: ["batch_settle"], purpose: "the receiver's sweep" });
    } else {
      // claim, refund: every claimed channel pays its receiver; a refund pays the channel's payer back.
      for (const c of Array.isArray(p.claims) ? p.claims : []) flow(c?.voucher?.channel?.payer, c?.voucher?.channel?.receiver, c?.totalClaimed, c?.voucher?.channel?.token);
      if (p.type === "refund") {
        flow(channel?.receiver, channel?.payer, p.amount, channel?.token);
        steps.push({ kinds: ["batch_refund", "batch_multicall"], purpose: "the channel refund" });
      } else steps.push({ kinds: ["batch_claim"], purpose: "the voucher claim" });
    }
  } else {
    const eip3009 = p.authorization && !p.permit2Authorization;
    payer = address(p.permit2Authorization?.from ?? p.authorization?.from);
    flow(payer, payTo, requirements.amount);
    // The payee the signed payload names, if the requirements name another (the mechanism refuses that; screened all the same).
    const signedTo = address(eip3009 ? p.authorization?.to : p.permit2Authorization?.witness?.to);
    if (signedTo && signedTo !== payTo) flow(payer, signedTo, requirements.amount);
    const wrapped = typeof p.signature === "string" && /^0x[0-9a-fA-F]*$/.test(p.signature) && isErc6492Signature(p.signature as Hex);
    if (features.walletDeployment && wrapped) steps.push({ kinds: ["wallet_deployment"], purpose: "the payer's wallet deployment" });
    if (eip3009) steps.push({ kinds: ["eip3009_transfer"], purpose: "the transfer" });
    else {
      if (features.gasFunding && payload.extensions && "erc20ApprovalGasSponsoring" in payload.extensions) steps.push({ kinds: ["gas_funding"], purpose: "the payer's approval gas" });
      steps.push({ kinds: requirements.scheme === "upto" ? ["upto_settle", "upto_settle_with_permit"] : ["permit2_settle", "permit2_settle_with_permit"], purpose: "the Permit2 settlement" });
    }
  }
  const parties = new Set<string>();
  for (const f of flows) {
    if (f.payer) parties.add(f.payer.toLowerCase());
    parties.add(f.payee.toLowerCase());
  }
  return { network: requirements.network, scheme: requirements.scheme, payer, flows, steps, parties, admitted: new Set() };
}

// The batch-settlement contract's functions the mechanism calls (facts of its ABI; @x402/evm does not export it).
const CHANNEL = "(address payer, address payerAuthorizer, address receiver, address receiverAuthorizer, address token, uint40 withdrawDelay, bytes32 salt)";
const CLAIM = `((${CHANNEL.slice(1, -1)}) channel, uint128 maxClaimableAmount) voucher, bytes signature, uint128 totalClaimed`;
const batchAbi = parseAbi([
  "function multicall(bytes[] data)",
  `function deposit(${CHANNEL} config, uint128 amount, address collector, bytes collectorData)`,
  `function claim((${CLAIM})[] voucherClaims)`,
  `function claimWithSignature((${CLAIM})[] voucherClaims, bytes authorizerSignature)`,
  "function settle(address receiver, address token)",
  `function refund(${CHANNEL} config, uint128 amount)`,
  `function refundWithSignature(${CHANNEL} config, uint128 amount, uint256 nonce, bytes receiverAuthorizerSignature)`,
]);

type Channel = { payer: Address; receiver: Address };

/** The addresses a batch-settlement call pays, refunds or debits (multicall: each inner call's). */
function batchParties(data: Hex, depth = 0): Address[] {
  const call = decodeFunctionData({ abi: batchAbi, data });
  const channels = (c: Channel) => [c.payer, c.receiver];
  switch (call.functionName) {
    case "multicall":
      if (depth > 0) throw new Error("a nested multicall");
      return call.args[0].flatMap((inner) => batchParties(inner, depth + 1));
    case "deposit":
    case "refund":
    case "refundWithSignature":
      return channels(call.args[0]);
    case "claim":
    case "claimWithSignature":
      return (call.args[0] as unknown as readonly { voucher: { channel: Channel } }[]).flatMap((c) => channels(c.voucher.channel));
    case "settle":
      return [call.args[0]];
  }
}

/** The addresses a transaction of a known kind pays or debits, read from its calldata. */
function partiesOf(kind: TransactionKind, to: Address, data: Hex): Address[] {
  switch (kind) {
    case "eip3009_transfer":
      // transferWithAuthorization(address from, address to, ...): both selectors start with them.
      return [getAddress(`0x${data.slice(34, 74)}`), getAddress(`0x${data.slice(98, 138)}`)];
    case "permit2_settle":
    case "permit2_settle_with_permit":
    case "upto_settle":
    case "upto_settle_with_permit": {
      const abi = kind.startsWith("upto") ? x402UptoPermit2ProxyABI : x402ExactPermit2ProxyABI;
      const call = decodeFunctionData({ abi, data }) as { args: readonly unknown[] };
      // settle(permit, [amount,] owner, witness, signature) and settleWithPermit(permit2612, ...): owner and witness.to.
      const owner = call.args.find((a): a is Address => typeof a === "string" && ADDRESS.test(a));
      const witness = call.args.find((a): a is { to: Address } => typeof a === "object" && a !== null && "to" in a);
      if (!owner || !witness) throw new Error("no owner or witness in the call");
      return [owner, witness.to];
    }
    case "gas_funding":
      return [to];
    case "wallet_deployment":
      return []; // an allowed factory, deploying the payer's wallet (its address is the payer's, checked by the facilitator)
    default:
      if (kind.startsWith("batch_")) return batchParties(data);
      throw new Error(`a ${kind} transaction is never part of a payment`);
  }
}

/**
 * Whether the plan admits this transaction: its kind fills a step not yet sent, and every address
 * its calldata pays or debits is a party the plan screened. Undefined when admitted (the step is
 * then taken), else why not (nothing may be signed).
 */
export function admit(plan: PaymentPlan, tx: { kind: TransactionKind; to: Address; data: Hex; value: bigint }): string | undefined {
  const index = plan.steps.findIndex((s, i) => !plan.admitted.has(i) && s.kinds.includes(tx.kind));
  if (index < 0) {
    const planned = plan.steps.map((s) => s.kinds.join("|")).join(", ") || "none";
    return `a ${tx.kind} transaction is not in this payment's plan (planned: ${planned})`;
  }
  if (tx.value > 0n && tx.kind !== "gas_funding") return `a ${tx.kind} transaction may not carry value`;
  if (tx.kind === "gas_funding" && (!plan.payer || tx.to.toLowerCase() !== plan.payer.toLowerCase())) return "a gas funding may only pay the payment's payer";
  let parties: Address[];
  try {
    parties = partiesOf(tx.kind, tx.to, tx.data);
  } catch (e) {
    return `the ${tx.kind} transaction's calldata cannot be read against the plan (${(e as Error).message.split("\n")[0]})`;
  }
  const stranger = parties.find((a) => !plan.parties.has(a.toLowerCase()));
  if (stranger) return `the ${tx.kind} transaction pays or debits ${getAddress(stranger)}, which this payment's plan does not name`;
  plan.admitted.add(index);
  return undefined;
}
