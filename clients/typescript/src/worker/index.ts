// The worker pool: work() and what its handlers use.
export { work, ABANDON_WAIT_MS } from "./pool.js";
export { workTx, type TxHandler } from "./tx.js";
export type { WorkOptions, StopOptions, Worker, WorkerStats, SlotChange } from "./pool.js";
export type { Handler, HandlerContext, HandleResult } from "./slot.js";
export type { Message } from "./message.js";
export { RetryAfterError, RETRY_DELAY_MS_MAX, DeadLetterError, HandlerTimeoutError, LeaseLostError, WorkerKilledError, HandlersStillRunningError, type RunningHandler, retryAfter, deadLetter } from "./outcome.js";
export { ListenNotDeliveringError, PROBE_WAIT_MS } from "./listener.js";
