// What every wallet repository shares: decoding column values (both engines return timestamps and
// jsonb in their own forms) and keyset pagination on a table's `seq`.
import type { Queryable } from "../../platform/storage.ts";

export const iso = (t: Date | string | null): string | null => (t === null ? null : t instanceof Date ? t.toISOString() : new Date(t).toISOString());
export const json = <T>(v: T | string): T => (typeof v === "string" ? (JSON.parse(v) as T) : v);

/** A page request as the API parses it. */
export interface Page {
  limit: number;
  /** Items after (wallets, oldest first) or before (signatures and audit, newest first) this cursor. */
  cursor?: bigint;
  agentId?: string;
}

export interface Paged<T> {
  items: T[];
  next: string | null;
}

/**
 * One page of `from` (a table with a `seq` column, filtered by `where` on $1…$n of `args`): after the
 * cursor oldest first, or before it newest first. One row more than the page says whether another follows.
 */
export async function keysetPage<R extends { seq: string | number }, T>(
  q: Queryable,
  query: { columns: string; from: string; where: string; args: unknown[]; newestFirst: boolean },
  page: Page,
  map: (row: R) => T,
): Promise<Paged<T>> {
  const n = query.args.length;
  const rows = await q.query<R>(
    `SELECT ${query.columns} FROM ${query.from} WHERE ${query.where} AND ($${n + 1}::bigint IS NULL OR seq ${query.newestFirst ? "<" : ">"} $${n + 1})
     ORDER BY seq ${query.newestFirst ? "DESC" : ""} LIMIT $${n + 2}`,
    [...query.args, page.cursor?.toString() ?? null, page.limit + 1],
  );
  const items = rows.slice(0, page.limit);
  return { items: items.map(map), next: rows.length > page.limit ? String(items[items.length - 1]!.seq) : null };
}
