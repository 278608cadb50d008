// Structured JSON logs (pino). Secrets never reach a log line: keys are redacted by path,
// and RPC URLs are reduced to their host before they are logged anywhere.
import { pino, type Logger } from "pino";

export type { Logger };

const REDACT = [
  "privateKey",
  "*.privateKey",
  "signerKeys",
  "*.signerKeys",
  "mnemonic",
  "*.mnemonic",
  "rpcUrls",
  "*.rpcUrls",
  "req.headers.authorization",
  "req.headers.cookie",
  'req.headers["x-api-key"]',
];

export function createLogger(service: string, level = process.env.LOG_LEVEL ?? "info"): Logger {
  return pino({ name: service, level, redact: { paths: REDACT, censor: "[redacted]" }, base: { service } });
}

/** A name for an RPC endpoint that is safe to log and to use as a metric label: its host only. */
export function endpointName(url: string): string {
  try {
    const u = new URL(url);
    return u.port ? `${u.hostname}:${u.port}` : u.hostname;
  } catch {
    return "invalid-url";
  }
}

/**
 * The one way an error (or a node's text) becomes words for a log line, an answer or a stored row:
 * its first line, without URLs (an RPC or webhook URL may embed an API key) or calldata, bounded.
 */
export function safeMessage(e: unknown, max = 300): string {
  const text = typeof e === "string" ? e : String((e as Error)?.message ?? e);
  return (text.split("\n")[0] ?? "")
    .replace(/https?:\/\/\S+/g, "<rpc>")
    .replace(/0x[0-9a-fA-F]{65,}/g, "0x…")
    // Control characters (a revert reason is the contract's bytes: NUL cannot be stored as text, and none belongs in a line).
    // eslint-disable-next-line no-control-regex -- matching control characters is the point
    .replace(/[\u0000-\u001f\u007f]/g, " ")
    .replace(/\s+/g, " ")
    .trim()
    .slice(0, max);
}
