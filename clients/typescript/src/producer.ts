// Sending events.
//
// send and sendBatch run on whatever Executor they are given: a connection
// inside the caller's BEGIN ... COMMIT (the events commit, and become
// visible to consumers, exactly when the caller commits, and vanish if it
// rolls back), or a pg.Pool, where a send commits on its own. On a pool,
// send coalesces under load like the Go client's Client.Send (see
// sendqueue.ts).
//
// Event ids are returned as decimal strings: ev_id is a bigint, and a
// string keeps every value exact, prints as is in JSON and logs, and turns
// into a bigint with BigInt(id) when arithmetic is wanted.

import { isPool, type Executor } from "./executor.js";
import { PgqueError, mapError } from "./errors.js";
import { encode, jsonbRefuses, type Encoded, type Event } from "./event.js";
import { coalescerFor } from "./sendqueue.js";

/**
 * Sends one event to queue and returns its event id. On a pg.Pool the send
 * may be coalesced with concurrent sends into one statement (never one
 * with a dedup key); on a connection it runs there, in the caller's
 * transaction if one is open.
 */
export async function send(exec: Executor, queue: string, event: Event): Promise<string> {
  const ev = encode(event);
  if (ev.dedup === null && isPool(exec)) return coalescerFor(exec).send(queue, ev);
  return sendOne(exec, queue, ev);
}

/** Sends one encoded event with one pgque.send call. */
export async function sendOne(exec: Executor, queue: string, ev: Encoded): Promise<string> {
  try {
    const { rows } = await exec.query<{ id: string }>(
      "select pgque.send($1::pg_catalog.text, $2::pg_catalog.text, $3::pg_catalog.text, $4::pg_catalog.text, $5::pg_catalog.text)::pg_catalog.text as id",
      [queue, ev.type, ev.payload, ev.key, ev.dedup],
    );
    return rows[0]!.id;
  } catch (err) {
    throw sendError(`sending to queue "${queue}"`, err);
  }
}

/**
 * Sends events atomically, in one statement, and returns their event ids in
 * input order. Events may be of different types; they keep their order
 * (within a key they are consumed in the order given). Every event is
 * encoded before the database is touched, so a bad payload sends nothing.
 */
export async function sendBatch(exec: Executor, queue: string, events: readonly Event[]): Promise<string[]> {
  const encoded = events.map((ev, i) => {
    try {
      return encode(ev);
    } catch (err) {
      const e = err as PgqueError;
      throw new PgqueError(`sending batch to queue "${queue}": event ${i}: ${e.message}`, e.kind, e.code, { cause: e });
    }
  });
  return sendEncoded(exec, queue, encoded);
}

/** Sends encoded events with one send_batch call. */
export async function sendEncoded(exec: Executor, queue: string, events: readonly Encoded[]): Promise<string[]> {
  if (events.length === 0) return [];
  const payloads = events.map((e) => e.payload);
  const keys = events.some((e) => e.key !== null) ? events.map((e) => e.key) : null;
  const dedups = events.some((e) => e.dedup !== null) ? events.map((e) => e.dedup) : null;
  const type = events[0]!.type;
  const oneType = events.every((e) => e.type === type);
  try {
    // One type: the single-type form, which takes the type once. Mixed
    // types: the form that takes a type per event, in one statement, so
    // the batch stays atomic and in order.
    const { rows } = oneType
      ? await exec.query<{ ids: string[] }>(
          "select pgque.send_batch($1::pg_catalog.text, $2::pg_catalog.text, $3::pg_catalog.text[], $4::pg_catalog.text[], $5::pg_catalog.text[])::pg_catalog.text[] as ids",
          [queue, type, payloads, keys, dedups],
        )
      : await exec.query<{ ids: string[] }>(
          "select pgque.send_batch($1::pg_catalog.text, $2::pg_catalog.text[], $3::pg_catalog.text[], $4::pg_catalog.text[], $5::pg_catalog.text[])::pg_catalog.text[] as ids",
          [queue, events.map((e) => e.type), payloads, keys, dedups],
        );
    return rows[0]!.ids;
  } catch (err) {
    const mapped = sendError(`sending batch to queue "${queue}"`, err);
    if (!(mapped instanceof PgqueError)) throw mapped;
    const named = namedEvent(mapped.message);
    const i = named ? named.index : refusedEvent(events, mapped.code);
    if (i < 0) throw mapped;
    const message = named ? named.message : mapped.message;
    throw new PgqueError(message.replace(`sending batch to queue "${queue}": `, `sending batch to queue "${queue}": event ${i}: `),
      mapped.kind, mapped.code, { cause: err });
  }
}

