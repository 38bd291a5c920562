// The worker pool's per-key guarantees against a real PostgreSQL: order
// and one-at-a-time per key (G1, G2), different keys of one slot at once,
// a slow key not stalling its slot, and the message's fields.

import { test } from "node:test";
import { createRequire } from "node:module";
import pg from "pg";
import assert from "node:assert/strict";
import { slots, subscribeSlots, Ticker, work, type Message, type WorkOptions } from "../src/index.js";
import { aheadOf, foldTuning } from "../src/worker/slot.js";
import { ReceiveGather } from "../src/worker/gather.js";
import * as q from "../src/worker/sql.js";
import { waitFor } from "./harness.js";
import { barrier, gate, Recorder, sendKeyed, setup } from "./worker_helpers.js";

const fast: Partial<WorkOptions> = { claimIntervalMs: 100, pollIntervalMs: 50, retryDelayMs: () => 20, listen: false };


test("each key's events are handled in order and one at a time, across many keys and two workers", async (t) => {
  const db = await setup(t, "order");
  const keys = Array.from({ length: 40 }, (_, i) => `tenant-${i}`);
  keys.push("", null as unknown as string);
  const rec = new Recorder();
  const handler = async (m: Message) => {
    rec.enter(m);
    // Yield a few times so that keys really interleave.
    for (let i = 0; i < 3; i++) await new Promise((r) => setImmediate(r));
    rec.leave(m, true);
  };
  const w1 = db.track(await work(db.pool, { ...fast, queue: "order", consumer: "c", slots: 4, concurrency: 16, batchSize: 50 }, handler));
  const w2 = db.track(await work(db.pool, { ...fast, queue: "order", consumer: "c", slots: 4, concurrency: 16, batchSize: 50 }, handler));
  const ids = await sendKeyed(db.pool, "order", keys, 20);
  await rec.handled(ids.length);
  await Promise.all([w1.stop(), w2.stop()]);
  assert.deepEqual(rec.violations, []);
  assert.equal(rec.total, ids.length, "every event handled once (no failures, no takeover)");
  // The NULL key and the empty key are two keys.
  assert.equal(rec.seen.get(null)?.length, 20);
  assert.equal(rec.seen.get("")?.length, 20);
});

test("different keys of one slot run at once up to the concurrency limit", async (t) => {
  const db = await setup(t, "conc");
  const keys = Array.from({ length: 8 }, (_, i) => `k${i}`);
  const all = barrier(8, 10_000);
  const rec = new Recorder();
  let maxRunning = 0;
  let running = 0;
  const w = await work(db.pool, { ...fast, queue: "conc", consumer: "c", slots: 1, concurrency: 8 }, async (m) => {
    rec.enter(m);
    running++;
    maxRunning = Math.max(maxRunning, running);
    // The first event of each key waits until the first events of all 8
    // keys are in handlers together: one slot handling keys one after
    // another would never get there.
    if ((m.payload as { i: number }).i === 0) await all.arrive();
    running--;
    rec.leave(m, true);
  });
  db.track(w);
  const ids = await sendKeyed(db.pool, "conc", keys, 3);
  await rec.handled(ids.length);
  await w.stop();
  assert.equal(all.arrived(), 8);
  assert.equal(maxRunning, 8);
  assert.deepEqual(rec.violations, []);
});

// Each slot, and each lane waiting for a place, listens on the worker's
// shared abort signals: past ten, Node warned of a leak
// (MaxListenersExceededWarning) in any process with more than ten slots.
test("sixteen slots and many waiting lanes raise no listener warning", async (t) => {
  const db = await setup(t, "listeners");
  const warnings: string[] = [];
  const onWarning = (w: Error) => warnings.push(`${w.name}: ${w.message}`);
  process.on("warning", onWarning);
  t.after(() => process.off("warning", onWarning));
  const rec = new Recorder();
  const w = await work(db.pool, { ...fast, queue: "listeners", consumer: "c", slots: 16, concurrency: 2 }, async (m) => {
    rec.enter(m);
    await new Promise((r) => setTimeout(r, 1));
    rec.leave(m, true);
  });
  db.track(w);
  const keys = Array.from({ length: 64 }, (_, i) => `k${i}`);
  const ids = await sendKeyed(db.pool, "listeners", keys, 3);
  await rec.handled(ids.length);
  await w.stop();
  await new Promise((r) => setImmediate(r)); // process.emitWarning reports on the next tick
  assert.deepEqual(warnings.filter((x) => x.startsWith("MaxListenersExceededWarning")), []);
  assert.deepEqual(rec.violations, []);
});

