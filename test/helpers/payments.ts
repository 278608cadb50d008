// Builds signed x402 `exact` payments for tests, in either request shape, with any field overridable
// (so tests can produce expired, mis-addressed or tampered payments on purpose).
import { randomBytes } from "node:crypto";
import { privateKeyToAccount } from "viem/accounts";
import { toHex, type Address, type Hex } from "viem";
import { authorizationTypes, permit2WitnessTypes } from "@x402/evm";
import { EXACT_PERMIT2_PROXY_ADDRESS, PERMIT2_ADDRESS, type AssetInfo } from "../../services/x402/networks.ts";

export interface PaymentSpec {
  network: string;
  chainId: number;
  asset: AssetInfo;
  payerKey: Hex;
  payTo: Address;
  amount: bigint;
  /** Overrides of the signed authorization (applied before signing). */
  auth?: Partial<{ to: Address; value: bigint; validAfter: bigint; validBefore: bigint; nonce: Hex | bigint; spender: Address; token: Address; from: Address }>;
  /** Replace the signature after signing (tampering). */
  signature?: Hex;
}

const now = () => BigInt(Math.floor(Date.now() / 1000));

export async function signEip3009(spec: PaymentSpec) {
  const account = privateKeyToAccount(spec.payerKey);
  const message = {
    from: spec.auth?.from ?? account.address,
    to: spec.auth?.to ?? spec.payTo,
    value: spec.auth?.value ?? spec.amount,
    validAfter: spec.auth?.validAfter ?? now() - 60n,
    validBefore: spec.auth?.validBefore ?? now() + 300n,
    nonce: (spec.auth?.nonce as Hex | undefined) ?? toHex(randomBytes(32)),
  };
  const signature = await account.signTypedData({
    domain: { name: spec.asset.eip712!.name, version: spec.asset.eip712!.version, chainId: spec.chainId, verifyingContract: spec.asset.address },
    types: authorizationTypes,
    primaryType: "TransferWithAuthorization",
    message,
  });
  return {
    signature: spec.signature ?? signature,
    authorization: {
      from: message.from,
      to: message.to,
      value: message.value.toString(),
      validAfter: message.validAfter.toString(),
      validBefore: message.validBefore.toString(),
      nonce: message.nonce,
    },
  };
}

export async function signPermit2(spec: PaymentSpec) {
  const account = privateKeyToAccount(spec.payerKey);
  const message = {
    permitted: { token: spec.auth?.token ?? spec.asset.address, amount: spec.auth?.value ?? spec.amount },
    spender: spec.auth?.spender ?? EXACT_PERMIT2_PROXY_ADDRESS,
    nonce: (spec.auth?.nonce as bigint | undefined) ?? BigInt(toHex(randomBytes(16))),
    deadline: spec.auth?.validBefore ?? now() + 300n,
    witness: { to: spec.auth?.to ?? spec.payTo, validAfter: spec.auth?.validAfter ?? now() - 60n },
  };
  const signature = await account.signTypedData({
    domain: { name: "Permit2", chainId: spec.chainId, verifyingContract: PERMIT2_ADDRESS },
    types: permit2WitnessTypes,
    primaryType: "PermitWitnessTransferFrom",
    message,
  });
  return {
    signature: spec.signature ?? signature,
    permit2Authorization: {
      from: spec.auth?.from ?? account.address,
      permitted: { token: message.permitted.token, amount: message.permitted.amount.toString() },
      spender: message.spender,
      nonce: message.nonce.toString(),
      deadline: message.deadline.toString(),
      witness: { to: message.witness.to, validAfter: message.witness.validAfter.toString() },
    },
  };
}

/** The service contract's request shape (paymentPayload.scheme/network, maxAmountRequired, resource URL). */
export function serviceShape(spec: PaymentSpec, payload: object, scheme = "exact") {
  return {
    paymentPayload: { x402Version: 2, scheme, network: spec.network, payload },
    paymentRequirements: {
      scheme,
      network: spec.network,
      asset: spec.asset.address,
      payTo: spec.payTo,
      maxAmountRequired: spec.amount.toString(),
      resource: "https://api.example.com/weather",
      maxTimeoutSeconds: 60,
    },
  };
}

/** Standard x402 v2 shape (paymentPayload.accepted, amount, extra). */
export function standardShape(spec: PaymentSpec, payload: object, extra: Record<string, unknown> = {}) {
  const requirements = {
    scheme: "exact",
    network: spec.network,
    asset: spec.asset.address,
    payTo: spec.payTo,
    amount: spec.amount.toString(),
    maxTimeoutSeconds: 60,
    extra: { ...(spec.asset.eip712 ?? {}), ...extra },
  };
  return {
    x402Version: 2,
    paymentPayload: { x402Version: 2, resource: { url: "https://api.example.com/weather" }, accepted: requirements, payload },
    paymentRequirements: requirements,
  };
}

export async function postJson(url: string, body: unknown, init: { raw?: string; method?: string; headers?: Record<string, string> } = {}) {
  const res = await fetch(url, {
    method: init.method ?? "POST",
    headers: { "content-type": "application/json", ...init.headers },
    body: init.method === "GET" || init.method === "HEAD" ? undefined : (init.raw ?? JSON.stringify(body)),
  });
  const text = await res.text();
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch {
    json = undefined;
  }
  return { status: res.status, headers: res.headers, text, json: json as Record<string, unknown> };
}
