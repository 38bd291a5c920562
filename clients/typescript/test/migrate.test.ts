import { test } from "node:test";
import assert from "node:assert/strict";
import pg from "pg";
import { checkSchema, installScript, installedVersion, migrate, SCHEMA_VERSION, SchemaVersionError, isPgqueError, sendBatch, Ticker, work } from "../src/index.js";
import { testDb } from "./harness.js";

test("migrate installs a fresh database, then upgrades in place keeping data", async (t) => {
  const db = await testDb({ install: false, t });
  await assert.rejects(checkSchema(db.pool), (err) => isPgqueError(err, "not_installed"));

  const first = await migrate(db.pool);
  assert.deepEqual([first.previous, first.version], ["", SCHEMA_VERSION]);
  await checkSchema(db.pool);

  await db.pool.query("select pgque.create_queue('keep')");
  await db.pool.query(`select pgque.send('keep', 't', '{"a":1}'::jsonb, null)`);
  const again = await migrate(db.pool);
  assert.deepEqual([again.previous, again.version], [SCHEMA_VERSION, SCHEMA_VERSION]);
  const { rows } = await db.pool.query("select queue_name from pgque.get_queue_info('keep')");
  assert.deepEqual(rows, [{ queue_name: "keep" }]);
});

// A role other than the installer's that holds ADMIN OPTION on a pgque
// role may grant it to any role (on PostgreSQL 16+ a CREATEROLE role has it
// on the roles it created): migrate names it for the operator to check.
test("migrate names the roles that may grant pgque's roles", async (t) => {
  const db = await testDb({ t });
  const role = `admin_of_reader_${process.pid}_${Date.now()}`;
  await db.pool.query(`create role ${role} nologin`);
  try {
    assert.ok(!(await migrate(db.pool)).roleAdmins.includes(`${role} on pgque_reader`));
    await db.pool.query(`grant pgque_reader to ${role} with admin option`);
    const res = await migrate(db.pool);
    assert.ok(res.roleAdmins.includes(`${role} on pgque_reader`), `roleAdmins ${JSON.stringify(res.roleAdmins)}`);
    assert.ok(!res.roleAdmins.some((a) => a.startsWith("postgres ")), "a superuser is listed");
  } finally {
    await db.pool.query(`drop role if exists ${role}`);
  }
});

test("the bundled script is the schema version's", async (t) => {
  const script = await installScript();
  assert.match(script, new RegExp(`^-- pgque ${SCHEMA_VERSION.replace(/\./g, "\\.")} install script`));
  const db = await testDb({ t });
  assert.equal(await installedVersion(db.pool), SCHEMA_VERSION);
});

test("migrate upgrades an older install: functions come back, the version moves, the schema check follows", async (t) => {
  const db = await testDb({ t });
  await db.pool.query("select pgque.create_queue('old')");
  // What an older release lacked: the mixed-type send_batch, and its version.
  await db.pool.query("drop function pgque.send_batch(text, text[], text[], text[], text[])");
  await db.pool.query("update pgque.version set version = '0.0.1'");
  await assert.rejects(checkSchema(db.pool), (err) => {
    assert.ok(err instanceof SchemaVersionError);
    assert.equal(err.kind, "schema_version");
    assert.equal(err.installed, "0.0.1");
    return true;
  });

  const upgraded = await migrate(db.pool);
  assert.deepEqual([upgraded.previous, upgraded.version], ["0.0.1", SCHEMA_VERSION]);
  await checkSchema(db.pool);
  const ids = await sendBatch(db.pool, "old", [{ type: "A", payload: 1 }, { type: "B", payload: 2 }]);
  assert.equal(ids.length, 2);
});

test("migrate inside the caller's transaction lands only when it commits", async (t) => {
  const db = await testDb({ install: false, t });
  const c = await db.pool.connect();
  try {
    await c.query("begin");
    assert.equal((await migrate(c)).version, SCHEMA_VERSION);
    await c.query("select pgque.create_queue('inside')");
    await c.query("rollback");
    assert.equal(await installedVersion(c), "");

    await c.query("begin");
    await migrate(c);
    await c.query("commit");
    assert.equal(await installedVersion(db.pool), SCHEMA_VERSION);
    // On a connection outside a transaction, migrate makes its own.
    assert.equal((await migrate(c)).previous, SCHEMA_VERSION);
  } finally {
    c.release();
  }
});

