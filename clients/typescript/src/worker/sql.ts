// The SQL calls of the worker pool: one function per pgque SQL function,
// the same calls in the same order as the Go pool's internal/dbq, so that
// TypeScript and Go workers of one consumer share every lease, token and
// epoch. Lease tokens are passed as parameters only, never logged or put
// into an error message.

import { intervalParam, msColumn, type Executor } from "../executor.js";
import type { ChunkRow } from "./message.js";

/** The chunk a slot handed out: what the fenced ack and nack present. */
export interface Delivery {
  epoch: string;
  batchId: string;
  msgId: string;
}

/** The lease of one slot: epoch and the secret token that proves it. */
export interface Lease {
  epoch: string;
  token: string;
  /** The backend pid of the LISTEN session the lease is bound to, 0 for none (claim_slot's session). */
  session: number;
}

/** A failed event to be retried after delayMs, or dead-lettered when delayMs is null. */
export interface Failure {
  id: string;
  delayMs: number | null;
  reason: string;
}

/** A peer worker as announce_worker returns it. */
export interface Peer {
  worker: string;
  hungry: boolean;
  slots: number[];
}

/** One row of partition_slot_leases. */
export interface SlotLease {
  slot: number;
  /** The consumer's N the row belongs to. */
  nslots: number;
  owner: string | null;
  live: boolean;
  /** The lease is bound to its holder's session, which is gone: a claim takes it over soon. */
  holderGone: boolean;
}

const ms = (n: number | null): string | null => (n === null ? null : intervalParam(Math.max(0, Math.round(n))));

export async function slotGroupN(db: Executor, queue: string, consumer: string): Promise<number | null> {
  const { rows } = await db.query<{ nslots: number }>(
    `select nslots from pgque.partition_slot_leases where queue operator(pg_catalog.=) $1::text and consumer operator(pg_catalog.=) $2::text limit 1`,
    [queue, consumer],
  );
  return rows[0]?.nslots ?? null;
}

/** The consumer's N and its resize state, as slot_group_info returns them. */
export interface SlotGroup {
  nslots: number;
  /** The N a resize in progress goes to; null when none runs. */
  resizeTo: number | null;
  /** Every N the consumer had before. */
  pastNSlots: number[];
}

/** slot_group_info: PQ034 (slot_not_subscribed) when the consumer has no slots. */
export async function slotGroupInfo(db: Executor, queue: string, consumer: string): Promise<SlotGroup> {
  const { rows } = await db.query<{ nslots: number; resize_to: number | null; past_nslots: number[] | null }>(
    `select nslots, resize_to, past_nslots from pgque.slot_group_info($1::text, $2::text)`,
    [queue, consumer],
  );
  const r = rows[0]!;
  return { nslots: r.nslots, resizeTo: r.resize_to, pastNSlots: r.past_nslots ?? [] };
}

export async function subscribeSlot(db: Executor, queue: string, consumer: string, slot: number, nslots: number, policy: string | null): Promise<void> {
  await db.query(`select pgque.subscribe_slot($1::text, $2::text, $3::int, $4::int, $5::text)`, [queue, consumer, slot, nslots, policy]);
}

export async function slotPolicy(db: Executor, queue: string, consumer: string): Promise<string | null> {
  const { rows } = await db.query<{ policy: string }>(
    `select policy from pgque.partition_slot_leases where queue operator(pg_catalog.=) $1::text and consumer operator(pg_catalog.=) $2::text limit 1`,
    [queue, consumer],
  );
  return rows[0]?.policy ?? null;
}

/**
 * claim_slot: a new lease (token null) or a renewal; null when another
 * live lease holds the slot. session (0: none) binds the lease to that
 * backend: the LISTEN session, whose end lets another claim take the lease
 * before its TTL (design.md, "Dead holders").
 */
export async function claimSlot(db: Executor, queue: string, consumer: string, slot: number, worker: string, ttlMs: number, token: string | null, session = 0): Promise<Lease | null> {
  const { rows } = await db.query<{ epoch: string | null; token: string | null }>(
    `select epoch, token::text as token from pgque.claim_slot($1::text, $2::text, $3::int, $4::text, $5::interval, $6::uuid, $7::int)`,
    [queue, consumer, slot, worker, ms(ttlMs), token, session === 0 ? null : session],
  );
  const r = rows[0];
  if (!r || r.epoch === null || r.token === null) return null;
  return { epoch: String(r.epoch), token: r.token, session };
}

export async function releaseSlot(db: Executor, queue: string, consumer: string, slot: number, worker: string, token: string): Promise<void> {
  await db.query(`select pgque.release_slot($1::text, $2::text, $3::int, $4::text, $5::uuid)`, [queue, consumer, slot, worker, token]);
}

/**
 * receive_partitioned_raw: the slot's next chunk; a non-null ack is the
 * chunk handed out last, acknowledged by the same statement first.
 */
