import { test } from "node:test";
import assert from "node:assert/strict";
import pg from "pg";
import { Ticker, isPgqueError, send } from "../src/index.js";
import { testDb, waitFor, type TestDb } from "./harness.js";

const db: TestDb = await testDb();

/** The worker holding the ticker lease, per the database. */
async function leaseOwner(): Promise<string | null> {
  const { rows } = await db.pool.query("select owner from pgque.ticker_lease");
  return rows[0]?.owner ?? null;
}

/** A ticker whose errors fail the test instead of being logged. */
function newTicker(pool: pg.Pool, workerId: string, errors: unknown[]): Ticker {
  return new Ticker(pool, { workerId, onError: (err) => errors.push(err) });
}

test("two tickers elect one leader; stopping it hands over at once, and ticks reach consumers", async () => {
  const errors: unknown[] = [];
  const a = newTicker(db.pool, "ts-a", errors);
  const b = newTicker(db.pool, "ts-b", errors);
  await a.start();
  try {
    await waitFor("ticker a to lead", () => a.isLeader());
    const checks = b.stats.leadChecks;
    await b.start();
    await waitFor("ticker b to ask for the lease", () => b.stats.leadChecks > checks);
    assert.equal(b.isLeader(), false);
    assert.equal(await leaseOwner(), "ts-a");

    // The leader's ticks make events visible to a consumer.
    await db.pool.query("select pgque.create_queue('tq'), pgque.subscribe('tq', 'c')");
    const id = await send(db.pool, "tq", { payload: { hello: 1 } });
    let got: string[] = [];
    await waitFor("the event to be delivered", async () => {
      const { rows } = await db.pool.query("select msg_id::text as id from pgque.receive('tq', 'c', 10)");
      got = rows.map((r) => r.id);
      return got.length > 0;
    });
    assert.deepEqual(got, [id]);

    // b checks the lease every 2.5 s (a quarter of the 10 s TTL) and the
    // lease would run for 10 s: a handover within 2 s is the resignation's
    // notification at work.
    const t0 = Date.now();
    await a.stop();
    assert.equal(a.isLeader(), false);
    await waitFor("ticker b to take over", () => b.isLeader(), 2_000);
    assert.ok(Date.now() - t0 < 2_000);
    assert.equal(await leaseOwner(), "ts-b");
  } finally {
    await a.stop();
    await b.stop();
  }
  assert.deepEqual(errors, []);
});

test("a ticker on a pool of one connection ticks, and listens on a connection of its own", async () => {
  // The resignation LISTEN once held one of the pool's connections for the
  // ticker's life: with max 1 the ticker itself then waited for ever for a
  // connection, and every other query of the pool with it.
  const pool = new pg.Pool({ connectionString: db.url, max: 1 });
  pool.on("error", () => {});
  const errors: unknown[] = [];
  const lead = newTicker(pool, "ts-one", errors);
  const standby = newTicker(pool, "ts-standby", errors);
  try {
    await lead.start();
    await waitFor("the ticker on a 1-connection pool to tick", () => lead.stats.ticks >= 3, 5_000);
    const { rows } = await pool.query("select 1 as one");
    assert.equal(rows[0].one, 1, "the pool still serves other queries");
    // Each tick commits without a flush, for its own transaction only: the
    // pool's one connection, which served those ticks, keeps the server's
    // setting for whatever it runs next.
    const [mine, fresh] = await Promise.all([pool, db.pool].map((p) => p.query("show synchronous_commit")));
    assert.equal(mine.rows[0].synchronous_commit, fresh.rows[0].synchronous_commit,
      "synchronous_commit on the ticker's connection after its ticks");
    await standby.start();
    const checks = standby.stats.leadChecks;
    await waitFor("the standby ticker to ask for the lease", () => standby.stats.leadChecks > checks, 5_000);
    // The standby asks again only every quarter TTL (2.5 s): a handover
    // within 2 s is its own LISTEN connection hearing the resignation.
    const t0 = Date.now();
    await lead.stop();
    await waitFor("the standby to take over", () => standby.isLeader(), 2_000);
    assert.ok(Date.now() - t0 < 2_000);
    assert.ok(pool.totalCount <= 1);
  } finally {
    await lead.stop();
    await standby.stop();
    await pool.end();
  }
  assert.deepEqual(errors, []);
});

