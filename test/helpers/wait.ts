// Polls until fn yields a value (not undefined), or fails after a deadline: waits on real services
// without asserting anything about how long they take.
export async function until<T>(fn: () => Promise<T | undefined> | T | undefined, what: string, ms = 60_000): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = await fn();
    if (v !== undefined) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}
