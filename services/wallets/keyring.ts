// The master keys: read from a file (a mounted Kubernetes Secret), one key a line, the first line the
// primary (it wraps new data keys), the others kept readable for data keys not yet re-wrapped.
// Only derived keys stay in memory: the key-encryption key (HKDF-SHA256, "kek/v1") and a public
// fingerprint (HKDF-SHA256, "fingerprint/v1") that tells two different keys with one id apart.
//
//   # <id>:<32 bytes as 64 hex characters or base64>; or just the key (id derived from its fingerprint)
//   mk-2026-07:5b0c…e1
//   mk-2026-01:Zm9v…
import { hkdfSync } from "node:crypto";
import { readFile } from "node:fs/promises";
import { unwatchFile, watchFile, type Stats } from "node:fs";
import type { Logger } from "../platform/logger.ts";

const HKDF_SALT = Buffer.from("x402-fleet/wallets/master-key");
const ID_PATTERN = /^[A-Za-z0-9._-]{1,64}$/;

export interface MasterKey {
  id: string;
  /** Public: 16 bytes derived from the key (hex), stored to detect a wrong key under a known id. */
  fingerprint: string;
  /** The key-encryption key (32 bytes) that wraps data keys. Never logged, never stored. */
  kek: Buffer;
}

export interface Keyring {
  primary: MasterKey;
  keys: ReadonlyMap<string, MasterKey>;
}

/** A keyring that could not be read; the message names the line, never its content. */
export class KeyringError extends Error {}

function derive(material: Buffer, info: string, length: number): Buffer {
  return Buffer.from(hkdfSync("sha256", material, HKDF_SALT, Buffer.from(info), length));
}

function decodeMaterial(text: string): Buffer | undefined {
  const hex = text.startsWith("0x") || text.startsWith("0X") ? text.slice(2) : text;
  if (/^[0-9a-fA-F]{64}$/.test(hex)) return Buffer.from(hex, "hex");
  if (/^[A-Za-z0-9+/]{43}=?$/.test(text) || /^[A-Za-z0-9_-]{43}$/.test(text)) {
    const bytes = Buffer.from(text, text.includes("-") || text.includes("_") ? "base64url" : "base64");
    if (bytes.length === 32) return bytes;
  }
  return undefined;
}

/** Derives the key-encryption key and fingerprint of 32 bytes of master key material. */
export function masterKeyFrom(material: Buffer, id?: string): MasterKey {
  const fingerprint = derive(material, "fingerprint/v1", 16).toString("hex");
  return { id: id ?? `mk-${fingerprint.slice(0, 12)}`, fingerprint, kek: derive(material, "kek/v1", 32) };
}

export function parseKeyring(text: string, source = "master key file"): Keyring {
  const keys = new Map<string, MasterKey>();
  let primary: MasterKey | undefined;
  const seen = new Set<string>();
  text.split(/\r?\n/).forEach((raw, i) => {
    const line = raw.trim();
    if (line === "" || line.startsWith("#")) return;
    const colon = line.indexOf(":");
    const id = colon >= 0 ? line.slice(0, colon).trim() : undefined;
    const materialText = (colon >= 0 ? line.slice(colon + 1) : line).trim();
    if (id !== undefined && !ID_PATTERN.test(id)) {
      throw new KeyringError(`${source}, line ${i + 1}: a key id is 1 to 64 of A-Z a-z 0-9 . _ -`);
    }
    const material = decodeMaterial(materialText);
    if (!material) throw new KeyringError(`${source}, line ${i + 1}: a master key is 32 bytes, written as 64 hex characters or base64`);
    const key = masterKeyFrom(material, id);
    material.fill(0);
    if (keys.has(key.id)) throw new KeyringError(`${source}, line ${i + 1}: key id ${key.id} appears twice`);
    if (seen.has(key.fingerprint)) throw new KeyringError(`${source}, line ${i + 1}: the same key appears twice (as ${key.id})`);
    seen.add(key.fingerprint);
    keys.set(key.id, key);
    primary ??= key;
  });
  if (!primary) throw new KeyringError(`${source}: no master key (one per line: <id>:<64 hex characters>)`);
  return { primary, keys };
}

export async function readKeyringFile(path: string): Promise<Keyring> {
  let text: string;
  try {
    text = await readFile(path, "utf8");
  } catch (e) {
    throw new KeyringError(`master key file ${path} cannot be read (${(e as NodeJS.ErrnoException).code ?? "error"})`);
  }
  return parseKeyring(text, `master key file ${path}`);
}

export interface KeyringSource {
  current(): Keyring;
  /**
   * Re-reads the file. A new keyring replaces the current one only if `accept` takes it (the
   * service checks fingerprints first); a broken file keeps the current one and throws.
   */
  reload(): Promise<{ keyring: Keyring; changed: boolean }>;
  /** A key by id; on a miss, re-reads the file once (another replica may already use a newer key). */
  find(id: string): Promise<MasterKey | undefined>;
  close(): void;
}

export interface KeyringSourceOptions {
  /** The file; omit to serve a fixed keyring (tests, embedding). */
  path?: string;
  keyring?: Keyring;
  logger: Logger;
  /** Checks a new keyring before it is used (throws to refuse it). */
  accept?: (k: Keyring) => Promise<void>;
  /** Called after a reload that changed the primary key. */
  onPrimaryChange?: (k: Keyring) => void;
  /** Poll interval of the file; 0 disables watching. */
  watchIntervalMs?: number;
}

const sameKeyring = (a: Keyring, b: Keyring) =>
  a.primary.id === b.primary.id && a.keys.size === b.keys.size && [...a.keys.values()].every((k) => b.keys.get(k.id)?.fingerprint === k.fingerprint);

export async function openKeyringSource(opts: KeyringSourceOptions): Promise<KeyringSource> {
  if (!opts.path && !opts.keyring) throw new KeyringError("no master key: give a master key file (--master-key-file)");
  let keyring = opts.keyring ?? (await readKeyringFile(opts.path!));
  await opts.accept?.(keyring);
  let lastMissReload = 0;

  const reload = async () => {
    if (!opts.path) return { keyring, changed: false };
    const next = await readKeyringFile(opts.path);
    if (sameKeyring(next, keyring)) return { keyring, changed: false };
    await opts.accept?.(next);
    const primaryChanged = next.primary.id !== keyring.primary.id;
    keyring = next;
    opts.logger.info({ primary: next.primary.id, keys: [...next.keys.keys()] }, "wallets master keys loaded");
    if (primaryChanged) opts.onPrimaryChange?.(next);
    return { keyring, changed: true };
  };

  const interval = opts.watchIntervalMs ?? 1000;
  const onChange = (curr: Stats, prev: Stats) => {
    if (curr.mtimeMs === prev.mtimeMs && curr.size === prev.size && curr.ino === prev.ino) return;
    reload().catch((e: Error) => opts.logger.error({ reason: e.message }, "wallets master key file not reloaded; keeping the current keys"));
  };
  if (opts.path && interval > 0) watchFile(opts.path, { interval, persistent: false }, onChange);

  return {
    current: () => keyring,
    reload,
    async find(id) {
      const hit = keyring.keys.get(id);
      if (hit || !opts.path) return hit;
      // At most one re-read a second on misses: a wrong id must not turn requests into file reads.
      if (Date.now() - lastMissReload < 1000) return undefined;
      lastMissReload = Date.now();
      await reload().catch(() => undefined);
      return keyring.keys.get(id);
    },
    close: () => {
      if (opts.path && interval > 0) unwatchFile(opts.path, onChange);
    },
  };
}
