// Keccak-256 for the verification path: the native Keccak-f permutation prebuilt inside the npm
// tarball of `keccak` where it loads (linux-x64, darwin-x64, win32-x64), viem's pure-JS one
// elsewhere. A verification hashes three times (the struct, the EIP-712 digest, the recovered
// key); in JavaScript that is about a tenth of its CPU, natively under a hundredth. Both give the
// same digest for every input (a differential test proves it).
import { createRequire } from "node:module";
import { dirname } from "node:path";
import { keccak256 as viemKeccak256, type Hex } from "viem";

interface KeccakState {
  initialize(rate: number, capacity: number): void;
  absorb(data: Uint8Array): void;
  absorbLastFewBits(bits: number): void;
  squeeze(length: number): Buffer;
}

function loadNative(): KeccakState | undefined {
  if (process.env.X402_DISABLE_NATIVE_KECCAK === "1") return undefined;
  try {
    const require = createRequire(import.meta.url);
    // The binding itself (a sponge state), not the package's stream API: a Transform stream per hash costs more than the hash.
    const State = (require("node-gyp-build") as (dir: string) => new () => KeccakState)(dirname(require.resolve("keccak/package.json")));
    const state = new State();
    return typeof state.absorb === "function" ? state : undefined;
  } catch {
    return undefined;
  }
}

// One state, used synchronously from initialize to squeeze: no two hashes interleave.
const state = loadNative();
export const nativeKeccakAvailable = state !== undefined;

/** Keccak-256 of bytes, as 0x-prefixed hex (viem's `keccak256(bytes)`). */
export function keccak256(bytes: Uint8Array): Hex {
  if (!state) return viemKeccak256(bytes);
  // Keccak-256: rate 1088 bits, capacity 512, the original padding (0x01, not SHA-3's 0x06).
  state.initialize(1088, 512);
  state.absorb(bytes);
  state.absorbLastFewBits(0x01);
  return `0x${state.squeeze(32).toString("hex")}`;
}
