// Signer keys of one network are never used on another. A key's nonce sequence, funding and
// trust (an `upto` payer names the key) belong to one chain; reusing it elsewhere mixes a
// testnet's keys into a mainnet (or the reverse). Every facilitator records the network of each of
// its keys in its settlement store and refuses to start with a key bound to another network; on a
// mainnet served by a real node (not a local development chain) anvil's public keys are refused.
import { bytesToHex } from "viem";
import { mnemonicToAccount } from "viem/accounts";
import type { Database, Migration } from "../platform/storage.ts";

export const SIGNER_NETWORK_MIGRATIONS: Migration[] = [
  {
    id: "signers/001_network_binding",
    sql: `
CREATE TABLE signer_networks (
  signer text PRIMARY KEY,
  network text NOT NULL,
  bound_at timestamptz NOT NULL DEFAULT now()
);
`,
  },
];

/** Binds each signer to this network on first use; throws naming any signer bound to another one. */
export async function bindSignersToNetwork(db: Database, network: string, signers: readonly string[]): Promise<void> {
  const lower = signers.map((s) => s.toLowerCase());
  for (const signer of lower) await db.query("INSERT INTO signer_networks (signer, network) VALUES ($1, $2) ON CONFLICT (signer) DO NOTHING", [signer, network]);
  const rows = await db.query<{ signer: string; network: string }>("SELECT signer, network FROM signer_networks WHERE signer = ANY($1::text[]) AND network <> $2", [lower, network]);
  if (rows.length > 0) {
    const list = rows.map((r) => `${r.signer} (bound to ${r.network})`).join(", ");
    throw new Error(`signer keys serve one network only: ${list} cannot sign for ${network}; give this network its own keys`);
  }
}

const DEVNET_MNEMONIC = "test test test test test test test test test test test junk";
let wellKnown: Set<string> | undefined;

/** Whether a key is one of the first 20 keys of anvil's public development mnemonic. */
export function isWellKnownDevnetKey(key: `0x${string}`): boolean {
  wellKnown ??= new Set(Array.from({ length: 20 }, (_, addressIndex) => bytesToHex(mnemonicToAccount(DEVNET_MNEMONIC, { addressIndex }).getHdKey().privateKey!).toLowerCase()));
  return wellKnown.has(key.toLowerCase());
}

/** Client versions of local development nodes, where the devnet runs mainnet chain ids with public keys. */
const DEVELOPMENT_NODE = /^(anvil|hardhat|ganache)/i;

/** Throws when a mainnet served by a real node would sign with a publicly known development key. */
export function refuseWellKnownKeys(network: { network: string; testnet: boolean }, keys: readonly `0x${string}`[], clientVersion: string): void {
  if (network.testnet || DEVELOPMENT_NODE.test(clientVersion.trim())) return;
  const index = keys.findIndex((k) => isWellKnownDevnetKey(k));
  if (index >= 0) throw new Error(`signer key ${index + 1} is a well-known development key (anvil's "test … junk" mnemonic): it guards nothing on the mainnet ${network.network}`);
}
