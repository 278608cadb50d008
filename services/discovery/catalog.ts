// The discovery catalog (the x402 `bazaar` extension): resources whose paid requests carried a
// bazaar declaration, recorded once a payment was settled (a /verify moves nothing, so it proves
// nothing), and served by the router at GET /v2/discovery/resources and /v2/discovery/search from
// the database its replicas share.
//
// A payment proves who paid and who was paid, never who runs the resource: anyone can pay a
// service's payTo, or pay itself, and declare any URL. So a settled declaration is *unproven*: it
// creates an entry that does not exist yet (its text is then write-once, owned by no one) or
// appends its own payment option to one that does (at most 8 unproven options per entry); it never
// rewrites an entry's fields, freshness or any option already listed. An entry is *owned* only once
// the resource itself vouched for a declarer: the router fetched the URL and its own 402 answer
// listed the payee that was paid (services/discovery/verification.ts). What such a proof writes is
// the resource's own answer (its description, metadata, declaration and the option as it prices
// it), never the declarer's echo; proven options come first in `accepts`; an entry nobody proved
// is taken over by the first proof.
//
// Declarations come from untrusted clients (they echo the resource server's 402 body), so every
// value passes the specification's rules before it is stored: `info` must match its own schema and
// the protocol's invariants (@x402/extensions), service metadata is soft-dropped field by field, the
// resource URL itself must be an absolute http(s) URL that is not an IP literal or a loopback name
// (the iconUrl rule), and free text is bounded. A declaration that fails is not catalogued, and
// the resource server is told why in EXTENSION-RESPONSES.
import {
  BAZAAR,
  extractDiscoveryInfo,
  isValidIconUrl,
  validateDiscoveryExtension,
  validateDiscoveryExtensionSpec,
  type DiscoveryExtension,
  type DiscoveryResource,
  type DiscoveryResourcesResponse,
  type SearchDiscoveryResourcesResponse,
} from "@x402/extensions/bazaar";
import type { PaymentPayload, PaymentRequirements } from "@x402/core/types";
import type { Database, Migration } from "../platform/storage.ts";

export const DISCOVERY_MIGRATIONS: Migration[] = [
  {
    id: "discovery/001_resources",
    sql: `CREATE TABLE IF NOT EXISTS discovery_resources (
      resource text NOT NULL,
      tool text NOT NULL DEFAULT '',
      type text NOT NULL,
      x402_version integer NOT NULL,
      accepts jsonb NOT NULL,
      pay_to text[] NOT NULL,
      schemes text[] NOT NULL,
      networks text[] NOT NULL,
      extension_keys text[] NOT NULL,
      description text,
      mime_type text,
      service_name text,
      tags text[],
      icon_url text,
      extensions jsonb,
      search_text text NOT NULL,
      last_updated timestamptz NOT NULL,
      PRIMARY KEY (resource, tool)
    );
    CREATE INDEX IF NOT EXISTS discovery_resources_updated ON discovery_resources (last_updated DESC, resource, tool)`,
  },
  {
    // Who owns an entry and each of its payment options (accept_tenants runs parallel to accepts).
    // Entries from before are credited to their first option's payee, without a tenant.
    id: "discovery/002_declarers",
    sql: `ALTER TABLE discovery_resources ADD COLUMN IF NOT EXISTS owner_pay_to text;
    ALTER TABLE discovery_resources ADD COLUMN IF NOT EXISTS owner_tenant text NOT NULL DEFAULT '';
    ALTER TABLE discovery_resources ADD COLUMN IF NOT EXISTS accept_tenants text[] NOT NULL DEFAULT '{}';
    UPDATE discovery_resources SET owner_pay_to = lower(accepts->0->>'payTo'), accept_tenants = array_fill(''::text, ARRAY[jsonb_array_length(accepts)]) WHERE owner_pay_to IS NULL`,
  },
  {
    // Which options the resource itself vouched for (parallel to accepts). An owner is now only a
    // declarer the resource vouched for: the owners credited before were never proven, so none remain.
    id: "discovery/003_proven_options",
    sql: `ALTER TABLE discovery_resources ADD COLUMN IF NOT EXISTS accept_verified boolean[] NOT NULL DEFAULT '{}';
    UPDATE discovery_resources SET owner_pay_to = NULL, owner_tenant = '', accept_verified = array_fill(false, ARRAY[jsonb_array_length(accepts)])`,
  },
];