export async function receive(db: Executor, queue: string, consumer: string, slot: number, nslots: number, worker: string, token: string, max: number, ack: Delivery | null): Promise<ChunkRow[]> {
  const { rows } = await db.query<ChunkRow>(
    `select msg_id, batch_id, type, payload, retry_count, ${msColumn("created_at", "created_ms")}, partition_key, epoch
       from pgque.receive_partitioned_raw($1::text, $2::text, $3::int, $4::int, $5::text, $6::uuid, $7::int, $8::bigint, $9::bigint, $10::bigint)`,
    [queue, consumer, slot, nslots, worker, token, max, ack?.epoch ?? null, ack?.batchId ?? null, ack?.msgId ?? null],
  );
  return rows;
}

export async function ack(db: Executor, queue: string, consumer: string, slot: number, nslots: number, worker: string, token: string, d: Delivery): Promise<void> {
  await db.query(`select pgque.ack_partitioned($1::text, $2::text, $3::int, $4::int, $5::text, $6::uuid, $7::bigint, $8::bigint, $9::bigint)`,
    [queue, consumer, slot, nslots, worker, token, d.epoch, d.batchId, d.msgId]);
}

export async function nack(db: Executor, queue: string, consumer: string, slot: number, nslots: number, worker: string, token: string, d: Delivery, f: Failure): Promise<boolean> {
  const { rows } = await db.query<{ n: number }>(
    `select pgque.nack_partitioned($1::text, $2::text, $3::int, $4::int, $5::text, $6::uuid, $7::bigint, $8::bigint, $9::bigint, $10::interval, $11::text) as n`,
    [queue, consumer, slot, nslots, worker, token, d.epoch, d.batchId, f.id, ms(f.delayMs), f.reason],
  );
  return rows[0]?.n === 1;
}

/**
 * complete_partitioned_in_tx: marks event msgId done for the slot inside
 * the caller's open transaction (db is that transaction's connection),
 * fenced by the lease; PQ038 when it was completed before.
 */
export async function completeInTx(db: Executor, queue: string, consumer: string, slot: number, nslots: number, worker: string, token: string,
  epoch: bigint, batchId: string, msgId: string): Promise<void> {
  await db.query(`select pgque.complete_partitioned_in_tx($1::text, $2::text, $3::int, $4::int, $5::text, $6::uuid, $7::bigint, $8::bigint, $9::bigint)`,
    [queue, consumer, slot, nslots, worker, token, epoch.toString(), batchId, msgId]);
}

/**
 * hold_keys_partitioned: defers the unfinished events of the chunk d of each
 * keys[i] from heads[i] on, in one call (a stop hands back hundreds of keys
 * of a chunk).
 */
export async function holdKeys(db: Executor, queue: string, consumer: string, slot: number, nslots: number, worker: string, token: string, d: Delivery, keys: (string | null)[], heads: string[]): Promise<void> {
  await db.query(`select pgque.hold_keys_partitioned($1::text, $2::text, $3::int, $4::int, $5::text, $6::uuid, $7::bigint, $8::bigint, $9::text[], $10::bigint[])`,
    [queue, consumer, slot, nslots, worker, token, d.epoch, d.batchId, keys, heads]);
}

/** settle_held_partitioned; false when the hold is no longer this epoch's. */
export async function settleHeld(db: Executor, queue: string, consumer: string, slot: number, nslots: number, worker: string, token: string, epoch: string, key: string | null, head: string, done: string[], failed: Failure[]): Promise<boolean> {
  const { rows } = await db.query<{ n: number }>(
    `select pgque.settle_held_partitioned($1::text, $2::text, $3::int, $4::int, $5::text, $6::uuid, $7::bigint, $8::text, $9::bigint, $10::bigint[], $11::bigint[], $12::interval[], $13::text[]) as n`,
    [queue, consumer, slot, nslots, worker, token, epoch, key, head, done, failed.map((f) => f.id), failed.map((f) => ms(f.delayMs)), failed.map((f) => f.reason)],
  );
  return rows[0]?.n === 1;
}

export async function releaseStaleHolds(db: Executor, queue: string, consumer: string, slot: number, nslots: number, worker: string, token: string): Promise<void> {
  await db.query(`select pgque.release_stale_holds_partitioned($1::text, $2::text, $3::int, $4::int, $5::text, $6::uuid)`, [queue, consumer, slot, nslots, worker, token]);
}

export async function slotLeases(db: Executor, queue: string, consumer: string): Promise<SlotLease[]> {
  const { rows } = await db.query<SlotLease>(
    `select slot, nslots, owner, coalesce(lease_until operator(pg_catalog.>) pg_catalog.now(), false) as live, holder_gone as "holderGone"
       from pgque.partition_slot_leases where queue operator(pg_catalog.=) $1::text and consumer operator(pg_catalog.=) $2::text order by slot`,
    [queue, consumer],
  );
  return rows;
}

export async function announce(db: Executor, queue: string, consumer: string, worker: string, hungry: boolean, slots: number[], maxAgeMs: number): Promise<Peer[]> {
  const { rows } = await db.query<Peer>(
    `select worker, hungry, slots from pgque.announce_worker($1::text, $2::text, $3::text, $4::bool, $5::int[], $6::interval)`,
    [queue, consumer, worker, hungry, slots, ms(maxAgeMs)],
  );
  return rows;
}

export async function notify(db: Executor, channel: string, payload: string): Promise<void> {
  await db.query(`select pg_catalog.pg_notify($1::text, $2::text)`, [channel, payload]);
}