test("the concurrency limit bounds the handlers running at once", async (t) => {
  const db = await setup(t, "limit");
  const keys = Array.from({ length: 10 }, (_, i) => `k${i}`);
  const rec = new Recorder();
  let running = 0;
  let maxRunning = 0;
  const w = await work(db.pool, { ...fast, queue: "limit", consumer: "c", slots: 2, concurrency: 3 }, async (m) => {
    rec.enter(m);
    running++;
    maxRunning = Math.max(maxRunning, running);
    await new Promise((r) => setTimeout(r, 2));
    running--;
    rec.leave(m, true);
  });
  db.track(w);
  const ids = await sendKeyed(db.pool, "limit", keys, 5);
  await rec.handled(ids.length);
  await w.stop();
  assert.ok(maxRunning <= 3, `at most 3 handlers at once, saw ${maxRunning}`);
  assert.deepEqual(rec.violations, []);
});

test("a slow key does not stall the other keys of its slot", async (t) => {
  const db = await setup(t, "slow");
  const rec = new Recorder();
  const slow = gate();
  const slowStarted = gate();
  const w = await work(db.pool, { ...fast, queue: "slow", consumer: "c", slots: 1, holdAfterMs: 30 }, async (m) => {
    rec.enter(m);
    try {
      if (m.key === "slow" && (m.payload as { i: number }).i === 0) {
        slowStarted.open();
        await slow.wait;
      }
    } finally {
      rec.leave(m, true);
    }
  });
  db.track(w);
  const first = await sendKeyed(db.pool, "slow", ["slow", "a"], 2);
  await slowStarted.wait;
  // Later events of other keys, in later batches, are handled while the
  // slow key's first handler still runs.
  const later = await sendKeyed(db.pool, "slow", ["b", "c", "d"], 5);
  await rec.handled(1 + later.length); // a's first, then b, c, d
  assert.equal(rec.seen.get("slow"), undefined, "the slow key is still in its first handler");
  assert.equal(rec.seen.get("a")?.length, 2);
  // Events of the slow key sent meanwhile wait for it, in order.
  const more = await sendKeyed(db.pool, "slow", ["slow"], 3);
  slow.open();
  await rec.handled(first.length + later.length + more.length);
  await w.stop();
  assert.equal(rec.seen.get("slow")?.length, 5);
  assert.deepEqual(rec.violations, []);
  // The hold left nothing behind on the server.
  const { rows } = await db.pool.query("select count(*)::int as n from pgque.key_block");
  assert.deepEqual(rows, [{ n: 0 }]);
});

