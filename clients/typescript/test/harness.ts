// Test harness: every test file gets a database of its own on the test
// server, with pgque installed by migrate().
//
// The server is PGQUE_TEST_DSN (a postgres:// URL or a keyword/value DSN of
// a role that may create databases) — `npm test` sets it to a throwaway
// cluster (run.ts) — or, when a file is run on its own without it, a
// throwaway cluster started for this process.

import { after } from "node:test";
import { randomBytes } from "node:crypto";
import pg from "pg";
import { startCluster } from "./cluster.js";
import { migrate } from "../src/migrate.js";

export interface TestDb {
  /** Connection string of the test database. */
  url: string;
  /** A pool on it as the superuser; ended by close(). */
  pool: pg.Pool;
  /** A connection string of the database as another role. */
  urlAs(role: string): string;
  /** Ends the pool and drops the database. Registered with after(). */
  close(): Promise<void>;
}

let serverDsn: Promise<string> | undefined;

function server(): Promise<string> {
  const env = process.env.PGQUE_TEST_DSN;
  serverDsn ??= env ? Promise.resolve(asUrl(env)) : startCluster().then((c) => c.url("postgres"));
  return serverDsn;
}

/** dsn as a postgres:// URL (node-postgres takes no keyword/value form). */
function asUrl(dsn: string): string {
  if (/^postgres(ql)?:\/\//.test(dsn)) return dsn;
  const db = /(?:^|\s)dbname\s*=\s*('(?:[^'\\]|\\.)*'|\S+)/.exec(dsn)?.[1]?.replace(/^'|'$/g, "");
  return withDatabase(dsn, db ?? "postgres");
}

/** The connection string dsn with its database and, if given, user replaced. */
export function withDatabase(dsn: string, dbname: string, user?: string): string {
  if (/^postgres(ql)?:\/\//.test(dsn)) {
    const u = new URL(dsn);
    u.pathname = "/" + encodeURIComponent(dbname);
    if (user !== undefined) {
      u.username = encodeURIComponent(user);
      u.password = "";
    }
    return u.toString();
  }
  // keyword/value form: node-postgres does not parse it, so turn it into a URL.
  const kv = new Map<string, string>();
  for (const m of dsn.matchAll(/(\w+)\s*=\s*('(?:[^'\\]|\\.)*'|\S+)/g)) {
    kv.set(m[1]!, m[2]!.startsWith("'") ? m[2]!.slice(1, -1).replace(/\\(.)/g, "$1") : m[2]!);
  }
  const q = new URLSearchParams();
  for (const [k, v] of kv) if (!["user", "dbname", "password"].includes(k)) q.set(k, v);
  const who = encodeURIComponent(user ?? kv.get("user") ?? "postgres");
  const pw = user === undefined && kv.has("password") ? ":" + encodeURIComponent(kv.get("password")!) : "";
  return `postgres://${who}${pw}@localhost/${encodeURIComponent(dbname)}?${q.toString()}`;
}

export interface TestDbOptions {
  /** Install pgque with migrate() (default true). */
  install?: boolean;
  /**
   * The test whose end drops the database: pass `t` when calling from
   * inside a test. Without it the database is dropped after the file's
   * tests, which works when testDb is awaited at the top of the file (in a
   * before() hook node's after() would run at the hook's end).
   */
  t?: AfterHost;
}

/**
 * Creates a fresh database for the calling test file and, unless told not
 * to, installs pgque into it. The database is dropped after the file's tests.
 */
export async function testDb(opts: TestDbOptions = {}): Promise<TestDb> {
  const dsn = await server();
  const name = "pgque_ts_" + randomBytes(6).toString("hex");
  const admin = new pg.Client({ connectionString: dsn });
  await admin.connect();
  try {
    await admin.query(`create database ${name}`);
  } finally {
    await admin.end();
  }
  const url = withDatabase(dsn, name);
  const pool = new pg.Pool({ connectionString: url, max: 20, allowExitOnIdle: true });
  if (opts.install ?? true) await migrate(pool);
  let closed = false;
  const db: TestDb = {
    url,
    pool,
    urlAs: (role) => withDatabase(dsn, name, role),
    close: async () => {
      if (closed) return;
      closed = true;
      // The drop below ends every session on the database, those of the
      // code under test too; a pool whose idle connection ends that way
      // emits "error", and with no listener that is an uncaught exception.
      pool.on("error", () => {});
      await pool.end();
      const c = new pg.Client({ connectionString: dsn });
      await c.connect();
      try {
        // pg's Pool.end() resolves once it has asked its connections to
        // close, not once they have: a session still closing, of this
        // pool or of one a test ended, would get the drop's "terminating
        // connection due to administrator command", which a pool with no
        // "error" listener throws as an uncaught exception that fails the
        // whole file (seen on a loaded machine). So the sessions are given
        // up to a second to go first (a closing one goes within
        // milliseconds); one a test left open is then ended by the drop,
        // as before.
        const deadline = Date.now() + 1000;
        while (Date.now() < deadline) {
          const { rows } = await c.query<{ n: number }>(
            "select count(*)::int as n from pg_stat_activity where datname = $1", [name]);
          if (rows[0]!.n === 0) break;
          await new Promise((r) => setTimeout(r, 20));
        }
        await c.query(`drop database if exists ${name} with (force)`);
      } finally {
        await c.end();
      }
    },
  };
  if (opts.t) afterTheRest(opts.t, () => db.close());
  else after(() => db.close());
  return db;
}

/** What afterTheRest needs of node's TestContext. */
export interface AfterHost {
  after(fn: () => unknown): void;
}

/**
 * Runs fn when the test ends, after every hook the test registers with
 * t.after from here on, those running last-registered first. Node runs a
 * test's after hooks in the order they were registered, so a database
 * dropped by a hook registered at the test's start went before the
 * workers, listeners and pools the test stopped in its own hooks: the drop
 * waited its second for their sessions, then cut them. Stopping in the
 * reverse order of starting also stops a worker before the pool it uses.
 * An error of a later hook is thrown after fn has run.
 */
export function afterTheRest(t: AfterHost, fn: () => Promise<void>): void {
  const later: Array<() => unknown> = [];
  const register = t.after.bind(t);
  t.after = (hook) => void later.push(hook);
  register(async () => {
    let failed: { err: unknown } | undefined;
    for (const hook of later.reverse()) {
      try {
        await hook();
      } catch (err) {
        failed ??= { err };
      }
    }
    await fn();
    if (failed) throw failed.err;
  });
}

/**
 * Resolves when cond() returns true, checking every few milliseconds, or
 * rejects after timeoutMs naming what was awaited. For conditions the code
 * under test makes true; not a sleep.
 */
export async function waitFor(what: string, cond: () => Promise<boolean> | boolean, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    if (await cond()) return;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}
