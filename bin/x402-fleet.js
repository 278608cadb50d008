#!/usr/bin/env node
// The x402-fleet command: the bundle in dist/ when it was built from the sources as they are
// (bin/built.mjs), otherwise the TypeScript sources through tsx's ESM hook.
import { fileURLToPath, pathToFileURL } from "node:url";
import { builtEntry } from "./built.mjs";

const built = builtEntry(fileURLToPath(new URL("..", import.meta.url)));
if (!built) (await import("tsx/esm/api")).register();
const { main } = built ? await import(pathToFileURL(built).href) : await import("../services/cli.ts");
try {
  await main(process.argv.slice(2));
} catch (e) {
  const taken = e && e.code === "EADDRINUSE" ? ` (another process listens there: the devnet of \`npm start\` already serves router 4020, hub 4030 and wallets 4040, admin ports +100; choose another --port / --admin-port)` : "";
  process.stderr.write(`x402-fleet: ${e instanceof Error ? e.message : String(e)}${taken}\n`);
  process.exit(1);
}