/**
 * The event a server refusal of a batch names itself, counted from 1 as
 * SQL counts ("event 3 of the batch: " before a type and key too long to
 * deliver, "dedup key 3 is empty"), as this package counts it (from 0),
 * and the message without the server's number; or null.
 */
function namedEvent(message: string): { index: number; message: string } | null {
  let m = /event (\d+) of the batch: /.exec(message);
  if (m) return { index: Number(m[1]) - 1, message: message.replace(m[0], "") };
  m = /dedup key (\d+) is /.exec(message);
  if (m) return { index: Number(m[1]) - 1, message: message.replace(m[0], "dedup key is ") };
  return null;
}

/**
 * Which event of a batch the server refused with code, found again here
 * (the server's error names none: it checks the batch in one statement),
 * or -1: for 22P02 and 22P05, the first whose payload is not JSON, or is
 * JSON with an escape jsonb refuses (a lone surrogate, \u0000: what
 * JSON.stringify escapes again after a parse); for 22021, the first whose
 * payload holds a NUL character as such (a json text can; encode() refused
 * one in a type or key, and JSON.stringify escapes it in a payload); for
 * 54001, the most deeply nested; for 54000, the longest. Runs only after a
 * refusal. (Refusals that name their event are read by namedEvent.)
 */
export function refusedEvent(events: readonly Encoded[], code: string): number {
  if (code === "22021") return events.findIndex((e) => e.payload.includes("\u0000"));
  if (code === "22P02" || code === "22P05") {
    return events.findIndex((e) => {
      let v: unknown;
      try {
        v = JSON.parse(e.payload);
      } catch {
        return true;
      }
      return jsonbRefuses(JSON.stringify(v));
    });
  }
  if (code === "54001" || code === "54000") {
    const size = code === "54001" ? nesting : (p: string) => p.length;
    let best = -1;
    let most = -1;
    events.forEach((e, i) => {
      const n = size(e.payload);
      if (n > most) [best, most] = [i, n];
    });
    return best;
  }
  return -1;
}

/** The deepest nesting of arrays and objects in JSON text p. */
function nesting(p: string): number {
  let depth = 0;
  let most = 0;
  let inString = false;
  for (let i = 0; i < p.length; i++) {
    const c = p.charCodeAt(i);
    if (inString) {
      if (c === 92) i++; // a backslash: skip the escaped character
      else if (c === 34) inString = false;
    } else if (c === 34) inString = true;
    else if (c === 91 || c === 123) most = Math.max(most, ++depth);
    else if (c === 93 || c === 125) depth--;
  }
  return most;
}

/**
 * mapError for a send: there the program limits (54000: data jsonb cannot
 * deliver; 54001: JSON nested deeper than the server's stack allows) can
 * only come from an event's body, so they are invalid_payload, not the
 * generic database kind they have elsewhere.
 */
function sendError(doing: string, err: unknown): unknown {
  const mapped = mapError(doing, err);
  if (mapped instanceof PgqueError && (mapped.code === "54000" || mapped.code === "54001")) {
    return new PgqueError(mapped.message, "invalid_payload", mapped.code, { cause: err });
  }
  return mapped;
}
