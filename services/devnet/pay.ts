// A ready-to-run example payment against a running devnet: the reference @x402/evm client signs
// an `exact` payment from a devnet payer; we verify and settle it through the router.
import { readFile } from "node:fs/promises";
import { ExactEvmScheme } from "@x402/evm/exact/client";
import type { PaymentRequirements } from "@x402/core/types";
import { declareDiscoveryExtension } from "@x402/extensions/bazaar";
import { privateKeyToAccount } from "viem/accounts";
import type { DevnetInfo } from "./devnet.ts";

export interface PayOptions {
  infoPath: string;
  network: string;
  amount: string;
  method?: "eip3009" | "permit2";
  /** Print the signed request body (service-contract shape) instead of sending it. */
  bodyOnly?: boolean;
  /**
   * Declare the resource for the router's discovery catalog (the bazaar extension, as a resource
   * server's 402 answer carries it); the body then has the standard v2 shape, which carries it.
   */
  bazaar?: boolean;
  /** The resource paid for (default https://api.example.com/premium). */
  resource?: string;
  /** Sent as Authorization: Bearer (a devnet started with --api-keys requires one). */
  apiKey?: string;
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
  const resource = opts.resource ?? "https://api.example.com/premium";
  // The service contract's request shape; the standard v2 shape (paymentPayload.accepted) works too.
  const body = opts.bazaar ? declaredBody(requirements, signed.payload, resource) : {
    paymentPayload: { x402Version: 2, scheme: "exact", network: net.network, payload: signed.payload },
    paymentRequirements: {
      scheme: "exact",
      network: net.network,
      asset: asset.address,
      payTo: requirements.payTo,
      maxAmountRequired: opts.amount,
      resource,
      maxTimeoutSeconds: 60,
    },
  };
  if (opts.bodyOnly) {
    print(JSON.stringify(body, null, 2));
    return { verify: undefined, settle: undefined };
  }
  print(`paying ${opts.amount} atomic ${asset.symbol} on ${net.network} from ${payer.address} to ${requirements.payTo} (${method})`);
  const call = async (action: string) => {
    const res = await fetch(`${info.routerUrl}/${action}`, { method: "POST", headers: { "content-type": "application/json", ...(opts.apiKey ? { authorization: `Bearer ${opts.apiKey}` } : {}) }, body: JSON.stringify(body) });
    const json = await res.json();
    print(`POST ${info.routerUrl}/${action} -> ${res.status} ${JSON.stringify(json)}`);
    // The catalog's outcome for a declaration (EXTENSION-RESPONSES): catalogued, or why not.
    const outcome = res.headers.get("extension-responses");
    if (outcome) print(`extension responses: ${Buffer.from(outcome, "base64").toString("utf8")}`);
    return json;
  };
  const verify = await call("verify");
  const settle = await call("settle");
  return { verify, settle };
}

/** A payment declaring its resource (bazaar), in the standard v2 shape: what a reference client sends after a resource server's 402. */
function declaredBody(requirements: PaymentRequirements, payload: Record<string, unknown>, url: string) {
  const declared = declareDiscoveryExtension({ input: { q: "example" }, inputSchema: { properties: { q: { type: "string" } } }, output: { example: { answer: "42" } } });
  // The resource server's extension adds the route's method before the 402 goes out.
  const bazaar = declared.bazaar!;
  const extensions = { bazaar: { ...bazaar, info: { ...bazaar.info, input: { ...bazaar.info.input, method: "GET" } } } };
  return {
    x402Version: 2,
    paymentPayload: { x402Version: 2, resource: { url, description: "An example paid API on the devnet", mimeType: "application/json" }, accepted: requirements, payload, extensions },
    paymentRequirements: requirements,
  };
}
