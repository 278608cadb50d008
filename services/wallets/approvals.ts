// Permit2 approval: the one transaction a wallet sends itself. Permit2 payments (exact on tokens
// without EIP-3009, and every upto payment) need the token's allowance to the canonical Permit2
// contract; the wallet signs `approve(Permit2, amount)` (default: unlimited, as Permit2 still needs a
// signature per transfer) and pays the gas from its native balance. The policy must allow the network
// and list the asset; the transaction is recorded like every other signature.
import { getAddress, isAddress, maxUint256, serializeSignature, type Address, type Hex } from "viem";
import { networkInfo, PERMIT2_ADDRESS, type Caip2 } from "../x402/networks.ts";
import type { ApprovalResult } from "./chain.ts";
import { WalletError } from "./errors.ts";
import { owned } from "./owned.ts";
import { signatureRecord, type Caller, type PaymentsDeps } from "./payments.ts";
import { allowsAsset } from "./policy.ts";
import type { SignatureOutcome, SignatureRecord } from "./store.ts";
import { unlockWallet } from "./unlock.ts";

export interface ApprovalRequest {
  network: Caip2;
  asset: string;
  amount?: string;
}

export function resolveAsset(network: Caip2, asset: string): Address {
  if (isAddress(asset, { strict: false })) return getAddress(asset);
  const match = networkInfo(network)?.assets.filter((a) => a.symbol.toLowerCase() === asset.toLowerCase()) ?? [];
  if (match.length !== 1) throw new WalletError("invalid_request", `asset: ${JSON.stringify(asset.slice(0, 64))} is neither an address nor a symbol we know on ${network}`);
  return match[0]!.address;
}

export async function approvePermit2(deps: PaymentsDeps, caller: Caller, walletId: string, req: ApprovalRequest): Promise<{ record: SignatureRecord; approval: ApprovalResult }> {
  const wallet = await owned(deps.store.walletWithKey(caller.platformId, walletId), walletId);
  if (!deps.chain?.has(req.network)) throw new WalletError("network_not_configured", `the wallet service has no RPC for ${req.network}`);
  const asset = resolveAsset(req.network, req.asset);
  const amount = req.amount !== undefined ? BigInt(req.amount) : maxUint256;
  const decision = allowsAsset(wallet.policy, req.network, asset, deps.now());
  if (!decision.ok) throw new WalletError(decision.code, decision.detail);

  const keys = await unlockWallet(deps.keyring, wallet);
  let signature: Hex | undefined;
  const what = { kind: "permit2_approval", scheme: null, network: req.network, asset, amount: amount.toString(), payTo: PERMIT2_ADDRESS, method: "transaction", resource: null, nonce: null, validBefore: null } as const;
  const record = (outcome: SignatureOutcome) => signatureRecord(caller, walletId, what, signature ?? "0x", deps.now(), outcome);
  const save = (r: SignatureRecord) => deps.store.withLockedWallet(caller.platformId, walletId, (tx) => deps.store.recordSignature(tx, r));
  try {
    const approval = await deps.chain.approvePermit2(req.network, asset, wallet.address, amount, (digest) => {
      const parts = keys.signTransaction(digest);
      signature = serializeSignature(parts);
      return parts;
    });
    const r = record({ status: approval.status === "success" ? 200 : 500, settled: approval.status === "success", transaction: approval.transaction });
    await save(r);
    return { record: r, approval };
  } catch (e) {
    // Signed but not confirmed (the RPC failed after sending): the signature is still on record.
    if (signature) await save(record({ settled: false, errorReason: e instanceof WalletError ? e.code : "error" })).catch(() => undefined);
    throw e;
  }
}
