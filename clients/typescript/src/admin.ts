// The admin surface: thin calls over pgque's SQL API, each one statement
// (or one transaction) on the Executor given. Which role may call what is
// the SQL's business (docs/security.md): each function says what it needs,
// and a role without the right gets a PgqueError of kind
// "permission_denied". Event and dead-letter ids are decimal strings, as
// send returns them.

import { dateOf, intervalParam, msColumn, withTransaction, type Executor } from "./executor.js";
import { PgqueError, mapError } from "./errors.js";

/** What happens to a key whose head event keeps failing. */
export type FailurePolicy = "skip" | "pause";

async function one<R>(exec: Executor, doing: string, text: string, params: unknown[]): Promise<R> {
  try {
    return (await exec.query<R>(text, params)).rows[0]!;
  } catch (err) {
    throw mapError(doing, err);
  }
}

/**
 * R with its Date fields K as the query returns them: milliseconds in
 * text (msColumn), which dateOf turns into Dates whatever type parsers the
 * application set.
 */
type Timed<R, K extends keyof R> = Omit<R, K> & { [F in K]: string | null };

async function all<R>(exec: Executor, doing: string, text: string, params: unknown[]): Promise<R[]> {
  try {
    return (await exec.query<R>(text, params)).rows;
  } catch (err) {
    throw mapError(doing, err);
  }
}

function invalid(message: string): PgqueError {
  return new PgqueError(`pgque: ${message}`, "invalid_argument");
}

/** Creates queue; false when it existed already. Needs pgque_admin. */
export async function createQueue(exec: Executor, queue: string): Promise<boolean> {
  const r = await one<{ n: number }>(exec, `creating queue "${queue}"`, "select pgque.create_queue($1::pg_catalog.text)::int4 as n", [queue]);
  return r.n === 1;
}

/** Drops queue; force drops it even while it has subscriptions. Needs pgque_admin. */
export async function dropQueue(exec: Executor, queue: string, opts: { force?: boolean } = {}): Promise<void> {
  await one(exec, `dropping queue "${queue}"`, "select pgque.drop_queue($1::pg_catalog.text, $2::boolean)", [queue, opts.force ?? false]);
}

/**
 * Sets one queue parameter (ticker_max_count, ticker_max_lag,
 * ticker_idle_period, rotation_period, max_retries, dedup_window, ...;
 * values as text, e.g. "10 ms"). Needs pgque_admin.
 */
export async function setQueueConfig(exec: Executor, queue: string, param: string, value: string): Promise<void> {
  await one(exec, `setting ${param} of queue "${queue}"`,
    "select pgque.set_queue_config($1::pg_catalog.text, $2::pg_catalog.text, $3::pg_catalog.text)", [queue, param, value]);
}

/**
 * Subscribes all nslots slots of a partitioned consumer in one transaction
 * and returns how many were new. A policy sets the failure policy of a new
 * consumer (default "skip"); another policy than the persisted one fails
 * with kind "policy_mismatch" (change it with setFailurePolicy), another
 * slot count with "slot_count_mismatch".
 */
export async function subscribeSlots(
  exec: Executor, queue: string, consumer: string, nslots: number, opts: { policy?: FailurePolicy } = {},
): Promise<number> {
  if (!Number.isInteger(nslots) || nslots < 1) throw invalid(`nslots must be an integer of at least 1, not ${nslots}`);
  if (opts.policy !== undefined && opts.policy !== "skip" && opts.policy !== "pause") {
    throw invalid(`failure policy must be "skip" or "pause", not ${JSON.stringify(opts.policy)}`);
  }
  const doing = `subscribing ${nslots} slots of "${consumer}" to queue "${queue}"`;
  try {
    return await withTransaction(exec, async (tx) => {
      let created = 0;
      for (let slot = 0; slot < nslots; slot++) {
        const { rows } = await tx.query<{ n: number }>(
          "select pgque.subscribe_slot($1::pg_catalog.text, $2::pg_catalog.text, $3::int4, $4::int4, $5::pg_catalog.text) as n",
          [queue, consumer, slot, nslots, opts.policy ?? null],
        );
        created += rows[0]!.n;
      }
      return created;
    });
  } catch (err) {
    throw mapError(doing, err);
  }
}

