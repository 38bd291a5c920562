// What a handler's failure asks for beyond "failed".
//
// A handler fails by throwing (or rejecting). The event is then retried
// after the worker's retry delay, or dead-lettered once the queue's
// max_retries is reached. Two errors say more: RetryAfterError asks for a
// particular delay (a downstream service said how long to wait), and
// DeadLetterError gives up on the event at once (no retry can fix a
// malformed payload). Both keep the handler's own error as `cause`, which
// is what the nack stores as the reason. They mirror the Go library's
// pgque.RetryAfter and pgque.DeadLetter, so a consumer group that mixes Go
// and TypeScript workers treats a failure the same on either side.

/**
 * The longest retry delay the server accepts (30 days), as the Go
 * library's RetryDelayMax. Longer delays, asked for with retryAfter() or
 * returned by the retryDelayMs option, are shortened to it: the server
 * refuses a nack past it, which failed the settle of the event's whole
 * chunk, and the chunk ran again, every key's events, for ever.
 */
export const RETRY_DELAY_MS_MAX = 30 * 24 * 3600 * 1000;

/**
 * ms brought into [0, RETRY_DELAY_MS_MAX], as the Go library's
 * clampRetryDelay: a delay that is not positive (or NaN) retries at once,
 * one past the maximum (Infinity too) waits the maximum.
 */
export function clampRetryDelay(ms: number): number {
  if (!(ms > 0)) return 0;
  return Math.min(ms, RETRY_DELAY_MS_MAX);
}

/**
 * A failure that asks for the event to be redelivered after `delayMs`
 * (a delay that is not positive retries at once; one past
 * RETRY_DELAY_MS_MAX, 30 days, waits that long). The delay comes first
 * here and second in retryAfter(err, ms); a delay that is no number is
 * refused with a TypeError, which then fails the event as any throw does,
 * rather than being read as "retry at once".
 */
export class RetryAfterError extends Error {
  readonly delayMs: number;
  constructor(delayMs: number, cause?: unknown) {
    if (typeof delayMs !== "number") {
      throw new TypeError(`RetryAfterError(delayMs, cause): delayMs must be a number of milliseconds, not ${typeof delayMs}` +
        (typeof cause === "number" ? " (the arguments are swapped: retryAfter(err, ms) takes the error first)" : ""));
    }
    const ms = clampRetryDelay(delayMs);
    super(`${describe(cause, "handler failed")} (retry after ${ms} ms)`, { cause });
    this.name = "RetryAfterError";
    this.delayMs = ms;
  }
}

/** A failure that dead-letters the event at once, with no retry. */
export class DeadLetterError extends Error {
  constructor(cause?: unknown) {
    super(describe(cause, "dead-lettered by the handler"), { cause });
    this.name = "DeadLetterError";
  }
}

/** The handler ran longer than the worker's handlerTimeoutMs. */
export class HandlerTimeoutError extends Error {
  constructor(readonly timeoutMs: number) {
    super(`handler timed out after ${timeoutMs} ms`);
    this.name = "HandlerTimeoutError";
  }
}

/** The slot's lease was lost (taken over, released, or expired locally). */
export class LeaseLostError extends Error {
  constructor(readonly slot: number, why: string) {
    super(`the lease on slot ${slot} was lost: ${why}`);
    this.name = "LeaseLostError";
  }
}

/** The worker was stopped hard: work in flight is abandoned, not acknowledged. */
export class WorkerKilledError extends Error {
  constructor() {
    super("the worker was stopped hard");
    this.name = "WorkerKilledError";
  }
}

/** A handler call kill() gave up waiting for (HandlersStillRunningError.running). */
export interface RunningHandler {
  slot: number;
  /** The id of the event the handler is handling, a decimal string. */
  eventId: string;
}

/**
 * Passed to onError when a hard stop gave up waiting for handlers that
 * ignore their aborted signal (ABANDON_WAIT_MS after aborting them): the
 * stop resolves anyway and they are abandoned. Nothing of theirs is
 * acknowledged; their events are delivered again to the slot's next owner
 * after the lease TTL. As the Go library's StillRunningError.
 */
export class HandlersStillRunningError extends Error {
  constructor(readonly running: readonly RunningHandler[], readonly waitedMs: number) {
    const what = running.length === 0
      ? "the worker's calls in flight"
      : running.map((h) => `slot ${h.slot} event ${h.eventId}`).join(", ");
    super(`the worker was stopped hard and gave up ${waitedMs} ms after aborting its handlers; still running: ${what} (abandoned: delivered again after the lease TTL)`);
    this.name = "HandlersStillRunningError";
  }
}

/** `throw retryAfter(err, 5000)`: retry the event in 5 s. */
export function retryAfter(err: unknown, delayMs: number): RetryAfterError {
  return new RetryAfterError(delayMs, err);
}

/** `throw deadLetter(err)`: dead-letter the event now. */
export function deadLetter(err?: unknown): DeadLetterError {
  return new DeadLetterError(err);
}

function describe(cause: unknown, fallback: string): string {
  if (cause instanceof Error) return cause.message;
  if (cause === undefined || cause === null) return fallback;
  return textOf(cause);
}

/**
 * The text of a thrown value that is no Error. A plain object reads as its
 * JSON, not "[object Object]"; String() of an object without a prototype
 * throws, and a reason must never throw: the event's failure would be lost
 * with its slot's chunk.
 */
function textOf(v: unknown): string {
  if (typeof v === "object" && v !== null) {
    const own = (v as { toString?: unknown }).toString;
    if (typeof own !== "function" || own === Object.prototype.toString) {
      try {
        const j = JSON.stringify(v);
        if (j !== undefined) return j;
      } catch {
        // circular, or holding a bigint: the tag below
      }
      return Object.prototype.toString.call(v);
    }
  }
  try {
    return String(v);
  } catch {
    return Object.prototype.toString.call(v);
  }
}

/** err as text: its message for an Error, else textOf. May throw (reasonOf catches). */
function textOfThrown(err: unknown): string {
  if (err instanceof DeadLetterError || err instanceof RetryAfterError) return String(err.message);
  if (err instanceof Error) return `${err.name === "Error" ? "" : String(err.name) + ": "}${String(err.message)}`;
  return textOf(err);
}

/** ReasonMaxBytes of the Go library: the longest reason stored with a nack. */
const reasonMaxBytes = 1000;

/**
 * The text a nack stores for err: its message, cut to a sane length. Never
 * throws: a value that cannot be read (a revoked Proxy, a message getter
 * that throws, a Symbol message) still fails its event, with a reason that
 * says so, instead of ending the slot's runner with its chunk unsettled.
 */
export function reasonOf(err: unknown): string {
  let s: string;
  try {
    s = textOfThrown(err);
  } catch {
    s = "the handler threw a value that cannot be read as text";
  }
  // PostgreSQL text cannot hold NUL.
  s = s.replace(/\u0000/g, "");
  if (Buffer.byteLength(s) <= reasonMaxBytes) return s;
  // Cut at a character boundary: drop code points until it fits.
  const chars = Array.from(s);
  while (Buffer.byteLength(chars.join("")) > reasonMaxBytes) chars.length -= Math.max(1, chars.length >> 4);
  return chars.join("");
}