test("a hot key's many fast events do not stall the other keys of its slot", async (t) => {
  // 400 events of 5 ms for one key, none near the hold time: as their events
  // left would take BUSY_HOLD_FACTOR hold times, the key is held and the
  // slot fetches on, so a cold key's event sent meanwhile is handled long
  // before the hot key is through.
  const db = await setup(t, "hot");
  const rec = new Recorder();
  const firstHot = gate();
  let hotAtCold = -1;
  const w = await work(db.pool, { ...fast, queue: "hot", consumer: "c", slots: 1 }, async (m) => {
    rec.enter(m);
    try {
      if (m.key === "hot") {
        await new Promise((r) => setTimeout(r, 5));
        firstHot.open();
      } else {
        hotAtCold = rec.seen.get("hot")?.length ?? 0;
      }
    } finally {
      rec.leave(m, true);
    }
  });
  db.track(w);
  const hot = await sendKeyed(db.pool, "hot", ["hot"], 400);
  await firstHot.wait;
  await sendKeyed(db.pool, "hot", ["cold"], 1);
  await rec.handled(hot.length + 1, 60_000);
  await w.stop();
  t.diagnostic(`the cold key's event was handled after ${hotAtCold} of the hot key's 400 events`);
  assert.ok(hotAtCold >= 0 && hotAtCold < 200, `the cold key's event was handled after ${hotAtCold} of the hot key's 400 events`);
  assert.deepEqual(rec.seen.get("hot"), hot, "the hot key's events, each once, in order");
  assert.deepEqual(rec.violations, []);
  const { rows } = await db.pool.query("select count(*)::int as n from pgque.key_block");
  assert.deepEqual(rows, [{ n: 0 }]);
});

test("a lane is ahead when its events left would take ten hold times at its handlers' mean", () => {
  const lane = (next: number, runs: number, ranMs: number, running = true) =>
    ({ runningSince: running ? Date.now() : null, runs, ranMs, next, events: new Array(40) });
  assert.equal(aheadOf(lane(6, 6, 18), 10), true, "34 left at 3 ms: 102 ms");
  assert.equal(aheadOf(lane(7, 7, 21), 10), false, "33 left at 3 ms: 99 ms");
  assert.equal(aheadOf(lane(1, 1, 3), 1), false, "one handler is no mean");
  assert.equal(aheadOf(lane(6, 6, 18, false), 10), false, "between two handlers");
});

test("the message carries key, type, parsed payload, id as a string, epoch, slot and time", async (t) => {
  const db = await setup(t, "msg");
  const got: Message[] = [];
  const done = gate();
  const w = await work(db.pool, { ...fast, queue: "msg", consumer: "c", slots: 2 }, (m) => {
    got.push(m);
    if (got.length === 3) done.open();
  });
  db.track(w);
  // now() is the event's ev_time, in the send's transaction.
  const sentAt = new Map<string, number>();
  for (const [type, sql, params] of [
    ["file.created", `select pgque.send('msg', 'file.created', '{"big": 12345678901234567890, "s": "x"}'::jsonb, 'tenant-1'), now() as at`, []],
    ["plain", `select pgque.send('msg', 'plain', $1::text, ''), now() as at`, ['"a string"']],
    ["nokey", `select pgque.send('msg', 'nokey', '[1,2]'::jsonb, null), now() as at`, []],
  ] as const) {
    const { rows } = await db.pool.query<{ at: Date }>(sql, [...params]);
    sentAt.set(type, rows[0]!.at.getTime());
  }
  await done.wait;
  // The slots' status gives the lease epoch as the messages carry it: a bigint.
  const status = await slots(db.pool, "msg", "c");
  await w.stop();
  const byType = new Map(got.map((m) => [m.type, m]));
  const created = byType.get("file.created")!;
  assert.equal(status.find((s) => s.slot === created.slot)!.epoch, created.epoch);
  assert.equal(created.key, "tenant-1");
  assert.equal((created.payload as { s: string }).s, "x");
  assert.match(created.id, /^\d+$/);
  assert.equal(typeof created.epoch, "bigint");
  assert.ok(created.epoch >= 1n);
  assert.equal(created.retryCount, 0);
  assert.equal(created.redelivered, false);
  assert.ok(created.createdAt instanceof Date);
  for (const m of got) assert.equal(m.createdAt.getTime(), sentAt.get(m.type), `${m.type}: createdAt is the send's time, to the millisecond`);
  assert.equal(created.nslots, 2);
  assert.ok(created.slot === 0 || created.slot === 1);
  assert.equal(byType.get("plain")!.key, "");
  assert.equal(byType.get("plain")!.payload, "a string");
  assert.equal(byType.get("nokey")!.key, null);
  assert.deepEqual(byType.get("nokey")!.payload, [1, 2]);
});

