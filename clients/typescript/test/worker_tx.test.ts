// Transactional handlers (workTx): an event's effects commit with its
// completion, so a chunk delivered again after a crash applies nothing twice,
// a failed attempt's writes roll back, and a worker whose lease was taken
// cannot commit.

import { test } from "node:test";
import assert from "node:assert/strict";
import type { PooledConnection } from "../src/executor.js";
import pg from "pg";
import { send, slots, work, workTx, type Message, type WorkOptions } from "../src/index.js";
import { txSpare } from "../src/worker/tx.js";
import { gate, sendKeyed, setup } from "./worker_helpers.js";
import { waitFor } from "./harness.js";

const fast: Partial<WorkOptions> = { claimIntervalMs: 100, pollIntervalMs: 50, retryDelayMs: () => 20, listen: false };

async function effects(pool: import("pg").Pool): Promise<Map<string, number>> {
  const { rows } = await pool.query<{ ev: string; n: number }>("select ev::text, count(*)::int as n from effect group by ev");
  return new Map(rows.map((r) => [r.ev, r.n]));
}

function insertEffect(tx: PooledConnection, m: Message): Promise<unknown> {
  return tx.query("insert into effect (ev) values ($1::bigint)", [m.id]);
}

// The first worker commits event 0's effect, then blocks in event 1's
// handler (same key, so the chunk is not acknowledged) and is killed. The
// second takes the slot over, gets both again: event 0's handler runs once
// more, but its completion finds the record and its effect rolls back.
for (const tx of [true, false]) {
  test(`${tx ? "workTx" : "work (plain, the control)"}: a chunk delivered again after a kill applies ${tx ? "each effect once" : "the completed effect twice"}`, async (t) => {
    const db = await setup(t, "tx");
    await db.pool.query("create table effect (ev bigint not null)");
    let ids: string[] = []; // sent once the first worker has subscribed
    const blocked = gate();
    // No hold: event 1 blocks until the kill, and a hold of its key after
    // holdAfterMs would acknowledge event 0 with the chunk, which a slow
    // machine reaches before the kill.
    const opts = { ...fast, queue: "tx", consumer: "c", slots: 1, leaseTtlMs: 1500, holdAfterMs: 600_000 } as WorkOptions;
    const first = async (m: Message, c: PooledConnection, signal: AbortSignal) => {
      if ((m.payload as { i: number }).i === 1) {
        blocked.open();
        await new Promise((_, reject) => signal.addEventListener("abort", () => reject(signal.reason), { once: true }));
      }
      await insertEffect(c, m);
    };
    const w1 = tx
      ? db.track(await workTx(db.pool, opts, (m, c, { signal }) => first(m, c, signal)))
      : db.track(await work(db.pool, opts, async (m, { signal }) => {
        const c = await db.pool.connect();
        try {
          await first(m, c, signal);
        } finally {
          c.release();
        }
      }));
    ids = await sendKeyed(db.pool, "tx", ["k"], 2);
    await blocked.wait;
    assert.deepEqual([...(await effects(db.pool))], [[ids[0], 1]], "event 0 committed before the kill");
    await w1.kill();

    const handled: string[] = [];
    const second = (m: Message) => handled.push(m.id);
    if (tx) {
      db.track(await workTx(db.pool, opts, async (m, c) => {
        second(m);
        await insertEffect(c, m);
      }));
    } else {
      db.track(await work(db.pool, opts, async (m) => {
        second(m);
        await db.pool.query("insert into effect (ev) values ($1::bigint)", [m.id]);
      }));
    }
    // The handler is called before its transaction commits: wait for the commit too.
    await waitFor("the second worker to handle both events and commit the last", async () =>
      handled.includes(ids[1]!) && (await effects(db.pool)).has(ids[1]!), 20_000);
    assert.deepEqual(handled, [ids[0], ids[1]], "both delivered again, in order");
    const got = await effects(db.pool);
    assert.equal(got.get(ids[1]!), 1);
    assert.equal(got.get(ids[0]!), tx ? 1 : 2);
  });
}

test("workTx: a handler that ends its transaction, or goes on in an aborted one, fails its event instead of completing it", async (t) => {
  const db = await setup(t, "txend");
  await db.pool.query("create table effect (ev bigint not null)");
  const errors = new Map<string, unknown>();
  const w = db.track(await workTx(db.pool, {
    ...fast, queue: "txend", consumer: "c", slots: 1, failurePolicy: "pause", retryDelayMs: () => 60_000,
    onHandled: (m, r) => void errors.set(m.key!, r.error),
  }, async (m: Message, tx) => {
    await insertEffect(tx, m);
    if (m.key === "rollback") await tx.query("rollback");
    if (m.key === "commit") await tx.query("commit");
    if (m.key === "aborted") await tx.query("select 1/0").catch(() => {});
  }));
  await sendKeyed(db.pool, "txend", ["rollback", "commit", "aborted"], 1);
  await waitFor("three handler calls", () => errors.size === 3);
  await w.stop();
  for (const [key, want] of [["rollback", /ended its transaction/], ["commit", /ended its transaction/], ["aborted", /a statement of the handler failed and the handler went on/]] as const) {
    const err = errors.get(key);
    assert.ok(err instanceof Error && want.test(err.message), `${key}: ${String(err)}`);
  }
  // None was completed: each waits for its retry, holding its key.
  const { rows } = await db.pool.query<{ key: string }>("select key from pgque.blocked_keys('txend', 'c') order by key");
  assert.deepEqual(rows.map((r) => r.key), ["aborted", "commit", "rollback"]);
});

