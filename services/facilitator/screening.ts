// Screening: a deny-list of payer and payee addresses, checked at /verify and /settle before any
// RPC call, so a denied payment is refused with a clear reason and nothing is ever sent for it.
// The list is a file (a mounted ConfigMap in a cluster): one 0x address a line, `#` comments. It is
// re-read when it changes, without a restart; a file that becomes unreadable or invalid keeps the
// last good list (logged), so an editing mistake never silently opens the gate.
import { readFileSync, unwatchFile, watchFile } from "node:fs";
import { getAddress } from "viem";
import type { Logger } from "../platform/logger.ts";

export const PAYER_DENIED = "payer_denied";
export const PAYEE_DENIED = "payee_denied";

export type Refusal = { reason: typeof PAYER_DENIED | typeof PAYEE_DENIED; message: string };

/** What a screening service is told about a payment. */
export interface ScreenedPayment {
  network: string;
  scheme: string;
  asset: string;
  amount: string;
  payer: string | undefined;
  payee: string;
  step: "verify" | "settle";
}

export interface Screening {
  /** Why this payment is refused, or undefined. */
  check(payer: string | undefined, payee: string): Refusal | undefined;
  size(): number;
  close(): void;
}

/** The addresses of a deny-list file's text; throws on a line that is not an address. */
export function parseDenyList(text: string): Set<string> {
  const out = new Set<string>();
  text.split("\n").forEach((raw, i) => {
    const line = raw.replace(/#.*$/, "").trim();
    if (!line) return;
    if (!/^0x[0-9a-fA-F]{40}$/.test(line)) throw new Error(`deny-list line ${i + 1} is not a 0x address`);
    out.add(getAddress(line));
  });
  return out;
}

export function watchDenyList(path: string, logger: Logger, pollMs = 1000): Screening {
  let denied = parseDenyList(readFileSync(path, "utf8")); // at start, a bad file is fatal
  logger.info({ addresses: denied.size }, "deny-list loaded");
  const reload = () => {
    try {
      denied = parseDenyList(readFileSync(path, "utf8"));
      logger.info({ addresses: denied.size }, "deny-list reloaded");
    } catch (e) {
      logger.error({ err: { message: (e as Error).message } }, "deny-list not reloaded; the last good list stays in force");
    }
  };
  // Polling, not inotify: a ConfigMap volume swaps a symlink, which watch() does not follow.
  watchFile(path, { interval: pollMs, persistent: false }, reload);
  const normal = (a: string | undefined) => (a && /^0x[0-9a-fA-F]{40}$/.test(a) ? getAddress(a) : undefined);
  return {
    check(payer, payee) {
      const p = normal(payer);
      if (p && denied.has(p)) return { reason: PAYER_DENIED, message: `the payer ${p} is on this facilitator's deny-list` };
      const r = normal(payee);
      if (r && denied.has(r)) return { reason: PAYEE_DENIED, message: `the payee ${r} is on this facilitator's deny-list` };
      return undefined;
    },
    size: () => denied.size,
    close: () => unwatchFile(path, reload),
  };
}
