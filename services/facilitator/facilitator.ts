// One chain's facilitator: the reference @x402/evm mechanisms on our signer, registered for
// exactly this network, behind an explicit (scheme, network) table.
import { x402Facilitator } from "@x402/core/facilitator";
import type { PaymentPayload, PaymentRequirements, SettleResponse, SupportedResponse, VerifyResponse } from "@x402/core/types";
import { ExactEvmScheme } from "@x402/evm/exact/facilitator";
import { UptoEvmScheme } from "@x402/evm/upto/facilitator";
import { BatchSettlementEvmScheme } from "@x402/evm/batch-settlement/facilitator";
import { getAddress, type Address, type PrivateKeyAccount } from "viem";
import { RequestError } from "../x402/errors.ts";
import { isDatabaseUnavailable } from "../platform/storage.ts";
import type { AssetInfo, Caip2 } from "../x402/networks.ts";
import { extensionsFor } from "../x402/extensions.ts";
import { checkSchemePayload } from "../x402/payloads.ts";
import { normalizeRequest, pairKey, type Scheme } from "../x402/wire.ts";
import type { CallerHeaders } from "../platform/http.ts";
import { safeMessage, type Logger } from "../platform/logger.ts";
import { reasonLabel, type Metrics } from "../platform/metrics.ts";
import { withSpan } from "../platform/tracing.ts";
import { isRpcUnavailable, watchRpc, type ChainClient } from "./chain.ts";
import { servingAssetCode, withAssetCode } from "./asset-code.ts";
import { createFastExactVerifier, fastExactApplies } from "./fast-exact.ts";
import { authenticateReceivers, receiversNeedingAuthorizer, type ReceiverCredentials } from "./receiver-auth.ts";
import { UNEXPECTED_SETTLE_ERROR, SETTLEMENT_PENDING, SettlementBusyError, TRANSACTION_FAILED } from "./settlement/answers.ts";
import type { SettleJob, SettlementCoordinator } from "./settlement/coordinator.ts";
import type { OutboxSigner } from "./settlement/outbox-signer.ts";
import { withDecodedReverts } from "./settlement/reverts.ts";
import { createSmartWalletPayers, simulatingDeployment } from "./smart-wallets.ts";
import type { Refusal, Screening } from "./screening.ts";
import { ScreeningUnavailableError, type ScreeningHook } from "./screening-hook.ts";
import { GAS_BUDGET_EXHAUSTED, SCHEME_TRANSACTION_KINDS, type GasMeter } from "./settlement/gas-meter.ts";
import { planPayment, type PaymentPlan } from "./plan.ts";
import { extractAndValidatePaymentIdentifier } from "@x402/extensions/payment-identifier";
import { createErc20ApprovalGasSponsoringExtension } from "@x402/extensions";
import { sponsorVerdict, type ApprovalSponsor, type SponsorRefusal } from "./settlement/approval-sponsor.ts";
import { createSettlementStatus, type StatusCaller } from "./settlement/status.ts";
import type { SettlementStore } from "./settlement/store.ts";
import { SETTLEMENT_STATUS, type ConfirmationPolicy } from "../x402/extensions.ts";

