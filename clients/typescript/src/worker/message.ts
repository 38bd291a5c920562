// The message a worker's handler receives.

import { dateOf } from "../executor.js";

/** One event as a handler sees it. */
export interface Message<P = unknown> {
  /** The event id (ev_id), a decimal string: int8 never loses precision. */
  readonly id: string;
  /** The partition key; `null` is the NULL key, distinct from `""`. */
  readonly key: string | null;
  /** The event type. */
  readonly type: string;
  /** The payload, parsed as JSON; a payload stored as non-JSON text is that string. */
  readonly payload: P;
  /** The payload exactly as stored (the JSON text, or the raw text). */
  readonly rawPayload: string | null;
  /** How many times the event was retried before (0 on first delivery). */
  readonly retryCount: number;
  /**
   * True when this is a retry of an event that failed before (retryCount
   * > 0) or a replayed dead letter. False for an event delivered again
   * after a crash, a hard stop or a takeover, whose retry count is
   * unchanged: it says nothing about whether the event was handled before.
   */
  readonly redelivered: boolean;
  /**
   * True when the event is a dead letter an operator put back (`dlq
   * replay`): it comes after the events of its key that were delivered
   * meanwhile, so a handler that applies state in order should check it.
   * `id` is the original event's id; `retryCount` the retries it had.
   */
  readonly replay: boolean;
  /** When the event was sent. */
  readonly createdAt: Date;
  /** The lease epoch of the slot the event was received under (fencing). */
  readonly epoch: bigint;
  /** The slot the event was received on, and the consumer's slot count. */
  readonly slot: number;
  readonly nslots: number;
  /** The batch the event was received in, a decimal string. */
  readonly batchId: string;
  readonly queue: string;
  readonly consumer: string;
}

/** A row of receive_partitioned_raw as node-postgres returns it. */
export interface ChunkRow {
  msg_id: string;
  batch_id: string;
  type: string;
  payload: string | null;
  retry_count: number | null;
  /** created_at in whole milliseconds since 1970 (msColumn). */
  created_ms: string;
  partition_key: string | null;
  epoch: string;
}

/**
 * Parses a stored payload the way the Go library does: JSON as it is, any
 * other text as that string, SQL NULL as null.
 */
export function parsePayload(raw: string | null): unknown {
  if (raw === null) return null;
  try {
    return JSON.parse(raw);
  } catch {
    return raw;
  }
}

/**
 * Splits the stored retry count: a replayed dead letter is stored with
 * retry_count -1 - n, n the retries it had (pgque.dlq_replay_report), so
 * ordinary events carry nothing extra.
 */
export function decodeRetry(stored: number | null): { retryCount: number; replay: boolean } {
  const n = stored ?? 0;
  return n < 0 ? { retryCount: -1 - n, replay: true } : { retryCount: n, replay: false };
}

export function toMessage(r: ChunkRow, queue: string, consumer: string, slot: number, nslots: number): Message {
  const { retryCount, replay } = decodeRetry(r.retry_count);
  return {
    id: String(r.msg_id),
    key: r.partition_key,
    type: r.type,
    payload: parsePayload(r.payload),
    rawPayload: r.payload,
    retryCount,
    redelivered: retryCount > 0 || replay,
    replay,
    createdAt: dateOf(r.created_ms)!,
    epoch: BigInt(r.epoch),
    slot,
    nslots,
    batchId: String(r.batch_id),
    queue,
    consumer,
  };
}