/** Removes all nslots slots of a partitioned consumer in one transaction. */
export async function unsubscribeSlots(exec: Executor, queue: string, consumer: string, nslots: number): Promise<void> {
  if (!Number.isInteger(nslots) || nslots < 1) throw invalid(`nslots must be an integer of at least 1, not ${nslots}`);
  try {
    await withTransaction(exec, async (tx) => {
      for (let slot = 0; slot < nslots; slot++) {
        await tx.query("select pgque.unsubscribe_slot($1::pg_catalog.text, $2::pg_catalog.text, $3::int4, $4::int4)",
          [queue, consumer, slot, nslots]);
      }
    });
  } catch (err) {
    throw mapError(`unsubscribing ${nslots} slots of "${consumer}" from queue "${queue}"`, err);
  }
}

/** Changes a partitioned consumer's failure policy. Needs pgque_admin. */
export async function setFailurePolicy(exec: Executor, queue: string, consumer: string, policy: FailurePolicy): Promise<void> {
  await one(exec, `setting the failure policy of "${consumer}" on queue "${queue}"`,
    "select pgque.set_failure_policy($1::pg_catalog.text, $2::pg_catalog.text, $3::pg_catalog.text)", [queue, consumer, policy]);
}

/**
 * Starts an online resize of consumer's slots to nslots (docs/design.md,
 * "Online resize of N") and returns its seal tick. Producers and workers
 * keep running: workers follow the resize by themselves. It completes once
 * the old slots are worked (resizes() shows its phase). Fails with
 * "resize_in_progress" while another resize of the consumer runs, and
 * "invalid_argument" when it has nslots already. Needs pgque_admin.
 */
export async function resizeSlots(exec: Executor, queue: string, consumer: string, nslots: number): Promise<string> {
  if (!Number.isInteger(nslots) || nslots < 1) throw invalid(`nslots must be an integer of at least 1, not ${nslots}`);
  const r = await one<{ tick: string }>(exec, `resizing consumer "${consumer}" of queue "${queue}" to ${nslots} slots`,
    "select pgque.resize_slots($1::pg_catalog.text, $2::pg_catalog.text, $3::pg_catalog.int4)::pg_catalog.text as tick", [queue, consumer, nslots]);
  return r.tick;
}

/** A resize of a consumer's slots: one in progress, or the consumer's last one. */
export interface Resize {
  queue: string;
  consumer: string;
  /** The slot count now: the old N until the cutover, the new one after. */
  nslots: number;
  /** The N a resize in progress goes to; null once done (nslots is it). */
  resizeTo: number | null;
  phase: "draining" | "settling" | "cutover" | "done";
  /** The tick the resize sealed the old N at; null once done. */
  sealTick: string | null;
  /** When the resize in progress started; null once done. */
  started: Date | null;
  /** When the last resize completed; null while one is in progress. */
  finished: Date | null;
  slotsDone: number;
  slotsTotal: number;
  heldKeys: number;
  blockedKeys: number;
}

/** The resizes in progress and each consumer's last one, of queue or of every queue. */
export async function resizes(exec: Executor, queue?: string): Promise<Resize[]> {
  const rows = await all<Timed<Resize, "started" | "finished">>(exec, queue === undefined ? "reading resizes" : `reading the resizes of queue "${queue}"`,
    `select queue, consumer, nslots, resize_to as "resizeTo", phase, seal_tick::pg_catalog.text as "sealTick",
            ${msColumn("started", "started")}, ${msColumn("finished", "finished")},
            slots_done as "slotsDone", slots_total as "slotsTotal", held_keys as "heldKeys", blocked_keys as "blockedKeys"
       from pgque.resize_status($1::pg_catalog.text) order by queue, consumer`, [queue ?? null]);
  return rows.map((r) => ({ ...r, started: dateOf(r.started), finished: dateOf(r.finished) }));
}

