// The doctor's chain checks for each FacilitatorNetwork, reported as its ChainChecked condition:
// the same checks as `x402-fleet doctor` (chain id and head of every endpoint, contract code,
// asset decimals and EIP-712 domains, fee floor, signer balances and nonce gaps), run by the
// operator with the resource's resolved inputs. They run off the reconcile pass (a slow RPC must
// not hold a worker) and at most once per interval per input state; when one finishes, the
// resource is queued again so its status shows the result. Informational: a failed check never
// blocks a rollout or takes a network out of the routing table (readiness does that).
import { resolveFacilitatorConfig } from "../services/facilitator/config.ts";
import { runDoctor, type DoctorReport } from "../services/facilitator/doctor.ts";
import type { Logger } from "../services/platform/logger.ts";
import { keyOf, type FacilitatorNetwork } from "./api.ts";
import type { InputCheck } from "./checks.ts";

export interface ChainCheckResult {
  ok: boolean;
  message: string;
}

export interface ChainChecker {
  /**
   * The latest result for these inputs, or undefined while none exists for them yet (a run is then
   * started, and `onDone` queues the resource when it ends).
   */
  resultFor(fn: FacilitatorNetwork, inputs: Required<Pick<InputCheck, "resolved">> & Pick<InputCheck, "secretsHash">): ChainCheckResult | undefined;
  /** Forget a resource (deleted). */
  forget(fn: FacilitatorNetwork): void;
}

export interface ChainCheckerOptions {
  /** Queue the resource again: its result is ready. */
  onDone(key: string): void;
  logger: Logger;
  /** How long a result stands before the checks run again for unchanged inputs (balances drain). */
  intervalMs?: number;
  rpcTimeoutMs?: number;
  /** How the checks reach the RPC endpoints (the operator's egress guard). */
  fetchFn?: typeof fetch;
  clock?: () => number;
  /** The checks themselves (default: the doctor's). */
  run?: (fn: FacilitatorNetwork, resolved: NonNullable<InputCheck["resolved"]>) => Promise<DoctorReport>;
}

/** A condition message stays readable in `kubectl describe`. */
const MAX_MESSAGE = 1024;

export function createChainChecker(opts: ChainCheckerOptions): ChainChecker {
  const interval = opts.intervalMs ?? 10 * 60_000;
  const clock = opts.clock ?? Date.now;
  const run = opts.run ?? ((fn, resolved) => runDoctor({ config: configOf(fn, resolved), rpcTimeoutMs: opts.rpcTimeoutMs ?? 5000, fetchFn: opts.fetchFn }));
  const entries = new Map<string, { fingerprint: string; at: number; result?: ChainCheckResult; running: boolean }>();

  function start(fn: FacilitatorNetwork, resolved: NonNullable<InputCheck["resolved"]>, fingerprint: string) {
    const uid = fn.metadata.uid!;
    const key = keyOf(fn.metadata.namespace!, fn.metadata.name);
    const entry = entries.get(uid) ?? { fingerprint, at: 0, running: false };
    entry.running = true;
    entries.set(uid, entry);
    run(fn, resolved)
      .then((report) => summarise(report))
      // The report's own messages name endpoints by host; an error here could carry a URL: say only its kind.
      .catch((e: unknown): ChainCheckResult => ({ ok: false, message: `the chain checks could not run (${(e as Error).name})` }))
      .then((result) => {
        const current = entries.get(uid);
        if (!current) return; // forgotten meanwhile
        Object.assign(current, { fingerprint, at: clock(), result, running: false });
        opts.logger.info({ facilitatorNetwork: key, ok: result.ok }, "chain checks done");
        opts.onDone(key);
      });
  }

  return {
    resultFor(fn, inputs) {
      const fingerprint = `${fn.metadata.generation ?? 0}/${inputs.secretsHash}`;
      const entry = entries.get(fn.metadata.uid!);
      const fresh = entry?.result && entry.fingerprint === fingerprint && clock() - entry.at < interval;
      if (!fresh && !entry?.running) start(fn, inputs.resolved, fingerprint);
      return entry?.result && entry.fingerprint === fingerprint ? entry.result : undefined;
    },
    forget(fn) {
      entries.delete(fn.metadata.uid!);
    },
  };
}

/** The facilitator configuration the pods will run with, as far as the checks need it. */
function configOf(fn: FacilitatorNetwork, resolved: NonNullable<InputCheck["resolved"]>) {
  const s = fn.spec;
  return resolveFacilitatorConfig({
    network: s.network,
    rpcUrls: resolved.rpcUrls,
    signerKeys: resolved.signerKeys,
    schemes: s.schemes,
    allowedAssets: s.assets?.length ? s.assets : undefined,
    confirmations: s.settlement?.confirmations,
    maxFeePerGasWei: s.settlement?.maxFeePerGasWei,
  });
}

function summarise(report: DoctorReport): ChainCheckResult {
  const problems = report.findings.filter((f) => !f.ok);
  const message = report.ok
    ? `${report.findings.length} checks passed (${[...new Set(report.findings.map((f) => f.check))].join(", ")})`
    : `${problems.length} problem(s): ${problems.map((f) => `${f.check}: ${f.message}`).join("; ")}`;
  return { ok: report.ok, message: message.length > MAX_MESSAGE ? `${message.slice(0, MAX_MESSAGE - 1)}…` : message };
}
