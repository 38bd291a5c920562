// The abort signal of one handler call, made only if the handler asks.

import { HandlerTimeoutError } from "./outcome.js";

/**
 * The signal a handler call sees, aborted when the call's timeout passes
 * (a HandlerTimeoutError) or when its slot gives up (abort, with the
 * slot's reason) while the call runs.
 *
 * Nothing is made until the handler reads `signal`. Making an AbortSignal
 * costs about 5 µs, and the AbortSignal.any over the slot's signal and a
 * timer's that each call made before about 12 µs more (in a loop, with the
 * garbage they leave): with quick handlers, a quarter or more of the
 * worker's CPU per event (docs/benchmarks.md, "A handler's signal only
 * when read"). A handler that never reads it costs one small object; one
 * that does gets its own AbortController and, with a timeout, one timer
 * for the time left. Whether a call that threw had timed out is read off
 * the clock, so a handler that ignores its signal is judged as before.
 *
 * The slot aborts the calls it runs (SlotRunner keeps them in a set)
 * instead of each call's signal following the slot's: a listener per
 * call on the slot's long-lived signal would pile up, and AbortSignal.any,
 * which avoids that with weak references, is the cost above. A call's
 * signal therefore stops following the slot once the call has returned.
 */
export class CallSignal {
  private ctl: AbortController | null = null;
  private timer: NodeJS.Timeout | null = null;
  private reason: unknown = undefined;
  private aborted = false;
  private ended = false;

  /** began is performance.now() when the call started; timeoutMs 0 is none. */
  constructor(private readonly began: number, private readonly timeoutMs: number) {}

  get signal(): AbortSignal {
    if (this.ctl === null) {
      this.ctl = new AbortController();
      if (this.aborted) {
        this.ctl.abort(this.reason);
      } else if (this.timeoutMs > 0 && !this.ended) {
        const left = this.began + this.timeoutMs - performance.now();
        if (left <= 0) this.abort(new HandlerTimeoutError(this.timeoutMs));
        else this.timer = setTimeout(() => this.abort(new HandlerTimeoutError(this.timeoutMs)), left);
      }
    }
    return this.ctl.signal;
  }

  /** Aborts the call's signal (made now or when it is read); the first reason stays. */
  abort(reason: unknown): void {
    if (this.aborted) return;
    this.aborted = true;
    this.reason = reason;
    this.clearTimer();
    this.ctl?.abort(reason);
  }

  /** Whether the call has run past its timeout, by the clock or by its timer. */
  timedOut(): boolean {
    if (this.aborted && this.reason instanceof HandlerTimeoutError) return true;
    return this.timeoutMs > 0 && performance.now() - this.began >= this.timeoutMs;
  }

  /** The call returned: no timer is left running, none is started later. */
  end(): void {
    this.ended = true;
    this.clearTimer();
  }

  private clearTimer(): void {
    if (this.timer !== null) {
      clearTimeout(this.timer);
      this.timer = null;
    }
  }
}
