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
  /**
   * The body, serialised with JSON.stringify. A payload that is itself
   * binary (Buffer, Uint8Array, ArrayBuffer) or has no JSON form is
   * refused; nested values are not looked at and follow JSON.stringify
   * (a nested Buffer becomes {"type":"Buffer","data":[...]}, undefined
   * fields are dropped).
   */
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
      // silently: make the choice of encoding the caller's. Only the payload
      // itself is looked at: finding one nested would walk every payload.
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
    if (jsonbRefuses(s)) {
      throw new PgqueError(
        refusedEscape.exec(s)![1] === "0000"
          ? "pgque: an event's payload holds a NUL character, which jsonb cannot hold"
          : "pgque: an event's payload holds a lone surrogate (half of a UTF-16 pair, as slice() leaves of an emoji it cuts), which jsonb cannot hold",
        "invalid_payload",
      );
    }
    payload = s;
  }
  if (ev.json !== undefined && unstorable(payload) === "a lone surrogate") {
    throw new PgqueError("pgque: an event's json holds a lone surrogate (half of a UTF-16 pair), which UTF-8 cannot carry", "invalid_payload");
  }
  // JSON.stringify writes no number numeric cannot hold; a json text may.
  // The server would store it and deliver the whole payload as a JSON
  // string (docs/sql-reference.md).
  const big = ev.json === undefined ? null : numericOverflow(payload);
  if (big !== null) {
    const shown = big.length <= 32 ? big : `${big.slice(0, 16)}...${big.slice(-8)} (${big.length} characters)`;
    throw new PgqueError(
      `pgque: the number ${shown} in an event's json is past the range of PostgreSQL's numeric (131 072 digits before the decimal point, 16 383 after it), which jsonb cannot hold`,
      "invalid_payload",
    );
  }
  const type = ev.type ?? EVENT_TYPE_DEFAULT;
  if (typeof type !== "string" || type === "") {
    throw new PgqueError("pgque: an event's type must be a non-empty string", "invalid_argument");
  }
  return { type: storable("type", type), payload, key: optionalText("partitionKey", ev.partitionKey), dedup: optionalText("dedupKey", ev.dedupKey) };
}

/**
 * An escape jsonb refuses in JSON.stringify's output, its hex digits
 * captured: \u0000 (a NUL character), or a surrogate's. JSON.stringify
 * writes a pair as its character and escapes a lone half only (well-formed
 * JSON.stringify), so any surrogate escape there is a lone surrogate. The
 * server refuses both (a jsonb reader would get the payload as a JSON
 * string). An escape is a backslash after an even run of them (in JSON,
 * \\ud800 is a backslash and "ud800").
 */
const refusedEscape = /(?:^|[^\\])(?:\\\\)*\\u(0000|d[89a-f][0-9a-f]{2})/;

/** Whether JSON.stringify's output s holds an escape jsonb refuses (refusedEscape). */
export function jsonbRefuses(s: string): boolean {
  return (s.includes("\\ud") || s.includes("\\u0000")) && refusedEscape.test(s);
}

/**
 * Limits of PostgreSQL's numeric, in which jsonb keeps a JSON number
 * (checked on 14 to 18, test/producer.test.ts): at most 131 072 digits
 * before the decimal point and 16 383 after it once the exponent is
 * applied, and an exponent within ±1 073 741 823.
 */
const NUMERIC_MAX_DIGITS = 131072;
const NUMERIC_MAX_SCALE = 16383;
const NUMERIC_MAX_EXPONENT = 1073741823;

/** A JSON string, or a number: its digits before the point, after it, and its exponent. */
const jsonToken = /"(?:[^"\\]|\\.)*"|-?(\d+)(?:\.(\d+))?(?:[eE]([+-]?\d+))?/g;

/**
 * The first number in JSON text p that PostgreSQL's numeric cannot hold,
 * as written, or null: jsonb refuses such text ("value overflows numeric
 * format", 22003), e.g. 1e131072, 1e-16384 or a zero with 16 384 zeros
 * after the point. Strings are skipped.
 */
export function numericOverflow(p: string): string | null {
  // Past a limit takes an exponent of four digits or more, or a run of at
  // least 8 192 digits: two quick tests spare the scan of a text with
  // neither (a tenth of its time on a 4.7 MB text).
  if (!/\d[eE][+-]?0*[1-9]\d{3}/.test(p) && (p.length < 8192 || !/\d{8192}/.test(p))) return null;
  for (const m of p.matchAll(jsonToken)) {
    const [number, whole, frac = "", e] = m;
    if (whole === undefined) continue; // a string
    const exp = e === undefined ? 0 : Number(e);
    if (Math.abs(exp) > NUMERIC_MAX_EXPONENT || frac.length - exp > NUMERIC_MAX_SCALE) return number;
    // The power of ten of the first significant digit (a zero has none).
    const w = whole.search(/[1-9]/);
    const f = w < 0 ? frac.search(/[1-9]/) : -1;
    const power = w >= 0 ? whole.length - 1 - w : f >= 0 ? -1 - f : null;
    if (power !== null && power + exp >= NUMERIC_MAX_DIGITS) return number;
  }
  return null;
}

/** A NUL, or an unpaired half of a UTF-16 surrogate pair. */
const unstorableChar = /\u0000|[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/;

/** What in s PostgreSQL text cannot hold as given, or null. */
export function unstorable(s: string): string | null {
  const m = unstorableChar.exec(s);
  if (m === null) return null;
  return m[0] === "\u0000" ? "a NUL character" : "a lone surrogate";
}

/**
 * s, when PostgreSQL stores it exactly; else a PgqueError naming the
 * field. Text cannot hold NUL, and node-postgres sends UTF-8, which has no
 * form for a lone surrogate (what slice() leaves of an emoji it cuts): it
 * became U+FFFD, so two keys that differ only there were one key on the
 * server, and a send with the second dedup key stored nothing while it
 * returned the first one's id.
 */
function storable(field: string, s: string): string {
  const bad = unstorable(s);
  if (bad !== null) {
    throw new PgqueError(`pgque: an event's ${field} holds ${bad}, which PostgreSQL text cannot store as given`, "invalid_argument");
  }
  return s;
}

/** A partitionKey or dedupKey: null when absent, else a string storable() accepts. */
function optionalText(field: string, v: unknown): string | null {
  if (v === undefined || v === null) return null;
  if (typeof v !== "string") {
    // A number or an object would be turned into text by the driver, and
    // 42 would be the key "42" of someone else's events.
    throw new PgqueError(`pgque: an event's ${field} must be a string or null, got ${typeof v}`, "invalid_argument");
  }
  return storable(field, v);
}
