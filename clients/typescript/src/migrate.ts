// Installing and upgrading pgque's schema from the package.
//
// sql/pgque.sql, written by the build from the repository's sql/
// (scripts/bundle-sql.mjs), is the Go installer's script byte for byte
// (`pgque sql` prints it; `make lint` fails when they differ), so a database
// migrated from TypeScript is the same as one installed by `pgque install`
// or pgquemigrate.Install, and either side can upgrade what the other
// installed. migrate() applies it the way the Go installer does: in one
// transaction, after taking the installer's lock, reading the version
// before and after.

import { readFile } from "node:fs/promises";
import { withTransaction, type Executor } from "./executor.js";
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
  /**
   * The roles other than the installing one and superusers that hold ADMIN
   * OPTION on a pgque role, as "role on pgque_role": each may grant that
   * role to any role, itself included. On PostgreSQL 16 and later a
   * CREATEROLE role holds it on every role it created, so one that created
   * the pgque roles before the install keeps that power. Check that each
   * is a role you trust (a DBA, the owner of pgque in another database of
   * the cluster); see docs/security.md. As the Go installer's RoleAdmins.
   */
  roleAdmins: string[];
}

let scriptCache: Promise<string> | undefined;

const clientQueries = new Map<string, Promise<string>>();

/**
 * The query in sql/client/<name>.sql, which the build copies from the
 * repository's sql/client/ (the Go client embeds the same files).
 */
function clientQuery(name: string): Promise<string> {
  let q = clientQueries.get(name);
  if (q === undefined) {
    q = readFile(new URL(`../../sql/client/${name}.sql`, import.meta.url), "utf8");
    clientQueries.set(name, q);
  }
  return q;
}

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
  const script = await installScript();
  try {
    return await withTransaction(exec, async (tx) => {
      await lockInstall(tx);
      const previous = await ownVersion(tx);
      await tx.query(script);
      const version = await installedVersion(tx);
      if (version !== SCHEMA_VERSION) {
        throw new PgqueError(
          `installing pgque: the script recorded version "${version}", want "${SCHEMA_VERSION}"`,
          "schema_version",
        );
      }
      const admins = await tx.query<{ admins: string[] }>("select pgque._role_admins() as admins");
      return { previous, version, roleAdmins: admins.rows[0]!.admins };
    });
  } catch (err) {
    throw mapError("installing pgque", err);
  }
}

/**
 * Serialises installs the way the Go installer does: on an installed
 * database a self-conflicting lock on pgque.version, which only pgque's
 * owner and pgque_admin can take, waited for at most FRESH_LOCK_WAIT_MS (a
 * pgque role can hold a lock on it without the right to: PREPARE of an
 * UPDATE locks the table and runs nothing), then failing with an error
 * naming the sessions that hold it; on a fresh one the advisory lock,
 * waited for at most FRESH_LOCK_WAIT_MS so a stranger holding the key
 * cannot stall the install.
 */
async function lockInstall(exec: Executor): Promise<void> {
  const { rows } = await exec.query<{ installed: boolean }>(`select exists (
    select 1 from pg_catalog.pg_class c join pg_catalog.pg_namespace n on n.oid = c.relnamespace
     where n.nspname operator(pg_catalog.=) 'pgque' and c.relname operator(pg_catalog.=) 'version'
       and pg_catalog.has_schema_privilege(n.oid, 'USAGE')
       and pg_catalog.has_table_privilege(c.oid, 'UPDATE')) as installed`);
  if (rows[0]!.installed) {
    if (await lockWithin(exec, "lock table pgque.version in share row exclusive mode")) return;
    const held = await exec.query<{ h: string }>(
      `select coalesce(pg_catalog.string_agg(distinct pg_catalog.format('pid %s (role %s)',
              l.pid, coalesce(a.usename::text, '?')), ', '), 'none now') as h
         from pg_catalog.pg_locks l left join pg_catalog.pg_stat_activity a on a.pid operator(pg_catalog.=) l.pid
        where l.granted and l.relation operator(pg_catalog.=) 'pgque.version'::pg_catalog.regclass
          and l.pid operator(pg_catalog.<>) pg_catalog.pg_backend_pid()`,
    );
    throw new PgqueError(
      `pgque.version stayed locked for ${FRESH_LOCK_WAIT_MS / 1000} s by ${held.rows[0]!.h}: another install or ` +
        "uninstall is running, or a session holds a lock on it; retry when it ends",
      "database",
      "55P03",
    );
  }
  // Held by someone else for too long: go on without it.
  await lockWithin(exec, `select pg_catalog.pg_advisory_xact_lock(${LOCK_KEY}::bigint)`);
}

/**
 * Runs sql, which takes a lock, waiting at most FRESH_LOCK_WAIT_MS; whether
 * it got the lock. The transaction's lock_timeout is left as it was.
 */