test("with LISTEN, the package's Ticker wakes an idle worker without waiting for its poll", async (t) => {
  const db = await setup(t, "wake", { ticker: false });
  const ticker = new Ticker(db.pool, { tickIntervalMs: 50 });
  await ticker.start();
  try {
    await wakeTest(db);
  } finally {
    await ticker.stop();
  }
});

test("with LISTEN, a pg.Pool of another copy of pg (a file: or linked install, an undeduped pg) is woken too", async (t) => {
  const db = await setup(t, "wake", { ticker: false });
  // A second copy of the pg module, as an application gets when npm does
  // not dedupe its pg with the package's: its Pool is not this package's.
  const req = createRequire(import.meta.url);
  for (const k of Object.keys(req.cache)) if (/[\\/]node_modules[\\/]pg(-pool)?[\\/]/.test(k)) delete req.cache[k];
  const otherPg = req("pg") as typeof pg;
  assert.notEqual(otherPg.Pool, pg.Pool);
  const pool = new otherPg.Pool({ connectionString: db.url });
  // As every pool of these tests: the database's drop at the test's end
  // ends its sessions, and an idle client's error with no listener is an
  // uncaught exception.
  pool.on("error", () => {});
  const ticker = new Ticker(db.pool, { tickIntervalMs: 50 });
  await ticker.start();
  try {
    await wakeTest(db, pool);
  } finally {
    await ticker.stop();
    await pool.end();
  }
});

async function wakeTest(db: Awaited<ReturnType<typeof setup>>, pool: pg.Pool = db.pool): Promise<void> {
  let got = false;
  // Each slot's first receive, right after its claim, must have found
  // nothing before the event is sent: then only a wake-up brings it.
  let received = 0;
  const query = pool.query.bind(pool) as (text: unknown, params?: unknown[]) => Promise<unknown>;
  (pool as unknown as { query: typeof query }).query = async (text, params) => {
    const r = await query(text, params);
    if (typeof text === "string" && text.includes("receive_partitioned_raw")) received++;
    return r;
  };
  // A poll interval of a minute: only the tick's NOTIFY can wake the slot in time.
  const w = db.track(await work(pool, { queue: "wake", consumer: "c", slots: 2, claimIntervalMs: 100, pollIntervalMs: 60_000 }, () => {
    got = true;
  }));
  await waitFor("both slots claimed and received once", () => w.ownedSlots().length === 2 && received >= 2);
  await db.pool.query("select pgque.send('wake', 't', '{}'::jsonb, 'k')");
  await waitFor("the event, woken by the tick", () => got, 20_000);
  await w.stop();
}

test("a chunk that ends its batch is acknowledged by the next wake-up's receive: one call per event, the last one alone within moments", async (t) => {
  const db = await setup(t, "fold");
  let receives = 0;
  const query = db.pool.query.bind(db.pool) as (text: unknown, params?: unknown[]) => Promise<unknown>;
  (db.pool as unknown as { query: typeof query }).query = (text, params) => {
    if (typeof text === "string" && text.includes("receive_partitioned_raw")) receives++;
    return query(text, params);
  };
  const seen: string[] = [];
  // A poll interval longer than the test: only wake-ups and the fold's own
  // bound make calls.
  const w = db.track(await work(db.pool, { queue: "fold", consumer: "c", slots: 1, claimIntervalMs: 100, pollIntervalMs: 120_000 }, (m) => {
    seen.push(m.id);
  }));
  await waitFor("the slot claimed", () => w.ownedSlots().length === 1, 20_000);
  const n = 30;
  const before = receives;
  const ids: string[] = [];
  for (let i = 0; i < n; i++) {
    const { rows } = await db.pool.query<{ id: string }>("select pgque.send('fold', 't', '{}'::jsonb, $1)::text as id", [`k${i % 3}`]);
    ids.push(rows[0].id);
    await waitFor(`event ${i}`, () => seen.length === i + 1, 10_000);
  }
  // Folded: a call per event (and one alone after the last). Unfolded: two.
  const made = receives - before;
  assert.ok(made <= n + n / 4, `${made} receive calls for ${n} events, one per event expected`);
  await waitFor("the last chunk acknowledged without a poll", async () => {
    const { rows } = await db.pool.query<{ open: string | null }>(
      "select open_batch::text as open from pgque.partition_slot_status where queue = 'fold' and consumer = 'c'");
    return rows.length === 1 && rows[0].open === null;
  }, 10_000);
  await w.stop();
  assert.deepEqual(seen, ids);
});

