// The hub's TypeScript client on the devnet: signed writes with the agent's wallet, then reads.
// `npm start` in one terminal, then, with AGENT_KEY the agent wallet's private key (0x hex):
//   AGENT_KEY=0x… npx tsx examples/hub.ts
import { readFileSync } from "node:fs";
import type { Hex } from "viem";
import { privateKeyToAccount } from "viem/accounts";
import { createHubClient } from "../services/hub/client.ts";

const key = process.env.AGENT_KEY;
if (!key) throw new Error("set AGENT_KEY to the agent wallet's private key (0x followed by 64 hex digits)");
// The hub of the running devnet (or HUB_URL for another one).
const url = process.env.HUB_URL ?? JSON.parse(readFileSync(".devnet/devnet.json", "utf8")).hubUrl;

const hub = createHubClient({ url, signer: privateKeyToAccount(key as Hex) });
const write = async (id: string, role: string, content: string) => {
  const stored = await hub.upload({ id, message: JSON.stringify({ name: "agent9527", role, content }) });
  console.log(`wrote ${stored.id} version ${stored.version} in bucket ${stored.bucket}`);
};
await write("chat8_0", "user", "what is x402?");
await write("chat8_1", "assistant", "HTTP 402 payments.");
await write("chat8_1", "assistant", "HTTP 402 payments, settled on chain."); // an edit: version 2

console.log("conversations", JSON.stringify(await hub.listConversations())); // newest first
console.log("chat8", JSON.stringify(await hub.getConversation({ id: "chat8" }))); // latest value of each record
console.log("chat8_1", await hub.download({ id: "chat8_1" })); // the latest version
const history = await hub.history({ id: "chat8_1" }); // every version kept
console.log("history", JSON.stringify({ latest: history?.latest, versions: history?.versions.map((v) => v.version) }));