/** Who declared a resource: the payee that was paid, and the tenant (API key id) when keys are on. */
export interface Declarer {
  tenant?: string;
}

/**
 * Whether the resource itself vouched for this declaration: its own 402 answer, fetched by the
 * router, listed the payee that was paid. The payload and requirements recorded are then the
 * resource's answer, not the declarer's.
 */
export interface Proof {
  verified: boolean;
}

/** What the resource server is told about its declaration (the spec's EXTENSION-RESPONSES `bazaar` key). */
export type CatalogOutcome = { status: "success" } | { status: "rejected"; rejectedReason: string };

export interface ListParams {
  type?: string;
  payTo?: string;
  scheme?: string;
  network?: string;
  extensions?: string;
  limit?: number;
  offset?: number;
}

export interface SearchParams extends Omit<ListParams, "offset"> {
  query: string;
  cursor?: string;
}

export interface Catalog {
  /**
   * Records a settled payment's declaration for its declarer (unproven unless `proof` says the
   * resource vouched for it); undefined when the payment declared none. Never throws for bad input.
   */
  record(payload: PaymentPayload, requirements: PaymentRequirements, declarer?: Declarer, proof?: Proof): Promise<CatalogOutcome | undefined>;
  list(params: ListParams): Promise<DiscoveryResourcesResponse>;
  search(params: SearchParams): Promise<SearchDiscoveryResourcesResponse>;
  /** Drops resources no payment has refreshed for `maxAgeMs` (a resource that is gone stops being listed); returns how many. */
  prune(maxAgeMs: number): Promise<number>;
}

/** A catalogued resource not paid for this long is dropped (each paid request refreshes it). */
export const DEFAULT_CATALOG_MAX_AGE_MS = 30 * 24 * 3_600_000;

export const MAX_PAGE = 100;
const MAX_CURSOR_OFFSET = 1_000_000;
/** Payment options the resource vouched for, per entry. */
const MAX_PROVEN_ACCEPTS = 16;
/** Unproven payment options per entry: a flood of claims on one URL stays this small. */
export const MAX_UNPROVEN_ACCEPTS = 8;
/** A proof that changes nothing rewrites the entry only to refresh it, at most this often. */
const PROVEN_REFRESH_MS = 3_600_000;
const MAX_TEXT = 512;
/** The echoed extensions of one resource, serialised; a bigger declaration is refused, not truncated. */
const MAX_EXTENSIONS_BYTES = 16 * 1024;

// eslint-disable-next-line no-control-regex -- control characters (category Cc) are what it finds
const CONTROL = /[\u0000-\u001f\u007f-\u009f]/;

/** Free text kept only when it is printable, single-line and bounded (soft-drop). */
function boundedText(value: unknown): string | undefined {
  if (typeof value !== "string" || value.length === 0 || value.length > MAX_TEXT || CONTROL.test(value)) return undefined;
  return value;
}

type Row = {
  resource: string;
  tool: string;
  type: string;
  x402_version: number;
  accepts: PaymentRequirements[];
  description: string | null;
  mime_type: string | null;
  service_name: string | null;
  tags: string[] | null;
  icon_url: string | null;
  extensions: Record<string, unknown> | null;
  last_updated: Date | string;
};

function item(r: Row): DiscoveryResource {
  return {
    resource: r.resource,
    type: r.type,
    x402Version: r.x402_version,
    accepts: r.accepts,
    lastUpdated: new Date(r.last_updated).toISOString(),
    ...(r.description !== null ? { description: r.description } : {}),
    ...(r.mime_type !== null ? { mimeType: r.mime_type } : {}),
    ...(r.service_name !== null ? { serviceName: r.service_name } : {}),
    ...(r.tags?.length ? { tags: r.tags } : {}),
    ...(r.icon_url !== null ? { iconUrl: r.icon_url } : {}),
    ...(r.extensions !== null ? { extensions: r.extensions } : {}),
  };
}

