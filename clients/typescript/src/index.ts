// pgque for Node.js: the package's public API.

export type { Executor, QueryResult, ConnectionSource, PooledConnection, PostgresJsLike } from "./executor.js";
export { fromPostgresJs } from "./executor.js";
export type { ErrorKind } from "./errors.js";
export { PgqueError, SchemaVersionError, isPgqueError, kindOf, mapError } from "./errors.js";
export type { MigrateResult } from "./migrate.js";
export { migrate, installedVersion, checkSchema, trustSchema, installScript } from "./migrate.js";
export { SCHEMA_VERSION } from "./version.js";
export type { Event } from "./event.js";
export { EVENT_TYPE_DEFAULT } from "./event.js";
export { send, sendBatch } from "./producer.js";
export type { SendQueueOptions, SendQueueStats } from "./sendqueue.js";
export { SendQueue, configureSends } from "./sendqueue.js";
export type { TickerOptions, TickerStats } from "./ticker.js";
export { Ticker, checkTickerRights, TICKER_FUNCTIONS } from "./ticker.js";
export { defaultWorkerId } from "./workerid.js";
export { withTransaction } from "./executor.js";
export type { FailurePolicy, BlockedKey, DeadLetter, ReplayReport, QueueStatus, SlotStatus, Resize, KeyHead, KeyShare, HotKey } from "./admin.js";
export {
  createQueue, dropQueue, setQueueConfig, subscribeSlots, unsubscribeSlots, setFailurePolicy,
  blockedKeys, unblockKey, retryKeyNow, deadLetters, replayDeadLetter, replayDeadLetterReport, purgeDeadLetters, queues, slots,
  resizeSlots, resizes, keyHeads, keyShares, hotKeys,
} from "./admin.js";
export * from "./worker/index.js";