export interface FacilitatorOptions {
  network: Caip2;
  signer: OutboxSigner;
  chain: ChainClient;
  coordinator: SettlementCoordinator;
  /** The settlement store and the depth a settlement is final at: the status API, and the policy /supported publishes. */
  settlements?: { store: SettlementStore; confirmations: number };
  schemes: Scheme[];
  /** Known assets of this network: their EIP-712 domain fills a missing `extra` (service-shape requests carry none). */
  assets: AssetInfo[];
  logger: Logger;
  metrics: Metrics;
  /** The one key `upto` payments name in witness.facilitator (advertised as extra.facilitatorAddress). */
  uptoFacilitatorAddress: Address;
  /** batch-settlement: the receiver-authorizer key; when set, advertised as extra.receiverAuthorizer. */
  receiverAuthorizer?: PrivateKeyAccount;
  /** Bearer-token digests of the receivers the receiver-authorizer key signs claims and refunds for. */
  receiverCredentials?: ReceiverCredentials;
  /** The token contracts accepted; unset: the known assets of this network (`assets`). */
  allowedAssets?: Address[];
  /** ERC-6492 factories a counterfactual payer's wallet may be deployed through (the reference mechanisms' allow-list). */
  eip6492Factories?: Address[];
  /** A deny-list of payers and payees (screening.ts), checked before any RPC call. */
  screening?: Screening;
  /** An external screening service (screening-hook.ts), asked after the deny-list, before any RPC call. */
  screeningHook?: ScreeningHook;
  /** The erc20ApprovalGasSponsoring extension's signer (settlement/approval-sponsor.ts); unset: not served. */
  approvalSponsor?: ApprovalSponsor;
}

export interface Facilitator {
  verify(body: unknown): Promise<VerifyResponse>;
  /** `gas`: the router's allowance for a tenant's settlement; filled with what was spent and the next quote. */
  settle(body: unknown, caller?: CallerHeaders, gas?: GasMeter): Promise<SettleResponse>;
  supported(): SupportedResponse;
  pairs(): string[];
  /** GET /v2/settlements/status: a payment named by its transaction, identifier, or payer and nonce (status.ts). */
  status(query: Record<string, unknown>, caller?: StatusCaller): Promise<{ status: number; body: unknown }>;
  /** POST /v2/settlements/status: the very payment a resource server sent to /settle. */
  statusOf(body: unknown, caller?: StatusCaller): Promise<{ status: number; body: unknown }>;
}