test("migrate refuses a schema another role prepared, and runs none of its code", async (t) => {
  const db = await testDb({ install: false, t });
  const role = `prep_${process.pid}_${Date.now()}`;
  const { rows } = await db.pool.query<{ db: string }>("select current_database() as db");
  await db.pool.query(`create role ${role}`);
  try {
    await db.pool.query(`grant create on database "${rows[0]!.db}" to ${role}`);
    // The role's trap: a version the installer would read before the
    // script, through a function that raises when it runs.
    const c = await db.pool.connect();
    try {
      await c.query(`set role ${role}`);
      await c.query("create schema pgque");
      await c.query(
        "create table pgque.version (singleton boolean primary key default true, version text not null, installed_at timestamptz default now())",
      );
      await c.query("insert into pgque.version (version) values ('0.0.1')");
      await c.query(
        "create function pgque.version() returns text language plpgsql as $$ begin raise exception 'the planted code ran as %', current_user; end $$",
      );
      await c.query("reset role");
    } finally {
      c.release();
    }
    await assert.rejects(migrate(db.pool), (err) => {
      assert.ok(isPgqueError(err, "permission_denied"), String(err));
      assert.match(String(err), new RegExp(`owned by role ${role}`));
      assert.doesNotMatch(String(err), /planted code ran/);
      return true;
    });
    // Nor does reading the version (checkSchema, at a worker's start): the
    // schema is a lesser role's, so nothing of it is called or read.
    await assert.rejects(installedVersion(db.pool), (err) => {
      assert.ok(isPgqueError(err, "permission_denied"), String(err));
      assert.match(String(err), new RegExp(`owned by role "${role}", which lacks SUPERUSER`));
      return true;
    });
  } finally {
    await db.pool.query("drop schema if exists pgque cascade");
    await db.pool.query(`drop owned by ${role}`);
    await db.pool.query(`drop role ${role}`);
  }
});

// A function of a schema is its owner's code: called by a superuser it
// runs as the superuser, and even SECURITY DEFINER it can point the
// caller's session at the owner's operators (set_config outlives the
// call). So a superuser's package calls nothing in a schema pgque a lesser
// role prepared: checkSchema, work() and the Ticker refuse it first.
test("a superuser's clients call nothing in a schema pgque a lesser role prepared", async (t) => {
  const db = await testDb({ install: false, t });
  const role = `lesser_${process.pid}_${Date.now()}`;
  const { rows } = await db.pool.query<{ db: string }>("select current_database() as db");
  await db.pool.query(`create role ${role}`);
  const one = new pg.Pool({ connectionString: db.url, max: 1 });
  try {
    await db.pool.query(`grant create on database "${rows[0]!.db}" to ${role}`);
    for (const definer of ["", "security definer set search_path = pg_catalog"]) {
      const c = await db.pool.connect();
      try {
        await c.query(`set role ${role}`);
        await c.query("create schema pgque");
        await c.query("create schema evil");
        await c.query("grant usage on schema pgque, evil to public");
        await c.query("create table pgque.version (singleton boolean primary key default true, version text not null)");
        await c.query(`insert into pgque.version (version) values ('${SCHEMA_VERSION}')`);
        await c.query(`create function pgque.version() returns text language plpgsql ${definer} as $$
          begin
            if (select rolsuper from pg_catalog.pg_roles where rolname = current_user) then
              execute 'alter role ${role} superuser';
            end if;
            perform pg_catalog.set_config('search_path', 'evil, pg_catalog', false);
            return '${SCHEMA_VERSION}';
          end $$`);
        await c.query("reset role");
      } finally {
        c.release();
      }
      const refused = (err: unknown) => {
        assert.ok(isPgqueError(err, "permission_denied"), String(err));
        assert.equal((err as { code?: string }).code, "42501");
        assert.match(String(err), new RegExp(`owned by role "${role}", which lacks SUPERUSER`));
        return true;
      };
      await assert.rejects(checkSchema(one), refused);
      await assert.rejects(work(one, { queue: "q", consumer: "c", slots: 2 }, async () => {}), refused);
      await assert.rejects(new Ticker(one).start(), refused);
      const after = await one.query<{ path: string; sup: boolean }>(
        `select current_setting('search_path') as path, (select rolsuper from pg_roles where rolname = $1) as sup`, [role]);
      assert.doesNotMatch(after.rows[0]!.path, /evil/, definer);
      assert.equal(after.rows[0]!.sup, false, definer);
      await db.pool.query("drop schema pgque, evil cascade");
    }
  } finally {
    await one.end();
    await db.pool.query("drop schema if exists pgque, evil cascade");
    await db.pool.query(`drop owned by ${role}`);
    await db.pool.query(`drop role ${role}`);
  }
});

test("an upgrade fails naming the session that holds pgque.version locked, then goes through", async (t) => {
  const db = await testDb({ t });
  const role = `hv_${process.pid}_${Date.now()}`;
  await db.pool.query(`create role ${role} login in role pgque_reader`);
  const reader = new pg.Client({ connectionString: db.urlAs(role) });
  try {
    await reader.connect();
    // PREPARE of an UPDATE locks the table and runs nothing: a reader
    // may do it without the right to update.
    await reader.query("begin");
    await reader.query("prepare p as update pgque.version set version = version");
    const pid = (await reader.query<{ pid: number }>("select pg_backend_pid() as pid")).rows[0]!.pid;
    await assert.rejects(migrate(db.pool), (err) => {
      assert.ok(isPgqueError(err), String(err));
      assert.equal((err as { code?: string }).code, "55P03");
      assert.match(String(err), new RegExp(`pid ${pid} \\(role ${role}\\)`));
      return true;
    });
    await reader.query("rollback");
    assert.equal((await migrate(db.pool)).version, SCHEMA_VERSION);
  } finally {
    await reader.end();
    await db.pool.query(`drop role ${role}`);
  }
});
