// Token buckets by key (a caller's address, an owner; in memory, per replica): a burst, then a
// steady rate. The clock is passed in, so limits are testable without waiting.

export interface RateLimit {
  /** Requests allowed at once. */
  burst: number;
  /** Tokens added per second. */
  perSecond: number;
}

export type RateDecision = { ok: true } | { ok: false; retryAfterSeconds: number };

export interface RateLimiter {
  /** Uses one token of `key`'s bucket, or says how long to wait. */
  take(key: string): RateDecision;
  /** The decision `take` would make, without using a token. */
  check(key: string): RateDecision;
}

interface Bucket {
  tokens: number;
  at: number;
}

export function createRateLimiter(limit: RateLimit, now: () => number = Date.now, maxKeys = 100_000): RateLimiter {
  const buckets = new Map<string, Bucket>();

  const refill = (b: Bucket, t: number) => {
    b.tokens = Math.min(limit.burst, b.tokens + ((t - b.at) / 1000) * limit.perSecond);
    b.at = t;
  };

  /** Forgets full buckets (idle owners) when the map grows large; a full bucket and no bucket behave alike. */
  const prune = (t: number) => {
    for (const [key, b] of buckets) {
      refill(b, t);
      if (b.tokens >= limit.burst) buckets.delete(key);
    }
    while (buckets.size > maxKeys) buckets.delete(buckets.keys().next().value as string);
  };

  const decide = (b: Bucket | undefined): RateDecision => {
    if (!b || b.tokens >= 1) return { ok: true };
    const wait = limit.perSecond > 0 ? (1 - b.tokens) / limit.perSecond : Number.POSITIVE_INFINITY;
    return { ok: false, retryAfterSeconds: Number.isFinite(wait) ? Math.max(1, Math.ceil(wait)) : 3600 };
  };

  return {
    take(key) {
      const t = now();
      let b = buckets.get(key);
      if (!b) {
        if (buckets.size >= maxKeys) prune(t);
        b = { tokens: limit.burst, at: t };
        buckets.set(key, b);
      } else refill(b, t);
      const decision = decide(b);
      if (decision.ok) b.tokens -= 1;
      return decision;
    },
    check(key) {
      const b = buckets.get(key);
      if (b) refill(b, now());
      return decide(b);
    },
  };
}