export function createFacilitator(opts: FacilitatorOptions): Facilitator {
  const core = new x402Facilitator();
  const signer = simulatingDeployment(servingAssetCode(opts.signer), opts.chain);
  // upto and batch-settlement send from the one key they advertise (extra.facilitatorAddress).
  const pinnedSigner = asCaller(signer, opts.uptoFacilitatorAddress);
  const factories = opts.eip6492Factories ?? [];
  const smartWallets = createSmartWalletPayers({ core, signer: opts.signer, chain: opts.chain, network: opts.network, factories });
  for (const scheme of opts.schemes) {
    // Each mechanism is registered for exactly this network: no eip155:* wildcard.
    if (scheme === "exact") core.register(opts.network, new ExactEvmScheme(signer, { eip6492AllowedFactories: factories }));
    if (scheme === "upto") core.register(opts.network, new UptoEvmScheme(pinnedSigner));
    if (scheme === "batch-settlement") {
      const authorizer = opts.receiverAuthorizer && { address: opts.receiverAuthorizer.address, signTypedData: (p: Parameters<PrivateKeyAccount["signTypedData"]>[0]) => opts.receiverAuthorizer!.signTypedData(p) };
      core.register(opts.network, new BatchSettlementEvmScheme(pinnedSigner, authorizer as never, { eip6492AllowedFactories: factories }));
    }
  }
  // EIP-2612 gas sponsoring rides in payload extensions and is handled by the exact Permit2 mechanism;
  // ERC-20 approval sponsoring needs its signer registered as the extension.
  const sponsor = opts.approvalSponsor;
  if (sponsor) core.registerExtension(createErc20ApprovalGasSponsoringExtension(sponsor));
  // The confirmation policy: at what depth a settlement is answered success and counted final.
  const settlements = opts.settlements;
  const policy: ConfirmationPolicy | undefined = settlements && { [opts.network]: { confirmations: settlements.confirmations } };
  const supported = {
    ...(core.getSupported() as SupportedResponse),
    extensions: [...extensionsFor(opts.schemes, { erc20ApprovalSponsoring: !!sponsor }), ...(policy ? [SETTLEMENT_STATUS] : [])],
    ...(policy ? { confirmationPolicy: policy } : {}),
  };
  const status = settlements && createSettlementStatus({ ...settlements, chain: opts.chain, network: opts.network, reusedReason: (p, r) => settleJobOf(p, r).reusedReason });
  const statusService = () => {
    if (!status) throw new RequestError("not_found", "this facilitator keeps no settlement status");
    return status;
  };
  const fastExact = createFastExactVerifier({ chain: opts.chain, signer });
  const pairs = supported.kinds.map((k) => pairKey(k.scheme, k.network));
  const domainByAsset = new Map(opts.assets.filter((a) => a.eip712).map((a) => [getAddress(a.address), a.eip712!]));
  // Gas is spent only on tokens we know: an attacker's own token could burn any amount in its transfer.
  const accepted = new Set(opts.allowedAssets ?? opts.assets.map((a) => getAddress(a.address)));
  function checkAsset(asset: string, where = ""): Address {
    const address = getAddress(asset);
    if (!accepted.has(address)) {
      throw new RequestError("unsupported_asset", `${where}${address} is not accepted on ${opts.network}; accepted assets: ${[...accepted].join(", ") || "(none)"}`);
    }
    return address;
  }

  function prepare(body: unknown): { payload: PaymentPayload; requirements: PaymentRequirements } {
    const request = normalizeRequest(body);
    const { paymentRequirements: requirements, paymentPayload: payload } = request;
    if (!pairs.includes(pairKey(requirements.scheme, requirements.network))) {
      throw new RequestError(
        "unsupported_scheme_network",
        `${pairKey(requirements.scheme, requirements.network)} is not served here; registered pairs: ${pairs.join(", ")}`,
      );
    }
    const asset = checkAsset(requirements.asset);
    checkSchemePayload(requirements.scheme, payload.payload);
    for (const token of tokensInside(payload.payload)) checkAsset(token, "the payload's token ");
    const domain = domainByAsset.get(asset);
    if (domain && (requirements.extra.name === undefined || requirements.extra.version === undefined)) {
      const extra = { name: domain.name, version: domain.version, ...requirements.extra };
      return { payload: { ...payload, accepted: { ...payload.accepted, extra: { ...extra, ...payload.accepted.extra } } }, requirements: { ...requirements, extra } };
    }
    return { payload, requirements };
  }

  /**
   * A sponsored approval whose fields do not match the payment (another signer, another token):
   * refused before any RPC call, at /verify and at /settle (the reference checks them at /verify only).
   */
  async function sponsorRefusal(payload: PaymentPayload, requirements: PaymentRequirements): Promise<{ reason: string; message: string } | undefined> {
    if (!sponsor || (requirements.scheme !== "exact" && requirements.scheme !== "upto")) return undefined;
    const refusal = await sponsor.refusalFor(payload, requirements);
    return refusal && { reason: refusal.code, message: refusal.message };
  }

  /**
   * The payment-identifier extension (an idempotency id): malformed → 400; bound to another payment
   * → 409 and nothing is sent. Only read here: a settlement binds it once it moved money or sent a
   * transaction (see settle), so /verify stays read-only and a forged payment cannot take the id.
   */
  async function checkIdentifier(payload: PaymentPayload, requirements: PaymentRequirements): Promise<string | undefined> {
    if (!payload.extensions || !("payment-identifier" in payload.extensions)) return undefined;
    const { id, validation } = extractAndValidatePaymentIdentifier(payload);
    if (!validation.valid) throw new RequestError("invalid_payload", `paymentPayload.extensions.payment-identifier: ${(validation.errors ?? ["invalid"]).join("; ")}`);
    if (id && (await opts.coordinator.identifierConflict(id, payload, requirements))) {
      throw new RequestError("payment_identifier_conflict", `payment identifier ${id} was already used for a different payment; a new payment needs a new id`);
    }
    return id ?? undefined;
  }

  /** What the payment may make the signer send, and to whom (plan.ts). */
  const planOf = (payload: PaymentPayload, requirements: PaymentRequirements) =>
    planPayment(payload, requirements, { walletDeployment: factories.length > 0, gasFunding: !!sponsor });

  /**
   * Why a payment is refused before any RPC call (worthless, or screened out), or undefined. Every
   * flow of its plan is screened: each payer and payee any of its transactions would touch (a batch
   * claim's channels, a sweep's receiver), not only the request's payTo. A screening service that
   * cannot answer under fail-closed is not a verdict: 503, nothing sent.
   */
  async function refusalOf(payload: PaymentPayload, requirements: PaymentRequirements, planned: PaymentPlan | undefined, step: "verify" | "settle"): Promise<{ reason: string; message: string } | undefined> {
    const worthless = worthlessReason(payload, requirements, step);
    if (worthless) return { reason: "invalid_payment_requirements", message: worthless };
    if (!opts.screening && !opts.screeningHook) return undefined;
    const plan = planned ?? planOf(payload, requirements);
    for (const flow of plan.flows) {
      const listed: Refusal | undefined = opts.screening?.check(flow.payer, flow.payee);
      if (listed) {
        opts.metrics.screeningChecks.inc({ network: opts.network, source: "deny_list", result: "denied" });
        return listed;
      }
    }
    if (!opts.screeningHook) return undefined;
    const questions = new Map(plan.flows.map((f) => [`${f.payer}|${f.payee}|${f.asset}|${f.amount}`, f]));
    try {
      const verdicts = await Promise.all(
        [...questions.values()].map((f) => opts.screeningHook!.check({ network: opts.network, scheme: requirements.scheme, asset: f.asset, amount: f.amount, payer: f.payer, payee: f.payee, step })),
      );
      return verdicts.find((v) => v !== undefined);
    } catch (e) {
      if (e instanceof ScreeningUnavailableError) throw new RequestError("backend_unavailable", e.message);
      throw e;
    }
  }

  /**
   * A tenant's allowance that cannot cover the plan's worst case (every step at its gas ceiling and
   * the fee cap, plus a funding's value): refused before the first step, so no payment is left half
   * done (a funding sent, its settlement refused).
   */
  async function budgetRefusal(plan: PaymentPlan, gas: GasMeter | undefined): Promise<{ reason: string; message: string } | undefined> {
    const remaining = gas?.remaining();
    if (remaining === undefined) return undefined;
    const parts = await Promise.all(plan.steps.map((s) => (s.kinds.includes("gas_funding") && sponsor ? Promise.all([opts.signer.worstCase(s.kinds), sponsor.fundingBound()]).then(([a, b]) => a + b) : opts.signer.worstCase(s.kinds))));
    const worst = parts.reduce((a, b) => a + b, 0n);
    if (worst <= remaining) return undefined;
    return { reason: GAS_BUDGET_EXHAUSTED, message: `this payment may cost up to ${worst} wei (${plan.steps.map((s) => s.purpose).join(", ")}), more than the ${remaining} wei left of the API key's gas budget for today; nothing was sent` };
  }

  /**
   * The fast path (fast-exact.ts) for an EIP-3009 payment, with the full path's steps that apply to
   * it in the same order (the asset's code, then a sponsored approval's refusal) and its context
   * passed by hand: no AsyncLocalStorage is entered, so a process that only verifies never turns on
   * Node's hooks on every promise. Undefined where the full path decides (a contract account, any
   * other payload: the fast path leaves them before any other step).
   */
  async function fastVerdict(payload: PaymentPayload, requirements: PaymentRequirements): Promise<{ failed: boolean; value?: VerifyResponse; error?: unknown } | undefined> {
    if (requirements.scheme !== "exact" || !fastExactApplies(payload)) return undefined;
    const watch = { failed: false };
    try {
      const assetCode = await opts.signer.getCode({ address: getAddress(requirements.asset) });
      const forged = await sponsorRefusal(payload, requirements);
      if (forged) return { failed: false, value: { isValid: false, invalidReason: forged.reason, invalidMessage: forged.message, payer: payerOf(payload) } };
      const value = await fastExact.verify(payload, requirements, { assetCode, watch });
      return value && { failed: watch.failed, value: scrub(value) };
    } catch (error) {
      return { failed: watch.failed || isRpcUnavailable(error), error };
    }
  }

  return {
    pairs: () => [...pairs],
    supported: () => supported,
    status: (query, caller = {}) => statusService().lookup(query, caller),
    statusOf: async (body, caller = {}) => {
      const service = statusService();
      const { payload, requirements } = prepare(body);
      return service.ofPayment(payload, requirements, caller);
    },

    async verify(body) {
      const { payload, requirements } = prepare(body);
      const labels = { network: opts.network, scheme: requirements.scheme };
      const end = opts.metrics.verifyDuration.startTimer(labels);
      await checkIdentifier(payload, requirements);
      // Verify signs nothing: its plan is only read for screening, so it is made only where screening is on.
      const refusal = await refusalOf(payload, requirements, undefined, "verify");
      const response = await withSpan("facilitator.verify", { "x402.network": opts.network, "x402.scheme": requirements.scheme }, async (span) => {
        let r: VerifyResponse;
        const { failed, value, error } = refusal
          ? { failed: false, value: { isValid: false, invalidReason: refusal.reason, invalidMessage: refusal.message, payer: payerOf(payload) } as VerifyResponse, error: undefined }
          : ((await fastVerdict(payload, requirements)) ??
            (await watchRpc(() =>
              withAssetCode(opts.signer, requirements, async () => {
                const payer = await smartWallets.stepsFor(payload, requirements);
                const forged = payer.refusal ?? (await sponsorRefusal(payload, requirements));
                if (forged) return { isValid: false, invalidReason: forged.reason, invalidMessage: forged.message, payer: payerOf(payload) } as VerifyResponse;
                // A sponsored approval's simulation answers the mechanism with a boolean: its reason is read back here.
                const verdict: { refusal?: SponsorRefusal } = {};
                const r = await sponsorVerdict.run(verdict, () => payer.verify());
                if (!r.isValid && verdict.refusal) return { ...r, invalidReason: verdict.refusal.code, invalidMessage: safeMessage(verdict.refusal.message) };
                return scrub(r);
              }),
            )));
        if (value && (value.isValid || !failed)) r = value;
        else if (failed) r = { isValid: false, invalidReason: RPC_UNAVAILABLE }; // no verdict: answered 503 below
        else {
          opts.logger.warn({ err: errorSummary(error), scheme: requirements.scheme }, "verify failed unexpectedly");
          r = { isValid: false, invalidReason: "unexpected_verify_error", invalidMessage: safeMessage(error) };
        }
        span.setAttributes({ "x402.valid": r.isValid, "x402.reason": reasonLabel(r.invalidReason) });
        return r;
      });
      end();
      opts.metrics.verifyTotal.inc({ ...labels, result: response.isValid ? "valid" : "invalid", reason: reasonLabel(response.invalidReason) });
      if (response.invalidReason === RPC_UNAVAILABLE) throw rpcUnavailable(opts);
      return response;
    },

    async settle(body, caller = {}, gas) {
      const { payload, requirements } = prepare(body);
      const job = { ...settleJobOf(payload, requirements), tenant: caller.tenant, webhook: caller.tenantWebhook };
      if (opts.receiverAuthorizer && requirements.scheme === "batch-settlement") {
        authenticateReceivers(receiversNeedingAuthorizer(payload.payload, opts.receiverAuthorizer.address), caller.authorization, opts.receiverCredentials);
      }
      const labels = { network: opts.network, scheme: requirements.scheme };
      const end = opts.metrics.settleDuration.startTimer(labels);
      const clientId = await checkIdentifier(payload, requirements);
      const plan = planOf(payload, requirements);
      // A plan the fees cannot be read for now is not refused here: each step's own commit still bounds it.
      const refusal = (await refusalOf(payload, requirements, plan, "settle")) ?? (await budgetRefusal(plan, gas).catch(() => undefined));
      const response = await withSpan("facilitator.settle", { "x402.network": opts.network, "x402.scheme": requirements.scheme }, async (span) => {
        let r: SettleResponse;
        const { failed, value, error } = refusal
          ? {
              failed: false,
              value: { success: false, errorReason: refusal.reason, errorMessage: refusal.message, transaction: "", network: requirements.network, ...(payerOf(payload) ? { payer: payerOf(payload) } : {}) } as SettleResponse,
              error: undefined,
            }
          : await watchRpc(() =>
              opts.coordinator.settle({
                ...job,
                clientId,
                gas,
                plan,
                run: () =>
                  withAssetCode(opts.signer, requirements, async () => {
                    const refused = (reason: string, message?: string) =>
                      ({ success: false, errorReason: reason, ...(message ? { errorMessage: message } : {}), transaction: "", network: requirements.network, payer: payerOf(payload) }) as SettleResponse;
                    const payer = await smartWallets.stepsFor(payload, requirements);
                    const forged = payer.refusal ?? (await sponsorRefusal(payload, requirements));
                    if (forged) return refused(forged.reason, forged.message);
                    const answered = await payer.beforeSettle();
                    if (answered) return answered;
                    return withDecodedReverts(() => core.settle(payload, requirements));
                  }),
              }),
            );
        // Only a refusal with nothing sent becomes a 503: a payment with a transaction is answered by its outcome or settlement_pending.
        if (value && !(failed && !value.success && value.errorReason !== SETTLEMENT_PENDING && !value.transaction)) r = scrub(value);
        else if (failed) r = { success: false, errorReason: RPC_UNAVAILABLE, transaction: "", network: requirements.network };
        // The store failed with nothing of this payment sent (the coordinator answers from the chain once a transaction exists): no verdict, 503.
        else if (isDatabaseUnavailable(error)) r = { success: false, errorReason: STORE_UNAVAILABLE, transaction: "", network: requirements.network };
        // Another request holds this payment and has sent nothing yet: not a verdict either (its outcome comes to a retry).
        else if (error instanceof SettlementBusyError) r = { success: false, errorReason: STORE_BUSY, errorMessage: error.message, transaction: "", network: requirements.network };
        else {
          opts.logger.error({ err: errorSummary(error), scheme: requirements.scheme }, "settle failed unexpectedly (nothing was stored for it)");
          r = { success: false, errorReason: UNEXPECTED_SETTLE_ERROR, errorMessage: safeMessage(error), transaction: "", network: requirements.network };
        }
        span.setAttributes({ "x402.success": r.success, "x402.reason": reasonLabel(r.errorReason), "x402.transaction": r.transaction });
        return r;
      });
      end();
      if (clientId && (response.success || response.transaction)) {
        await opts.coordinator.bindIdentifier(clientId, payload, requirements).catch((e: unknown) => opts.logger.warn({ err: errorSummary(e) }, "payment identifier not bound"));
      }
      // A tenant answered with a transaction reads the payment's status (whoever settled it first).
      if (settlements && job.tenant && (response.success || response.transaction)) {
        await opts.coordinator.noteTenant(job).catch((e: unknown) => opts.logger.warn({ err: errorSummary(e) }, "tenant not recorded for the status API"));
      }
      // A refusal with nothing sent is kept so the payment's status can say why (not a 503: that is no verdict).
      if (settlements && !response.success && !response.transaction && !NO_VERDICT.has(response.errorReason ?? "")) {
        await opts.coordinator.noteRefusal(job, response).catch((e: unknown) => opts.logger.warn({ err: errorSummary(e) }, "refusal not recorded for the status API"));
      }
      // The size of the router's next reservation for this scheme (no quote when the RPC is down).
      // (A counterfactual payer's wallet may be deployed first, a sponsored payer funded first: one more transaction each.)
      if (gas) {
        const kinds = SCHEME_TRANSACTION_KINDS[requirements.scheme] ?? [];
        gas.quote = await Promise.all([
          opts.signer.worstCase(kinds),
          factories.length ? opts.signer.worstCase(["wallet_deployment"]) : 0n,
          sponsor && requirements.scheme !== "batch-settlement" ? Promise.all([opts.signer.worstCase(["gas_funding"]), sponsor.fundingBound()]).then(([tx, value]) => tx + value) : 0n,
        ])
          .then(([settle, deploy, funding]) => settle + deploy + funding)
          .catch(() => undefined);
      }
      const result = response.success ? "success" : response.errorReason === SETTLEMENT_PENDING ? "pending" : "failure";
      opts.metrics.settleTotal.inc({ ...labels, result, reason: reasonLabel(response.errorReason) });
      if (response.errorReason === RPC_UNAVAILABLE) throw rpcUnavailable(opts);
      if (response.errorReason === STORE_UNAVAILABLE) throw new RequestError("backend_unavailable", "the settlement store is unavailable; retry (a retry reports this payment's outcome)", RETRY_SOON);
      if (response.errorReason === STORE_BUSY) throw new RequestError("backend_unavailable", response.errorMessage ?? "another request is settling this payment; retry", RETRY_SOON);
      return response;
    },
  };
}

