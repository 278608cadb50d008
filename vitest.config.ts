import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    include: ["test/**/*.test.ts"],
    testTimeout: 60_000,
    hookTimeout: 120_000,
    // Tests start real anvil nodes and services; keep the 2-core machine from thrashing.
    maxWorkers: 2,
    fileParallelism: true,
  },
});
