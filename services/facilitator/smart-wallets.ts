// Smart-wallet payers (ERC-1271 and ERC-6492), the payer kind the reference mechanisms handle only
// in part: they trust a wrapped EIP-3009 signature at /verify and deploy the wallet at /settle
// before the token checks it, and they neither simulate nor deploy a counterfactual Permit2 payer.
// Everything this facilitator adds for them lives here: which payment needs what before the
// mechanism may run (a check of the wrapped signature, a verification as if the wallet existed, the
// deployment), so the facilitator's own steps stay the protocol's.
import { x402Facilitator } from "@x402/core/facilitator";
import type { PaymentPayload, PaymentRequirements, SettleResponse, VerifyResponse } from "@x402/core/types";
import { authorizationTypes } from "@x402/evm";
import { AsyncLocalStorage } from "node:async_hooks";
import { getAddress, isErc6492Signature, parseErc6492Signature, type Abi, type Address, type Hex } from "viem";
import { simulateBlocks } from "viem/actions";
import type { ChainClient } from "./chain.ts";
import type { OutboxSigner } from "./settlement/outbox-signer.ts";

/** Why a payment is refused: a reason code and one line. */
export interface Refusal {
  reason: string;
  message: string;
}

/** A counterfactual wallet's deployment: the allowed factory and its calldata (from the ERC-6492 wrapper). */
interface Deployment {
  factory: Address;
  data: Hex;
  /** The wallet it deploys (the payment's payer). */
  payer: Address;
}

/** What a payment's payer kind needs around the mechanism. */
export interface PayerSteps {
  /** A forged or disallowed wallet: refused before the mechanism runs (nothing is sent). */
  refusal?: Refusal;
  /** The mechanism's verification, as this payer needs it (a counterfactual wallet simulated as deployed). */
  verify(): Promise<VerifyResponse>;
  /**
   * What must happen before the mechanism settles: a counterfactual wallet verified as if it existed,
   * then deployed. An answer ends the settlement there (refused, or upto's charge of 0).
   */
  beforeSettle(): Promise<SettleResponse | undefined>;
}

export interface SmartWalletOptions {
  core: x402Facilitator;
  /** The signer the mechanisms were registered with (deployments are sent through it). */
  signer: OutboxSigner;
  chain: ChainClient;
  network: string;
  /** ERC-6492 factories a counterfactual payer's wallet may be deployed through. */
  factories: readonly Address[];
}

/** While set, every read of the mechanisms runs after this deployment, in one simulated block. */
const deployedFor = new AsyncLocalStorage<Deployment>();