async function lockWithin(exec: Executor, sql: string): Promise<boolean> {
  const prev = await exec.query<{ v: string }>("select pg_catalog.current_setting('lock_timeout') as v");
  await exec.query("savepoint pgque_lock");
  try {
    await exec.query("select pg_catalog.set_config('lock_timeout', $1, true)", [`${FRESH_LOCK_WAIT_MS}ms`]);
    await exec.query(sql);
  } catch (err) {
    // Rolling back the savepoint also undoes the lock_timeout.
    await exec.query("rollback to savepoint pgque_lock");
    // 55P03 lock_not_available: held by someone else too long.
    if (sqlstateOf(err) === "55P03") return false;
    throw err;
  }
  // Releasing the savepoint keeps the lock and the lock_timeout: put the
  // caller's lock_timeout back.
  await exec.query("release savepoint pgque_lock");
  await exec.query("select pg_catalog.set_config('lock_timeout', $1, true)", [prev.rows[0]!.v]);
  return true;
}

/**
 * installedVersion as the installer reads it, before the script's
 * preflight has run: only when schema pgque, its version table and its
 * version function all belong to the installing role. Otherwise it reads
 * nothing and returns "": calling a function, or reading a table (a view,
 * a column type's output function), of a schema another role prepared
 * would run that role's code as the installer, and the preflight, the
 * script's first statement, refuses such a schema with an error naming its
 * owner. As the Go installer's ownVersion.
 */
async function ownVersion(exec: Executor): Promise<string> {
  const { rows } = await exec.query<{ own: boolean }>(await clientQuery("own_version"));
  return rows[0]!.own ? installedVersion(exec) : "";
}

/**
 * The pgque version installed in the database; "" when pgque is not
 * installed or the caller may not use schema pgque. Every pgque role may
 * call it. Like the Go InstalledVersion, it calls pgque.version() (or
 * reads the table, on installs older than the function) only when that can
 * run no code of another role as the caller: the function is the
 * current_user's own, or SECURITY DEFINER with a pinned search_path and
 * owned by the schema's owner, as pgque's is; the table is the caller's
 * own, or a plain text-typed table without row security owned by the
 * schema's owner. A schema pgque someone prepared as a trap reads as "".
 * Before any of that, trustSchema must accept the schema's owner.
 */
export async function installedVersion(exec: Executor): Promise<string> {
  await trustSchema(exec);
  const { rows } = await exec.query<{ has_table: boolean; has_fn: boolean }>(await clientQuery("version_source"));
  if (!rows[0]!.has_table) return "";
  const q = rows[0]!.has_fn ? "select pgque.version() as v" : "select version as v from pgque.version";
  const v = await exec.query<{ v: string | null }>(q);
  return v.rows[0]?.v ?? "";
}

/**
 * Fails with a PgqueError of kind "permission_denied" (SQLSTATE 42501) when
 * schema pgque belongs to a role that lacks a right the caller has:
 * SUPERUSER, CREATEROLE, BYPASSRLS, REPLICATION, or membership in
 * pg_execute_server_program, pg_read_server_files, pg_write_server_files,
 * pg_read_all_data, pg_write_all_data or pg_signal_backend. The schema's
 * functions are its owner's code: calling one runs that code with the
 * caller's rights or, SECURITY DEFINER, lets it change the caller's session
 * (a search_path set with set_config outlives the call). So the package
 * calls nothing in such a schema, as the installer refuses a superuser's
 * install over another role's schema: installedVersion, checkSchema, the
 * Ticker's and work()'s start ask it first. The owner's own login, or a
 * superuser's session with options '-c role=<owner>', is trusted. Only
 * catalogs are read, with pg_catalog's operators (sql/client/trust_schema.sql,
 * as the Go TrustSchema).
 */
export async function trustSchema(exec: Executor): Promise<void> {
  let rows: { owner: string; caller: string; lacks: string | null }[];
  try {
    ({ rows } = await exec.query<{ owner: string; caller: string; lacks: string | null }>(await clientQuery("trust_schema")));
  } catch (err) {
    throw mapError("checking the owner of schema pgque", err);
  }
  const row = rows[0];
  if (row === undefined || row.lacks === null) return;
  throw new PgqueError(
    `pgque: schema pgque is owned by role "${row.owner}", which lacks ${row.lacks} that role "${row.caller}" has: ` +
      `pgque's clients run no code of a less privileged role's schema; connect as "${row.owner}" ` +
      `(a superuser can add options='-c role=${row.owner}'), or install pgque as a role you trust`,
    "permission_denied",
    "42501",
  );
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
  if (v === "") await explainMissing(exec);
  if (v !== SCHEMA_VERSION) throw new SchemaVersionError(v, SCHEMA_VERSION);
}

/**
 * Throws why installedVersion found nothing: a schema pgque the role may
 * not use (permission_denied, naming the grants that help), or no pgque at
 * all (not_installed).
 */
async function explainMissing(exec: Executor): Promise<never> {
  let row: { present: boolean; role: string };
  try {
    row = (await exec.query<{ present: boolean; role: string }>(
      `select exists (select 1 from pg_catalog.pg_namespace where nspname operator(pg_catalog.=) 'pgque') as present,
              current_user as role`)).rows[0]!;
  } catch (err) {
    throw mapError("reading the pgque schema version", err);
  }
  if (row.present) {
    throw new PgqueError(
      `pgque: role "${row.role}" may not use schema pgque; grant it pgque_writer (send), pgque_reader (work) ` +
        "or pgque_admin (ticker, admin calls)",
      "permission_denied",
      "42501",
    );
  }
  throw new PgqueError("pgque: not installed in this database (run migrate())", "not_installed");
}
