// Whether dist/ (scripts/build.mjs) was bundled from the TypeScript sources exactly as they are
// now: only then does the command run it. A source edited since, or no build, runs the sources
// through tsx instead, so nothing ever runs stale code.
import { createHash } from "node:crypto";
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";

/** The folders the bundle is made of (everything services/cli.ts can import). */
const SOURCE_DIRS = ["services", "operator"];

/** Packages bundled into dist/ rather than imported from node_modules (scripts/build.mjs): an upgrade makes the bundle stale too. */
const BUNDLED_PACKAGES = ["@x402/evm"];

/** A digest of every TypeScript source under the project root (paths and contents), and of the bundled packages' versions. */
export function sourcesDigest(root) {
  const hash = createHash("sha256");
  for (const pkg of BUNDLED_PACKAGES) {
    const manifest = join(root, "node_modules", pkg, "package.json");
    hash.update(`\0${pkg}\0`).update(existsSync(manifest) ? readFileSync(manifest) : "absent");
  }
  for (const dir of SOURCE_DIRS) {
    const files = readdirSync(join(root, dir), { recursive: true })
      .map(String)
      .filter((f) => f.endsWith(".ts"))
      .sort();
    for (const f of files) hash.update(`\0${dir}/${f}\0`).update(readFileSync(join(root, dir, f)));
  }
  return hash.digest("hex");
}

/** dist/cli.js when dist/ was built from the current sources; otherwise undefined. */
export function builtEntry(root) {
  let stamp;
  try {
    stamp = JSON.parse(readFileSync(join(root, "dist", "build.json"), "utf8"));
  } catch {
    return undefined; // never built (or a broken stamp): the sources
  }
  return stamp.sources === sourcesDigest(root) ? join(root, "dist", stamp.entry) : undefined;
}
