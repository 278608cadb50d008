// The bundle (scripts/build.mjs, dist/): the command runs it only while it was built from the
// sources as they are, and a service started from it says so in x402_build_info.
import { spawn, execFileSync, type ChildProcess } from "node:child_process";
import { mkdtemp, mkdir, readdir, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { builtEntry, sourcesDigest } from "../bin/built.mjs";
import { ROOT } from "./helpers/helm.ts";

const children: ChildProcess[] = [];
const dirs: string[] = [];
afterEach(async () => {
  for (const c of children.splice(0)) c.kill("SIGKILL");
  for (const d of dirs.splice(0)) await rm(d, { recursive: true, force: true });
});

async function project(): Promise<string> {
  const root = await mkdtemp(join(tmpdir(), "x402-build-"));
  dirs.push(root);
  await mkdir(join(root, "services", "router"), { recursive: true });
  await mkdir(join(root, "operator"), { recursive: true });
  await mkdir(join(root, "dist"));
  await writeFile(join(root, "services", "cli.ts"), "export const a = 1;\n");
  await writeFile(join(root, "services", "router", "router.ts"), "export const b = 2;\n");
  await writeFile(join(root, "operator", "main.ts"), "export const c = 3;\n");
  return root;
}
const stamp = (root: string, sources: string) => writeFile(join(root, "dist", "build.json"), JSON.stringify({ sources, entry: "cli.js" }));

describe("the bundle", () => {
  it("is run only while it was built from the sources as they are: an edit, a new file or no stamp runs the sources", async () => {
    const root = await project();
    expect(builtEntry(root)).toBeUndefined(); // never built
    await stamp(root, sourcesDigest(root));
    expect(builtEntry(root)).toBe(join(root, "dist", "cli.js"));

    await writeFile(join(root, "services", "router", "router.ts"), "export const b = 3;\n");
    expect(builtEntry(root)).toBeUndefined(); // a source edited since the build
    await stamp(root, sourcesDigest(root));
    expect(builtEntry(root)).toBeDefined();

    await writeFile(join(root, "operator", "new.ts"), "export {};\n");
    expect(builtEntry(root)).toBeUndefined(); // a source added
    await writeFile(join(root, "dist", "build.json"), "{not json");
    expect(builtEntry(root)).toBeUndefined();
  });

  it("is stale when a package bundled into it (@x402/evm) changes version", async () => {
    const root = await project();
    await mkdir(join(root, "node_modules", "@x402", "evm"), { recursive: true });
    await writeFile(join(root, "node_modules", "@x402", "evm", "package.json"), JSON.stringify({ name: "@x402/evm", version: "2.27.0" }));
    await stamp(root, sourcesDigest(root));
    expect(builtEntry(root)).toBe(join(root, "dist", "cli.js"));
    await writeFile(join(root, "node_modules", "@x402", "evm", "package.json"), JSON.stringify({ name: "@x402/evm", version: "2.28.0" }));
    expect(builtEntry(root)).toBeUndefined();
  });

  it("serves from dist/: the router started by the command reports runtime bundle", async () => {
    if (!builtEntry(ROOT)) execFileSync(process.execPath, ["scripts/build.mjs"], { cwd: ROOT, stdio: "inherit" });
    expect(builtEntry(ROOT)).toBe(join(ROOT, "dist", "cli.js"));
    const dir = await mkdtemp(join(tmpdir(), "x402-build-run-"));
    dirs.push(dir);
    await writeFile(join(dir, "routing.json"), JSON.stringify({ backends: [] }));
    const child = spawn(process.execPath, ["bin/x402-fleet.js", "router", "--routing-table", join(dir, "routing.json"), "--port", "0", "--admin-port", "0"], { cwd: ROOT, env: { ...process.env, LOG_LEVEL: "info" }, stdio: ["ignore", "pipe", "pipe"] });
    children.push(child);
    let out = "";
    child.stdout!.on("data", (d: Buffer) => (out += d.toString()));
    child.stderr!.on("data", (d: Buffer) => (out += d.toString()));
    let admin: string | undefined;
    for (let i = 0; i < 300 && !admin; i++) {
      admin = /"admin":"(http:\/\/127\.0\.0\.1:\d+)"/.exec(out)?.[1];
      if (!admin) await new Promise((r) => setTimeout(r, 50));
    }
    expect(admin, out.slice(-500)).toBeDefined();
    const metrics = await (await fetch(`${admin}/metrics`)).text();
    expect(metrics).toMatch(/^x402_build_info\{runtime="bundle",node="v\d+\.\d+\.\d+"[^}]*\} 1$/m);
  });

  it("gives the bundled @x402/evm mechanisms native signature recovery: their viem is the shim", async () => {
    if (!builtEntry(ROOT)) execFileSync(process.execPath, ["scripts/build.mjs"], { cwd: ROOT, stdio: "inherit" });
    const chunks = await Promise.all((await readdir(join(ROOT, "dist"))).filter((f) => f.endsWith(".js")).map((f) => readFile(join(ROOT, "dist", f), "utf8")));
    const mechanisms = chunks.find((c) => c.includes("async function verifyECDSA("));
    expect(mechanisms, "the exact mechanism is bundled").toBeDefined();
    // Its signature check calls the shim's recovery (secp256k1.ts), not viem's pure-JS one.
    const body = mechanisms!.slice(mechanisms!.indexOf("async function verifyECDSA("), mechanisms!.indexOf("async function verifyERC1271("));
    expect(body).toMatch(/await recoverAddress\(\{ hash: digest, signature \}\)/);
    expect(mechanisms).toContain("// services/facilitator/crypto/viem-for-mechanisms.ts");
    for (const c of chunks) expect(c).not.toMatch(/import \{[^}]*\brecoverAddress\s*[,}][^;]*from "viem"/);
  });
});
