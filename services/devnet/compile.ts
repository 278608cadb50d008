// Compiles the devnet's own Solidity (services/devnet/contracts/*.sol) in-process with solc-js and
// caches the artifacts under node_modules/.cache/x402-fleet/, keyed by the sources, the compiler
// version and the settings, so every later call (and every later process) skips the ~1 s compile.
import { createHash } from "node:crypto";
import { existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import type { Abi, Hex } from "viem";

export interface CompiledContract {
  abi: Abi;
  bytecode: Hex;
  deployedBytecode: Hex;
}

export type CompiledContracts = Record<string, CompiledContract>;

/** Cancun: transient storage (EIP-1153) is used; anvil 1.7 defaults to a later fork, so it runs there. */
export const DEVNET_EVM_VERSION = "cancun";

// Beside this file in the sources; bundled, this runs from dist/ and they stay in the sources' folder.
const HERE = dirname(fileURLToPath(import.meta.url));
const CONTRACTS_DIR = existsSync(join(HERE, "contracts")) ? join(HERE, "contracts") : join(HERE, "..", "services", "devnet", "contracts");
const CACHE_FORMAT = 1;
const CACHE_PREFIX = "devnet-contracts-";

const SETTINGS = {
  optimizer: { enabled: true, runs: 200 },
  evmVersion: DEVNET_EVM_VERSION,
  outputSelection: { "*": { "*": ["abi", "evm.bytecode.object", "evm.deployedBytecode.object"] } },
} as const;

interface SolcError {
  severity: "error" | "warning" | "info";
  formattedMessage?: string;
  message: string;
}

interface SolcOutput {
  errors?: SolcError[];
  contracts?: Record<string, Record<string, { abi: Abi; evm: { bytecode: { object: string }; deployedBytecode: { object: string } } }>>;
}

interface CacheFile {
  format: number;
  key: string;
  solcVersion: string;
  contracts: CompiledContracts;
}

const require = createRequire(import.meta.url);

function solcPackageVersion(): string {
  return (require("solc/package.json") as { version: string }).version;
}

function cacheDir(): string {
  // <project>/node_modules/solc/package.json -> <project>/node_modules/.cache/x402-fleet
  const nodeModules = dirname(dirname(require.resolve("solc/package.json")));
  return join(nodeModules, ".cache", "x402-fleet");
}

function readSources(): Record<string, string> {
  const files = readdirSync(CONTRACTS_DIR)
    .filter((f) => f.endsWith(".sol"))
    .sort();
  if (files.length === 0) throw new Error(`no .sol files in ${CONTRACTS_DIR}`);
  return Object.fromEntries(files.map((f) => [f, readFileSync(join(CONTRACTS_DIR, f), "utf8")]));
}

function cacheKey(sources: Record<string, string>, solcVersion: string): string {
  const h = createHash("sha256");
  h.update(JSON.stringify({ format: CACHE_FORMAT, solcVersion, settings: SETTINGS }));
  for (const [name, content] of Object.entries(sources)) {
    h.update(`\0${name}\0`);
    h.update(content);
  }
  return h.digest("hex");
}

function readCache(file: string, key: string): CompiledContracts | undefined {
  try {
    const parsed = JSON.parse(readFileSync(file, "utf8")) as CacheFile;
    if (parsed.format === CACHE_FORMAT && parsed.key === key) return parsed.contracts;
  } catch {
    // missing or unreadable: compile
  }
  return undefined;
}

function writeCache(file: string, data: CacheFile): void {
  try {
    mkdirSync(dirname(file), { recursive: true });
    const tmp = `${file}.${process.pid}.tmp`;
    writeFileSync(tmp, JSON.stringify(data));
    renameSync(tmp, file); // atomic: parallel processes never read a half-written file
    for (const old of readdirSync(dirname(file))) {
      if (old.startsWith(CACHE_PREFIX) && old.endsWith(".json") && join(dirname(file), old) !== file) {
        rmSync(join(dirname(file), old), { force: true }); // artifacts of older sources
      }
    }
  } catch {
    // read-only node_modules: still correct, only slower next time
  }
}

async function compile(sources: Record<string, string>): Promise<{ solcVersion: string; contracts: CompiledContracts }> {
  const solc = (await import("solc")).default as { version(): string; compile(input: string, opts?: unknown): string };
  const input = {
    language: "Solidity",
    sources: Object.fromEntries(Object.entries(sources).map(([name, content]) => [name, { content }])),
    settings: SETTINGS,
  };
  const missing: string[] = [];
  const output = JSON.parse(
    solc.compile(JSON.stringify(input), {
      import: (path: string) => {
        missing.push(path);
        return { error: `imports from outside services/devnet/contracts are not allowed: ${path}` };
      },
    }),
  ) as SolcOutput;
  const errors = (output.errors ?? []).filter((e) => e.severity === "error");
  if (errors.length > 0 || missing.length > 0) {
    const text = errors.map((e) => (e.formattedMessage ?? e.message).trim()).join("\n\n");
    throw new Error(`solc ${solc.version()} failed to compile ${CONTRACTS_DIR}:\n${text}`);
  }
  const contracts: CompiledContracts = {};
  for (const [file, byName] of Object.entries(output.contracts ?? {})) {
    for (const [name, c] of Object.entries(byName)) {
      if (!c.evm.bytecode.object) continue; // interfaces and abstract contracts
      if (contracts[name]) throw new Error(`contract name ${name} is defined twice (second in ${file})`);
      contracts[name] = {
        abi: c.abi,
        bytecode: `0x${c.evm.bytecode.object}`,
        deployedBytecode: `0x${c.evm.deployedBytecode.object}`,
      };
    }
  }
  return { solcVersion: solc.version(), contracts };
}

let memo: { key: string; result: Promise<CompiledContracts> } | undefined;

/**
 * Compiles every .sol file of services/devnet/contracts. Returns the deployable contracts by name
 * (interfaces and abstract contracts are left out). Cached in memory and on disk.
 */
export function compileDevnetContracts(): Promise<CompiledContracts> {
  const sources = readSources();
  const key = cacheKey(sources, solcPackageVersion());
  if (memo?.key === key) return memo.result;
  const file = join(cacheDir(), `${CACHE_PREFIX}${key.slice(0, 16)}.json`);
  const result = (async () => {
    const cached = readCache(file, key);
    if (cached) return cached;
    const { solcVersion, contracts } = await compile(sources);
    writeCache(file, { format: CACHE_FORMAT, key, solcVersion, contracts });
    return contracts;
  })();
  memo = { key, result };
  result.catch(() => {
    if (memo?.result === result) memo = undefined;
  });
  return result;
}

/** Looks a contract up by name and fails loudly if it is missing. */
export function devnetContract(contracts: CompiledContracts, name: string): CompiledContract {
  const c = contracts[name];
  if (!c) throw new Error(`devnet contract ${name} not found (have: ${Object.keys(contracts).join(", ")})`);
  return c;
}
