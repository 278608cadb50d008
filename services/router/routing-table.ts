// The router's routing table: which facilitator service serves which network, and its kinds.
// Kept in a JSON file (the operator writes it into a ConfigMap; the devnet writes it locally)
// and reloaded when the file changes. A broken file never replaces a good table.
import { readFile } from "node:fs/promises";
import { unwatchFile, watchFile } from "node:fs";
import { z } from "zod";
import { CAIP2_PATTERN } from "../x402/networks.ts";
import type { Logger } from "../platform/logger.ts";

const kind = z.object({
  x402Version: z.number().int(),
  scheme: z.string().min(1),
  network: z.custom<`${string}:${string}`>((v) => typeof v === "string" && CAIP2_PATTERN.test(v), "expected a CAIP-2 eip155 network"),
  extra: z.record(z.unknown()).optional(),
});

const tableSchema = z.object({
  backends: z.array(
    z.object({
      network: z.string().regex(CAIP2_PATTERN),
      url: z.string().url(),
      kinds: z.array(kind),
      signers: z.array(z.string()).default([]),
      extensions: z.array(z.string()).default([]),
    }),
  ),
});

export type RoutingTable = z.infer<typeof tableSchema>;
export type Backend = RoutingTable["backends"][number];

export function parseRoutingTable(text: string): RoutingTable {
  const parsed = tableSchema.safeParse(JSON.parse(text));
  if (!parsed.success) {
    const issue = parsed.error.issues[0]!;
    throw new Error(`routing table: ${issue.path.join(".")}: ${issue.message}`);
  }
  const seen = new Set<string>();
  for (const b of parsed.data.backends) {
    if (seen.has(b.network)) throw new Error(`routing table: network ${b.network} is listed twice`);
    seen.add(b.network);
    for (const k of b.kinds) {
      if (k.network !== b.network) throw new Error(`routing table: backend ${b.network} lists a kind for ${k.network}`);
    }
  }
  return parsed.data;
}

export interface RoutingTableSource {
  current(): RoutingTable | undefined;
  close(): void;
}

/** Loads the table from a file and reloads it whenever the file changes (polling: works for ConfigMap symlink swaps). */
export async function watchRoutingTable(path: string, logger: Logger, onChange: (t: RoutingTable) => void, intervalMs = 500): Promise<RoutingTableSource> {
  let table: RoutingTable | undefined;
  const load = async () => {
    try {
      const next = parseRoutingTable(await readFile(path, "utf8"));
      table = next;
      onChange(next);
      logger.info({ networks: next.backends.map((b) => b.network) }, "routing table loaded");
    } catch (e) {
      logger.error({ path, reason: (e as Error).message }, "routing table not loaded; keeping the previous one");
    }
  };
  await load();
  watchFile(path, { interval: intervalMs, persistent: false }, (curr, prev) => {
    if (curr.mtimeMs !== prev.mtimeMs || curr.size !== prev.size || curr.ino !== prev.ino) void load();
  });
  return { current: () => table, close: () => unwatchFile(path) };
}