test("a ticker with listen: false opens no LISTEN connection and still leads", async () => {
  const errors: unknown[] = [];
  const t = new Ticker(db.pool, { workerId: "ts-nolisten", onError: (err) => errors.push(err), listen: false, leaseTtlMs: 1_000 });
  const listening = async () => {
    const { rows } = await db.pool.query(
      "select count(*)::int as n from pg_stat_activity where datname = current_database() and query ilike 'listen pgque_ticker%'");
    return rows[0].n as number;
  };
  try {
    await t.start();
    await waitFor("the ticker to lead", () => t.isLeader(), 5_000);
    assert.equal(await listening(), 0);
  } finally {
    await t.stop();
  }
  assert.deepEqual(errors, []);
});

test("a ticker defers to a lease held through the Go ticker's SQL", async () => {
  const errors: unknown[] = [];
  // The Go ticker (internal/tickerd) leads with exactly this call.
  await db.pool.query("select pgque.ticker_lead('go-ticker', '10 seconds'::interval)");
  const t = newTicker(db.pool, "ts-c", errors);
  const checks = t.stats.leadChecks;
  await t.start();
  try {
    await waitFor("the ticker to ask for the lease", () => t.stats.leadChecks > checks);
    assert.equal(t.isLeader(), false);
    assert.equal(await leaseOwner(), "go-ticker");
    await db.pool.query("select pgque.ticker_resign('go-ticker')");
    await waitFor("the ticker to take over from the Go one", () => t.isLeader(), 2_000);
  } finally {
    await t.stop();
  }
  assert.deepEqual(errors, []);
});

test("start fails at once, naming the missing rights, for a role without pgque_admin", async () => {
  for (const group of ["pgque_reader", "pgque_writer"]) {
    const role = `ts_${group}_${Math.random().toString(36).slice(2, 8)}`;
    await db.pool.query(`create role ${role} login in role ${group}`);
    const pool = new pg.Pool({ connectionString: db.urlAs(role), max: 2, allowExitOnIdle: true });
    try {
      const t = new Ticker(pool, { onError: (err) => assert.fail(`loop ran: ${err}`) });
      await assert.rejects(t.start(), (err) => {
        assert.ok(isPgqueError(err, "permission_denied"), String(err));
        assert.match(err.message, new RegExp(`role "${role}" may not run the ticker`));
        assert.match(err.message, /pgque\.ticker_lead\(text, interval\)/);
        assert.match(err.message, /grant pgque_admin to/);
        return true;
      });
      assert.equal(t.isLeader(), false);
    } finally {
      await pool.end();
      await db.pool.query(`drop role ${role}`);
    }
  }

  const stranger = `ts_none_${Math.random().toString(36).slice(2, 8)}`;
  await db.pool.query(`create role ${stranger} login`);
  const spool = new pg.Pool({ connectionString: db.urlAs(stranger), max: 2, allowExitOnIdle: true });
  try {
    await assert.rejects(new Ticker(spool).start(), (err) => {
      assert.ok(isPgqueError(err, "permission_denied"), String(err));
      assert.match(err.message, new RegExp(`role "${stranger}" may not use schema pgque`));
      return true;
    });
  } finally {
    await spool.end();
    await db.pool.query(`drop role ${stranger}`);
  }

  const admin = `ts_admin_${Math.random().toString(36).slice(2, 8)}`;
  await db.pool.query(`create role ${admin} login in role pgque_admin`);
  const pool = new pg.Pool({ connectionString: db.urlAs(admin), max: 3, allowExitOnIdle: true });
  const t = new Ticker(pool, { workerId: "ts-admin", onError: (err) => assert.fail(String(err)) });
  try {
    await db.pool.query("select pgque.ticker_resign(owner) from pgque.ticker_lease");
    await t.start();
    await waitFor("the admin role's ticker to lead", () => t.isLeader());
  } finally {
    await t.stop();
    await pool.end();
    await db.pool.query(`drop role ${admin}`);
  }
});

