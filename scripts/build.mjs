// npm run build: bundles the services into dist/ with esbuild (packages stay imports of
// node_modules). A service started from the bundle runs without tsx's loader, a hooks thread per
// process that costs about 40 MB of resident memory (bench: the facilitator 313 → 276 MB, the
// router 113 → 97 MB). bin/x402-fleet.js runs the bundle only while it matches the sources
// (bin/built.mjs); the image, `npm start`, `npm test` and `npm run bench` build it first.
import { build } from "esbuild";
import { existsSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { join, sep } from "node:path";
import { fileURLToPath } from "node:url";
import { sourcesDigest } from "../bin/built.mjs";

const root = fileURLToPath(new URL("..", import.meta.url));

// Packages stay imports of node_modules, except @x402/evm: bundled, so that its import of viem can
// be the shim that recovers signatures natively (services/facilitator/crypto/viem-for-mechanisms.ts).
const MECHANISMS = `${sep}node_modules${sep}@x402${sep}evm${sep}`;
const VIEM_FOR_MECHANISMS = join(root, "services/facilitator/crypto/viem-for-mechanisms.ts");
// Its own imports resolve from the root node_modules once bundled: a nested copy it depends on would be swapped silently.
if (existsSync(join(root, "node_modules/@x402/evm/node_modules"))) throw new Error("node_modules/@x402/evm has nested dependencies; the bundle would not use them (scripts/build.mjs)");
const packagesExceptMechanisms = {
  name: "packages-except-mechanisms",
  setup(b) {
    b.onResolve({ filter: /^[^./]/ }, (args) => {
      if (args.path === "viem" && args.importer.includes(MECHANISMS)) return { path: VIEM_FOR_MECHANISMS };
      if (args.path === "@x402/evm" || args.path.startsWith("@x402/evm/")) return undefined; // bundled
      return { path: args.path, external: true };
    });
  },
};
const sources = sourcesDigest(root);
// Built beside dist/ and swapped in whole: a process starting meanwhile runs the old bundle, the new
// one, or (between the two renames) the sources; never half a bundle.
const staging = join(root, `dist.${process.pid}.tmp`);
rmSync(staging, { recursive: true, force: true });
try {
  await build({
    entryPoints: [join(root, "services/cli.ts")],
    outdir: staging,
    bundle: true,
    // Each command's service stays a chunk of its own, loaded only by that command (as the sources' dynamic imports).
    splitting: true,
    format: "esm",
    platform: "node",
    target: "node20",
    plugins: [packagesExceptMechanisms],
    logLevel: "warning",
  });
  writeFileSync(join(staging, "build.json"), JSON.stringify({ sources, entry: "cli.js" }) + "\n");
  rmSync(join(root, "dist"), { recursive: true, force: true });
  renameSync(staging, join(root, "dist"));
} finally {
  // A failed build, or a concurrent one that swapped its dist/ in first, leaves no staging folder behind.
  rmSync(staging, { recursive: true, force: true });
}
