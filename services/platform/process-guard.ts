// The last line of defence of every long-running process. Node's default for an unhandled
// rejection or an uncaught exception is to exit: one provider fault that escapes a request path
// would then crash-loop every replica at once. Here it is logged (type and first line, URLs
// removed: RPC URLs embed API keys), counted in x402_unhandled_errors_total, and the process
// keeps serving. A count above zero is a bug to fix (every promise on a request path must be
// awaited or handled), not a state to live with.
import type { Logger } from "./logger.ts";
import { safeMessage } from "./logger.ts";

export type UnhandledKind = "rejection" | "exception";

// Process-wide: the handlers are per process, while every service registry (several share one
// process on the devnet) reads these counts when scraped.
const counts: Record<UnhandledKind, number> = { rejection: 0, exception: 0 };
let installed = false;

export function unhandledErrorCounts(): Readonly<Record<UnhandledKind, number>> {
  return counts;
}

/** Installs the handlers once per process; later calls are no-ops. */
export function installProcessGuard(logger: Logger): void {
  if (installed) return;
  installed = true;
  const note = (kind: UnhandledKind, error: unknown) => {
    counts[kind] += 1;
    // Not under `err`: pino's error serializer would replace the type with the object's.
    logger.error({ kind, error: { type: (error as Error)?.name ?? typeof error, message: safeMessage(error) } }, `unhandled ${kind}; the process keeps serving`);
  };
  process.on("unhandledRejection", (reason) => note("rejection", reason));
  process.on("uncaughtException", (error) => note("exception", error));
}