/** The filters both endpoints share, and search's words, as a WHERE clause and its parameters. */
function whereOf(p: ListParams, words: string[] = []): { clause: string; args: unknown[] } {
  const where: string[] = [];
  const args: unknown[] = [];
  const add = (sql: (n: string) => string, value: unknown) => {
    args.push(value);
    where.push(sql(`$${args.length}`));
  };
  if (p.type) add((n) => `type = ${n}`, p.type);
  if (p.payTo) add((n) => `${n} = ANY(pay_to)`, p.payTo.toLowerCase());
  if (p.scheme) add((n) => `${n} = ANY(schemes)`, p.scheme);
  if (p.network) add((n) => `${n} = ANY(networks)`, p.network);
  if (p.extensions) add((n) => `${n}::text[] <@ extension_keys`, p.extensions.split(",").map((s) => s.trim()).filter(Boolean));
  // Every word must appear (case-insensitive) in the resource's URL, description, name, tags or tool.
  for (const word of words) add((n) => `search_text LIKE ${n}`, `%${word.replace(/[\\%_]/g, (c) => `\\${c}`)}%`);
  return { clause: where.length ? `WHERE ${where.join(" AND ")}` : "", args };
}

const cursorOf = (offset: number) => Buffer.from(JSON.stringify({ o: offset })).toString("base64url");
/** An opaque cursor back to its offset; anything else starts from the top (the spec lets servers ignore cursors). */
function offsetOf(cursor: string | undefined): number {
  if (!cursor) return 0;
  try {
    const o = (JSON.parse(Buffer.from(cursor, "base64url").toString("utf8")) as { o?: unknown }).o;
    return typeof o === "number" && Number.isSafeInteger(o) && o >= 0 && o <= MAX_CURSOR_OFFSET ? o : 0;
  } catch {
    return 0;
  }
}

type Options = { accepts: PaymentRequirements[]; tenants: string[]; verified: boolean[] };

/** The accepts column and the filter columns derived from it. */
function acceptColumns(accepts: PaymentRequirements[]): [string, string[], string[], string[]] {
  return [JSON.stringify(accepts), [...new Set(accepts.map((a) => a.payTo.toLowerCase()))], [...new Set(accepts.map((a) => a.scheme))], [...new Set(accepts.map((a) => a.network))]];
}

/**
 * Where a declarer's payment option goes in an entry's `accepts`, one option per (scheme, network,
 * asset, payTo). Unproven: a new option is appended, one already listed never changes (a price
 * change waits for the resource's own word), and another tenant's is refused. Proven: the option as
 * the resource prices it joins the proven ones, which come first; it replaces an unproven listing
 * of the same option, wherever it was.
 */
function placeAccept(entry: Options, accepted: PaymentRequirements, tenant: string, verified: boolean): Options | { refused: string } {
  const same = (a: PaymentRequirements) => a.scheme === accepted.scheme && a.network === accepted.network && a.asset.toLowerCase() === accepted.asset.toLowerCase() && a.payTo.toLowerCase() === accepted.payTo.toLowerCase();
  const listed = entry.accepts.findIndex(same);
  if (!verified) {
    if (listed >= 0) return entry.tenants[listed] === tenant ? entry : { refused: "this payment option is listed for this resource by another declarer" };
    if (entry.verified.filter((v) => !v).length >= MAX_UNPROVEN_ACCEPTS) return { refused: `this resource lists ${MAX_UNPROVEN_ACCEPTS} payment options its resource has not confirmed already` };
    return { accepts: [...entry.accepts, accepted], tenants: [...entry.tenants, tenant], verified: [...entry.verified, false] };
  }
  if (listed >= 0 && entry.verified[listed]) {
    const at = (xs: unknown[], v: unknown) => xs.map((x, i) => (i === listed ? v : x));
    return { accepts: at(entry.accepts, accepted) as PaymentRequirements[], tenants: at(entry.tenants, tenant) as string[], verified: entry.verified };
  }
  const others = (xs: unknown[]) => xs.filter((_, i) => i !== listed);
  const [accepts, tenants, flags] = [others(entry.accepts) as PaymentRequirements[], others(entry.tenants) as string[], others(entry.verified) as boolean[]];
  const proven = flags.filter(Boolean).length; // proven options are the first ones
  if (proven >= MAX_PROVEN_ACCEPTS) return { refused: `this resource lists ${MAX_PROVEN_ACCEPTS} payment options it confirmed already` };
  accepts.splice(proven, 0, accepted);
  tenants.splice(proven, 0, tenant);
  flags.splice(proven, 0, true);
  return { accepts, tenants, verified: flags };
}

