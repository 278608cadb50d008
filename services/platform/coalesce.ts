// Calls of one kind made in the same turn of the event loop become one statement: a burst's
// hundred claims, receipts recorded or answers stored in a turn cost the database one parse, one
// plan and one round trip instead of a hundred (the embedded engine runs every statement on the
// event loop's thread, so there it is most of a settlement's CPU). Each call gets its own result.
// Two calls on one key never share a statement (each must see the other as a separate write), and
// a statement that fails runs its calls again one by one, so no call fails for its neighbours.

export interface CoalesceOptions<I> {
  /** Writes: calls with the same key go to different statements (reads need none). */
  key?: (item: I) => string;
  /** Calls per statement at most. */
  max?: number;
  /**
   * Statements of this kind in flight at most; the calls that come meanwhile wait for one to end
   * and go together. A process busy with a burst reaches a statement with a request or two a turn,
   * so without it a turn's batch is smallest exactly when the database is busiest.
   */
  lanes?: number;
}

/** `run` gets the calls of a turn and answers with one result per call, in order. */
export function coalesce<I, R>(run: (items: I[]) => Promise<R[]>, opts: CoalesceOptions<I> = {}): (item: I) => Promise<R> {
  const max = opts.max ?? 500;
  type Batch = { items: I[]; keys: Set<string>; waiters: { resolve: (r: R) => void; reject: (e: unknown) => void }[] };
  let current: Batch | undefined;
  const settle = (b: Batch, results: R[]) => b.waiters.forEach((w, i) => w.resolve(results[i]!));
  const lanes = opts.lanes ?? Infinity;
  let inFlight = 0;
  // Batches made and not yet run, oldest first (the last may still be `current`, open to more calls).
  const waiting: Batch[] = [];
  const pump = () => {
    while (inFlight < lanes && waiting.length > 0) {
      const b = waiting.shift()!;
      if (current === b) current = undefined;
      inFlight++;
      run(b.items)
        .then(
          (results) => settle(b, results),
          (e: unknown) => {
            if (b.items.length === 1) return b.waiters[0]!.reject(e);
            b.items.forEach((item, i) =>
              run([item]).then(
                ([r]) => b.waiters[i]!.resolve(r!),
                (err: unknown) => b.waiters[i]!.reject(err),
              ),
            );
          },
        )
        .finally(() => {
          inFlight--;
          pump();
        });
    }
  };
  return (item) =>
    new Promise<R>((resolve, reject) => {
      const key = opts.key?.(item);
      if (!current || (key !== undefined && current.keys.has(key)) || current.items.length >= max) {
        // Run at the end of the turn, or, with every lane busy, once one frees (calls join it meanwhile).
        waiting.push((current = { items: [], keys: new Set(), waiters: [] }));
        setImmediate(pump);
      }
      current.items.push(item);
      if (key !== undefined) current.keys.add(key);
      current.waiters.push({ resolve, reject });
    });
}