test("workTx: a failed attempt's writes roll back with it, and the retry applies them once", async (t) => {
  const db = await setup(t, "txr");
  await db.pool.query("create table effect (ev bigint not null)");
  let attempts = 0;
  const done = gate();
  db.track(await workTx(db.pool, { ...fast, queue: "txr", consumer: "c", slots: 1 }, async (m, c) => {
    await insertEffect(c, m);
    if (++attempts === 1) throw new Error("fails after writing");
    done.open();
  }));
  const [id] = await sendKeyed(db.pool, "txr", ["k"], 1);
  await done.wait;
  await waitFor("the event's effect", async () => (await effects(db.pool)).get(id!) === 1);
  assert.equal(attempts, 2);
  assert.deepEqual([...(await effects(db.pool))], [[id, 1]]);
});

/**
 * A workTx worker on pool whose handlers each hold their connection until
 * release opens, counting those running now and the most at once.
 */
async function gatedTxWorker(db: Awaited<ReturnType<typeof setup>>, pool: pg.Pool, queue: string, slots: number) {
  const release = gate();
  const n = { running: 0, most: 0 };
  const worker = db.track(await workTx(pool, { ...fast, queue, consumer: "c", slots }, async (m, c) => {
    n.most = Math.max(n.most, ++n.running);
    try {
      await release.wait;
      await insertEffect(c, m);
    } finally {
      n.running--;
    }
  }));
  return { worker, release, n };
}

// Each running workTx handler holds a connection; with more handlers than
// connections, the pool's first-come queue made the worker's own calls
// (lease renewals among them) and the application's sends wait behind
// every handler queued before them. By default a transactional worker now
// runs at most the pool's max less its spare (txSpare: 2 here), so the
// pool always has connections left.
test("workTx on a small pool leaves two connections free: sends and the worker's calls go on while handlers block", async (t) => {
  const db = await setup(t, "txp");
  await db.pool.query("create table effect (ev bigint not null)");
  const small = new pg.Pool({ connectionString: db.url, max: 4 });
  small.on("error", () => {});
  t.after(() => small.end());
  const { worker: w, release, n } = await gatedTxWorker(db, small, "txp", 4);
  const ids = await sendKeyed(db.pool, "txp", ["a", "b", "c", "d", "e", "f", "g", "h"], 2);
  await waitFor("two handlers to hold their connections", () => n.running === 2);
  // With every connection held by a handler this send would wait for the
  // gate, which opens only after it.
  const sent = send(small, "txp", { payload: { late: true }, partitionKey: "z" });
  const inTime = await Promise.race([sent.then(() => true), new Promise<boolean>((r) => setTimeout(() => r(false), 5_000).unref())]);
  assert.equal(inTime, true, "a send on the worker's pool went through while its handlers were blocked");
  assert.equal(w.stats().running, 2);
  release.open();
  await waitFor("every effect", async () => (await effects(db.pool)).size === ids.length + 1);
  assert.equal(n.most, 2, "at most max - 2 handlers ran at once");
});

test("workTx leaves a connection per two slots to the worker's own calls, up to half its pool", async (t) => {
  assert.deepEqual([txSpare(40, 16), txSpare(48, 16), txSpare(10, 16), txSpare(4, 4), txSpare(2, 1), txSpare(40, 4)], [10, 10, 5, 2, 2, 4]);
  const db = await setup(t, "txs");
  await db.pool.query("create table effect (ev bigint not null)");
  // 4 slots on a pool of 40: 2 + 4 / 2 = 4 spare, so 36 handlers at once
  // (38 when the spare was 2 whatever the slots).
  const pool = new pg.Pool({ connectionString: db.url, max: 40 });
  pool.on("error", () => {});
  t.after(() => pool.end());
  const { worker: w, release, n } = await gatedTxWorker(db, pool, "txs", 4);
  const ids = await sendKeyed(db.pool, "txs", Array.from({ length: 64 }, (_, i) => `k${i}`), 1);
  await waitFor("36 handlers to hold their connections", () => n.running === 36);
  // Every further handler would find the pool's connections enough: what
  // keeps it waiting is the worker's limit alone.
  await waitFor("the worker's calls to go on beside them", async () => (await slots(pool, "txs", "c")).every((s) => s.live));
  assert.equal(w.stats().running, 36);
  release.open();
  await waitFor("every effect", async () => (await effects(db.pool)).size === ids.length);
  assert.equal(n.most, 36, "more handlers than the pool's max less its spare ran at once");
});

