// Docs as tests: the fenced blocks of README.md and docs/, which ones run, what each command is
// documented to print, and whether what it printed matches.
//
// A block in a language a reader could paste (sh, ts, ...) says what it is after the language:
//   ```sh run                          every command runs against a devnet, in order, in one shell
//   ```sh illustration                 shown, never run (production commands, placeholders)
//   ```ts run file=examples/exact.ts   the block is that file, byte for byte; a `sh run` block runs it
//   ```sh run devnet=api-keys          runs on a second devnet, started with --api-keys
// `# ` lines directly under a command (no blank line between) are what the command prints. In
// expected output `…` stands for anything: inside a string ("0x…"), as a value ({…}, […] or a
// bare …), as an entry ("…": "…" allows keys the page does not show), or as a whole line (any lines).
import { spawn } from "node:child_process";

/** Languages whose blocks a reader could run: each must be marked `run` or `illustration`. */
export const MARKED_LANGUAGES = new Set(["sh", "bash", "shell", "console", "ts", "typescript", "js", "javascript"]);

export interface DocBlock {
  /** The page, relative to the repository root. */
  page: string;
  /** 1-based line of the opening fence. */
  line: number;
  lang: string;
  mark: "run" | "illustration" | undefined;
  /** `file=` of a TypeScript block: the file it shows. */
  file?: string;
  /** `devnet=` of a shell block: the devnet variant it runs on (`api-keys`); unset: the default devnet. */
  devnet?: string;
  body: string;
}

export function parseBlocks(page: string, markdown: string): DocBlock[] {
  const blocks: DocBlock[] = [];
  const lines = markdown.split("\n");
  for (let i = 0; i < lines.length; i++) {
    const open = /^(\s*)(`{3,}|~{3,})(.*)$/.exec(lines[i]!);
    if (!open) continue;
    const [, indent, fence, info] = open as unknown as [string, string, string, string];
    const words = info.trim().split(/\s+/).filter(Boolean);
    const body: string[] = [];
    let j = i + 1;
    for (; j < lines.length; j++) {
      const l = lines[j]!;
      if (l.trim().startsWith(fence) && l.trim().replace(/[`~]/g, "") === "") break;
      body.push(l.startsWith(indent) ? l.slice(indent.length) : l);
    }
    const mark = words.find((w) => w === "run" || w === "illustration") as DocBlock["mark"];
    const file = words.find((w) => w.startsWith("file="))?.slice("file=".length);
    const devnet = words.find((w) => w.startsWith("devnet="))?.slice("devnet=".length);
    blocks.push({ page, line: i + 1, lang: (words[0] ?? "").toLowerCase(), mark, file, devnet, body: body.join("\n") + (body.length ? "\n" : "") });
    i = j;
  }
  return blocks;
}

export interface ShellStep {
  command: string;
  /** What the page says the command prints (the `# ` lines under it), or undefined when it says nothing. */
  expected?: string;
}

/** The commands of a shell block and the output documented under each. */
export function stepsOf(body: string): ShellStep[] {
  const steps: ShellStep[] = [];
  const lines = body.split("\n");
  let last: ShellStep | undefined; // the command the next `# ` lines belong to, until a blank line
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i]!;
    const trimmed = line.trim();
    if (trimmed === "") {
      last = undefined;
      continue;
    }
    if (trimmed.startsWith("#")) {
      if (last) {
        const out = trimmed.replace(/^# ?/, "");
        last.expected = last.expected === undefined ? out : `${last.expected}\n${out}`;
      }
      continue;
    }
    const command = [line];
    const heredoc = /<<-?\s*['"]?(\w+)['"]?/.exec(line)?.[1];
    if (heredoc) {
      while (i + 1 < lines.length && lines[i]!.trim() !== heredoc) command.push(lines[++i]!);
    } else {
      while (command[command.length - 1]!.trimEnd().endsWith("\\") && i + 1 < lines.length) command.push(lines[++i]!);
    }
    last = { command: command.join("\n") };
    steps.push(last);
  }
  return steps;
}

