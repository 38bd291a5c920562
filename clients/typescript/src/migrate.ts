// Installing and upgrading pgque's schema from the package.
//
// sql/pgque.sql is the Go installer's script, byte for byte (`pgque sql`
// prints it; `make lint` fails when the copy is stale), so a database
// migrated from TypeScript is the same as one installed by `pgque install`
// or pgquemigrate.Install, and either side can upgrade what the other
// installed. migrate() applies it the way the Go installer does: in one
// transaction, after taking the installer's lock, reading the version
// before and after.

import { readFile } from "node:fs/promises";
import { isPool, type Executor } from "./executor.js";
import { PgqueError, SchemaVersionError, mapError, sqlstateOf } from "./errors.js";
import { SCHEMA_VERSION } from "./version.js";

/**
 * The advisory lock key that serialises the first install of a database
 * across sessions: the bytes of "pgque" read as a number (the Go installer's
 * LockKey, so Go and TypeScript installers exclude each other).
 */
const LOCK_KEY = "482771826021"; // 0x7067717565

/** How long a first install waits for the advisory lock before going on. */
const FRESH_LOCK_WAIT_MS = 10_000;

/** What migrate did. */
export interface MigrateResult {
  /** The version installed before; "" on a fresh database. */
  previous: string;
  /** The version installed now. */
  version: string;
}

let scriptCache: Promise<string> | undefined;

/** The install script, as `pgque sql` prints it. */
export function installScript(): Promise<string> {
  scriptCache ??= readFile(new URL("../../sql/pgque.sql", import.meta.url), "utf8");
  return scriptCache;
}

/**
 * Installs pgque into the database, or upgrades it in place, keeping data.
 * exec is a pg.Pool (a connection is checked out for the transaction) or
 * one connection: a pg.Client/PoolClient, or postgres.js's reserved
 * connection or `sql.begin` transaction through fromPostgresJs. On a
 * connection already inside a transaction the work runs in a savepoint and
 * lands when the caller commits; otherwise migrate opens and commits its own
 * transaction. Needs the rights `pgque install` needs (see docs/security.md).
 */
export async function migrate(exec: Executor): Promise<MigrateResult> {
  if (isPool(exec)) {
    const conn = await exec.connect();
    let broken: unknown;
    try {
      return await migrate(conn);
    } catch (err) {
      broken = err;
      throw err;
    } finally {
      conn.release(broken instanceof Error && sqlstateOf(broken) === undefined ? broken : undefined);
    }
  }
  const script = await installScript();
  return inTransaction(exec, async () => {
    await lockInstall(exec);
    const previous = await installedVersion(exec);
    await exec.query(script);
    const version = await installedVersion(exec);
    if (version !== SCHEMA_VERSION) {
      throw new PgqueError(
        `installing pgque: the script recorded version "${version}", want "${SCHEMA_VERSION}"`,
        "schema_version",
      );
    }
    return { previous, version };
  }).catch((err) => {
    throw mapError("installing pgque", err);
  });
}

/**
 * Runs fn in a transaction on the one connection exec: its own when exec is
 * outside a transaction, else a savepoint of the caller's.
 */
async function inTransaction<T>(exec: Executor, fn: () => Promise<T>): Promise<T> {
  let own = false;
  try {
    await exec.query("savepoint pgque_migrate");
  } catch (err) {
    // 25P01 no_active_sql_transaction: not inside a transaction block.
    if (sqlstateOf(err) !== "25P01") throw err;
    own = true;
    await exec.query("begin");
  }
  try {
    const out = await fn();
    await exec.query(own ? "commit" : "release savepoint pgque_migrate");
    return out;
  } catch (err) {
    try {
      await exec.query(own ? "rollback" : "rollback to savepoint pgque_migrate");
    } catch {
      // The connection broke: the server rolls back on its own.
    }
    throw err;
  }
}

/**
 * Serialises installs the way the Go installer does: on an installed
 * database a self-conflicting lock on pgque.version, which only pgque's
 * owner and pgque_admin can take; on a fresh one the advisory lock, waited
 * for at most FRESH_LOCK_WAIT_MS so a stranger holding the key cannot stall
 * the install.
 */
async function lockInstall(exec: Executor): Promise<void> {
  const { rows } = await exec.query<{ installed: boolean }>(`select exists (
    select 1 from pg_catalog.pg_class c join pg_catalog.pg_namespace n on n.oid = c.relnamespace
     where n.nspname operator(pg_catalog.=) 'pgque' and c.relname operator(pg_catalog.=) 'version'
       and pg_catalog.has_schema_privilege(n.oid, 'USAGE')
       and pg_catalog.has_table_privilege(c.oid, 'UPDATE')) as installed`);
  if (rows[0]!.installed) {
    await exec.query("lock table pgque.version in share row exclusive mode");
    return;
  }
  const prev = await exec.query<{ v: string }>("select pg_catalog.current_setting('lock_timeout') as v");
  await exec.query("savepoint pgque_lock");
  try {
    await exec.query(
      "select pg_catalog.set_config('lock_timeout', $1, true), pg_catalog.pg_advisory_xact_lock($2::bigint)",
      [`${FRESH_LOCK_WAIT_MS}ms`, LOCK_KEY],
    );
  } catch (err) {
    await exec.query("rollback to savepoint pgque_lock");
    // 55P03 lock_not_available: held by someone else too long; go on.
    if (sqlstateOf(err) === "55P03") return;
    throw err;
  }
  // Releasing the savepoint keeps the lock and the lock_timeout: put the
  // caller's lock_timeout back.
  await exec.query("release savepoint pgque_lock");
  await exec.query("select pg_catalog.set_config('lock_timeout', $1, true)", [prev.rows[0]!.v]);
}

/**
 * The pgque version installed in the database; "" when pgque is not
 * installed or the caller may not use schema pgque. Every pgque role may
 * call it.
 */
export async function installedVersion(exec: Executor): Promise<string> {
  const { rows } = await exec.query<{ has_table: boolean; has_fn: boolean }>(`select
    exists (select 1 from pg_catalog.pg_class c
            join pg_catalog.pg_namespace n on n.oid = c.relnamespace
            where n.nspname operator(pg_catalog.=) 'pgque' and c.relname operator(pg_catalog.=) 'version'
              and pg_catalog.has_schema_privilege(n.oid, 'USAGE')) as has_table,
    exists (select 1 from pg_catalog.pg_proc p
            join pg_catalog.pg_namespace n on n.oid = p.pronamespace
            where n.nspname operator(pg_catalog.=) 'pgque' and p.proname operator(pg_catalog.=) 'version'
              and p.pronargs operator(pg_catalog.=) 0) as has_fn`);
  if (!rows[0]!.has_table) return "";
  const q = rows[0]!.has_fn ? "select pgque.version() as v" : "select version as v from pgque.version";
  const v = await exec.query<{ v: string | null }>(q);
  return v.rows[0]?.v ?? "";
}

/**
 * Fails with a SchemaVersionError when the database holds another pgque
 * schema version than SCHEMA_VERSION, and with a PgqueError of kind
 * "not_installed" when pgque is not installed. Like the Go Connect's check.
 */
export async function checkSchema(exec: Executor): Promise<void> {
  let v: string;
  try {
    v = await installedVersion(exec);
  } catch (err) {
    throw mapError("reading the pgque schema version", err);
  }
  if (v === "") throw new PgqueError("pgque: not installed in this database (run migrate())", "not_installed");
  if (v !== SCHEMA_VERSION) throw new SchemaVersionError(v, SCHEMA_VERSION);
}
