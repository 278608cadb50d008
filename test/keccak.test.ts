// Keccak-256 of the verification path: the native permutation gives viem's digest for every input
// length (across the 136-byte rate's boundaries), and loads here; without it, viem's own answers.
import { describe, expect, it, vi } from "vitest";
import { randomBytes } from "node:crypto";
import { keccak256 as viemKeccak256 } from "viem";
import { keccak256, nativeKeccakAvailable } from "../services/facilitator/crypto/keccak.ts";

const LENGTHS = [0, 1, 31, 32, 33, 64, 65, 66, 135, 136, 137, 224, 271, 272, 273, 500, 1024, 4096];

describe("keccak256", () => {
  it("loads the native permutation on this platform (the package's prebuilt binding)", () => {
    // A packaging change that lost the binding would silently cost every verification the JS hash.
    if (process.platform === "linux" && process.arch === "x64") expect(nativeKeccakAvailable).toBe(true);
  });

  it("gives viem's digest for every length, and again for the same input (no state left behind)", () => {
    for (const length of LENGTHS) {
      for (let i = 0; i < 20; i++) {
        const bytes = randomBytes(length);
        const expected = viemKeccak256(bytes);
        expect(keccak256(bytes), `${length} bytes`).toBe(expected);
        expect(keccak256(new Uint8Array(bytes)), `${length} bytes as a Uint8Array`).toBe(expected);
      }
    }
    expect(keccak256(new Uint8Array())).toBe("0xc5d2460186f7233c927e7db2dcc703c0e500b653ca82273b7bfad8045d85a470");
  });

  it("falls back to viem's hash where the binding is turned off", async () => {
    vi.stubEnv("X402_DISABLE_NATIVE_KECCAK", "1");
    vi.resetModules();
    try {
      const fallback = await import("../services/facilitator/crypto/keccak.ts");
      expect(fallback.nativeKeccakAvailable).toBe(false);
      const bytes = randomBytes(300);
      expect(fallback.keccak256(bytes)).toBe(viemKeccak256(bytes));
    } finally {
      vi.unstubAllEnvs();
    }
  });
});