test("a slot behind wakes itself at each batch's end: a backlog of many ticks drains without waiting for the fold's bound", async (t) => {
  const db = await setup(t, "behind", { ticker: false });
  await subscribeSlots(db.pool, "behind", "c", 2);
  // 60 ticks of two events each, all written before the worker starts: no
  // tick's notification will reach it, so only the receive's own wake-up
  // (a short last chunk of a batch with later ticks) moves it on at once.
  const ticks = 60;
  const ids: string[] = [];
  for (let i = 0; i < ticks; i++) {
    ids.push(...(await sendKeyed(db.pool, "behind", ["k0", "k1"], 1)));
    await db.pool.query("select pgque.force_next_tick('behind'), pgque.ticker('behind')");
  }
  // The fold's bound and the poll are a minute: without the wake-up each
  // batch's end would wait that long.
  const saved = foldTuning.ackFoldWaitMs;
  foldTuning.ackFoldWaitMs = 60_000;
  t.after(() => {
    foldTuning.ackFoldWaitMs = saved;
  });
  const rec = new Recorder();
  const w = db.track(await work(db.pool, { queue: "behind", consumer: "c", slots: 2, claimIntervalMs: 100, pollIntervalMs: 60_000, batchSize: 5 }, (m) => {
    rec.enter(m);
    rec.leave(m, true);
  }));
  await rec.handled(ids.length, 20_000);
  await w.stop();
  assert.deepEqual(rec.violations, []);
  assert.equal(rec.total, ids.length);
  assert.deepEqual([...(rec.seen.get("k0") ?? []), ...(rec.seen.get("k1") ?? [])].sort(), [...ids].sort());
});

test("a tick wakes only the slots it touched: one keyed event per tick calls on its slot alone", async (t) => {
  const db = await setup(t, "touched");
  // Count the receives per slot at the pool the worker calls through.
  const calls = new Map<number, number>();
  let gathered = 0;
  const query = db.pool.query.bind(db.pool) as (text: unknown, params?: unknown[]) => Promise<unknown>;
  (db.pool as unknown as { query: typeof query }).query = (text, params) => {
    if (typeof text === "string" && text.includes("receive_partitioned_raw_slots") && params) {
      gathered++;
    } else if (typeof text === "string" && text.includes("receive_partitioned_raw") && params) {
      const slot = params[2] as number;
      calls.set(slot, (calls.get(slot) ?? 0) + 1);
    }
    return query(text, params);
  };
  let handled = 0;
  // A poll interval longer than the test: only NOTIFYs wake the slots.
  const w = db.track(await work(db.pool, { queue: "touched", consumer: "c", slots: 16, claimIntervalMs: 100, pollIntervalMs: 120_000 }, () => {
    handled++;
  }));
  await waitFor("all 16 slots claimed", () => w.ownedSlots().length === 16, 20_000);
  // Keys of slots 0..3 only: slots 4..15 are never touched.
  const { rows } = await db.pool.query<{ k: string }>(
    "select k from generate_series(0, 10000) i, lateral (select 'k' || i as k) s where pgque.slot_of(k, 16) < 4 order by i limit 20");
  const sendOne = async (key: string) => {
    const want = handled + 1;
    await db.pool.query("select pgque.send('touched', 't', '{}'::jsonb, $1)", [key]);
    await waitFor(`the event of key ${key}`, () => handled === want, 10_000);
  };
  // Until the worker has seen a touched set the plain tag wakes every
  // slot: the first event shows it one. A slot busy when that wake-up came
  // keeps it and makes one more call whenever it gets to run, so an
  // untouched slot may make one call below, never more: without touched
  // sets each would make one per event.
  await sendOne(rows[0].k);
  await sendOne(rows[1].k);
  const before = new Map(calls);
  for (let i = 0; i < 30; i++) await sendOne(rows[(i * 7) % rows.length].k);
  for (let s = 4; s < 16; s++) {
    const made = (calls.get(s) ?? 0) - (before.get(s) ?? 0);
    assert.ok(made <= 1, `slot ${s}, never touched, made ${made} receive calls for 30 events`);
  }
  let touched = 0;
  for (let s = 0; s < 4; s++) touched += (calls.get(s) ?? 0) - (before.get(s) ?? 0);
  assert.ok(touched >= 30, `slots 0..3 made ${touched} receive calls for 30 events`);
  assert.equal(gathered, 0, "receives gathered without gatherReceives");
  await w.stop();
});

