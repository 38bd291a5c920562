// Events to send and their encoding for the SQL API.

import { PgqueError } from "./errors.js";

/** The type of an event sent without one (the SQL send(queue, payload)'s). */
export const EVENT_TYPE_DEFAULT = "default";

/**
 * One event to send. Give its body as `payload` (any JSON-serialisable
 * value; a string becomes a JSON string) or as `json` (JSON text you
 * encoded yourself, stored as given after the server checked it), not both.
 */
export interface Event {
  /** A short name consumers dispatch on, e.g. "FileCreated"; default "default". */
  type?: string;
  /** The body, serialised with JSON.stringify. */
  payload?: unknown;
  /** The body as JSON text, sent as is; the server refuses invalid JSON. */
  json?: string;
  /**
   * Routes the event: events with the same key are consumed in order, one
   * at a time. null or absent is the NULL key (always slot 0); "" is a key
   * of its own, distinct from NULL.
   */
  partitionKey?: string | null;
  /**
   * Makes the send idempotent: a key the queue has seen within its dedup
   * window stores nothing and returns the first event's id. null or absent
   * means no dedup; "" is refused (invalid_argument).
   */
  dedupKey?: string | null;
}

/** An event ready for the SQL API. */
export interface Encoded {
  type: string;
  payload: string;
  key: string | null;
  dedup: string | null;
}

/**
 * Encodes ev for the SQL API, or throws a PgqueError of kind
 * "invalid_payload" naming what is wrong, before the database is touched.
 */
export function encode(ev: Event): Encoded {
  if (ev === null || typeof ev !== "object") {
    throw new PgqueError(`pgque: an event must be an object with a payload, got ${ev === null ? "null" : typeof ev}`, "invalid_payload");
  }
  let payload: string;
  if (ev.json !== undefined) {
    if (ev.payload !== undefined) {
      throw new PgqueError("pgque: an event has both payload and json; give one", "invalid_payload");
    }
    if (typeof ev.json !== "string") {
      throw new PgqueError(`pgque: an event's json must be JSON text (a string), got ${typeof ev.json}`, "invalid_payload");
    }
    payload = ev.json;
  } else {
    if (ev.payload instanceof Uint8Array || ev.payload instanceof ArrayBuffer) {
      // JSON.stringify would turn a Buffer into {"type":"Buffer","data":[...]}
      // silently: make the choice of encoding the caller's.
      throw new PgqueError(
        "pgque: a payload must be JSON; encode binary data yourself (e.g. as a base64 string)",
        "invalid_payload",
      );
    }
    let s: string | undefined;
    try {
      s = JSON.stringify(ev.payload);
    } catch (err) {
      throw new PgqueError(`pgque: the payload cannot be serialised as JSON: ${(err as Error).message}`, "invalid_payload", "", { cause: err });
    }
    if (s === undefined) {
      throw new PgqueError(`pgque: the payload (${typeof ev.payload}) has no JSON form; give payload or json`, "invalid_payload");
    }
    payload = s;
  }
  const type = ev.type ?? EVENT_TYPE_DEFAULT;
  if (typeof type !== "string" || type === "") {
    throw new PgqueError("pgque: an event's type must be a non-empty string", "invalid_argument");
  }
  return { type, payload, key: ev.partitionKey ?? null, dedup: ev.dedupKey ?? null };
}