export function createCatalog(db: Database): Catalog {
  return {
    async record(payload, requirements, declarer = {}, proof = { verified: false }) {
      const declared = (payload.extensions as Record<string, unknown> | undefined)?.[BAZAAR.key];
      if (declared === undefined) return undefined;
      if (!declared || typeof declared !== "object") return { status: "rejected", rejectedReason: "the bazaar extension is not an object" };
      const extension = declared as DiscoveryExtension;
      let spec;
      let schema;
      try {
        spec = validateDiscoveryExtensionSpec(declared as Record<string, unknown>);
        schema = spec.valid ? validateDiscoveryExtension(extension) : undefined;
      } catch {
        return { status: "rejected", rejectedReason: "the bazaar declaration could not be validated" };
      }
      if (!spec.valid) return { status: "rejected", rejectedReason: `info breaks the bazaar rules: ${(spec.errors ?? []).join("; ").slice(0, 200)}` };
      if (!schema?.valid) return { status: "rejected", rejectedReason: `info does not match its schema: ${(schema?.errors ?? []).join("; ").slice(0, 200)}` };
      const resourceUrl = (payload.resource as { url?: unknown } | undefined)?.url;
      if (typeof resourceUrl !== "string" || !isValidIconUrl(resourceUrl)) {
        return { status: "rejected", rejectedReason: "resource.url must be an absolute http(s) URL on a public host name (no IP literal, no localhost, no credentials)" };
      }
      let found;
      try {
        found = extractDiscoveryInfo(payload, requirements, false); // validated above; service metadata is sanitised inside
      } catch {
        found = null;
      }
      if (!found) return { status: "rejected", rejectedReason: "no discovery information could be extracted" };
      const extensions = { [BAZAAR.key]: declared };
      if (JSON.stringify(extensions).length > MAX_EXTENSIONS_BYTES) return { status: "rejected", rejectedReason: `the bazaar declaration is larger than ${MAX_EXTENSIONS_BYTES} bytes` };
      const input = found.discoveryInfo.input as { type: string; toolName?: string; tool?: string };
      const type = input.type;
      const tool = type === "mcp" ? String(input.toolName ?? input.tool ?? "") : "";
      const http = found as { resourceUrl: string; description?: string; mimeType?: string; serviceName?: string; tags?: string[]; iconUrl?: string };
      const { scheme, network, asset, amount, payTo, maxTimeoutSeconds, extra } = requirements;
      const accepted: PaymentRequirements = { scheme, network, asset, amount, payTo, maxTimeoutSeconds, extra: extra ?? {} };
      const description = boundedText(http.description);
      const searchText = [http.resourceUrl, description, http.serviceName, ...(http.tags ?? []), tool].filter(Boolean).join(" ").toLowerCase();
      const tenant = declarer.tenant ?? "";
      const fields = [type, payload.x402Version, Object.keys(extensions), description ?? null, boundedText(http.mimeType) ?? null, http.serviceName ?? null, http.tags ?? [], http.iconUrl ?? null, JSON.stringify(extensions), searchText];
      const verified = proof.verified;
      return db.transaction(async (tx) => {
        // The first settled declaration creates the entry (owned only when proven); of concurrent first ones, one insert wins.
        const created = await tx.query(
          `INSERT INTO discovery_resources (resource, tool, type, x402_version, extension_keys, description, mime_type, service_name, tags, icon_url, extensions, search_text,
             accepts, pay_to, schemes, networks, accept_tenants, accept_verified, owner_pay_to, owner_tenant, last_updated)
           VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11::jsonb, $12, $13::jsonb, $14, $15, $16, $17, $18, $19, $20, now())
           ON CONFLICT (resource, tool) DO NOTHING RETURNING resource`,
          [http.resourceUrl, tool, ...fields, ...acceptColumns([accepted]), [tenant], [verified], verified ? accepted.payTo.toLowerCase() : null, verified ? tenant : ""],
        );
        if (created.length) return { status: "success" } as const;
        const [entry] = await tx.query<{ accepts: PaymentRequirements[]; accept_tenants: string[]; accept_verified: boolean[]; owner_pay_to: string | null; owner_tenant: string }>(
          "SELECT accepts, accept_tenants, accept_verified, owner_pay_to, owner_tenant FROM discovery_resources WHERE resource = $1 AND tool = $2 FOR UPDATE",
          [http.resourceUrl, tool],
        );
        if (!entry) return { status: "rejected", rejectedReason: "the entry was pruned meanwhile; the next payment retries" } as const;
        const listed: Options = { accepts: entry.accepts, tenants: entry.accepts.map((_, i) => entry.accept_tenants[i] ?? ""), verified: entry.accepts.map((_, i) => entry.accept_verified[i] ?? false) };
        const placed = placeAccept(listed, accepted, tenant, verified);
        if ("refused" in placed) return { status: "rejected", rejectedReason: placed.refused } as const;
        const options = [...acceptColumns(placed.accepts), placed.tenants, placed.verified];
        if (!verified) {
          // Unproven: its own new option at most; never the entry's text, freshness or a listed option.
          if (placed !== listed) await tx.query("UPDATE discovery_resources SET accepts = $3::jsonb, pay_to = $4, schemes = $5, networks = $6, accept_tenants = $7, accept_verified = $8 WHERE resource = $1 AND tool = $2", [http.resourceUrl, tool, ...options]);
          return { status: "success" } as const;
        }
        // The resource's own word: its text and option, the entry the first prover's if nobody proved it before.
        const [ownerPayTo, ownerTenant] = entry.owner_pay_to === null ? [accepted.payTo.toLowerCase(), tenant] : [entry.owner_pay_to, entry.owner_tenant];
        // A proof that changes nothing refreshes the entry at most hourly (a busy resource costs little).
        await tx.query(
          `UPDATE discovery_resources SET type = $3, x402_version = $4, extension_keys = $5, description = $6, mime_type = $7, service_name = $8, tags = $9, icon_url = $10,
             extensions = $11::jsonb, search_text = $12, accepts = $13::jsonb, pay_to = $14, schemes = $15, networks = $16, accept_tenants = $17, accept_verified = $18,
             owner_pay_to = $19, owner_tenant = $20, last_updated = now()
           WHERE resource = $1 AND tool = $2 AND (last_updated < now() - ($21 || ' milliseconds')::interval
             OR ROW(type, x402_version, extension_keys, description, mime_type, service_name, tags, icon_url, extensions, search_text, accepts, accept_tenants, accept_verified, owner_pay_to, owner_tenant)
               IS DISTINCT FROM ROW($3::text, $4::integer, $5::text[], $6::text, $7::text, $8::text, $9::text[], $10::text, $11::jsonb, $12::text, $13::jsonb, $17::text[], $18::boolean[], $19::text, $20::text))`,
          [http.resourceUrl, tool, ...fields, ...options, ownerPayTo, ownerTenant, String(PROVEN_REFRESH_MS)],
        );
        return { status: "success" } as const;
      });
    },

    async list(params) {
      const limit = params.limit ?? MAX_PAGE;
      const offset = params.offset ?? 0;
      const { clause, args } = whereOf(params);
      const [rows, [count]] = await Promise.all([
        // The page as parameters: a statement's text stays one of a few (the embedded engine keeps each text prepared).
        db.query<Row>(`SELECT * FROM discovery_resources ${clause} ORDER BY last_updated DESC, resource, tool LIMIT $${args.length + 1} OFFSET $${args.length + 2}`, [...args, limit, offset]),
        db.query<{ total: string }>(`SELECT count(*)::text AS total FROM discovery_resources ${clause}`, args),
      ]);
      return { x402Version: 2, items: rows.map(item), pagination: { limit, offset, total: Number(count?.total ?? 0) } };
    },

    async prune(maxAgeMs) {
      const gone = await db.query("DELETE FROM discovery_resources WHERE last_updated < now() - ($1 || ' milliseconds')::interval RETURNING resource", [String(Math.floor(maxAgeMs))]);
      return gone.length;
    },

    async search(params) {
      const limit = params.limit ?? 20;
      const offset = offsetOf(params.cursor);
      const words = params.query.toLowerCase().split(/\s+/).filter(Boolean).slice(0, 8);
      const { clause, args } = whereOf(params, words);
      const rows = await db.query<Row>(`SELECT * FROM discovery_resources ${clause} ORDER BY last_updated DESC, resource, tool LIMIT ${limit + 1} OFFSET ${offset}`, args);
      const more = rows.length > limit;
      return { x402Version: 2, resources: rows.slice(0, limit).map(item), partialResults: false, pagination: { limit, cursor: more ? cursorOf(offset + limit) : null } };
    },
  };
}