/** A key held by a failing head event under the "pause" policy. */
export interface BlockedKey {
  queue: string;
  consumer: string;
  slot: number;
  /** The key; null is the NULL key, distinct from "". */
  key: string | null;
  /**
   * "blocked" (the head failed and waits for its retry), "releasing" (the
   * head was settled; the deferred events are being put back) or "held"
   * (the key's lane runs on past its acknowledged chunk).
   */
  state: "blocked" | "releasing" | "held";
  /** The failing head's event id. */
  headEventId: string;
  since: Date;
  failures: number;
  reason: string | null;
  /** Events of the key waiting behind the head. */
  deferred: number;
}

/** The blocked keys of queue's consumers (of one consumer when given). */
export async function blockedKeys(exec: Executor, queue: string, consumer?: string): Promise<BlockedKey[]> {
  const rows = await all<Timed<BlockedKey, "since">>(exec, `listing blocked keys of queue "${queue}"`,
    `select queue, consumer, slot, key, state, head_ev_id::pg_catalog.text as "headEventId", ${msColumn("since", "since")},
            failures, reason, deferred::pg_catalog.float8 as deferred
       from pgque.blocked_keys($1::pg_catalog.text, $2::pg_catalog.text)`, [queue, consumer ?? null]);
  return rows.map((r) => ({ ...r, since: dateOf(r.since)! }));
}

/**
 * A key as an error message quotes it: its first 200 characters, then its
 * length in bytes when it is longer (a key is any text; quoted whole, a
 * 1 MB key made every message that named it megabytes long). The server's
 * messages quote keys the same way.
 */
function keyLabel(key: string | null): string {
  if (key === null || key.length <= 200) return JSON.stringify(key);
  return `${JSON.stringify(key.slice(0, 200))}… (${Buffer.byteLength(key)} bytes)`;
}

/**
 * Dead-letters the failing head of a blocked key and lets the key go on;
 * returns the head's event id. Fails with "key_not_blocked" or, while the
 * head is being redelivered, "key_busy". Needs pgque_admin.
 */
export async function unblockKey(exec: Executor, queue: string, consumer: string, key: string | null): Promise<string> {
  const r = await one<{ id: string }>(exec, `unblocking key ${keyLabel(key)} of "${consumer}" on queue "${queue}"`,
    "select pgque.unblock_key($1::pg_catalog.text, $2::pg_catalog.text, $3::pg_catalog.text)::pg_catalog.text as id", [queue, consumer, key]);
  return r.id;
}

/** Retries a blocked key's head now instead of at its backoff; false when no retry was pending. Needs pgque_admin. */
export async function retryKeyNow(exec: Executor, queue: string, consumer: string, key: string | null): Promise<boolean> {
  const r = await one<{ n: number }>(exec, `retrying key ${keyLabel(key)} of "${consumer}" on queue "${queue}"`,
    "select pgque.retry_key_now($1::pg_catalog.text, $2::pg_catalog.text, $3::pg_catalog.text)::int4 as n", [queue, consumer, key]);
  return r.n === 1;
}

/** An event that failed for good for one consumer. */
export interface DeadLetter {
  /** Identifies the dead letter within its queue (replayDeadLetter). */
  id: string;
  consumer: string;
  deadSince: Date;
  /** The last failure, as nacked. */
  reason: string | null;
  eventId: string;
  eventTime: Date;
  retryCount: number;
  /** True when the event had been replayed before and died again. */
  replayed: boolean;
  type: string | null;
  /** The payload as JSON text. */
  json: string | null;
  key: string | null;
}