test("the slots a tick wakes receive in one call, and every event is still handled once, in key order", async (t) => {
  const db = await setup(t, "gather");
  // Count the calls for several slots at the pool the worker calls through.
  const gathered: number[][] = [];
  const query = db.pool.query.bind(db.pool) as (text: unknown, params?: unknown[]) => Promise<unknown>;
  (db.pool as unknown as { query: typeof query }).query = (text, params) => {
    if (typeof text === "string" && text.includes("receive_partitioned_raw_slots") && params) gathered.push([...(params[4] as number[])]);
    return query(text, params);
  };
  const rec = new Recorder();
  const w = db.track(await work(db.pool, { queue: "gather", consumer: "c", slots: 16, claimIntervalMs: 100, pollIntervalMs: 120_000, gatherReceives: true }, (m) => {
    rec.enter(m);
    rec.leave(m, true);
  }));
  await waitFor("all 16 slots claimed", () => w.ownedSlots().length === 16, 20_000);
  // Two keys on each of slots 0..7; each burst is one transaction with an
  // event of every one of them, so its tick touches 8 slots at once.
  const { rows } = await db.pool.query<{ k: string; s: number }>(
    `select k, s from (select k, pgque.slot_of(k, 16) as s, row_number() over (partition by pgque.slot_of(k, 16) order by i) as n
       from generate_series(0, 10000) i, lateral (select 'g' || i as k) x) y where s < 8 and n <= 2 order by s, k`);
  assert.equal(rows.length, 16);
  const bursts = 12;
  let sent = 0;
  for (let b = 0; b < bursts; b++) {
    const c = await db.pool.connect();
    try {
      await c.query("begin");
      for (const r of rows) await c.query("select pgque.send('gather', 't', $1::jsonb, $2)", [JSON.stringify({ b }), r.k]);
      await c.query("commit");
    } finally {
      c.release();
    }
    sent += rows.length;
    await rec.handled(sent);
  }
  await w.stop();
  assert.deepEqual(rec.violations, []);
  assert.equal(rec.total, sent, "every event handled once");
  // Until the worker has seen a touched set every slot wakes on every
  // tick, and a slot still busy with its last chunk joins a later call:
  // not every burst is one call, but most are.
  assert.ok(gathered.length >= bursts / 2, `${gathered.length} calls for several slots in ${bursts} bursts of 8 touched slots`);
  assert.ok(gathered.some((g) => g.length >= 4), `no call served 4 slots or more: ${JSON.stringify(gathered)}`);
  // Every chunk was acknowledged: nothing is left for the slots.
  const { rows: left } = await db.pool.query<{ lag: string }>(
    "select coalesce(sum(lag), 0)::text as lag from pgque.partition_slot_status where queue = 'gather' and consumer = 'c'");
  assert.equal(left[0]!.lag, "0");
});

