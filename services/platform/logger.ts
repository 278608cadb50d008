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

/** First line of an error, without URLs (an RPC URL may embed an API key): safe for logs and answers. */
export function conciseMessage(e: unknown): string {
  const first = String((e as Error)?.message ?? e).split("\n")[0] ?? "";
  return first.replace(/https?:\/\/\S+/g, "<rpc>").slice(0, 300);
}
