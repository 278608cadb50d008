// The checks a FacilitatorNetwork must pass before anything is rolled out: its signer Secret exists
// and parses, its RPC URLs (and database URL) resolve, and every RPC answers eth_chainId with the
// chain of `network`. Unless the operator allows private RPC, an endpoint on a loopback, private,
// link-local or cluster-internal address is refused before any connection (RpcEndpointNotAllowed):
// whoever may create a FacilitatorNetwork must not make the operator probe its own network.
// Messages name Secrets by name/key and endpoints by host only: never a key, never a full URL.
import { privateKeyToAccount } from "viem/accounts";
import { parseSignerKeys } from "../services/facilitator/config.ts";
import { DestinationNotAllowed } from "../services/platform/egress.ts";
import { endpointName } from "../services/platform/logger.ts";
import type { FacilitatorNetwork } from "./api.ts";
import { chainIdOf } from "../services/x402/networks.ts";
import { secretsDigest, signerKeyName, type Observation } from "./builders.ts";

export interface SecretData {
  /** Values by key, decoded (base64 → UTF-8). */
  data: Record<string, string>;
}

export interface CheckDeps {
  /** Reads a Secret of the resource's namespace; undefined when it does not exist. */
  readSecret(namespace: string, name: string): Promise<SecretData | undefined>;
  /** Asks one RPC endpoint for its chain id; throws DestinationNotAllowed for a refused destination. */
  chainIdOf(url: string): Promise<number>;
}

export interface InputCheck {
  observation: Observation;
  /** Digest of the referenced secret values, for the pod template annotation. */
  secretsHash: string;
  /** The resolved inputs, when nothing blocks: for the chain checks only, held in memory, never written anywhere. */
  resolved?: ResolvedInputs;
}

/**
 * RPC URLs (they may embed API keys) and signer keys, as the pods will get them. Serialised or
 * inspected (JSON, logs), it shows nothing: only the chain checks read the fields.
 */
export class ResolvedInputs {
  constructor(
    readonly rpcUrls: string[],
    readonly signerKeys: `0x${string}`[],
  ) {}
  toJSON(): string {
    return "[resolved inputs]";
  }
  [Symbol.for("nodejs.util.inspect.custom")](): string {
    return "[resolved inputs]";
  }
}

class Blocked extends Error {
  constructor(
    readonly reason: NonNullable<Observation["blocker"]>["reason"],
    message: string,
  ) {
    super(message);
  }
}

