// The container image, without a Docker engine (there is none here): the Dockerfile's shape (glibc
// base, production dependencies only, non-root, the CLI as entrypoint), and what one image for
// every subcommand needs: every module the `x402-fleet` command can load, dynamic imports of every
// subcommand included, is inside what the Dockerfile copies, and every package it imports is a
// production (or optional) dependency, so `npm ci --omit=dev` is enough.
import { readFileSync } from "node:fs";
import { builtinModules } from "node:module";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { build } from "esbuild";
import { ROOT, one, render } from "./helpers/helm.ts";

const dockerfile = readFileSync(join(ROOT, "Dockerfile"), "utf8");
const pkg = JSON.parse(readFileSync(join(ROOT, "package.json"), "utf8")) as { dependencies: Record<string, string>; optionalDependencies?: Record<string, string>; devDependencies: Record<string, string> };

interface Stage {
  from: string;
  name?: string;
  instructions: { op: string; args: string }[];
}

/** FROM-separated stages of the Dockerfile, with line continuations joined and ARG defaults substituted. */
function stages(): Stage[] {
  const lines = dockerfile.replace(/\\\n/g, " ").split("\n").map((l) => l.trim()).filter((l) => l && !l.startsWith("#"));
  const args: Record<string, string> = {};
  const out: Stage[] = [];
  for (const line of lines) {
    const [op, ...rest] = line.split(/\s+/);
    const argsText = rest.join(" ").replace(/\$\{(\w+)\}/g, (_m, k: string) => args[k] ?? "");
    if (op === "ARG" && out.length === 0) {
      const [k, v] = argsText.split("=");
      args[k!] = v ?? "";
    } else if (op === "FROM") {
      const m = /^(\S+)(?:\s+AS\s+(\S+))?/i.exec(argsText)!;
      out.push({ from: m[1]!, name: m[2], instructions: [] });
    } else {
      out.at(-1)?.instructions.push({ op: op!, args: argsText });
    }
  }
  return out;
}

