// x402-fleet: one command, one subcommand per service. Each service owns its flags, help and option
// checks (its config file, loaded without the service); this file only dispatches over the table.
import { operatorCli, preUninstallCli } from "../operator/config.ts";
import { devnetCli, payCli } from "./devnet/config.ts";
import { doctorCli, facilitatorCli } from "./facilitator/options.ts";
import { hubCli, hubUploadCli } from "./hub/config.ts";
import { FlagError, parseFlags, type Command } from "./platform/flags.ts";
import { createLogger } from "./platform/logger.ts";
import { routerCli } from "./router/config.ts";
import { apiKeyClis } from "./tenants/api-key-command.ts";
import { walletsCli } from "./wallets/config.ts";

export const COMMANDS: readonly Command[] = [devnetCli, facilitatorCli, routerCli, ...apiKeyClis, hubCli, walletsCli, operatorCli, preUninstallCli, doctorCli, hubUploadCli, payCli];

/** The command column: the longest name and two spaces. */
const NAME_WIDTH = Math.max(...COMMANDS.map((c) => c.name.length)) + 2;

const usage = () =>
  `x402-fleet <command> [options]   (x402-fleet <command> --help: its flags and environment)\n\ncommands:\n${COMMANDS.map((c) => `  ${c.name.padEnd(NAME_WIDTH)}${c.summary}\n`).join("")}`;

const helpOf = (c: Command) => `x402-fleet ${c.name}: ${c.summary}\n${c.help}`;

function onShutdown(stop: () => Promise<void>) {
  let stopping = false;
  const handler = (signal: string) => {
    if (stopping) return;
    stopping = true;
    void stop().finally(() => process.exit(signal === "SIGINT" ? 130 : 0));
  };
  process.once("SIGINT", () => handler("SIGINT"));
  process.once("SIGTERM", () => handler("SIGTERM"));
}

/** Usage errors (unknown command or flag, a bad value) exit 2 before anything starts; failures throw. */
export async function main(argv: string[]): Promise<void> {
  const [name, ...args] = argv;
  if (name === "help" || name === "--help" || name === "-h") {
    const command = COMMANDS.find((c) => c.name === args[0]);
    process.stdout.write(command ? helpOf(command) : usage());
    return;
  }
  const command = COMMANDS.find((c) => c.name === name);
  if (!command) {
    process.stderr.write(`${name === undefined ? "no command given" : `unknown command: ${name}`}\n\n${usage()}`);
    process.exitCode = 2;
    return;
  }
  if (args.includes("--help") || args.includes("-h")) {
    process.stdout.write(helpOf(command));
    return;
  }
  try {
    const flags = parseFlags(command.name, args, command.flags);
    if (command.service) {
      // Before anything starts: a stray rejection must be counted and logged, never exit the process.
      const { installProcessGuard } = await import("./platform/process-guard.ts");
      installProcessGuard(createLogger(command.name));
      const { startTracing } = await import("./platform/tracing.ts");
      await startTracing(`x402-fleet-${command.name}`);
    }
    const running = await command.run(flags, process.env);
    if (running) onShutdown(running.close);
  } catch (e) {
    if (!(e instanceof FlagError)) throw e;
    process.stderr.write(`x402-fleet ${command.name}: ${e.message}\n`);
    process.exitCode = 2;
  }
}