test("a gathered receive is all or nothing: one slot's wrong token fails the call, and every slot then asks alone", async (t) => {
  const db = await setup(t, "gatherfall", { ticker: false });
  await subscribeSlots(db.pool, "gatherfall", "c", 4);
  const tokens: string[] = [];
  for (let s = 0; s < 3; s++) {
    const lease = await q.claimSlot(db.pool, "gatherfall", "c", s, "w", 60_000, null);
    assert.ok(lease, `claim of slot ${s}`);
    tokens.push(lease.token);
    const { rows } = await db.pool.query<{ k: string }>(
      "select k from generate_series(0, 10000) i, lateral (select 'f' || i as k) x where pgque.slot_of(k, 4) = $1 order by i limit 2", [s]);
    for (const r of rows) await db.pool.query("select pgque.send('gatherfall', 't', '{}'::jsonb, $1)", [r.k]);
  }
  await db.pool.query("select pgque.force_next_tick('gatherfall')");
  await db.pool.query("select pgque.ticker()");
  // Slot 1's token no longer proves its lease.
  tokens[1] = "00000000-0000-4000-8000-000000000000";
  // Count the calls at the pool the gatherer calls through.
  const texts: string[] = [];
  const query = db.pool.query.bind(db.pool) as (text: unknown, params?: unknown[]) => Promise<unknown>;
  (db.pool as unknown as { query: typeof query }).query = (text, params) => {
    if (typeof text === "string" && text.includes("receive_partitioned_raw")) texts.push(text.includes("_slots") ? "slots" : "one");
    return query(text, params);
  };
  const g = new ReceiveGather(db.pool, "gatherfall", "c", "w", 10);
  const got = await Promise.allSettled([0, 1, 2].map((s) => g.receive(s, 4, tokens[s]!, null)));
  assert.equal(g.calls, 1);
  assert.deepEqual(texts, ["slots", "one", "one", "one"]);
  for (const s of [0, 2]) {
    const r = got[s]!;
    assert.ok(r.status === "fulfilled" && r.value.length === 2, `slot ${s}: ${JSON.stringify(r)}`);
  }
  const bad = got[1]!;
  assert.ok(bad.status === "rejected" && (bad.reason as { code?: string }).code === "PQ085", `slot 1: ${String((bad as PromiseRejectedResult).reason)}`);
});

test("a hot key's lane keeps its place between its events: a chunk of many cold keys does not slow it to one event per turn of all of them", async (t) => {
  const db = await setup(t, "hotlane");
  const starts: string[] = [];
  const w = db.track(await work(db.pool, { ...fast, queue: "hotlane", consumer: "c", slots: 1, concurrency: 2, batchSize: 100 },
    async (m: Message) => {
      starts.push(m.key!);
      await new Promise((r) => setTimeout(r, 10));
    }));
  await waitFor("the slot claimed", () => w.ownedSlots().length === 1);
  // One transaction, so one chunk: the hot key's 10 events among 40 cold keys.
  const keys: string[] = [];
  for (let i = 0; i < 10; i++) keys.push("hot", `c${4 * i}`, `c${4 * i + 1}`, `c${4 * i + 2}`, `c${4 * i + 3}`);
  await sendKeyed(db.pool, "hotlane", keys, 1);
  await waitFor("every event handled", () => starts.length === keys.length, 20_000);
  // Two places: the hot lane keeps one and the cold lanes share the
  // other, so the hot key's tenth event starts about when the tenth cold
  // one does. Were the place given back after each event, the hot key's
  // second event would queue behind all 39 waiting cold lanes.
  const tenthHot = starts.reduce((at, k, i) => (k === "hot" && starts.slice(0, i + 1).filter((x) => x === "hot").length === 10 ? i : at), -1);
  const coldBefore = starts.slice(0, tenthHot).filter((k) => k !== "hot").length;
  assert.ok(coldBefore <= 20, `the hot key's last event started after ${coldBefore} of the 40 cold ones (order ${starts.join(",")})`);
});