describe("the Dockerfile", () => {
  const all = stages();
  const runtime = all.at(-1)!;
  const of = (s: Stage, op: string) => s.instructions.filter((i) => i.op === op).map((i) => i.args);

  it("is multi-stage: dependencies installed for production in a full glibc image, copied into a slim glibc one", () => {
    expect(all.length).toBeGreaterThanOrEqual(2);
    const deps = all[0]!;
    expect(deps.from).toMatch(/^node:20(\.\d+)*-bookworm$/); // compilers for native addons (secp256k1)
    expect(runtime.from).toMatch(/^node:20(\.\d+)*-bookworm-slim$/); // glibc, like the deps stage: native addons run as built
    expect(of(deps, "RUN").join(" ")).toMatch(/npm ci --omit=dev/);
    expect(of(deps, "COPY").join(" ")).toMatch(/package\.json package-lock\.json \.npmrc/);
    expect(of(runtime, "COPY")).toContain(`--from=${deps.name} /app/node_modules ./node_modules`);
    expect(of(runtime, "RUN")).toEqual([]); // nothing installed or built in the final image
    // The bundle the pods run (no TypeScript loader) is built beside the dependencies and copied.
    expect(of(deps, "RUN").some((r) => r.startsWith("node scripts/build.mjs"))).toBe(true);
    expect(of(runtime, "COPY")).toContain(`--from=${deps.name} /app/dist ./dist`);
  });

  it("fails the dependencies stage where `npm ci` failed, even when npm exits 0 (\"Exit handler never called!\")", () => {
    const install = of(all[0]!, "RUN").find((r) => r.includes("npm ci"))!;
    // in the same RUN, after npm ci: npm's record of the tree and every direct dependency must be there
    const check = install.slice(install.indexOf("npm ci"));
    expect(check).toMatch(/^npm ci [^&]*&& node -e '[^']*process\.exit\(1\)/);
    const script = /node -e '([^']*)'/.exec(check)![1]!;
    expect(script).toContain("node_modules/.package-lock.json");
    expect(script).toContain('require("./package.json").dependencies');
  });

  it("needs no BuildKit frontend from a registry (no `# syntax=` line)", () => {
    expect(dockerfile).not.toMatch(/^#\s*syntax\s*=/m);
  });

  it("leaves the devnet-only packages out of the image, which only services/devnet loads", async () => {
    const DEVNET_ONLY = ["@foundry-rs", "solc", "@uniswap/v4-periphery"];
    const build = of(all[0]!, "RUN").find((r) => r.startsWith("node scripts/build.mjs"))!;
    for (const p of DEVNET_ONLY) expect(build).toContain(`node_modules/${p}`);
    expect(build.indexOf("rm -rf")).toBeGreaterThan(build.indexOf("node scripts/build.mjs")); // after the bundle is built
    const { readdirSync } = await import("node:fs");
    const sources = (dir: string): string[] =>
      readdirSync(join(ROOT, dir), { withFileTypes: true }).flatMap((e) => (e.isDirectory() ? sources(`${dir}/${e.name}`) : e.name.endsWith(".ts") ? [`${dir}/${e.name}`] : []));
    const loaders = [...sources("services"), ...sources("operator")].filter((f) => DEVNET_ONLY.some((p) => new RegExp(`["'\`]${p.replace("/", "\\/")}["'/]`).test(readFileSync(join(ROOT, f), "utf8"))));
    expect(loaders.filter((f) => !f.startsWith("services/devnet/"))).toEqual([]);
  });

  it("runs the x402-fleet command as a non-root uid, the chart's", () => {
    const user = of(runtime, "USER").at(-1)!;
    expect(user).toMatch(/^\d+:\d+$/); // numeric: runAsNonRoot can verify it
    expect(user).not.toMatch(/^0:/);
    expect(of(runtime, "ENTRYPOINT")).toEqual(['["node", "/app/bin/x402-fleet.js"]']);
    const docs = render();
    for (const name of ["router", "operator", "hub"]) {
      const pod = (one(docs, "Deployment", `fleet-x402-fleet-${name}`).spec as { template: { spec: { securityContext: { runAsUser: number; runAsGroup: number } } } }).template.spec;
      expect(`${pod.securityContext.runAsUser}:${pod.securityContext.runAsGroup}`).toBe(user);
    }
    // the facilitator pods the operator creates use the same uid and the image's entrypoint
    const builders = readFileSync(join(ROOT, "operator", "builders.ts"), "utf8");
    expect(builders).toContain(`runAsUser: ${user.split(":")[0]}`);
    expect(builders).toContain(`args: ["facilitator"]`);
  });

  it("keeps the writable places outside the root filesystem (TMPDIR, HOME and the embedded stores' defaults on /tmp)", () => {
    const env = of(runtime, "ENV").join(" ");
    expect(env).toContain("TMPDIR=/tmp");
    expect(env).toContain("HOME=/tmp");
    // the sources default to .data/... in the working directory, the read-only /app: each service's variable, set
    for (const [variable, config] of [["X402_DATA_DIR", "services/facilitator/config.ts"], ["X402_ROUTER_DATA_DIR", "services/router/config.ts"], ["HUB_DATA_DIR", "services/hub/config.ts"], ["WALLETS_DATA_DIR", "services/wallets/config.ts"]] as const) {
      expect(readFileSync(join(ROOT, config), "utf8")).toContain(`env.${variable}`);
      expect(env).toMatch(new RegExp(`${variable}=/tmp/x402-fleet/\\w+`));
    }
    expect(env).toContain('NODE_OPTIONS="--max-semi-space-size=4"'); // the young generation the bench measures with
  });

  it("has every module the command can load, and only production dependencies", async () => {
    const copied = of(runtime, "COPY").filter((c) => !c.startsWith("--from")).map((c) => c.split(/\s+/)[0]!);
    expect(copied).toEqual(expect.arrayContaining(["package.json", "bin", "services", "operator"]));
    const result = await build({
      entryPoints: [join(ROOT, "bin", "x402-fleet.js")],
      absWorkingDir: ROOT,
      bundle: true,
      platform: "node",
      format: "esm",
      packages: "external",
      metafile: true,
      write: false,
      outdir: join(ROOT, ".tools", "esbuild-unused"),
      logLevel: "silent",
    });
    const local = Object.keys(result.metafile.inputs);
    expect(local).toContain("services/cli.ts");
    expect(local).toContain("operator/main.ts"); // the dynamic import of a subcommand is followed
    expect(local.filter((f) => !copied.some((dir) => f === dir || f.startsWith(`${dir}/`)))).toEqual([]);
    const packages = new Set(
      Object.values(result.metafile.outputs)
        .flatMap((o) => o.imports.filter((i) => i.external).map((i) => i.path))
        .filter((p) => !p.startsWith("node:") && !builtinModules.includes(p))
        .map((p) => (p.startsWith("@") ? p.split("/").slice(0, 2).join("/") : p.split("/")[0]!)),
    );
    expect(packages.has("tsx")).toBe(true);
    const production = { ...pkg.dependencies, ...pkg.optionalDependencies };
    expect([...packages].filter((p) => !(p in production))).toEqual([]);
  });

  it("has a .dockerignore that keeps the build context small without dropping what the image copies", () => {
    const ignored = readFileSync(join(ROOT, ".dockerignore"), "utf8").split("\n").map((l) => l.trim()).filter((l) => l && !l.startsWith("#"));
    expect(ignored).toEqual(expect.arrayContaining(["**/node_modules", ".git", "test", ".tools"]));
    for (const needed of ["package.json", "package-lock.json", ".npmrc", "bin", "services", "operator"]) expect(ignored).not.toContain(needed);
    expect(ignored.indexOf("!scripts/build.mjs")).toBeGreaterThan(ignored.indexOf("scripts")); // the deps stage builds the bundle
  });
});