// The wait for a connection takes no signal: a handler whose connection
// came only after a kill (from a handler the kill ended) must not start,
// nor commit, then.
test("workTx: a handler whose connection comes after the worker was killed does not run", async (t) => {
  const db = await setup(t, "txk");
  const small = new pg.Pool({ connectionString: db.url, max: 2 });
  small.on("error", () => {});
  t.after(() => small.end());
  let calls = 0;
  const w = db.track(await workTx(small, { ...fast, queue: "txk", consumer: "c", slots: 1, concurrency: 4 }, async (_m, _tx, { signal }) => {
    calls++;
    // Honours its signal: the kill ends it at once, and its connection goes
    // to a handler still waiting for one.
    await new Promise<void>((resolve) => {
      if (signal.aborted) resolve();
      signal.addEventListener("abort", () => resolve(), { once: true });
    });
    throw signal.reason;
  }));
  await sendKeyed(db.pool, "txk", ["a", "b", "c", "d"], 1);
  await waitFor("two handlers running and two waiting for a connection", () => calls === 2 && small.waitingCount >= 2);
  await w.kill();
  await waitFor("the waiting checkouts to be served", () => small.waitingCount === 0 && small.idleCount === small.totalCount);
  assert.equal(calls, 2, "no handler started after the kill");
});

// pg's pool stops listening for a connection's errors while it is checked
// out: a connection lost between statements (a Postgres restart, a killed
// PgBouncer) would throw an uncaught exception and end the process. The
// attempt fails instead, and the retry applies the effect once.
test("workTx: the handler's connection lost between statements fails the attempt, not the process", async (t) => {
  const db = await setup(t, "txl");
  await db.pool.query("create table effect (ev bigint not null)");
  const attempts: number[] = [];
  const done = gate();
  db.track(await workTx(db.pool, { ...fast, queue: "txl", consumer: "c", slots: 1 } as WorkOptions, async (m, c) => {
    attempts.push(m.retryCount);
    if (attempts.length === 1) {
      const { rows } = await c.query<{ pid: number }>("select pg_backend_pid() as pid");
      const ended = new Promise((r) => (c as unknown as import("pg").PoolClient).once("end", r));
      await db.pool.query("select pg_terminate_backend($1)", [rows[0]!.pid]);
      await ended; // the server closed the connection while no statement ran on it
    }
    await insertEffect(c, m);
    done.open();
  }));
  const [id] = await sendKeyed(db.pool, "txl", ["k"], 1);
  await done.wait;
  await waitFor("the retry's effect", async () => (await effects(db.pool)).get(id!) === 1, 20_000);
  assert.deepEqual(attempts, [0, 1], "the lost attempt failed and was retried");
});

// The completion keeps a key share lock on the slot's lease row and waits
// for it at most 2 s; a claim taking the slot over holds the row longer.
// Such a lock timeout is not the
// handler's failure: the transaction runs again, the event is not retried
// (no retry counted against max_retries, no paused key), and its effect
// commits once.
test("workTx: a completion that waited out its lock timeout runs the handler again instead of failing the event", async (t) => {
  const db = await setup(t, "txlock");
  await db.pool.query("create table effect (ev bigint not null)");
  const holder = await db.pool.connect(); // released before the test's pool ends
  const proceed = gate();
  const started = gate();
  const runs: { id: string; retry: number }[] = [];
  const outcomes: unknown[] = [];
  const done = gate();
  db.track(await workTx(db.pool, {
    ...fast, queue: "txlock", consumer: "c", slots: 1,
    onHandled: (_m, r) => {
      outcomes.push(r.error);
      done.open();
    },
  }, async (m, tx) => {
    runs.push({ id: m.id, retry: m.retryCount });
    if (runs.length === 1) {
      started.open();
      await proceed.wait;
    } else await holder.query("rollback"); // the lease row's holder lets go
    await insertEffect(tx, m);
  }));
  try {
    const [id] = await sendKeyed(db.pool, "txlock", ["k"], 1);
    await started.wait;
    await holder.query("begin");
    await holder.query("select 1 from pgque.slot_lease where sl_consumer = 'c' for update");
    proceed.open(); // its completion now waits 2 s for the lease row, in vain
    await done.wait;
    assert.deepEqual(runs, [{ id, retry: 0 }, { id, retry: 0 }], "run again at once, not retried later");
    assert.deepEqual(outcomes, [undefined], "one handled call, no failure");
    assert.deepEqual([...(await effects(db.pool))], [[id, 1]]);
  } finally {
    await holder.query("rollback").catch(() => {});
    holder.release();
  }
});
