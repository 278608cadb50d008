#!/usr/bin/env node
// The x402-fleet command. Sources are TypeScript, loaded through tsx's ESM hook.
import { register } from "tsx/esm/api";

register();
const { main } = await import("../services/cli.ts");
try {
  await main(process.argv.slice(2));
} catch (e) {
  const taken = e && e.code === "EADDRINUSE" ? ` (another process listens there: the devnet of \`npm start\` already serves router 4020, hub 4030 and wallets 4040, admin ports +100; choose another --port / --admin-port)` : "";
  process.stderr.write(`x402-fleet: ${e instanceof Error ? e.message : String(e)}${taken}\n`);
  process.exit(1);
}
