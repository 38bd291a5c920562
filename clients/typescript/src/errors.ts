// Errors the package throws.
//
// Every error PostgreSQL raises through a pgque call is rethrown as a
// PgqueError that carries the SQLSTATE (`code`), a stable `kind` chosen from
// the SQLSTATE alone (never from message text), and the driver's error as
// `cause`. The kinds mirror the Go library's sentinel errors, so a program
// can branch on `err.kind === "queue_not_found"` the way a Go program tests
// errors.Is(err, pgque.ErrQueueNotFound). Errors that never reached the
// database (a broken connection, an aborted call) are rethrown unchanged.

/** What went wrong, independent of the message's wording. */
export type ErrorKind =
  | "queue_not_found"
  | "consumer_not_found"
  | "invalid_name"
  | "invalid_argument"
  | "unknown_parameter"
  | "batch_not_open"
  | "event_not_in_batch"
  | "slot_count_mismatch"
  | "policy_mismatch"
  | "lease_lost"
  | "slot_subscription"
  | "slot_not_subscribed"
  | "key_not_blocked"
  | "key_busy"
  /** The event was completed in a transaction before (complete_in_tx): a redelivery to skip. */
  | "already_completed"
  | "resize_in_progress"
  | "dead_letter_not_found"
  | "table_attached"
  | "table_not_attached"
  | "permission_denied"
  | "invalid_payload"
  | "schema_version"
  | "not_installed"
  | "already_started"
  | "database";

/** The SQLSTATEs of pgque's SQL contract and the kind each means. */
const sqlstates: Readonly<Record<string, ErrorKind>> = {
  "22004": "invalid_argument",
  "22021": "invalid_payload", // character_not_in_repertoire
  "22P02": "invalid_payload", // invalid_text_representation (bad JSON)
  "22P05": "invalid_payload", // untranslatable_character (\u0000)
  "42501": "permission_denied",
  PQ001: "queue_not_found",
  PQ002: "consumer_not_found",
  PQ010: "invalid_name",
  PQ011: "invalid_argument",
  PQ012: "unknown_parameter",
  PQ020: "batch_not_open",
  PQ022: "event_not_in_batch",
  PQ030: "slot_count_mismatch",
  PQ031: "policy_mismatch",
  PQ032: "lease_lost",
  PQ033: "slot_subscription",
  PQ034: "slot_not_subscribed",
  // A fenced ack or nack named a chunk that is no longer the slot's current
  // delivery: for this worker it is the same as losing the lease.
  PQ035: "lease_lost",
  PQ036: "key_not_blocked",
  PQ037: "key_busy",
  PQ038: "already_completed",
  PQ039: "already_completed",
  PQ040: "dead_letter_not_found",
  PQ060: "table_attached",
  PQ061: "table_not_attached",
  PQ062: "table_attached",
  PQ063: "invalid_argument",
  PQ064: "table_attached",
  PQ070: "resize_in_progress",
  PQ071: "slot_not_subscribed",
  PQ072: "invalid_argument",
  PQ073: "resize_in_progress",
  PQ074: "invalid_argument",
  // The lease token presented does not prove the current lease.
  PQ085: "lease_lost",
};

/** The kind a SQLSTATE maps to; "database" for any other code. */
export function kindOf(sqlstate: string): ErrorKind {
  return sqlstates[sqlstate] ?? "database";
}

/** An error raised by pgque's SQL or detected by the package. */
export class PgqueError extends Error {
  /** The SQLSTATE, e.g. "PQ001"; "" for an error detected in the package. */
  readonly code: string;
  /** What went wrong, chosen by SQLSTATE. */
  readonly kind: ErrorKind;

  constructor(message: string, kind: ErrorKind, code = "", options?: { cause?: unknown }) {
    super(message, options);
    this.name = "PgqueError";
    this.kind = kind;
    this.code = code;
  }
}

/** The database holds another pgque schema version than the package's. */
export class SchemaVersionError extends PgqueError {
  constructor(readonly installed: string, readonly want: string) {
    super(
      `pgque: the database has pgque schema ${installed}, this package needs ${want} ` +
        "(upgrade the database with migrate() or 'pgque upgrade', or use the matching package)",
      "schema_version",
    );
    this.name = "SchemaVersionError";
  }
}

/** True when err is a PgqueError, of the given kind when one is named. */
export function isPgqueError(err: unknown, kind?: ErrorKind): err is PgqueError {
  return err instanceof PgqueError && (kind === undefined || err.kind === kind);
}

/** The SQLSTATE of a driver error (node-postgres or postgres.js), if any. */
export function sqlstateOf(err: unknown): string | undefined {
  if (typeof err !== "object" || err === null) return undefined;
  const code = (err as { code?: unknown }).code;
  return typeof code === "string" && /^[0-9A-Z]{5}$/.test(code) ? code : undefined;
}

/**
 * Turns a driver error carrying a SQLSTATE into a PgqueError whose message
 * says what was being done ("sending to queue x: ..."), followed by the
 * server's detail when it gave one; returns any other error unchanged. Use
 * as `throw mapError("doing x", err)`.
 */
export function mapError(doing: string, err: unknown): unknown {
  if (err instanceof PgqueError) return err;
  const code = sqlstateOf(err);
  if (code === undefined) return err;
  const message = err instanceof Error ? err.message : String(err);
  const hint = code === "42501" && message.startsWith("permission denied for ") ? `; ${roleHint}` : "";
  return new PgqueError(`${doing}: ${message}${detailOf(err)} (SQLSTATE ${code}${hint})`, kindOf(code), code, { cause: err });
}

/**
 * ": " and the DETAIL of a server error (both drivers keep it as
 * `detail`), or "". PostgreSQL says there what was wrong where the message
 * only says what failed: "invalid input syntax for type json" is followed
 * by 'Token "not" is invalid.', which a caller reading err.message alone
 * never saw.
 */
function detailOf(err: unknown): string {
  const detail = (err as { detail?: unknown }).detail;
  if (typeof detail !== "string" || detail.trim() === "") return "";
  return `: ${detail.trim().replace(/\.$/, "")}`;
}

/**
 * Follows PostgreSQL's own permission errors ("permission denied for
 * function send", "... for schema pgque"): they name the object, not the
 * pgque role that grants it. pgque's own 42501 errors say more. The Go
 * library adds the same words.
 */
const roleHint =
  "pgque_writer may send, pgque_reader may consume, pgque_admin may do both and administer: " +
  "grant the login the role its job needs";

/** Runs fn, rethrowing what it throws through mapError(doing, ...). */
export async function mapped<T>(doing: string, fn: () => Promise<T>): Promise<T> {
  try {
    return await fn();
  } catch (err) {
    throw mapError(doing, err);
  }
}