/** The oldest dead letters of queue (of one consumer when given), at most limit (default 100). */
export async function deadLetters(exec: Executor, queue: string, opts: { consumer?: string; limit?: number } = {}): Promise<DeadLetter[]> {
  const limit = opts.limit ?? 100;
  if (!Number.isInteger(limit) || limit < 0) throw invalid(`dead letter limit must be a non-negative integer, not ${limit}`);
  const rows = await all<Timed<DeadLetter, "deadSince" | "eventTime">>(exec, `listing dead letters of queue "${queue}"`,
    `select dl_id::pg_catalog.text as id, consumer, ${msColumn("dl_time", '"deadSince"')}, reason, ev_id::pg_catalog.text as "eventId",
            ${msColumn("ev_time", '"eventTime"')}, case when ev_retry < 0 then -1 - ev_retry else ev_retry end as "retryCount",
            ev_retry < 0 as replayed, ev_type as type, ev_data as json, key
       from pgque.dlq_list($1::pg_catalog.text, $2::pg_catalog.text, $3::int4)`, [queue, opts.consumer ?? null, limit]);
  return rows.map((r) => ({ ...r, deadSince: dateOf(r.deadSince)!, eventTime: dateOf(r.eventTime)! }));
}

/** What replaying a dead letter did (replayDeadLetterReport). */
export interface ReplayReport {
  /** The event id, the original's: the replay arrives with Message.replay set. */
  eventId: string;
  /**
   * Events of the same key with a greater id that the consumer had already
   * been handed: when above 0 the replay comes after them, out of the key's
   * order (events still dead-lettered themselves are not counted).
   */
  laterDelivered: number;
  /** False when rotation already dropped the original event, so the count above may be short. */
  historyComplete: boolean;
  consumer: string;
  key: string | null;
}

/**
 * Puts a dead letter back into queue for the consumer it failed for only
 * (same event id, its retry count kept, marked as a replay) and returns the
 * event id. Fails with "dead_letter_not_found" or "consumer_not_found".
 * Needs pgque_admin. replayDeadLetterReport says whether the replay
 * overtakes later events of its key.
 */
export async function replayDeadLetter(exec: Executor, queue: string, id: string | bigint): Promise<string> {
  return (await replayDeadLetterReport(exec, queue, id)).eventId;
}

/** replayDeadLetter, reporting the later events of the key the replay comes after. */
export async function replayDeadLetterReport(exec: Executor, queue: string, id: string | bigint): Promise<ReplayReport> {
  if (typeof id === "string" && !/^-?[0-9]{1,19}$/.test(id)) {
    throw invalid(`dead letter id ${JSON.stringify(id)} is not an integer`);
  }
  return one<ReplayReport>(exec, `replaying dead letter ${id} of queue "${queue}"`,
    `select ev_id::pg_catalog.text as "eventId", later_delivered::pg_catalog.float8 as "laterDelivered",
            history_complete as "historyComplete", consumer, key
       from pgque.dlq_replay_report($1::pg_catalog.text, $2::int8)`, [queue, String(id)]);
}

/**
 * Deletes dead letters of queue for good (of one consumer, older than
 * olderThanMs, when given) and returns how many. Needs pgque_admin.
 */
export async function purgeDeadLetters(exec: Executor, queue: string, opts: { consumer?: string; olderThanMs?: number } = {}): Promise<number> {
  const older = opts.olderThanMs ?? 0;
  if (!(older >= 0 && Number.isFinite(older))) throw invalid(`purge olderThanMs must be a non-negative number, not ${older}`);
  const r = await one<{ n: number }>(exec, `purging dead letters of queue "${queue}"`,
    "select pgque.dlq_purge($1::pg_catalog.text, $2::pg_catalog.text, $3::interval)::pg_catalog.float8 as n",
    [queue, opts.consumer ?? null, intervalParam(older)]);
  return r.n;
}

