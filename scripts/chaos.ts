// `npm run chaos -- --minutes 10 [--seed N] [--replicas 2] [--clients 4] [--keep-logs]`: the chaos
// test of test/helpers/chaos.ts for as long as asked. Prints its seed (a seed replays the same
// faults and payments) and the verdict; exits 1 on any violation.
import { parseArgs } from "node:util";
import { formatReport, runChaos } from "../test/helpers/chaos.ts";

const { values } = parseArgs({
  options: { minutes: { type: "string", default: "10" }, seed: { type: "string" }, replicas: { type: "string", default: "2" }, clients: { type: "string", default: "4" }, "keep-logs": { type: "boolean", default: false } },
});
const seed = values.seed === undefined ? Math.floor(Math.random() * 2 ** 31) : Number(values.seed);
const minutes = Number(values.minutes);
if (!Number.isInteger(seed) || !(minutes > 0)) {
  process.stderr.write("chaos: --minutes must be a positive number and --seed an integer\n");
  process.exit(2);
}
process.stdout.write(`chaos: seed ${seed}\n`);
const report = await runChaos({
  seed,
  durationMs: Math.round(minutes * 60_000),
  replicas: Number(values.replicas),
  clients: Number(values.clients),
  keepLogs: values["keep-logs"],
  log: (line) => process.stdout.write(`${line}\n`),
});
process.stdout.write(`${formatReport(report)}\n`);
if (values["keep-logs"] && !report.violations.length) process.stdout.write(`process logs: ${report.logDir}\n`);
process.exit(report.violations.length ? 1 : 0);
