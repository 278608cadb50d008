// Runs before `npm start` and `npm test`: installs the locked dependencies on a fresh checkout
// (or after package-lock.json changed), so the README's two commands are all a newcomer needs.
import { execSync } from "node:child_process";
import { existsSync, statSync } from "node:fs";

const marker = "node_modules/.package-lock.json";
const stale = !existsSync(marker) || statSync(marker).mtimeMs < statSync("package-lock.json").mtimeMs;
if (stale) {
  console.error("x402-fleet: installing dependencies (npm ci)...");
  execSync("npm ci --no-audit --no-fund", { stdio: "inherit" });
}
