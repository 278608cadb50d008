// Command-line flags of every `x402-fleet` command: one parser and one set of value checks, so each
// command refuses a bad value the same way, naming the flag (or environment variable) it came from,
// before anything starts.
import { parseArgs } from "node:util";
import { CAIP2_PATTERN } from "../x402/networks.ts";

export type FlagSpec = Record<string, { type: "string" | "boolean"; multiple?: boolean }>;
export type FlagValues<F extends FlagSpec> = {
  [K in keyof F]?: F[K]["type"] extends "boolean" ? boolean : F[K]["multiple"] extends true ? string[] : string;
};
type Env = NodeJS.ProcessEnv;

/** One `x402-fleet <name>`: the CLI only dispatches over a table of these. */
export interface Command<F extends FlagSpec = FlagSpec> {
  name: string;
  /** One line in `x402-fleet help`, and the first of `x402-fleet <name> --help`. */
  summary: string;
  /** The rest of `x402-fleet <name> --help`: its flags and environment. */
  help: string;
  flags: F;
  /** A long-running service: the process guard and tracing first, a graceful stop on SIGINT/SIGTERM. */
  service?: boolean;
  run(flags: FlagValues<F>, env: Env): Promise<{ close(): Promise<void> } | void>;
}

/** Keeps a command's flag names typed inside its own `run`. */
export const defineCommand = <F extends FlagSpec>(command: Command<F>): Command => command as Command;

/**
 * A long-running service: its options are checked first, and only then is its module (which may
 * load viem or a Kubernetes client) imported and started.
 */
export function serviceCommand<F extends FlagSpec, O>(c: Pick<Command<F>, "name" | "summary" | "help" | "flags"> & {
  optionsFrom(flags: FlagValues<F>, env: Env): O | Promise<O>;
  start(options: O, env: Env): Promise<{ close(): Promise<void> }>;
}): Command {
  return defineCommand({ ...c, service: true, run: async (flags, env) => c.start(await c.optionsFrom(flags, env), env) });
}

/** Flags that take one string each, by name: the common case. */
export const stringFlags = <K extends string>(...names: K[]) => Object.fromEntries(names.map((n) => [n, { type: "string" }])) as Record<K, { type: "string" }>;

/** A value the user gave that the command cannot use: a usage error, not a failure to start. */
export class FlagError extends Error {}

/** Unknown flags, stray arguments and flags without a value are refused by name. */
export function parseFlags<F extends FlagSpec>(command: string, args: string[], flags: F): FlagValues<F> {
  try {
    return parseArgs({ args, options: flags, strict: true, allowPositionals: false }).values as FlagValues<F>;
  } catch (e) {
    const { code, message } = e as { code?: string; message: string };
    const quoted = /'([^']*)'/.exec(message)?.[1] ?? "";
    if (code === "ERR_PARSE_ARGS_UNKNOWN_OPTION") throw new FlagError(`unknown flag ${quoted} (x402-fleet ${command} --help lists its flags)`);
    if (code === "ERR_PARSE_ARGS_UNEXPECTED_POSITIONAL") throw new FlagError(`unexpected argument ${JSON.stringify(quoted)}: every value follows its --flag`);
    throw new FlagError(message);
  }
}

/** The flag when given, else the environment variable (empty counts as unset), with the name to blame. */
export function flagOrEnv(flag: string, value: string | undefined, env: Env, name: string): [string, string | undefined] {
  return value !== undefined ? [flag, value] : [name, env[name] || undefined];
}

function refuse(name: string, what: string, got: string): never {
  throw new FlagError(`${name} must be ${what}, got ${JSON.stringify(got)}`);
}

const unset = (v: string | undefined): v is undefined | "" => v === undefined || v === "";

export function port(name: string, v: string | undefined): number | undefined {
  if (unset(v)) return undefined;
  if (!/^\d{1,5}$/.test(v) || Number(v) > 65535) refuse(name, "an integer from 0 to 65535", v);
  return Number(v);
}

export function wholeNumber(name: string, v: string | undefined): number | undefined {
  if (unset(v)) return undefined;
  if (!/^\d{1,15}$/.test(v)) refuse(name, "a non-negative integer", v);
  return Number(v);
}

/** Any number `Number` reads; ranges are the caller's (the facilitator's schema checks them). */
export function number(name: string, v: string | undefined): number | undefined {
  if (unset(v)) return undefined;
  if (Number.isNaN(Number(v))) refuse(name, "a number", v);
  return Number(v);
}

export function oneOf<T extends string>(name: string, v: string | undefined, choices: readonly T[]): T | undefined {
  if (v === undefined) return undefined;
  if (!(choices as readonly string[]).includes(v)) refuse(name, `one of ${choices.join(", ")}`, v);
  return v as T;
}

export function caip2(name: string, v: string): string {
  if (!CAIP2_PATTERN.test(v)) refuse(name, "a CAIP-2 network id such as eip155:8453", v);
  return v;
}

/** An http(s) URL; never echoed, since RPC URLs often carry an API key. */
export function httpUrl(name: string, v: string): string {
  if (!URL.canParse(v) || !/^https?:$/.test(new URL(v).protocol)) throw new FlagError(`${name} must be an http(s) URL`);
  return v;
}

/** Comma-separated items, blanks dropped; undefined when not given. */
export const list = (v: string | undefined): string[] | undefined => (v === undefined ? undefined : v.split(",").map((s) => s.trim()).filter(Boolean));