/**
 * The chain's RPC gave no answer while a payment was judged, and nothing was sent: not a verdict
 * on the payment, so the contract's 503 (retry later), as for an unreachable facilitator. Metrics
 * count it under this reason.
 */
const RPC_UNAVAILABLE = "rpc_unavailable";
/** The settlement store failed before anything of the payment was stored (counted under this reason, answered 503). */
const STORE_UNAVAILABLE = "store_unavailable";
/** Another request holds the payment's claim with nothing sent (answered 503). */
const STORE_BUSY = "settlement_busy";
const RETRY_SOON = { "retry-after": "1" };
/** Answers that say nothing of the payment (ours or a provider's fault): never kept as its status. */
const NO_VERDICT = new Set([RPC_UNAVAILABLE, STORE_UNAVAILABLE, STORE_BUSY, UNEXPECTED_SETTLE_ERROR, SETTLEMENT_PENDING]);
const rpcUnavailable = (opts: FacilitatorOptions) =>
  new RequestError("backend_unavailable", `the RPC of ${opts.network} (${opts.chain.endpoints.join(", ")}) did not answer; retry later`);

/**
 * The signer as one key: `upto` advertises getAddresses()[0] as the facilitator address (the
 * reference picks one at random from several) and simulates settle calls from it.
 */
