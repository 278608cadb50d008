// Permit2 approval: the one transaction a wallet sends itself. Permit2 payments (exact on tokens
// without EIP-3009, and every upto payment) need the token's allowance to the canonical Permit2
// contract; the wallet signs `approve(Permit2, amount)` (default: unlimited, as Permit2 still needs a
// signature per transfer) and pays the gas from its native balance. The policy must allow the network
// and list the asset; the transaction is recorded like every other signature.
import { randomBytes } from "node:crypto";
import { getAddress, isAddress, keccak256, maxUint256, serializeSignature, type Address, type Hex } from "viem";
import { networkInfo, PERMIT2_ADDRESS, type Caip2 } from "../x402/networks.ts";
import type { ApprovalResult } from "./chain.ts";
import { WalletError } from "./errors.ts";
import type { Caller, PaymentsDeps } from "./payments.ts";
import { evaluate } from "./policy.ts";
import type { SignatureRecord } from "./store.ts";
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
  const wallet = await deps.store.walletWithKey(caller.platformId, walletId);
  if (!wallet) throw new WalletError("not_found", `no wallet ${walletId}`);
  if (!deps.chain?.has(req.network)) throw new WalletError("network_not_configured", `the wallet service has no RPC for ${req.network}`);
  const asset = resolveAsset(req.network, req.asset);
  const amount = req.amount !== undefined ? BigInt(req.amount) : maxUint256;
  // The policy's gate for this asset: not expired, network allowed, asset listed (no recipient, host or cap applies).
  const decision = evaluate(
    { ...wallet.policy, payTo: undefined, hosts: undefined, schemes: undefined },
    { scheme: "exact", network: req.network, asset, amount: 0n, payTo: PERMIT2_ADDRESS, method: "permit2" },
    { hosts: [], nowMs: deps.now(), spentToday: () => 0n },
  );
  if (!decision.ok) throw new WalletError(decision.code, decision.detail);

  const keys = await unlockWallet(deps.keyring, wallet);
  let signature: Hex | undefined;
  const record = (outcome: SignatureRecord["outcome"]): SignatureRecord => ({
    id: `sig_${randomBytes(12).toString("hex")}`,
    walletId,
    apiKeyId: caller.apiKeyId,
    kind: "permit2_approval",
    scheme: null,
    network: req.network,
    asset,
    amount: amount.toString(),
    payTo: PERMIT2_ADDRESS,
    method: "transaction",
    resource: null,
    nonce: null,
    validBefore: null,
    signatureHash: keccak256(signature ?? "0x"),
    createdAt: new Date(deps.now()).toISOString(),
    outcome,
  });
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
