// A ready-to-run example payment against a running devnet: the reference @x402/evm client signs
// an `exact` payment from a devnet payer; we verify and settle it through the router.
import { readFile } from "node:fs/promises";
import { ExactEvmScheme } from "@x402/evm/exact/client";
import type { PaymentRequirements } from "@x402/core/types";
import { privateKeyToAccount } from "viem/accounts";
import type { DevnetInfo } from "./devnet.ts";

export interface PayOptions {
  infoPath: string;
  network: string;
  amount: string;
  method?: "eip3009" | "permit2";
  /** Print the signed request body (service-contract shape) instead of sending it. */
  bodyOnly?: boolean;
  print?: (line: string) => void;
}

export async function payOnDevnet(opts: PayOptions): Promise<{ verify: unknown; settle: unknown }> {
  const print = opts.print ?? ((l: string) => console.log(l));
  if (!/^\d+$/.test(opts.amount)) throw new Error(`pay: --amount must be a whole number of the token's atomic units (10000 is 0.01 USDC), got ${JSON.stringify(opts.amount)}`);
  const info = JSON.parse(await readFile(opts.infoPath, "utf8")) as DevnetInfo;
  const net = info.networks.find((n) => n.network === opts.network);
  if (!net) throw new Error(`the devnet does not run ${opts.network}; it runs ${info.networks.map((n) => n.network).join(", ")}`);
  const method = opts.method ?? (net.assets.some((a) => a.transferMethods.includes("eip3009")) ? "eip3009" : "permit2");
  const asset = net.assets.find((a) => a.transferMethods.includes(method));
  if (!asset) throw new Error(`no ${method} asset on ${opts.network}`);
  const payer = info.payers.find((p) => p.permit2Approved)!;
  const requirements: PaymentRequirements = {
    scheme: "exact",
    network: net.network,
    asset: asset.address,
    amount: opts.amount,
    payTo: info.receivers[0]!.address,
    maxTimeoutSeconds: 60,
    extra: { ...(asset.eip712 ?? {}), ...(method === "permit2" ? { assetTransferMethod: "permit2" } : {}) },
  };
  const client = new ExactEvmScheme(privateKeyToAccount(payer.privateKey));
  const signed = await client.createPaymentPayload(2, requirements);
  // The service contract's request shape; the standard v2 shape (paymentPayload.accepted) works too.
  const body = {
    paymentPayload: { x402Version: 2, scheme: "exact", network: net.network, payload: signed.payload },
    paymentRequirements: {
      scheme: "exact",
      network: net.network,
      asset: asset.address,
      payTo: requirements.payTo,
      maxAmountRequired: opts.amount,
      resource: "https://api.example.com/premium",
      maxTimeoutSeconds: 60,
    },
  };
  if (opts.bodyOnly) {
    print(JSON.stringify(body, null, 2));
    return { verify: undefined, settle: undefined };
  }
  print(`paying ${opts.amount} atomic ${asset.symbol} on ${net.network} from ${payer.address} to ${requirements.payTo} (${method})`);
  const call = async (action: string) => {
    const res = await fetch(`${info.routerUrl}/${action}`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
    const json = await res.json();
    print(`POST ${info.routerUrl}/${action} -> ${res.status} ${JSON.stringify(json)}`);
    return json;
  };
  const verify = await call("verify");
  const settle = await call("settle");
  return { verify, settle };
}
