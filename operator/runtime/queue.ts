// A work queue with client-go's semantics: a key is queued at most once (dirty set); a key being
// processed is never handed to a second worker, and if it is added meanwhile it is queued again
// when the first worker is done; failed keys come back after a per-key exponential backoff
// (combined with a global token bucket), and `forget` resets a key's backoff after a success.

export interface RateLimiterOptions {
  /** First retry delay; doubles per consecutive failure of the same key. client-go: 5 ms. */
  baseDelayMs: number;
  /** Cap of the per-key delay. client-go: 1000 s. */
  maxDelayMs: number;
  /** Global bucket over all retries: sustained rate and burst. client-go: 10 qps, burst 100. */
  qps: number;
  burst: number;
}

export const DEFAULT_RATE_LIMITS: RateLimiterOptions = { baseDelayMs: 5, maxDelayMs: 1_000_000, qps: 10, burst: 100 };

/** max(per-key exponential backoff, global token bucket), as client-go's DefaultControllerRateLimiter. */
export class RateLimiter {
  private failures = new Map<string, number>();
  private tokens: number;
  private last: number;

  constructor(
    private readonly opts: RateLimiterOptions = DEFAULT_RATE_LIMITS,
    private readonly clock: () => number = Date.now,
  ) {
    this.tokens = opts.burst;
    this.last = clock();
  }

  /** The delay before the key's next attempt; counts one more failure of it. */
  when(key: string): number {
    const n = this.failures.get(key) ?? 0;
    this.failures.set(key, n + 1);
    const exp = Math.min(this.opts.maxDelayMs, this.opts.baseDelayMs * 2 ** Math.min(n, 62));
    return Math.max(exp, this.bucketDelay());
  }

  numRequeues(key: string): number {
    return this.failures.get(key) ?? 0;
  }

  forget(key: string): void {
    this.failures.delete(key);
  }

  private bucketDelay(): number {
    const now = this.clock();
    this.tokens = Math.min(this.opts.burst, this.tokens + ((now - this.last) / 1000) * this.opts.qps);
    this.last = now;
    this.tokens -= 1;
    return this.tokens >= 0 ? 0 : Math.ceil((-this.tokens / this.opts.qps) * 1000);
  }
}

export class WorkQueue {
  private queue: string[] = [];
  private dirty = new Set<string>();
  private processing = new Set<string>();
  private waiters: ((key: string | undefined) => void)[] = [];
  private timers = new Map<string, { at: number; timer: NodeJS.Timeout }>();
  private shuttingDown = false;
  private idleWaiters: (() => void)[] = [];

  constructor(readonly limiter: RateLimiter = new RateLimiter()) {}

  add(key: string): void {
    if (this.shuttingDown || this.dirty.has(key)) return;
    this.dirty.add(key);
    if (this.processing.has(key)) return; // queued again by done()
    this.handOut(key);
  }

  /** To a waiting worker if there is one, else to the back of the queue. */
  private handOut(key: string): void {
    const waiter = this.waiters.shift();
    if (waiter) {
      this.dirty.delete(key);
      this.processing.add(key);
      waiter(key);
    } else {
      this.queue.push(key);
    }
  }

  /** Adds the key after a delay; an earlier pending delay for the same key wins. */
  addAfter(key: string, delayMs: number): void {
    if (this.shuttingDown) return;
    if (delayMs <= 0) return this.add(key);
    const at = Date.now() + delayMs;
    const pending = this.timers.get(key);
    if (pending && pending.at <= at) return;
    if (pending) clearTimeout(pending.timer);
    const timer = setTimeout(() => {
      this.timers.delete(key);
      this.add(key);
    }, delayMs);
    timer.unref?.();
    this.timers.set(key, { at, timer });
  }

  addRateLimited(key: string): number {
    const delay = this.limiter.when(key);
    this.addAfter(key, delay);
    return delay;
  }

  forget(key: string): void {
    this.limiter.forget(key);
  }

  /** The next key to process, or undefined once the queue shuts down. */
  get(): Promise<string | undefined> {
    if (this.shuttingDown) return Promise.resolve(undefined);
    const key = this.queue.shift();
    if (key !== undefined) {
      this.dirty.delete(key);
      this.processing.add(key);
      return Promise.resolve(key);
    }
    return new Promise((resolve) => this.waiters.push(resolve));
  }

  done(key: string): void {
    this.processing.delete(key);
    if (this.dirty.has(key)) {
      if (this.shuttingDown) this.dirty.delete(key);
      else this.handOut(key);
    }
    if (this.processing.size === 0) this.idleWaiters.splice(0).forEach((w) => w());
  }

  len(): number {
    return this.queue.length;
  }

  isProcessing(key: string): boolean {
    return this.processing.has(key);
  }

  /** Stops handing out keys and resolves once every key in progress is done. */
  async shutDown(): Promise<void> {
    this.shuttingDown = true;
    for (const { timer } of this.timers.values()) clearTimeout(timer);
    this.timers.clear();
    this.queue = [];
    this.dirty.clear();
    this.waiters.splice(0).forEach((w) => w(undefined));
    if (this.processing.size > 0) await new Promise<void>((r) => this.idleWaiters.push(r));
  }
}