const ANY = "\u0000any";

/** The documented JSON with its `…` placeholders made parseable, or undefined when it is not JSON. */
function parseExpectedJson(text: string): unknown {
  const prepared = text
    .replace(/\{\s*…\s*\}/g, JSON.stringify(ANY))
    .replace(/\[\s*…\s*\]/g, JSON.stringify(ANY))
    .replace(/:\s*…(?=\s*[,}\]])/g, `:${JSON.stringify(ANY)}`);
  try {
    return JSON.parse(prepared);
  } catch {
    return undefined;
  }
}

function globMatches(pattern: string, actual: string): boolean {
  const re = new RegExp(`^${pattern.split("…").map((p) => p.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")).join("[\\s\\S]*")}$`);
  return re.test(actual);
}

/** Differences between a documented JSON value and the printed one (empty: they match). */
function jsonDiff(expected: unknown, actual: unknown, path: string): string[] {
  if (expected === ANY) return [];
  if (typeof expected === "string") {
    if (typeof actual !== "string") return [`${path}: expected a string like ${JSON.stringify(expected)}, got ${JSON.stringify(actual)}`];
    return globMatches(expected, actual) ? [] : [`${path}: expected ${JSON.stringify(expected)}, got ${JSON.stringify(actual)}`];
  }
  if (Array.isArray(expected)) {
    if (!Array.isArray(actual)) return [`${path}: expected an array, got ${JSON.stringify(actual)}`];
    if (expected.length === 1 && expected[0] === "…") return [];
    if (expected.length !== actual.length) return [`${path}: expected ${expected.length} items, got ${actual.length}`];
    return expected.flatMap((e, i) => jsonDiff(e, actual[i], `${path}[${i}]`));
  }
  if (expected !== null && typeof expected === "object") {
    if (actual === null || typeof actual !== "object" || Array.isArray(actual)) return [`${path}: expected an object, got ${JSON.stringify(actual)}`];
    const exp = expected as Record<string, unknown>;
    const act = actual as Record<string, unknown>;
    const open = exp["…"] === "…";
    const diffs = Object.keys(exp)
      .filter((k) => k !== "…")
      .flatMap((k) => (k in act ? jsonDiff(exp[k], act[k], `${path}.${k}`) : [`${path}.${k}: missing`]));
    if (!open) diffs.push(...Object.keys(act).filter((k) => !(k in exp)).map((k) => `${path}.${k}: not documented (${JSON.stringify(act[k])})`));
    return diffs;
  }
  return Object.is(expected, actual) ? [] : [`${path}: expected ${JSON.stringify(expected)}, got ${JSON.stringify(actual)}`];
}

/** Compares one line (or a whole JSON document) of documented output with the printed one. */
function compareLine(expected: string, actual: string): string[] {
  const json = parseExpectedJson(expected);
  if (json !== undefined && typeof json === "object") {
    let parsed: unknown;
    try {
      parsed = JSON.parse(actual);
    } catch {
      return [`expected JSON ${expected}\n  got ${actual}`];
    }
    return jsonDiff(json, parsed, "$");
  }
  return globMatches(expected.trim(), actual.trim()) ? [] : [`expected ${JSON.stringify(expected)}, got ${JSON.stringify(actual)}`];
}

/**
 * Differences between what a page says a command prints and what it printed (empty: they match).
 * JSON is compared field by field, key order ignored; text line by line; a line `…` stands for any lines.
 */