export function createSmartWalletPayers(opts: SmartWalletOptions) {
  const { core, signer } = opts;
  const payerOf = (payload: PaymentPayload) => (payload.payload as { permit2Authorization?: { from?: string }; authorization?: { from?: string } }).permit2Authorization?.from ?? (payload.payload as { authorization?: { from?: string } }).authorization?.from;
  const refused = (payload: PaymentPayload, requirements: PaymentRequirements, reason: string, message?: string) =>
    ({ success: false, errorReason: reason, ...(message ? { errorMessage: message } : {}), transaction: "", network: requirements.network, payer: payerOf(payload) }) as SettleResponse;

  /**
   * An ERC-6492 EIP-3009 signature of a wallet not yet deployed: the reference mechanism trusts it at
   * /verify and deploys the wallet at /settle before the token checks it, so a forged one would cost
   * us a deployment. It is checked first, as the token will check it (viem's ERC-6492 validator, one
   * eth_call that deploys the wallet only inside the call).
   */
  async function counterfactualRefusal(payload: PaymentPayload, requirements: PaymentRequirements): Promise<Refusal | undefined> {
    const p = payload.payload as { signature?: string; authorization?: { from: Address; to: Address; value: string; validAfter: string; validBefore: string; nonce: Hex } };
    if (requirements.scheme !== "exact" || !p.authorization || !isErc6492Eip3009(payload)) return undefined;
    const a = p.authorization;
    const valid = await signer.verifyTypedData({
      address: getAddress(a.from),
      domain: { name: String(requirements.extra.name), version: String(requirements.extra.version), chainId: Number(opts.network.slice("eip155:".length)), verifyingContract: getAddress(requirements.asset) },
      types: authorizationTypes,
      primaryType: "TransferWithAuthorization",
      message: { from: getAddress(a.from), to: getAddress(a.to), value: BigInt(a.value), validAfter: BigInt(a.validAfter), validBefore: BigInt(a.validBefore), nonce: a.nonce },
      signature: p.signature as Hex,
    } as Parameters<OutboxSigner["verifyTypedData"]>[0]);
    return valid ? undefined : { reason: "invalid_exact_evm_signature", message: "the ERC-6492 signature does not verify for the counterfactual wallet (checked before any deployment)" };
  }

  /**
   * A Permit2 payment (exact or upto) from a wallet not deployed yet: its factory must be allowed; its
   * deployment is simulated before every read of the verification (eth_simulateV1), so every
   * reference check runs as if the wallet existed, and at /settle it is deployed only once that
   * verification passed.
   */
  async function undeployedPermit2Payer(payload: PaymentPayload): Promise<Deployment | { refusal: Refusal } | undefined> {
    const p = payload.payload as { signature?: unknown; permit2Authorization?: { from?: unknown } };
    const from = p.permit2Authorization?.from;
    if (typeof from !== "string" || !/^0x[0-9a-fA-F]{40}$/.test(from) || !isErc6492(p.signature)) return undefined;
    let wrapped: { address?: Address; data?: Hex };
    try {
      wrapped = parseErc6492Signature(p.signature as Hex);
    } catch {
      return { refusal: { reason: "invalid_permit2_signature", message: "the ERC-6492 signature cannot be decoded" } };
    }
    if (!wrapped.address || !wrapped.data) return undefined;
    const code = await signer.getCode({ address: getAddress(from) });
    if (code && code !== "0x") return undefined; // deployed: the reference checks the inner signature (ERC-1271)
    if (!opts.factories.some((f) => f.toLowerCase() === wrapped.address!.toLowerCase())) {
      return { refusal: { reason: "eip6492_factory_not_allowed", message: `factory ${wrapped.address} is not on this facilitator's ERC-6492 allow-list` } };
    }
    return { factory: getAddress(wrapped.address), data: wrapped.data, payer: getAddress(from) };
  }

  /** The reference verification, as if an undeployed payer's wallet were deployed. */
  const verifyAs = (deployment: Deployment | undefined, payload: PaymentPayload, requirements: PaymentRequirements) =>
    deployment ? deployedFor.run(deployment, () => core.verify(payload, requirements)) : core.verify(payload, requirements);

  /** Sends the deployment and waits for it: true once the wallet exists. */
  async function deploy(deployment: Deployment): Promise<boolean> {
    const hash = await signer.sendTransaction({ to: deployment.factory, data: deployment.data });
    const deployed = (await signer.waitForTransactionReceipt({ hash })).status === "success";
    signer.forgetCode(deployment.payer);
    return deployed;
  }

  return {
    /** What this payment's payer kind needs around the mechanism (nothing beyond it for a plain account). */
    async stepsFor(payload: PaymentPayload, requirements: PaymentRequirements): Promise<PayerSteps> {
      const undeployed = requirements.scheme === "batch-settlement" ? undefined : await undeployedPermit2Payer(payload);
      const refusal = (undeployed && "refusal" in undeployed ? undeployed.refusal : undefined) ?? (await counterfactualRefusal(payload, requirements));
      const deployment = undeployed && !("refusal" in undeployed) ? undeployed : undefined;
      return {
        refusal,
        verify: () => verifyAs(deployment, payload, requirements),
        async beforeSettle() {
          if (requirements.scheme === "exact" && !deployment && isErc6492Eip3009(payload)) {
            // The reference EIP-3009 settle verifies without simulating, then deploys a counterfactual
            // wallet: an unpayable payment (no balance, nonce used) from a fresh wallet would cost us a
            // deployment every time. Verified whole first, as at /verify (deployment and transfer simulated).
            const check = await core.verify(payload, requirements);
            return check.isValid ? undefined : refused(payload, requirements, check.invalidReason ?? "invalid_payload", check.invalidMessage);
          }
          if (!deployment) return undefined;
          // Deployed only for a payment that verifies as if the wallet existed: a forged one costs nothing.
          // (upto is verified against its signed ceiling, as the reference settle does; the charge is checked by the settlement.)
          const permitted = (payload.payload as { permit2Authorization?: { permitted?: { amount?: string } } }).permit2Authorization?.permitted?.amount;
          const check = await verifyAs(deployment, payload, requirements.scheme === "upto" && permitted ? { ...requirements, amount: permitted } : requirements);
          if (!check.isValid) return refused(payload, requirements, check.invalidReason ?? "invalid_payload", check.invalidMessage);
          if (requirements.scheme === "upto" && permitted) {
            // The charge too, before the deployment: above the ceiling the reference refuses and at 0 it
            // sends nothing, so neither may cost us a deployment (the reference's answers, in its order).
            const charge = BigInt(requirements.amount);
            if (charge > BigInt(permitted)) return refused(payload, requirements, "invalid_upto_evm_payload_settlement_exceeds_amount");
            if (charge === 0n) return { success: true, transaction: "", network: requirements.network, payer: payerOf(payload), amount: "0" } as SettleResponse;
          }
          return (await deploy(deployment)) ? undefined : refused(payload, requirements, "smart_wallet_deployment_failed", "the payer's wallet could not be deployed");
        },
      };
    },
  };
}