/** Runs the checks in order and stops at the first blocker. */
export async function checkInputs(fn: FacilitatorNetwork, deps: CheckDeps): Promise<InputCheck> {
  const namespace = fn.metadata.namespace ?? "default";
  const secrets = new Map<string, Promise<SecretData | undefined>>();
  const read = (name: string) => {
    if (!secrets.has(name)) secrets.set(name, deps.readSecret(namespace, name));
    return secrets.get(name)!;
  };
  const hashed: { ref: string; value: string }[] = [];
  const observation: Observation = {};
  let resolved: InputCheck["resolved"];
  try {
    // 1. signer keys
    const ref = fn.spec.signerSecretRef;
    const key = signerKeyName(fn);
    const secret = await read(ref.name);
    if (!secret) throw new Blocked("SignerSecretNotFound", `signer Secret "${ref.name}" not found in namespace ${namespace}`);
    const text = secret.data[key];
    if (text === undefined) throw new Blocked("SignerSecretInvalid", `signer Secret "${ref.name}" has no key "${key}"`);
    let keys: `0x${string}`[];
    try {
      keys = parseSignerKeys(text);
    } catch (e) {
      // parseSignerKeys never echoes a line; its message names the line number only.
      throw new Blocked("SignerSecretInvalid", `signer Secret "${ref.name}" key "${key}": ${(e as Error).message}`);
    }
    if (keys.length === 0) throw new Blocked("SignerSecretInvalid", `signer Secret "${ref.name}" key "${key}" holds no keys`);
    observation.signers = keys.map((k) => privateKeyToAccount(k).address);
    hashed.push({ ref: `signer:${ref.name}/${key}`, value: text });

    // 2. RPC endpoints
    const endpoints: { label: string; url: string }[] = [];
    for (const endpoint of fn.spec.rpc) {
      if (endpoint.secretKeyRef) {
        const { name, key: urlKey } = endpoint.secretKeyRef;
        const label = `Secret ${name}/${urlKey}`;
        const s = await read(name);
        if (!s) throw new Blocked("RpcSecretNotFound", `RPC Secret "${name}" not found in namespace ${namespace}`);
        const value = s.data[urlKey]?.trim();
        if (value === undefined) throw new Blocked("RpcSecretNotFound", `RPC Secret "${name}" has no key "${urlKey}"`);
        if (!isHttpUrl(value)) throw new Blocked("RpcEndpointInvalid", `the value of ${label} is not an http(s) URL without commas or spaces`);
        endpoints.push({ label, url: value });
        hashed.push({ ref: `rpc:${name}/${urlKey}`, value });
      } else {
        if (!isHttpUrl(endpoint.url)) throw new Blocked("RpcEndpointInvalid", `RPC URL of ${endpointName(endpoint.url)} is not an http(s) URL`);
        endpoints.push({ label: endpointName(endpoint.url), url: endpoint.url });
      }
    }

    // 3. the shared database, when configured
    if (fn.spec.database) {
      const { name, key: urlKey } = fn.spec.database.urlSecretRef;
      const s = await read(name);
      const value = s?.data[urlKey]?.trim();
      if (value === undefined) throw new Blocked("DatabaseSecretNotFound", `database Secret "${name}" ${s ? `has no key "${urlKey}"` : `not found in namespace ${namespace}`}`);
      if (!/^postgres(ql)?:\/\/\S+$/.test(value)) throw new Blocked("DatabaseSecretInvalid", `the value of Secret ${name}/${urlKey} is not a postgres:// URL`);
      hashed.push({ ref: `database:${name}/${urlKey}`, value });
    }
    // …and the screening service's URL (it may carry a token, so it lives in a Secret)
    const screening = fn.spec.screening?.service;
    if (screening) {
      const { name, key: urlKey } = screening.urlSecretRef;
      const s = await read(name);
      const value = s?.data[urlKey]?.trim();
      if (value === undefined) throw new Blocked("ScreeningSecretNotFound", `screening Secret "${name}" ${s ? `has no key "${urlKey}"` : `not found in namespace ${namespace}`}`);
      if (!isHttpUrl(value)) throw new Blocked("ScreeningSecretInvalid", `the value of Secret ${name}/${urlKey} is not an http(s) URL`);
      hashed.push({ ref: `screening:${name}/${urlKey}`, value });
    }

    // 4. every endpoint must be on the chain of `network`
    const expected = chainIdOf(fn.spec.network);
    const answers = await Promise.all(
      endpoints.map(async (e): Promise<{ label: string; url: string; chainId?: number; error?: string; refused?: boolean }> => {
        try {
          return { ...e, chainId: await deps.chainIdOf(e.url) };
        } catch (err) {
          return { ...e, error: (err as Error).message, refused: err instanceof DestinationNotAllowed };
        }
      }),
    );
    const refused = answers.find((a) => a.refused);
    if (refused) {
      throw new Blocked(
        "RpcEndpointNotAllowed",
        `RPC ${refused.label} is a loopback, private or cluster-internal address; the operator contacts public endpoints only unless it allows private RPC (chart value operator.allowPrivateRpc)`,
      );
    }
    const wrong = answers.find((a) => a.chainId !== undefined && a.chainId !== expected);
    if (wrong) {
      observation.chainId = wrong.chainId;
      throw new Blocked("ChainIdMismatch", `RPC ${wrong.label} reports chain id ${wrong.chainId}, but ${fn.spec.network} needs ${expected}`);
    }
    const reached = answers.filter((a) => a.chainId !== undefined);
    if (reached.length === 0) {
      // Not a blocker: an RPC outage must not tear a serving network out of the routing table;
      // the pods' readiness probes check their RPC themselves.
      observation.warning = { reason: "RpcUnreachable", message: `no RPC endpoint answered eth_chainId: ${answers.map((a) => `${a.label} (${a.error})`).join("; ")}` };
    } else {
      observation.chainId = expected;
    }
    resolved = new ResolvedInputs(
      endpoints.map((e) => e.url),
      keys,
    );
  } catch (e) {
    if (!(e instanceof Blocked)) throw e;
    observation.blocker = { reason: e.reason, message: e.message };
  }
  return { observation, secretsHash: secretsDigest(hashed), resolved };
}

function isHttpUrl(value: string): boolean {
  if (/[\s,]/.test(value)) return false;
  try {
    const u = new URL(value);
    return u.protocol === "http:" || u.protocol === "https:";
  } catch {
    return false;
  }
}

/**
 * eth_chainId over plain JSON-RPC. Errors carry a short code, never the URL (it may embed a key).
 */
export async function fetchChainId(url: string, timeoutMs = 5000, fetchFn: typeof fetch = fetch): Promise<number> {
  let res: Response;
  try {
    res = await fetchFn(url, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ jsonrpc: "2.0", id: 1, method: "eth_chainId", params: [] }),
      signal: AbortSignal.timeout(timeoutMs),
    });
  } catch (e) {
    if (e instanceof DestinationNotAllowed) throw e;
    const err = e as Error & { cause?: { code?: string } };
    throw new Error(err.name === "TimeoutError" ? `timeout after ${timeoutMs} ms` : (err.cause?.code ?? "connection failed"));
  }
  if (!res.ok) {
    await res.body?.cancel();
    throw new Error(`HTTP ${res.status}`);
  }
  let body: { result?: unknown };
  try {
    body = (await res.json()) as { result?: unknown };
  } catch {
    throw new Error("not a JSON-RPC answer");
  }
  if (typeof body.result !== "string" || !/^0x[0-9a-fA-F]+$/.test(body.result)) throw new Error("no chain id in the answer");
  return Number.parseInt(body.result, 16);
}
