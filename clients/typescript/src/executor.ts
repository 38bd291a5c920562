// The one narrow door through which the package reaches PostgreSQL.
//
// Every SQL call of the package goes through an Executor, so the same
// producer, admin and migrate code runs on a pg.Pool (each call on some
// pooled connection), on a pg.PoolClient or pg.Client the caller holds
// (inside the caller's BEGIN ... COMMIT, so sends commit or roll back with
// the caller's own writes), or on postgres.js through fromPostgresJs.

/** The rows a query returned, as the driver parsed them. */
export interface QueryResult<R> {
  rows: R[];
  /**
   * The rows the statement inserted, updated, deleted or returned, as
   * pg reports it (a handler's `tx.query(...).rowCount` under workTx);
   * absent through {@link fromPostgresJs}.
   */
  rowCount?: number | null;
}

/**
 * Runs one parameterised statement. pg.Pool, pg.PoolClient and pg.Client
 * satisfy it as they are; wrap a postgres.js `sql` (or the `tx` of
 * `sql.begin`) with {@link fromPostgresJs}.
 */
export interface Executor {
  query<R = Record<string, unknown>>(text: string, params?: unknown[]): Promise<QueryResult<R>>;
}

/**
 * A pg.Pool: hands out a dedicated connection where the package needs
 * several statements on one session (migrate's transaction).
 */
export interface ConnectionSource extends Executor {
  connect(): Promise<PooledConnection>;
}

/** One connection checked out of a ConnectionSource. */
export interface PooledConnection extends Executor {
  /** Returns the connection to its pool; a truthy argument destroys it. */
  release(destroy?: boolean | Error): void;
}

/**
 * Checks a connection out of db for the package's own use, so that losing
 * it cannot crash the process. pg's pool stops listening for a connection's
 * errors while it is checked out, and a pg.Client with no listener turns
 * an error between statements (a Postgres restart, a terminated backend,
 * a killed PgBouncer) into an uncaught exception. Until it is released the
 * connection keeps an error listener, and release destroys a connection
 * that failed so: the statement that needs it next fails instead, as an
 * ordinary error the caller handles.
 */
export async function checkout(db: ConnectionSource): Promise<PooledConnection> {
  const conn = await db.connect();
  const ee = conn as PooledConnection & { on?: (ev: "error", fn: (err: Error) => void) => unknown; off?: (ev: "error", fn: (err: Error) => void) => unknown };
  if (typeof ee.on !== "function" || typeof ee.off !== "function") return conn;
  let lost: Error | undefined;
  const onError = (err: Error) => {
    lost = err;
  };
  ee.on("error", onError);
  const release = conn.release;
  conn.release = (destroy?: boolean | Error) => {
    ee.off!("error", onError);
    conn.release = release;
    release.call(conn, destroy || lost);
  };
  return conn;
}

/** The part of a postgres.js `sql` (or transaction) the adapter uses. */
export interface PostgresJsLike {
  unsafe(text: string, params?: unknown[]): PromiseLike<Iterable<unknown>>;
}

/**
 * Adapts a postgres.js `sql` tag, or the `tx` of `sql.begin(tx => ...)`, to
 * an Executor: sends made through the adapter of a `tx` commit with it.
 */
export function fromPostgresJs(sql: PostgresJsLike): Executor {
  return {
    async query<R>(text: string, params: unknown[] = []): Promise<QueryResult<R>> {
      const rows = await sql.unsafe(text, params);
      return { rows: Array.from(rows) as R[] };
    },
  };
}

/**
 * True when exec is a pg.Pool (it hands out connections and counts them):
 * each of its queries may run on another connection, so it cannot carry a
 * transaction across statements.
 */
export function isPool(exec: Executor): exec is ConnectionSource {
  const p = exec as { connect?: unknown; totalCount?: unknown };
  return typeof p.connect === "function" && typeof p.totalCount === "number";
}

/**
 * Runs fn in a transaction and returns what it returns: on a pg.Pool, on a
 * connection checked out for it (BEGIN ... COMMIT); on one connection
 * outside a transaction, in a transaction of its own; on one connection
 * inside the caller's transaction, in a savepoint, so that the work lands
 * when the caller commits. fn gets the executor to use. A failure rolls the
 * work back and rethrows.
 */
export async function withTransaction<T>(exec: Executor, fn: (tx: Executor) => Promise<T>): Promise<T> {
  if (isPool(exec)) {
    const conn = await checkout(exec);
    let broken: Error | undefined;
    try {
      return await inTransaction(conn, fn, true);
    } catch (err) {
      // A connection that failed without a SQLSTATE may be broken: destroy it.
      if (err instanceof Error && typeof (err as { code?: unknown }).code !== "string") broken = err;
      throw err;
    } finally {
      conn.release(broken);
    }
  }
  return inTransaction(exec, fn, false);
}

/**
 * withTransaction on one connection: idle when the caller knows it is
 * outside a transaction (one just checked out of a pool), which then
 * begins one without the SAVEPOINT probe, whose refusal outside a
 * transaction block is an ERROR line in the server's log.
 */
async function inTransaction<T>(exec: Executor, fn: (tx: Executor) => Promise<T>, idle: boolean): Promise<T> {
  let own = idle;
  if (idle) {
    await exec.query("begin");
  } else {
    try {
      await exec.query("savepoint pgque_tx");
    } catch (err) {
      // 25P01 no_active_sql_transaction: not inside a transaction block.
      if ((err as { code?: unknown }).code !== "25P01") throw err;
      own = true;
      await exec.query("begin");
    }
  }
  try {
    const out = await fn(exec);
    await exec.query(own ? "commit" : "release savepoint pgque_tx");
    return out;
  } catch (err) {
    try {
      await exec.query(own ? "rollback" : "rollback to savepoint pgque_tx");
    } catch {
      // The connection broke: the server rolls back on its own.
    }
    throw err;
  }
}

/**
 * The text of an interval parameter of ms milliseconds, in seconds:
 * PostgreSQL 14 refuses a count of milliseconds past 2^31 (about 24.8 days)
 * as "interval field value out of range", where seconds reach 68 years on
 * every supported major.
 */
export function intervalParam(ms: number): string {
  return `${(ms / 1000).toFixed(3)} seconds`;
}

/**
 * A timestamptz column selected as whole milliseconds since 1970, in text,
 * for dateOf. node-postgres parses a timestamptz with the parser the
 * application set for the type, if any (`types.setTypeParser` is global to
 * the process: some keep timestamps as strings), and with a regular
 * expression per value otherwise, 0.8 µs of the worker's CPU per event;
 * text is left alone. floor in numeric is exact, and a Date holds
 * milliseconds: the same instant node-postgres's own parser gives.
 * `column` is a name of the query's, never a caller's value.
 */
export function msColumn(column: string, as: string): string {
  return `(pg_catalog.floor(extract(epoch from ${column}) operator(pg_catalog.*) 1000))::pg_catalog.int8::pg_catalog.text as ${as}`;
}

/** The Date of a column msColumn selected; null stays null. */
export function dateOf(ms: string | null): Date | null {
  return ms === null ? null : new Date(Number(ms));
}
