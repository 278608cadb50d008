// Docs as tests: every block of README.md and docs/ that a reader could paste is marked runnable or
// illustration, and every runnable one runs against a real devnet and prints what the page says.
// The commands run in a scratch directory laid out like the repository root (`.devnet/devnet.json`,
// `examples/`), with `npx x402-fleet` and `npx tsx` resolving to this checkout as they do in it, and
// the devnet's documented addresses (127.0.0.1:4020...) pointed at the test devnet's free ports.
import { chmod, mkdir, mkdtemp, readdir, readFile, rm, symlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join, relative, resolve } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { NETWORKS } from "../services/x402/networks.ts";
import { compareOutput, describeFailures, MARKED_LANGUAGES, parseBlocks, runShellBlock, stepsOf, type DocBlock } from "./helpers/doc-blocks.ts";
import { startTestDevnet } from "./helpers/devnet.ts";

const ROOT = resolve(import.meta.dirname, "..");

async function markdownPages(): Promise<string[]> {
  const walk = async (dir: string): Promise<string[]> =>
    (await readdir(join(ROOT, dir), { withFileTypes: true })).flatMap((e) => (e.isDirectory() ? [] : e.name.endsWith(".md") ? [join(dir, e.name)] : [])).concat(
      ...(await Promise.all((await readdir(join(ROOT, dir), { withFileTypes: true })).filter((e) => e.isDirectory()).map((e) => walk(join(dir, e.name))))),
    );
  return ["README.md", ...(await walk("docs")).sort()];
}

const pages = await markdownPages();
const blocks: DocBlock[] = (await Promise.all(pages.map(async (p) => parseBlocks(p, await readFile(join(ROOT, p), "utf8"))))).flat();
const runnableShell = blocks.filter((b) => b.mark === "run" && ["sh", "bash", "shell", "console"].includes(b.lang));

describe("docs: every block a reader could paste says whether it runs", () => {
  it("finds the pages and their runnable blocks", () => {
    expect(pages).toEqual(expect.arrayContaining(["README.md", "docs/hub.md", "docs/wallets.md", "docs/schemes/exact.md"]));
    expect(runnableShell.map((b) => b.page)).toEqual(expect.arrayContaining(["README.md", "docs/hub.md", "docs/wallets.md", "docs/metrics.md", "docs/schemes/exact.md", "docs/schemes/upto.md", "docs/schemes/batch-settlement.md"]));
    // npm start serves discovery, and API keys on the devnet started with --api-keys (issue 35)
    expect(runnableShell.some((b) => b.body.includes("/v2/discovery/resources"))).toBe(true);
    expect(runnableShell.filter((b) => b.devnet === "api-keys").map((b) => b.page)).toContain("docs/tenants.md");
  });

  it("marks every shell and TypeScript block `run` or `illustration`", () => {
    const unmarked = blocks.filter((b) => MARKED_LANGUAGES.has(b.lang) && !b.mark).map((b) => `${b.page}:${b.line} (${b.lang})`);
    expect(unmarked).toEqual([]);
  });

  it("shows a runnable TypeScript block as a file of examples/, byte for byte, and some runnable command runs it", async () => {
    const ts = blocks.filter((b) => b.mark === "run" && ["ts", "typescript", "js", "javascript"].includes(b.lang));
    expect(ts.length).toBeGreaterThan(0);
    for (const b of ts) {
      expect(b.file, `${b.page}:${b.line}: a runnable TypeScript block names its file (file=examples/...)`).toMatch(/^examples\/[\w.-]+\.ts$/);
      expect(b.body, `${b.page}:${b.line} differs from ${b.file}`).toBe(await readFile(join(ROOT, b.file!), "utf8"));
      const runs = runnableShell.some((s) => stepsOf(s.body).some((step) => step.command.includes(`tsx ${b.file}`)));
      expect(runs, `${b.page}:${b.line}: no runnable block runs ${b.file}`).toBe(true);
    }
  });
});

describe("docs: the output comparison", () => {
  it("compares JSON field by field, ignoring key order, with … for what varies", () => {
    expect(compareOutput('{"a":1,"b":"0x…"}', '{"b":"0x12","a":1}')).toEqual([]);
    expect(compareOutput('{"a":1,"b":"0x…"}', '{"b":"12","a":1}')).not.toEqual([]);
    expect(compareOutput('{"a":1}', '{"a":1,"c":2}')).toEqual(["$.c: not documented (2)"]);
    expect(compareOutput('{"a":1,"…":"…"}', '{"a":1,"c":2}')).toEqual([]);
    expect(compareOutput('{"a":1,"b":2}', '{"a":1}')).toEqual(["$.b: missing"]);
    expect(compareOutput('{"kinds":[…],"n":{…}}', '{"kinds":[1,2],"n":{"x":1}}')).toEqual([]);
    expect(compareOutput('{"isValid":false}', '{"isValid":true}')).not.toEqual([]);
  });

  it("compares text line by line, … inside a line and as whole lines", () => {
    expect(compareOutput("request 1: 200, transaction 0x…", "request 1: 200, transaction 0xabc")).toEqual([]);
    expect(compareOutput("a\n…\nz", "a\nb\nc\nz")).toEqual([]);
    expect(compareOutput("a\nb", "a")).not.toEqual([]);
    expect(compareOutput("a", "a\nb")).not.toEqual([]);
  });
});