function asCaller(signer: OutboxSigner, address: Address): OutboxSigner {
  return {
    ...signer,
    getAddresses: () => [address],
    readContract: (args) => signer.readContract({ ...args, account: address } as typeof args),
  };
}

/** How a settlement is identified, reserved and sent, by scheme and payload type. */
function settleJobOf(payload: PaymentPayload, requirements: PaymentRequirements): Omit<SettleJob, "run"> {
  const inner = payload.payload as BatchPayloadFields & { authorization?: { from?: string }; permit2Authorization?: { from?: string; witness?: { facilitator?: string } } };
  const takes = (reusedReason: string, from: string, insufficientReason: string) => ({
    payload,
    requirements,
    reusedReason,
    reservation: { asset: getAddress(requirements.asset), payer: getAddress(from), amount: BigInt(requirements.amount), insufficientReason },
  });
  if (requirements.scheme === "batch-settlement") {
    // A batch sweep carries nothing unique (receiver, token) and may legitimately repeat: no replay identity.
    if (inner.type === "settle") return { payload, requirements, unique: true, reusedReason: TRANSACTION_FAILED };
    const deposit = inner.type === "deposit" && inner.channelConfig && inner.deposit;
    return {
      payload,
      requirements,
      reusedReason: TRANSACTION_FAILED,
      ...(deposit
        ? { reservation: { asset: getAddress(inner.channelConfig!.token), payer: getAddress(inner.channelConfig!.payer), amount: BigInt(inner.deposit!.amount), insufficientReason: "invalid_batch_settlement_evm_insufficient_balance" } }
        : {}),
    };
  }
  if (requirements.scheme === "exact" && inner.authorization?.from && !inner.permit2Authorization) {
    return takes("invalid_exact_evm_nonce_already_used", inner.authorization.from, "invalid_exact_evm_insufficient_balance");
  }
  // Permit2 (exact, upto): upto is sent from the key its witness names and answers with the settled amount.
  const job = takes("permit2_invalid_nonce", inner.permit2Authorization!.from!, "permit2_insufficient_balance");
  if (requirements.scheme !== "upto") return job;
  const named = inner.permit2Authorization?.witness?.facilitator;
  return { ...job, signer: named ? getAddress(named) : undefined, extra: { amount: requirements.amount } };
}

