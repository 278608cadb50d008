// The chaos test of issue 33, CI's short form: two minutes of faults (replicas and the router
// SIGKILLed, mining paused, PostgreSQL crashed at least twice) under careful clients, judged on
// chain. The long form: `npm run chaos -- --minutes 10 [--seed N]` (docs/settlement.md, Chaos test).
import { expect, it } from "vitest";
import { formatReport, runChaos } from "./helpers/chaos.ts";

// A fixed seed keeps CI's schedule the same from run to run; X402_CHAOS_SEED replays another.
const seed = Number(process.env.X402_CHAOS_SEED ?? 20_250_933);
const durationMs = Number(process.env.X402_CHAOS_SECONDS ?? 120) * 1000;

it(`chaos (seed ${seed}): no caller told "failed" for a paid payment, no success without its transfer, exact balances`, async () => {
  const report = await runChaos({ seed, durationMs, log: (line) => process.stdout.write(`${line}\n`) });
  process.stdout.write(`${formatReport(report)}\n`);
  expect(report.faults.database).toBeGreaterThanOrEqual(2);
  expect(report.settledOnChain).toBeGreaterThan(0);
  expect(report.violations.map((v) => `${v.rule}: ${v.count}; e.g. ${v.examples[0]}`)).toEqual([]);
}, durationMs + 240_000);
