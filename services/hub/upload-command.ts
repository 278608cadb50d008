// `x402-fleet hub-upload`: one signed write from the command line, for people trying the hub and
// for scripts. The key is read from a file (never a flag: flags end up in shell history and `ps`).
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { isAddress, isHex, type Address } from "viem";
import { privateKeyToAccount } from "viem/accounts";
import { createHubClient, HubClientError, type UploadResult } from "./client.ts";
import { KINDS, type Kind } from "./wire.ts";

export interface HubUploadCommandOptions {
  /** The hub's base URL; default: `hubUrl` of the devnet whose state is in `stateDir`. */
  hubUrl?: string;
  stateDir: string;
  keyFile?: string;
  id?: string;
  message?: string;
  bucket?: string;
  kind?: string;
  owner?: string;
}

export async function hubUploadCommand(o: HubUploadCommandOptions): Promise<UploadResult> {
  if (!o.keyFile) throw new Error("hub-upload: --key-file (or HUB_SIGNER_KEY_FILE) is required: a file holding the wallet's 0x private key");
  if (!o.id) throw new Error("hub-upload: --id is required (the key to write, e.g. chat7_0)");
  if (o.message === undefined) throw new Error("hub-upload: --message is required (the value to store)");
  if (o.kind !== undefined && !(KINDS as readonly string[]).includes(o.kind)) throw new Error(`hub-upload: --kind must be one of ${KINDS.join(", ")}`);
  if (o.owner !== undefined && !isAddress(o.owner)) throw new Error("hub-upload: --owner must be a 0x address (a contract wallet the key signs for)");
  const key = (await readFile(o.keyFile, "utf8")).trim();
  // Never echo the file's content: it is a private key, even when malformed.
  if (!isHex(key) || key.length !== 66) throw new Error(`hub-upload: ${o.keyFile} must hold one 0x-prefixed 32-byte hex private key`);
  const url = o.hubUrl ?? (await devnetHubUrl(o.stateDir));
  const hub = createHubClient({ url, signer: privateKeyToAccount(key), owner: o.owner as Address | undefined });
  try {
    return await hub.upload({ id: o.id, message: o.message, bucket: o.bucket, kind: o.kind as Kind | undefined });
  } catch (e) {
    if (e instanceof HubClientError) throw new Error(`hub-upload: ${e.message}`);
    throw e;
  }
}

async function devnetHubUrl(stateDir: string): Promise<string> {
  const path = join(stateDir, "devnet.json");
  let info: { hubUrl?: string | null };
  try {
    info = JSON.parse(await readFile(path, "utf8")) as { hubUrl?: string | null };
  } catch {
    throw new Error(`hub-upload: no --hub-url and no running devnet (${path} is missing): give --hub-url or start one with npm start`);
  }
  if (!info.hubUrl) throw new Error(`hub-upload: the devnet in ${stateDir} runs no hub; give --hub-url`);
  return info.hubUrl;
}
