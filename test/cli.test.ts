// The command table: every command refuses a bad value, an unknown flag or an unknown command by
// name and exits non-zero before anything starts; `x402-fleet <command> --help` documents each flag.
import { afterEach, describe, expect, it, vi } from "vitest";
import { spawn } from "node:child_process";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { COMMANDS, main } from "../services/cli.ts";
import { missingDevnetTools } from "../services/devnet/config.ts";

const dir = mkdtempSync(join(tmpdir(), "x402-cli-"));
const table = join(dir, "routing.json");
writeFileSync(table, JSON.stringify({ backends: [] }));

interface Run {
  code: number | null;
  out: string;
  ms: number;
}

/** The binary with a clean environment; killed after 30 s, so a command that started shows as code null. */
function run(args: string[], env: Record<string, string> = {}): Promise<Run> {
  const started = Date.now();
  const child = spawn(process.execPath, ["bin/x402-fleet.js", ...args], { stdio: ["ignore", "pipe", "pipe"], env: { PATH: process.env.PATH ?? "", HOME: dir, LOG_LEVEL: "info", ...env } });
  let out = "";
  child.stdout.on("data", (d: Buffer) => (out += d.toString()));
  child.stderr.on("data", (d: Buffer) => (out += d.toString()));
  const timer = setTimeout(() => child.kill("SIGKILL"), 30_000);
  return new Promise((resolve) =>
    child.once("exit", (code) => {
      clearTimeout(timer);
      resolve({ code, out, ms: Date.now() - started });
    }),
  );
}

/** Two at a time: the machine has two cores. */
async function runAll(cases: { args: string[]; env?: Record<string, string> }[]): Promise<Run[]> {
  const results: Run[] = [];
  for (let i = 0; i < cases.length; i += 2) results.push(...(await Promise.all(cases.slice(i, i + 2).map((c) => run(c.args, c.env)))));
  return results;
}

const port = (name: string, got: string) => `${name} must be an integer from 0 to 65535, got "${got}"`;

// [command line, extra env, what the refusal must say]
const BAD_VALUES: [string[], Record<string, string>, string][] = [
  [["router", "--routing-table", table, "--port", "abc"], {}, port("--port", "abc")],
  [["router", "--routing-table", table, "--admin-port", "70000"], {}, port("--admin-port", "70000")],
  [["router", "--routing-table", table], { PORT: "http" }, port("PORT", "http")],
  [["facilitator", "--network", "eip155:8453", "--rpc-url", "http://127.0.0.1:1", "--port", "abc"], {}, port("--port", "abc")],
  [["facilitator", "--network", "eip155:8453", "--rpc-url", "http://127.0.0.1:1", "--admin-port", "1.5"], {}, port("--admin-port", "1.5")],
  [["facilitator", "--network", "base"], {}, '--network must be a CAIP-2 network id such as eip155:8453, got "base"'],
  [["facilitator", "--network", "eip155:8453", "--rpc-url", "ftp://rpc.example/SECRET"], {}, "--rpc-url must be an http(s) URL"],
  [["facilitator", "--schemes", "exact,nope"], {}, '--schemes must be one of exact, upto, batch-settlement, got "nope"'],
  [["facilitator", "--network", "eip155:8453", "--rpc-url", "http://127.0.0.1:1"], { X402_MAX_FEE_BUMPS: "many" }, 'X402_MAX_FEE_BUMPS must be a number, got "many"'],
  [["doctor", "--network", "eip155:8453", "--router-url", "router:4020"], {}, "--router-url must be an http(s) URL"],
  [["doctor", "--port", "abc"], {}, port("--port", "abc")],
  [["hub", "--port", "abc"], {}, port("--port", "abc")],
  [["hub", "--chain-id", "base"], {}, '--chain-id must be a non-negative integer, got "base"'],
  [["hub", "--rpc-url", "rpc.example"], {}, "--rpc-url must be an http(s) URL"],
  [["hub"], { HUB_QUOTA_BYTES: "lots" }, 'HUB_QUOTA_BYTES must be a non-negative integer, got "lots"'],
  [["wallets", "--master-key-file", "/nonexistent", "--port", "abc"], {}, port("--port", "abc")],
  [["wallets", "--master-key-file", "/nonexistent", "--admin-port=-1"], {}, port("--admin-port", "-1")],
  [["operator", "--facilitator-image", "x402-fleet:test", "--admin-port", "abc"], {}, port("--admin-port", "abc")],
  [["operator", "--facilitator-image", "x402-fleet:test"], { X402_LEASE_RENEW_DEADLINE_SECONDS: "20" }, "X402_LEASE_RENEW_DEADLINE_SECONDS (20) must be less than X402_LEASE_DURATION_SECONDS (15)"],
  [["operator", "--facilitator-image", "x402-fleet:test"], { X402_LEASE_RETRY_PERIOD_SECONDS: "9" }, "must be more than 1.2 × X402_LEASE_RETRY_PERIOD_SECONDS (9)"],
  [["operator", "--facilitator-image", "x402-fleet:test"], { X402_LEASE_DURATION_SECONDS: "15s" }, 'X402_LEASE_DURATION_SECONDS: "15s" is not a number of seconds'],
  [["devnet", "--port", "abc"], {}, port("--port", "abc")],
  [["devnet", "--networks", "eip155:8453,eip155:1"], {}, '--networks must be one of eip155:56, eip155:97, eip155:8453, eip155:84532, eip155:137, eip155:42161, got "eip155:1"'],
  [["pay", "--method", "card"], {}, '--method must be one of eip3009, permit2, got "card"'],
  [["pay", "--network", "base"], {}, '--network must be one of'],
  [["hub-upload", "--hub-url", "hub.example", "--key-file", "/nonexistent", "--id", "a", "--message", "m"], {}, "--hub-url must be an http(s) URL"],
  [["api-key-create", "--name", "co", "--requests-per-minute", "lots"], {}, '--requests-per-minute must be a non-negative integer or "none", got "lots"'],
  [["api-key-create", "--name", "co", "--networks", "base"], {}, '"base" is not a valid network'],
  [["api-key-limits", "--id", "0123456789abcdef", "--gas-budget", "eip155:8453=1e18"], {}, "--gas-budget takes NETWORK=WEI or NETWORK=none"],
  [["api-key-usage", "--since", "yesterday"], {}, "--since is a UTC day, YYYY-MM-DD"],
  [["api-key-rotate", "--id", "nope"], {}, "--id <16 hex characters> is required"],
  [["api-key-revoke"], {}, "--id <16 hex characters> is required"],
  [["api-key-webhook-key", "--id", "nope"], {}, "--id <16 hex characters> is required"],
  [["api-key-list", "--admin-url", "router:9420"], {}, "--admin-url must be an http(s) URL"],
];