/** A devnet the blocks run on, and the scratch directory laid out like the repository root around it. */
interface DocsDevnet {
  devnet: Awaited<ReturnType<typeof startTestDevnet>>;
  scratch: string;
  env: NodeJS.ProcessEnv;
  addresses: Map<string, string>;
}

/** The devnets blocks may ask for (`devnet=...`): the default one, and one whose router requires API keys. */
const DEVNET_VARIANTS: Record<string, { networks: (typeof NETWORKS)[number]["network"][]; opts: Parameters<typeof startTestDevnet>[1] }> = {
  default: { networks: ["eip155:8453", "eip155:56"], opts: {} },
  "api-keys": { networks: ["eip155:8453"], opts: { apiKeys: true, hub: false, wallets: false } },
};

async function startDocsDevnet(variant: string): Promise<DocsDevnet> {
  const { networks, opts } = DEVNET_VARIANTS[variant]!;
  const devnet = await startTestDevnet(networks, opts);
  const info = devnet.info;
  const addresses = new Map<string, string>();
  const origin = (url: string | null) => (url ? new URL(url).origin : "");
  // The devnet's documented ports (npm start: router 4020, admin +100, hub +10, wallets +20,
  // facilitator of the i-th network +101+i, its admin +301+i) → the test devnet's.
  addresses.set("4020", origin(info.routerUrl)).set("4120", origin(info.routerAdminUrl));
  addresses.set("4030", origin(info.hubUrl)).set("4130", origin(info.hubAdminUrl));
  addresses.set("4040", origin(info.walletsUrl)).set("4140", origin(info.walletsAdminUrl));
  for (const n of info.networks) {
    const i = NETWORKS.findIndex((x) => x.network === n.network);
    addresses.set(String(4121 + i), origin(n.facilitatorUrl)).set(String(4321 + i), origin(n.adminUrl));
  }
  const scratch = await mkdtemp(join(tmpdir(), "x402-docs-"));
  await symlink(devnet.dir, join(scratch, ".devnet"));
  await symlink(join(ROOT, "examples"), join(scratch, "examples"));
  // `npx <bin>` as in the repository: this checkout's binaries, nothing downloaded.
  await mkdir(join(scratch, ".bin"));
  await writeFile(
    join(scratch, ".bin", "npx"),
    [
      "#!/usr/bin/env bash",
      'case "$1" in',
      `  x402-fleet) shift; exec node ${JSON.stringify(join(ROOT, "bin", "x402-fleet.js"))} "$@";;`,
      `  tsx) shift; exec ${JSON.stringify(join(ROOT, "node_modules", ".bin", "tsx"))} "$@";;`,
      '  *) echo "docs test: npx $1 is not a binary of this repository" >&2; exit 127;;',
      "esac",
      "",
    ].join("\n"),
  );
  await chmod(join(scratch, ".bin", "npx"), 0o755);
  const env = { ...process.env, PATH: `${join(scratch, ".bin")}:${process.env.PATH}`, LOG_LEVEL: "warn" };
  return { devnet, scratch, env, addresses };
}

describe("docs: every runnable block runs on a devnet as written", () => {
  const devnets = new Map<string, Promise<DocsDevnet>>();
  /** A variant's devnet, started when a block first needs it. */
  const devnetFor = (variant = "default") => {
    if (!DEVNET_VARIANTS[variant]) throw new Error(`no devnet variant ${variant} (devnet=${Object.keys(DEVNET_VARIANTS).join("|")})`);
    if (!devnets.has(variant)) devnets.set(variant, startDocsDevnet(variant));
    return devnets.get(variant)!;
  };

  beforeAll(async () => {
    await devnetFor();
  }, 150_000);

  afterAll(async () => {
    for (const started of devnets.values()) {
      const d = await started.catch(() => undefined);
      await d?.devnet.stop();
      if (d?.scratch) await rm(d.scratch, { recursive: true, force: true });
    }
  });

  const run = async (body: string, variant?: string) => {
    const { scratch, env, addresses } = await devnetFor(variant);
    return runShellBlock(body, { cwd: scratch, env, addresses, timeoutMs: 120_000 });
  };

  for (const block of runnableShell) {
    it(`${block.page}:${block.line}`, { timeout: 150_000 }, async () => {
      const result = await run(block.body, block.devnet);
      expect(describeFailures(result), `${relative(ROOT, join(ROOT, block.page))}:${block.line}`).toBe("");
    });
  }

  it("fails a page that drifted: a wrong documented answer, and a command that no longer works", { timeout: 150_000 }, async () => {
    const tryIt = runnableShell.find((b) => b.page === "README.md" && b.body.includes("--body-only"));
    expect(tryIt).toBeDefined();
    const original = tryIt!.body;
    const documented = '/v2/verify\n# {"isValid":true';
    expect(original).toContain(documented);

    const wrongAnswer = await run(original.replace(documented, '/v2/verify\n# {"isValid":false'));
    const verify = wrongAnswer.steps.find((s) => s.step.command.includes("/v2/verify"))!;
    expect(verify.output).toContain('"isValid":true'); // the command worked ...
    expect(verify.problems.join("\n")).toContain("$.isValid"); // ... and the page was wrong about it
    expect(describeFailures(wrongAnswer)).not.toBe("");

    const broken = await run(original.replaceAll("--amount 10000", "--amount ten"));
    const first = broken.steps.findIndex((s) => s.step.command.includes("--amount ten"));
    expect(broken.steps[first]!.problems[0]).toMatch(/exited with status [1-9]/);
    expect(broken.steps.slice(first + 1).every((s) => s.problems.includes("not reached"))).toBe(true);
  });
});
