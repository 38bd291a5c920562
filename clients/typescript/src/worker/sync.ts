// Small promise-based coordination primitives of the worker pool.

/** A counting semaphore whose waiters give up when their signal aborts. */
export class Semaphore {
  private waiters: { resolve: () => void; reject: (e: unknown) => void; signal: AbortSignal | undefined; onAbort: () => void }[] = [];
  constructor(private free: number) {}

  acquire(signal?: AbortSignal): Promise<void> {
    if (signal?.aborted) return Promise.reject(signal.reason);
    if (this.free > 0) {
      this.free--;
      return Promise.resolve();
    }
    return new Promise((resolve, reject) => {
      const w = {
        resolve,
        reject,
        signal,
        onAbort: () => {
          this.waiters = this.waiters.filter((x) => x !== w);
          reject(signal!.reason);
        },
      };
      signal?.addEventListener("abort", w.onAbort, { once: true });
      this.waiters.push(w);
    });
  }

  release(): void {
    const w = this.waiters.shift();
    if (w) {
      w.signal?.removeEventListener("abort", w.onAbort);
      w.resolve();
    } else this.free++;
  }
}

/** A mutex: lock() resolves with the function that unlocks. */
export class Mutex {
  private tail: Promise<void> = Promise.resolve();
  lock(): Promise<() => void> {
    let unlock!: () => void;
    const next = new Promise<void>((r) => (unlock = r));
    const prev = this.tail;
    this.tail = prev.then(() => next);
    return prev.then(() => unlock);
  }
}

/** A wake-up signal: wait() resolves on fire(), on timeout, or on abort. */
export class Wake {
  private pending: (() => void)[] = [];
  private fired = false;

  fire(): void {
    const p = this.pending;
    this.pending = [];
    if (p.length === 0) this.fired = true;
    for (const f of p) f();
  }

  /** Waits up to ms (jittered by ±jitter) for fire() or signal. */
  wait(ms: number, signal: AbortSignal, jitter = 0.2): Promise<void> {
    if (this.fired || signal.aborted) {
      this.fired = false;
      return Promise.resolve();
    }
    return new Promise((resolve) => {
      const done = () => {
        clearTimeout(t);
        signal.removeEventListener("abort", done);
        this.pending = this.pending.filter((f) => f !== done);
        resolve();
      };
      const t = setTimeout(done, ms * (1 - jitter + 2 * jitter * Math.random()));
      signal.addEventListener("abort", done, { once: true });
      this.pending.push(done);
    });
  }
}

/** Resolves after ms, or at once when signal aborts. */
export function sleep(ms: number, signal?: AbortSignal): Promise<void> {
  return new Promise((resolve) => {
    if (signal?.aborted) return resolve();
    const done = () => {
      clearTimeout(t);
      signal?.removeEventListener("abort", done);
      resolve();
    };
    const t = setTimeout(done, ms);
    signal?.addEventListener("abort", done, { once: true });
  });
}