describe("x402-fleet refuses bad input by name, before anything starts", () => {
  it("a bad value of every command that takes values", { timeout: 240_000 }, async () => {
    const results = await runAll(BAD_VALUES.map(([args, env]) => ({ args, env })));
    const failures = BAD_VALUES.flatMap(([args, env], i) => {
      const r = results[i]!;
      const refused = r.code !== null && r.code !== 0 && r.out.includes(BAD_VALUES[i]![2]) && !/listening|started/.test(r.out);
      return refused ? [] : [`${JSON.stringify(env)} ${args.join(" ")} → exit ${r.code} after ${r.ms} ms: ${r.out.trim()}`];
    });
    expect(failures).toEqual([]);
    // the values above reach the commands' checks, not their required-flag checks
    expect(BAD_VALUES.map(([args]) => args[0])).toEqual(expect.arrayContaining(COMMANDS.filter((c) => Object.keys(c.flags).length).map((c) => c.name)));
  });

  it("an unknown flag, a stray argument, an unknown command and no command", { timeout: 120_000 }, async () => {
    const cases = [
      { args: ["router", "--routing-table", table, "--network", "eip155:8453"], says: "router: unknown flag --network (x402-fleet router --help lists its flags)" },
      { args: ["hub", "4030"], says: 'hub: unexpected argument "4030"' },
      { args: ["api-key-list", "--id", "0123456789abcdef"], says: "api-key-list: unknown flag --id" },
      { args: ["routr"], says: "unknown command: routr" },
      { args: [], says: "no command given" },
    ];
    const results = await runAll(cases);
    cases.forEach((c, i) => {
      expect(results[i]!.code, c.args.join(" ")).toBe(2);
      expect(results[i]!.out).toContain(c.says);
    });
  });
});

describe("x402-fleet help", () => {
  let printed = "";
  const capture = () => {
    printed = "";
    vi.spyOn(process.stdout, "write").mockImplementation((chunk) => {
      printed += String(chunk);
      return true;
    });
  };
  afterEach(() => vi.restoreAllMocks());

  it("<command> --help prints that command's flags and starts nothing", async () => {
    for (const command of COMMANDS) {
      capture();
      await main([command.name, "--help", "--port", "abc"]);
      vi.restoreAllMocks();
      expect(printed.startsWith(`x402-fleet ${command.name}: `), command.name).toBe(true);
      for (const flag of Object.keys(command.flags)) expect(printed, `${command.name} --${flag}`).toContain(`--${flag}`);
      expect(process.exitCode ?? 0).toBe(0);
    }
  });

  it("help lists every command; the binary's --help exits 0", { timeout: 60_000 }, async () => {
    capture();
    await main(["help"]);
    vi.restoreAllMocks();
    for (const command of COMMANDS) expect(printed).toContain(`  ${command.name} `);
    const [bin] = await runAll([{ args: ["router", "--help"] }]);
    expect(bin!.code).toBe(0);
    expect(bin!.out).toContain("--routing-table FILE");
  });
});

describe("x402-fleet devnet outside a checkout", () => {
  it("names the development-only tools it lacks (the image removes anvil, solc and @uniswap/v4-periphery) before starting anything", async () => {
    expect(missingDevnetTools()).toEqual([]); // this checkout has them
    const absent = (id: string): string => {
      throw new Error(`Cannot find module '${id}'`);
    };
    expect(missingDevnetTools(absent, "")).toEqual(["anvil (@foundry-rs/anvil-linux-amd64, or anvil on PATH)", "solc", "@uniswap/v4-periphery"]);
    expect(missingDevnetTools(absent, `${dir}`)).toHaveLength(3); // no anvil on that PATH either
  });
});