/** One queue's state, from pgque.get_queue_info. */
export interface QueueStatus {
  name: string;
  /** Events per second between the last ticks; null before two ticks. */
  eventsPerSec: number | null;
  /** Events sent but not yet covered by a tick. */
  unticked: number;
  /** Seconds since the last tick; null before the first. */
  tickerLagSec: number | null;
  retryPending: number;
  deadLetters: number;
  lastTickId: string | null;
  maxRetries: number;
}

/** The state of queue, or of every queue the role may see. */
export async function queues(exec: Executor, queue?: string): Promise<QueueStatus[]> {
  return all<QueueStatus>(exec, queue === undefined ? "reading queue status" : `reading the status of queue "${queue}"`,
    `select queue_name as name, ev_per_sec as "eventsPerSec", ev_new::pg_catalog.float8 as unticked,
            extract(epoch from ticker_lag)::pg_catalog.float8 as "tickerLagSec",
            retry_pending::pg_catalog.float8 as "retryPending", dead_letters::pg_catalog.float8 as "deadLetters",
            last_tick_id::pg_catalog.text as "lastTickId", queue_max_retries as "maxRetries"
       from pgque.get_queue_info($1::pg_catalog.text) order by queue_name`, [queue ?? null]);
}

/** One slot of a partitioned consumer, from pgque.partition_slot_status. */
export interface SlotStatus {
  queue: string;
  consumer: string;
  slot: number;
  nslots: number;
  /** The worker holding the lease, if any. */
  owner: string | null;
  /** Whether the lease is live by the server's clock. */
  live: boolean;
  /** The lease epoch (0 before the first claim): a bigint, as Message.epoch and SlotChange.epoch. */
  epoch: bigint;
  /**
   * Events of the slot still to be handled: after its cursor, waiting for a
   * retry or deferred behind a held key. The acknowledged chunks of its open
   * batch, and a held key's events already completed by workTx handlers,
   * are not counted; a plain handler's progress in a held key is, until the
   * key settles.
   */
  lag: number;
  oldestPendingAgeSec: number;
  policy: string | null;
}

/** The slots of queue's partitioned consumers (of one consumer when given). */
export async function slots(exec: Executor, queue?: string, consumer?: string): Promise<SlotStatus[]> {
  const rows = await all<Omit<SlotStatus, "epoch"> & { epoch: string }>(exec, "reading slot status",
    `select queue, consumer, slot, nslots, owner,
            coalesce(lease_until operator(pg_catalog.>) pg_catalog.now(), false) as live,
            coalesce(epoch, 0)::pg_catalog.text as epoch, coalesce(lag, 0)::pg_catalog.float8 as lag,
            coalesce(extract(epoch from oldest_pending_age), 0)::pg_catalog.float8 as "oldestPendingAgeSec", policy
       from pgque.partition_slot_status
      where ($1::pg_catalog.text is null or queue operator(pg_catalog.=) $1::pg_catalog.text)
        and ($2::pg_catalog.text is null or consumer operator(pg_catalog.=) $2::pg_catalog.text)
      order by queue, consumer, slot`, [queue ?? null, consumer ?? null]);
  return rows.map((r) => ({ ...r, epoch: BigInt(r.epoch) }));
}

/** A key of a partitioned consumer with events pending, from pgque.key_heads. */
export interface KeyHead {
  slot: number;
  /** The partition key; null is the NULL key (slot 0), distinct from "". */
  key: string | null;
  /**
   * By precedence: "blocked" (the head failed and waits for its retry),
   * "releasing", "held" (its lane runs on past its chunk), "retrying" (an
   * event waits in the retry queue), "in flight" (in the slot's open
   * batch) or "flowing".
   */
  state: string;
  /** The key's oldest pending event. */
  headEventId: string;
  headAgeSec: number;
  /** The key's events pending for the slot (a lower bound when estimated). */
  pending: number;
  failures: number;
  reason: string | null;
  retryAt: Date | null;
  /** Events deferred behind a blocked or held head (pause). */
  deferred: number;
  /** The slot's scan budget ran out: counts are lower bounds, the heads are still the oldest. */
  estimated: boolean;
}

