// Platforms and their API keys: the tenants of the wallet service. A key is kept as a digest only;
// revoking keeps the row (the audit trail and signatures name the key that acted).
import type { Database } from "../../platform/storage.ts";
import { iso } from "./rows.ts";

export interface Platform {
  id: string;
  name: string;
  createdAt: string;
}

export interface ApiKeyInfo {
  id: string;
  platformId: string;
  label: string | null;
  createdAt: string;
  revokedAt: string | null;
}

export interface StoredApiKey extends ApiKeyInfo {
  digest: string;
}

export type ApiKeyInput = { id: string; digest: string; label?: string };

// Rows carry the domain names (columns aliased); only the engine's timestamp type differs.
type PlatformRow = Omit<Platform, "createdAt"> & { createdAt: Date | string };
type ApiKeyRow = Omit<StoredApiKey, "createdAt" | "revokedAt"> & { createdAt: Date | string; revokedAt: Date | string | null };

const PLATFORM_COLUMNS = `id, name, created_at AS "createdAt"`;
const API_KEY_COLUMNS = `id, platform_id AS "platformId", digest, label, created_at AS "createdAt", revoked_at AS "revokedAt"`;

const toPlatform = (r: PlatformRow): Platform => ({ ...r, createdAt: iso(r.createdAt)! });
const toApiKey = ({ digest: _digest, ...r }: ApiKeyRow): ApiKeyInfo => ({ ...r, createdAt: iso(r.createdAt)!, revokedAt: iso(r.revokedAt) });

export interface PlatformRepository {
  createPlatform(id: string, name: string, key: ApiKeyInput): Promise<Platform>;
  listPlatforms(): Promise<Platform[]>;
  platform(platformId: string): Promise<Platform | undefined>;
  /** Undefined when the platform does not exist. */
  addApiKey(platformId: string, key: ApiKeyInput): Promise<ApiKeyInfo | undefined>;
  listApiKeys(platformId: string): Promise<ApiKeyInfo[] | undefined>;
  revokeApiKey(platformId: string, keyId: string, at: Date): Promise<ApiKeyInfo | undefined>;
  apiKey(keyId: string): Promise<StoredApiKey | undefined>;
}

export function platformRepository(db: Database): PlatformRepository {
  const platform = async (platformId: string) => {
    const [row] = await db.query<PlatformRow>(`SELECT ${PLATFORM_COLUMNS} FROM wallet_platforms WHERE id = $1`, [platformId]);
    return row ? toPlatform(row) : undefined;
  };

  return {
    async createPlatform(id, name, key) {
      return db.transaction(async (tx) => {
        const [row] = await tx.query<PlatformRow>(`INSERT INTO wallet_platforms (id, name) VALUES ($1, $2) RETURNING ${PLATFORM_COLUMNS}`, [id, name]);
        await tx.query("INSERT INTO wallet_api_keys (id, platform_id, digest, label) VALUES ($1, $2, $3, $4)", [key.id, id, key.digest, key.label ?? null]);
        return toPlatform(row!);
      });
    },

    async listPlatforms() {
      return (await db.query<PlatformRow>(`SELECT ${PLATFORM_COLUMNS} FROM wallet_platforms ORDER BY created_at, id`)).map(toPlatform);
    },

    platform,

    async addApiKey(platformId, key) {
      const [row] = await db.query<ApiKeyRow>(
        `INSERT INTO wallet_api_keys (id, platform_id, digest, label) SELECT $1, p.id, $3, $4 FROM wallet_platforms p WHERE p.id = $2 RETURNING ${API_KEY_COLUMNS}`,
        [key.id, platformId, key.digest, key.label ?? null],
      );
      return row ? toApiKey(row) : undefined;
    },

    async listApiKeys(platformId) {
      if (!(await platform(platformId))) return undefined;
      return (await db.query<ApiKeyRow>(`SELECT ${API_KEY_COLUMNS} FROM wallet_api_keys WHERE platform_id = $1 ORDER BY created_at, id`, [platformId])).map(toApiKey);
    },

    async revokeApiKey(platformId, keyId, at) {
      const [row] = await db.query<ApiKeyRow>(
        `UPDATE wallet_api_keys SET revoked_at = COALESCE(revoked_at, $3) WHERE id = $1 AND platform_id = $2 RETURNING ${API_KEY_COLUMNS}`,
        [keyId, platformId, at],
      );
      return row ? toApiKey(row) : undefined;
    },

    async apiKey(keyId) {
      const [row] = await db.query<ApiKeyRow>(`SELECT ${API_KEY_COLUMNS} FROM wallet_api_keys WHERE id = $1`, [keyId]);
      return row ? { ...toApiKey(row), digest: row.digest } : undefined;
    },
  };
}