export type SmartWalletPayers = ReturnType<typeof createSmartWalletPayers>;

const isErc6492 = (signature: unknown): boolean => typeof signature === "string" && /^0x[0-9a-fA-F]*$/.test(signature) && isErc6492Signature(signature as Hex);

/** An EIP-3009 payload whose signature is ERC-6492-wrapped (a payer wallet the reference may deploy at /settle). */
function isErc6492Eip3009(payload: PaymentPayload): boolean {
  const p = payload.payload as { signature?: unknown; authorization?: unknown; permit2Authorization?: unknown };
  return !!p.authorization && !p.permit2Authorization && isErc6492(p.signature);
}

/**
 * The signer whose reads see a counterfactual wallet as deployed (inside a verification of
 * stepsFor): the deployment and the read are simulated together with eth_simulateV1, nothing is
 * sent. As an ERC-6492 validator does, a wallet is asked about the inner signature, not the wrapper.
 */
export function simulatingDeployment(signer: OutboxSigner, chain: ChainClient): OutboxSigner {
  return {
    ...signer,
    async getCode(args) {
      const deployment = deployedFor.getStore();
      // Any code: the mechanisms only ask whether the payer is a contract (then they ask it, below).
      if (deployment && getAddress(args.address) === deployment.payer) return "0xfe";
      return signer.getCode(args);
    },
    async readContract(args) {
      const a = { ...(args as unknown as { address: Address; abi: Abi; functionName: string; args?: readonly unknown[]; account?: Address }) };
      // ERC-6492: a wallet is asked about the signature inside the wrapper, deployed or not (the
      // reference mechanisms pass the wrapper to isValidSignature once the wallet exists).
      if (a.functionName === "isValidSignature" && typeof a.args?.[1] === "string" && isErc6492Signature(a.args[1] as Hex)) {
        a.args = [a.args[0], parseErc6492Signature(a.args[1] as Hex).signature];
      }
      const deployment = deployedFor.getStore();
      if (!deployment) return signer.readContract(a as unknown as typeof args);
      const [block] = await simulateBlocks(chain.client, {
        blocks: [
          {
            calls: [
              { account: signer.getAddresses()[0], to: deployment.factory, data: deployment.data },
              { account: a.account, to: a.address, abi: a.abi, functionName: a.functionName, args: a.args ?? [] },
            ] as never,
          },
        ],
      });
      const [deployed, call] = block!.calls as unknown as { status: string; result?: unknown; error?: Error }[];
      if (deployed?.status !== "success") throw new Error("the payer's wallet deployment fails when simulated");
      if (call?.status !== "success") throw call?.error ?? new Error("the call reverts after the wallet's deployment");
      return call.result;
    },
  };
}
