#!/usr/bin/env node
// The x402-fleet command. Sources are TypeScript, loaded through tsx's ESM hook.
import { register } from "tsx/esm/api";

register();
const { main } = await import("../services/cli.ts");
try {
  await main(process.argv.slice(2));
} catch (e) {
  process.stderr.write(`x402-fleet: ${e instanceof Error ? e.message : String(e)}\n`);
  process.exit(1);
}
