// Small promise-based coordination primitives of the worker pool.

interface Waiter {
  resolve: () => void;
  reject: (e: unknown) => void;
  signal: AbortSignal | undefined;
}

/**
 * A counting semaphore whose waiters give up when their signal aborts.
 *
 * A slot's lanes wait here by the hundred, all on the same signal. So a
 * signal gets one abort listener, registered with its first waiter, not one
 * per waiter: EventTarget checks each new listener against those it holds,
 * which made a wait linear in the number of waiters (and a Node warning
 * past ten listeners).
 */
export class Semaphore {
  private waiters = new Set<Waiter>();
  private bySignal = new Map<AbortSignal, { waiters: Set<Waiter>; onAbort: () => void }>();
  constructor(private free: number) {}

  /** Takes a place if one is free, without waiting. */
  tryAcquire(): boolean {
    if (this.free <= 0) return false;
    this.free--;
    return true;
  }

  acquire(signal?: AbortSignal): Promise<void> {
    if (signal?.aborted) return Promise.reject(signal.reason);
    if (this.tryAcquire()) return Promise.resolve();
    return new Promise((resolve, reject) => {
      const w: Waiter = { resolve, reject, signal };
      this.waiters.add(w);
      if (!signal) return;
      let group = this.bySignal.get(signal);
      if (!group) {
        const g = {
          waiters: new Set<Waiter>(),
          onAbort: () => {
            this.bySignal.delete(signal);
            for (const x of g.waiters) {
              this.waiters.delete(x);
              x.reject(signal.reason);
            }
          },
        };
        group = g;
        this.bySignal.set(signal, g);
        signal.addEventListener("abort", g.onAbort, { once: true });
      }
      group.waiters.add(w);
    });
  }

  release(): void {
    // A Set iterates in insertion order: the longest waiter goes first.
    for (const w of this.waiters) {
      this.waiters.delete(w);
      if (w.signal) {
        const group = this.bySignal.get(w.signal)!;
        group.waiters.delete(w);
        if (group.waiters.size === 0) {
          this.bySignal.delete(w.signal);
          w.signal.removeEventListener("abort", group.onAbort);
        }
      }
      w.resolve();
      return;
    }
    this.free++;
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