/**
 * The keys of a partitioned consumer whose head has waited longest, oldest
 * first: which tenants are behind, and why. Reads at most `scan` pending
 * events (default 20 000) split between the slots; `slot` narrows it to
 * one, `limit` (default 20) caps the keys. What `pgque keys` prints.
 */
export async function keyHeads(
  exec: Executor, queue: string, consumer: string, opts: { slot?: number; limit?: number; scan?: number } = {},
): Promise<KeyHead[]> {
  const rows = await all<Timed<KeyHead, "retryAt">>(exec, `reading the key heads of "${consumer}" on queue "${queue}"`,
    `select slot, key, state, head_ev_id::pg_catalog.text as "headEventId",
            extract(epoch from head_age)::pg_catalog.float8 as "headAgeSec", pending::pg_catalog.float8 as pending,
            failures, reason, ${msColumn("retry_at", '"retryAt"')}, deferred::pg_catalog.float8 as deferred, estimated
       from pgque.key_heads($1::pg_catalog.text, $2::pg_catalog.text, $3::pg_catalog.int4,
                            coalesce($4::pg_catalog.int4, 20), coalesce($5::pg_catalog.int4, 20000))`,
    [queue, consumer, opts.slot ?? null, opts.limit ?? null, opts.scan ?? null]);
  return rows.map((r) => ({ ...r, retryAt: dateOf(r.retryAt) }));
}

/** One slot's pending events and its busiest key, from pgque.key_shares. */
export interface KeyShare {
  slot: number;
  pending: number;
  /** The key with the most pending events on the slot; null when none is pending. */
  topKey: string | null;
  topPending: number;
  /** topPending / pending: near 1, one key is the slot's whole backlog. */
  share: number | null;
  /** Distinct keys pending. */
  keys: number;
  estimated: boolean;
}

/** Per slot of a partitioned consumer: its backlog and how much of it one key is. */
export async function keyShares(exec: Executor, queue: string, consumer: string, opts: { scan?: number } = {}): Promise<KeyShare[]> {
  return all<KeyShare>(exec, `reading the key shares of "${consumer}" on queue "${queue}"`,
    `select slot, pending::pg_catalog.float8 as pending, top_key as "topKey", top_pending::pg_catalog.float8 as "topPending",
            share, keys::pg_catalog.float8 as keys, estimated
       from pgque.key_shares($1::pg_catalog.text, $2::pg_catalog.text, coalesce($3::pg_catalog.int4, 20000))`,
    [queue, consumer, opts.scan ?? null]);
}

/** A key among the busiest of a queue's recent events, from pgque.hot_keys. */
export interface HotKey {
  key: string | null;
  events: number;
  /** Events per second over spanSec. */
  rate: number;
  /** Of the events read. */
  share: number;
  /** The time the events read cover: the window, or less when estimated. */
  spanSec: number;
  estimated: boolean;
}

/**
 * The busiest keys of queue's events sent within the last windowMs
 * (default 60 000), reading at most `sample` (default 20 000) of the newest.
 */
export async function hotKeys(
  exec: Executor, queue: string, opts: { windowMs?: number; limit?: number; sample?: number } = {},
): Promise<HotKey[]> {
  return all<HotKey>(exec, `reading the hot keys of queue "${queue}"`,
    `select key, events::pg_catalog.float8 as events, rate, share,
            extract(epoch from span)::pg_catalog.float8 as "spanSec", estimated
       from pgque.hot_keys($1::pg_catalog.text, pg_catalog.make_interval(secs => coalesce($2::pg_catalog.float8, 60000) operator(pg_catalog./) 1000),
                           coalesce($3::pg_catalog.int4, 10), coalesce($4::pg_catalog.int4, 20000))`,
    [queue, opts.windowMs ?? null, opts.limit ?? null, opts.sample ?? null]);
}