test("options are validated", () => {
  assert.throws(() => new Ticker(db.pool, { leaseTtlMs: 10 }), (err) => isPgqueError(err, "invalid_argument"));
  assert.throws(() => new Ticker(db.pool, { workerId: "" }), (err) => isPgqueError(err, "invalid_argument"));
  assert.throws(() => new Ticker(db.pool, { tickIntervalMs: -1 }), (err) => isPgqueError(err, "invalid_argument"));
});

test("a stopped ticker says it cannot start again; one stopped before it started starts", async () => {
  const errors: unknown[] = [];
  const t = newTicker(db.pool, "ts-restart", errors);
  await t.start();
  await assert.rejects(t.start(), (err) => isPgqueError(err, "already_started") && /ticker already started/.test(err.message));
  await t.stop();
  await assert.rejects(t.start(), (err) =>
    isPgqueError(err, "already_started") && /stopped and does not start again; create a new Ticker/.test(err.message));

  // stop() before start() stops nothing: the ticker starts and leads.
  await db.pool.query("select pgque.ticker_resign(owner) from pgque.ticker_lease where owner is not null");
  const early = newTicker(db.pool, "ts-early", errors);
  await early.stop();
  await early.start();
  try {
    await waitFor("the ticker stopped before it started to lead", () => early.isLeader());
  } finally {
    await early.stop();
  }
  assert.deepEqual(errors, []);
});

test("a hung lease call does not stall the loop: it is reported and the ticker leads once the lock goes", async () => {
  await db.pool.query("select pgque.ticker_resign(owner) from pgque.ticker_lease where owner is not null");
  const errors: unknown[] = [];
  const blocker = await db.pool.connect();
  const t = new Ticker(db.pool, { workerId: "ts-hung", leaseTtlMs: 1_000, onError: (err) => errors.push(err) });
  try {
    await blocker.query("begin");
    await blocker.query("lock table pgque.ticker_lease in access exclusive mode");
    await t.start();
    await waitFor("the hung ticker_lead to be reported", () => errors.length > 0, 5_000);
    assert.match(String(errors[0]), /ticker_lead did not return within 1000 ms/);
    assert.equal(t.isLeader(), false);
    await blocker.query("rollback");
    await waitFor("the ticker to lead once the lock is gone", () => t.isLeader(), 10_000);
  } finally {
    await blocker.query("rollback").catch(() => {});
    blocker.release();
    await t.stop();
  }
});

test("a committed subscribe asks the leader for its routing indexes, built at once rather than at the next maint", async () => {
  // The SQL leaves index changes to maint_route_indexes(): a subscribe that
  // built them held its queue's producers until its transaction ended.
  await db.pool.query("select pgque.create_queue('ixq')");
  const routeIndexes = async (n: number) => {
    const { rows } = await db.pool.query(
      `select count(*)::int as c from pg_catalog.pg_class c join pgque.queue q on q.queue_name = 'ixq'
        where c.relkind = 'i' and c.relname ~ ('^event_' || q.queue_id || '_[0-9]+_route' || $1::int || '$')`, [n]);
    return rows[0].c as number;
  };
  const subscribe = (consumer: string, n: number) =>
    db.pool.query("select pgque.subscribe_slot('ixq', $1, k, $2) from generate_series(0, $2 - 1) k", [consumer, n]);
  await subscribe("early", 4);
  assert.equal(await routeIndexes(4), 0, "no routing index before maint_route_indexes");
  const errors: unknown[] = [];
  const t = new Ticker(db.pool, { workerId: "ts-indexes", onError: (err) => errors.push(err), maintIntervalMs: 3_600_000 });
  try {
    await t.start();
    // The first maint's: the next is an hour away.
    await waitFor("the first maint's routing indexes", async () => (await routeIndexes(4)) === 3, 20_000);
    await subscribe("late", 8);
    await waitFor("the routing indexes the subscribe asked for", async () => (await routeIndexes(8)) === 3, 20_000);
  } finally {
    await t.stop();
  }
  assert.deepEqual(errors, []);
});