export function compareOutput(expected: string, actual: string): string[] {
  const whole = parseExpectedJson(expected);
  if (whole !== undefined && typeof whole === "object" && expected.includes("\n")) return compareLine(expected, actual);
  const exp = expected.split("\n");
  const act = actual.split("\n").filter((l) => l.trim() !== "");
  const diffs: string[] = [];
  let a = 0;
  for (let e = 0; e < exp.length; e++) {
    if (exp[e]!.trim() === "…") {
      // Any lines, up to the first that matches the next expected line.
      const next = exp[e + 1];
      if (next === undefined) return diffs;
      while (a < act.length && compareLine(next, act[a]!).length > 0) a++;
      continue;
    }
    if (a >= act.length) return [...diffs, `expected ${JSON.stringify(exp[e])}, got nothing more`];
    diffs.push(...compareLine(exp[e]!, act[a]!));
    a++;
  }
  if (a < act.length) diffs.push(`not documented: ${JSON.stringify(act.slice(a).join("\n"))}`);
  return diffs;
}

/** Replaces the documented addresses (the devnet's fixed ports) with the running devnet's. */
export function substitute(text: string, addresses: Map<string, string>): string {
  return text.replace(/https?:\/\/127\.0\.0\.1:(\d+)/g, (whole, port: string) => addresses.get(port) ?? whole);
}

export interface StepResult {
  step: ShellStep;
  output: string;
  /** What is wrong with this step: its exit status or output; empty when it did as documented. */
  problems: string[];
}

export interface BlockRun {
  steps: StepResult[];
  stderr: string;
  exitCode: number | null;
}

const MARK = "@@docs-step-done@@";

/**
 * Runs a shell block's commands in order in one bash (so variables carry from one command to the
 * next), with `set -eo pipefail`, and judges each against the output documented under it. Commands
 * started in the background end with the block.
 */
export async function runShellBlock(body: string, opts: { cwd: string; env: NodeJS.ProcessEnv; addresses: Map<string, string>; timeoutMs: number }): Promise<BlockRun> {
  const steps = stepsOf(body);
  const script = ["set -eo pipefail", ...steps.flatMap((s) => [substitute(s.command, opts.addresses), `printf '\\n${MARK}\\n'`])].join("\n");
  const child = spawn("bash", ["-c", script], { cwd: opts.cwd, env: opts.env, stdio: ["ignore", "pipe", "pipe"], detached: true });
  let stdout = "";
  let stderr = "";
  child.stdout.on("data", (d: Buffer) => (stdout += d.toString()));
  child.stderr.on("data", (d: Buffer) => (stderr += d.toString()));
  const killGroup = () => {
    try {
      process.kill(-child.pid!, "SIGTERM");
    } catch {
      // already gone
    }
  };
  const timer = setTimeout(killGroup, opts.timeoutMs);
  const exitCode = await new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)));
  clearTimeout(timer);
  // Background commands of the block (a resource server it started) end with it.
  killGroup();
  const outputs = stdout.split(`\n${MARK}\n`);
  const results: StepResult[] = steps.map((step, i) => {
    const done = i < outputs.length - 1;
    const output = (outputs[i] ?? "").replace(/\n+$/, "");
    const problems: string[] = [];
    if (!done) problems.push(i === outputs.length - 1 ? `exited with status ${exitCode}` : "not reached");
    else if (step.expected !== undefined) problems.push(...compareOutput(substitute(step.expected, opts.addresses), output));
    // A command the page shows without output must not have answered with an error body either.
    else if (/^\s*\{\s*"error"\s*:/.test(output)) problems.push(`answered an error: ${output}`);
    return { step, output, problems };
  });
  return { steps: results, stderr, exitCode };
}

/** A readable account of what went wrong in a block run, for a failing test's message. */
export function describeFailures(run: BlockRun): string {
  const bad = run.steps.filter((s) => s.problems.length > 0);
  if (bad.length === 0) return "";
  return [
    ...bad.map((s) => `$ ${s.step.command}\n${s.output ? `${s.output}\n` : ""}  ✗ ${s.problems.join("\n  ✗ ")}`),
    run.stderr.trim() ? `stderr:\n${run.stderr.trim().split("\n").slice(-20).join("\n")}` : "",
  ].join("\n");
}
