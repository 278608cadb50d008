// Used by scripts/kind-e2e.sh: turns the in-cluster anvil (reached through a port-forward) into
// an x402 devnet chain (our devnet contracts, funded payers, a funded facilitator signer), writes
// the signer key file for the Secret, and a devnet.json that `x402-fleet pay` reads.
// Devnet keys only (anvil's public test mnemonic): never use them anywhere else.
import { mkdir, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { parseArgs } from "node:util";
import { bytesToHex } from "viem";
import { mnemonicToAccount } from "viem/accounts";
import { setupDevnetChain } from "../services/devnet/chain-setup.ts";
import { DEVNET_MNEMONIC } from "../services/devnet/devnet.ts";
import { networkInfo } from "../services/x402/networks.ts";

const { values } = parseArgs({ options: { "rpc-url": { type: "string" }, "router-url": { type: "string" }, network: { type: "string" }, out: { type: "string" } } });
const network = values.network ?? "eip155:8453";
const net = networkInfo(network);
if (!net || !values["rpc-url"] || !values["router-url"] || !values.out) throw new Error("usage: kind-e2e-chain.ts --rpc-url URL --router-url URL --out DIR [--network eip155:8453]");

const key = (addressIndex: number) => {
  const account = mnemonicToAccount(DEVNET_MNEMONIC, { addressIndex });
  return { address: account.address, privateKey: bytesToHex(account.getHdKey().privateKey!) };
};
const signer = key(10);
const payers = [
  { ...key(1), permit2Approved: true },
  { ...key(2), permit2Approved: false },
];

await setupDevnetChain({ rpcUrl: values["rpc-url"], chainId: net.chainId, assets: net.assets, gasFunded: [signer.address], payers });
await mkdir(values.out, { recursive: true });
await writeFile(join(values.out, "signer-keys"), `${signer.privateKey}\n`, { mode: 0o600 });
const info = {
  routerUrl: values["router-url"],
  hubUrl: null,
  networks: [{ network, chainId: net.chainId, rpcUrl: values["rpc-url"], facilitatorUrl: "", signers: [signer.address], assets: net.assets }],
  payers,
  receivers: [key(3)],
};
await writeFile(join(values.out, "devnet.json"), JSON.stringify(info, null, 2));
console.log(`${network} prepared: signer ${signer.address}`);