interface BatchPayloadFields {
  type?: string;
  token?: string;
  channelConfig?: { token: string; payer: string };
  deposit?: { amount: string; authorization?: { permit2Authorization?: { permitted?: { token?: string } } } };
  claims?: { voucher?: { channel?: { token?: string } } }[];
}

/** Every token a batch-settlement payload names (channel configs, claims, sweeps, Permit2 deposits). */
function tokensInside(payload: Record<string, unknown>): string[] {
  const p = payload as BatchPayloadFields;
  const tokens = [p.token, p.channelConfig?.token, p.deposit?.authorization?.permit2Authorization?.permitted?.token, ...(Array.isArray(p.claims) ? p.claims.map((c) => c?.voucher?.channel?.token) : [])];
  return tokens.filter((t): t is string => typeof t === "string" && /^0x[0-9a-fA-F]{40}$/.test(t));
}

/**
 * Why a payment is not worth a transaction: a zero amount, or a payer paying itself, moves nothing
 * but costs our gas. `upto` settling 0 is the documented no-op (no transaction), so only its
 * ceiling at /verify must be non-zero.
 */
function worthlessReason(payload: PaymentPayload, requirements: PaymentRequirements, step: "verify" | "settle"): string | undefined {
  const p = payload.payload as BatchPayloadFields;
  if (requirements.scheme === "batch-settlement") {
    if (p.type === "deposit" && p.deposit && isZero(p.deposit.amount)) return "a deposit of 0 moves nothing";
    return undefined;
  }
  const payer = payerOf(payload);
  // Compared in lower case (both are 20-byte hex): a checksum would cost a keccak per new payer.
  if (payer && /^0x[0-9a-fA-F]{40}$/.test(payer) && payer.toLowerCase() === requirements.payTo.toLowerCase()) return "the payer pays itself: nothing would move";
  if (requirements.scheme === "upto" && step === "settle") return undefined;
  if (BigInt(requirements.amount) === 0n) return "the amount is 0: a payment must move a positive amount";
  return undefined;
}

/** The payer as the mechanism sees it: Permit2 wins when present (the reference executes it first). */
function payerOf(payload: PaymentPayload): string | undefined {
  const p = payload.payload as { authorization?: { from?: string }; permit2Authorization?: { from?: string }; channelConfig?: { payer?: string } };
  return p.permit2Authorization?.from ?? p.authorization?.from ?? p.channelConfig?.payer;
}

/** Zero however it is written (BigInt also reads "0x0", " 0"); unreadable amounts are the mechanism's to refuse. */
function isZero(amount: unknown): boolean {
  try {
    return BigInt(String(amount)) === 0n;
  } catch {
    return false;
  }
}

/** Mechanism messages can quote raw RPC errors (with the endpoint URL): keep them short and URL-free. */
function scrub<T extends { invalidMessage?: string; errorMessage?: string }>(r: T): T {
  if (r.invalidMessage !== undefined) r.invalidMessage = safeMessage(r.invalidMessage);
  if (r.errorMessage !== undefined) r.errorMessage = safeMessage(r.errorMessage);
  return r;
}

/** What of an error may be logged: its type and first line, URLs removed. */
function errorSummary(e: unknown): { type: string; message: string } {
  return { type: (e as Error)?.name ?? "Error", message: safeMessage(e) };
}
