import { test } from "node:test";
import assert from "node:assert/strict";
import pg from "pg";
import { send, sendBatch, isPgqueError, configureSends } from "../src/index.js";
import type { Executor, QueryResult } from "../src/index.js";
import { numericOverflow } from "../src/event.js";
import { testDb, waitFor, type TestDb } from "./harness.js";

const db: TestDb = await testDb();

/** A new queue with a unique name. */
async function newQueue(prefix: string): Promise<string> {
  const name = `${prefix}_${Math.random().toString(36).slice(2, 8)}`;
  await db.pool.query("select pgque.create_queue($1)", [name]);
  return name;
}

interface Row {
  id: string;
  type: string;
  data: string;
  key: string | null;
}

/** The events stored for queue, in ev_id order (read as the superuser). */
async function stored(queue: string): Promise<Row[]> {
  const { rows } = await db.pool.query<Row>(
    `select e.ev_id::text as id, e.ev_type as type, e.ev_data as data, e.ev_extra1 as key
       from pgque.event e join pgque.queue q on e.ev_part / 16 = q.queue_id
      where q.queue_name = $1 order by e.ev_id`,
    [queue],
  );
  return rows;
}

/** Runs fn in a transaction on one pooled connection, then commits or rolls back. */
async function inTx<T>(end: "commit" | "rollback", fn: (c: pg.PoolClient) => Promise<T>): Promise<T> {
  const c = await db.pool.connect();
  try {
    await c.query("begin");
    const out = await fn(c);
    await c.query(end);
    return out;
  } finally {
    c.release();
  }
}

test("sends in a rolled-back transaction vanish, in a committed one land", async () => {
  const q = await newQueue("tx");
  await inTx("rollback", async (c) => {
    await send(c, q, { type: "A", payload: { n: 1 } });
    await sendBatch(c, q, [{ type: "A", payload: { n: 2 } }]);
    assert.equal((await c.query("select 1")).rowCount, 1);
  });
  assert.deepEqual(await stored(q), []);

  const ids = await inTx("commit", async (c) => {
    const one = await send(c, q, { type: "A", payload: { n: 1 }, partitionKey: "t1" });
    const many = await sendBatch(c, q, [
      { type: "A", payload: { n: 2 }, partitionKey: "t1" },
      { type: "A", payload: { n: 3 } },
    ]);
    // Not visible outside the transaction before it commits.
    assert.deepEqual(await stored(q), []);
    return [one, ...many];
  });
  const rows = await stored(q);
  assert.deepEqual(rows.map((r) => r.id), ids);
  assert.deepEqual(rows.map((r) => JSON.parse(r.data).n), [1, 2, 3]);
  assert.deepEqual(rows.map((r) => r.key), ["t1", "t1", null]);
});

test("a batch of mixed types is one atomic statement and keeps its order", async () => {
  const q = await newQueue("mixed");
  const events = ["Created", "Created", "Updated", "Created", "Deleted", "Updated"].map((type, n) => ({
    type,
    payload: { n },
    partitionKey: n % 2 ? "a" : "b",
  }));
  const ids = await sendBatch(db.pool, q, events);
  assert.equal(ids.length, events.length);
  const rows = await stored(q);
  assert.deepEqual(rows.map((r) => r.id), ids);
  assert.deepEqual(rows.map((r) => r.type), events.map((e) => e.type));
  assert.deepEqual(rows.map((r) => JSON.parse(r.data).n), [0, 1, 2, 3, 4, 5]);

  // A bad payload anywhere sends none of the batch.
  await assert.rejects(
    sendBatch(db.pool, q, [{ type: "X", payload: 1 }, { type: "Y", json: "{not json" }]),
    (err) => isPgqueError(err, "invalid_payload"),
  );
  assert.equal((await stored(q)).length, events.length);
});

test("payload forms: values as JSON, json text as given, binary refused", async () => {
  const q = await newQueue("forms");
  await send(db.pool, q, { payload: "hello" });
  await send(db.pool, q, { json: '{"b": 2,  "a": 1}' });
  await send(db.pool, q, { payload: null });
  const rows = await stored(q);
  assert.deepEqual(rows.map((r) => r.data), ['"hello"', '{"b": 2,  "a": 1}', "null"]);
  assert.deepEqual(rows.map((r) => r.type), ["default", "default", "default"]);

  for (const bad of [{ payload: Buffer.from("x") }, { payload: undefined }, { payload: 1n }, { payload: 1, json: "1" }]) {
    await assert.rejects(send(db.pool, q, bad), (err) => isPgqueError(err, "invalid_payload") && err.code === "");
  }
  await assert.rejects(send(db.pool, q, { json: "{oops" }), (err) => isPgqueError(err, "invalid_payload") && err.code === "22P02");
  // Nested values are not looked at (the guide says so): they follow JSON.stringify.
  await send(db.pool, q, { payload: { file: Buffer.from("x"), when: undefined } });
  assert.equal((await stored(q)).at(-1)!.data, '{"file":{"type":"Buffer","data":[120]}}');
  // The server's detail says what is wrong with the text, in the message.
  for (const [json, says] of [['{"a": not}', 'json: Token "not" is invalid'], ['"\\udc00"', "json: Unicode low surrogate must follow a high surrogate"]]) {
    await assert.rejects(send(db.pool, q, { json }), (err) => isPgqueError(err, "invalid_payload") && err.message.includes(says), json);
    await assert.rejects(sendBatch(db.pool, q, [{ payload: 1 }, { json }]), (err) =>
      isPgqueError(err, "invalid_payload") && err.message.includes(says) && err.message.includes("event 1: "), `${json} in a batch`);
  }
  assert.equal((await stored(q)).length, 4);
});

// The server counts a batch's events from 1, this package from 0: an
// event the server's refusal names is reported as the package counts it,
// once, and a refused batch stores nothing.
test("a batch refusal the server names its event in is reported with the package's index", async () => {
  const q = await newQueue("named");
  await assert.rejects(sendBatch(db.pool, q, [{ payload: 1, dedupKey: "a" }, { payload: 2, dedupKey: "" }]), (err) => {
    assert.ok(isPgqueError(err), String(err));
    assert.equal(err.code, "PQ063");
    assert.match(err.message, /: event 1: dedup key is empty/);
    assert.doesNotMatch(err.message, /dedup key 2/);
    return true;
  });
  // A type and key too long to deliver together, at a limit lowered for
  // the test (the real one is 268435455 bytes).
  await db.pool.query("create or replace function pgque._deliverable_bytes() returns bigint language sql immutable as $$ select 1000::bigint $$");
  try {
    const wide = [{ payload: 1 }, { payload: 2, partitionKey: "k" }, { payload: 3, type: "t".repeat(600), partitionKey: "k".repeat(401) }];
    await assert.rejects(sendBatch(db.pool, q, wide), (err) => {
      assert.ok(isPgqueError(err), String(err));
      assert.equal(err.code, "54000");
      assert.match(err.message, /: event 2: event type and partition key of 1001 bytes together/);
      assert.doesNotMatch(err.message, /of the batch/);
      return true;
    });
    await assert.rejects(send(db.pool, q, { payload: 1, partitionKey: "k".repeat(1001) }), (err) => isPgqueError(err) && err.code === "54000");
  } finally {
    await db.pool.query("create or replace function pgque._deliverable_bytes() returns bigint language sql immutable as $$ select 268435455::bigint $$");
  }
  assert.equal((await stored(q)).length, 0);
});

test("the NULL key and the empty key are different keys", async () => {
  const q = await newQueue("keys");
  await send(db.pool, q, { payload: 1, partitionKey: null });
  await send(db.pool, q, { payload: 2, partitionKey: "" });
  await send(db.pool, q, { payload: 3 });
  await sendBatch(db.pool, q, [{ payload: 4, partitionKey: "" }, { payload: 5 }]);
  assert.deepEqual((await stored(q)).map((r) => r.key), [null, "", null, "", null]);
});

test("a dedup key sends once and returns the first id", async () => {
  const q = await newQueue("dedup");
  const a = await send(db.pool, q, { payload: 1, dedupKey: "req-7" });
  const b = await send(db.pool, q, { payload: 2, dedupKey: "req-7" });
  const [c, d] = await sendBatch(db.pool, q, [{ payload: 3, dedupKey: "req-7" }, { payload: 4, dedupKey: "req-8" }]);
  assert.equal(b, a);
  assert.equal(c, a);
  assert.notEqual(d, a);
  assert.equal((await stored(q)).length, 2);
  await assert.rejects(send(db.pool, q, { payload: 5, dedupKey: "" }), (err) => isPgqueError(err, "invalid_argument"));
});

test("keys, types and dedup keys PostgreSQL cannot store as given are refused, naming the field", async () => {
  const q = await newQueue("text");
  // A lone surrogate (what slice() leaves of a cut emoji) became U+FFFD on
  // the way: "file-\ud83d" and "file-\ud83e" were one dedup key, and the
  // second send stored nothing and returned the first one's id.
  const bad: [string, Parameters<typeof send>[2], string, string][] = [
    ["lone surrogate key", { payload: 1, partitionKey: "tenant-\ud83d" }, "invalid_argument", "partitionKey holds a lone surrogate"],
    ["low surrogate key", { payload: 1, partitionKey: "\udc00x" }, "invalid_argument", "partitionKey holds a lone surrogate"],
    ["NUL key", { payload: 1, partitionKey: "a\u0000b" }, "invalid_argument", "partitionKey holds a NUL"],
    ["lone surrogate dedup key", { payload: 1, dedupKey: "file-\ud83e" }, "invalid_argument", "dedupKey holds a lone surrogate"],
    ["NUL type", { type: "T\u0000", payload: 1 }, "invalid_argument", "type holds a NUL"],
    ["lone surrogate type", { type: "T\ud800", payload: 1 }, "invalid_argument", "type holds a lone surrogate"],
    ["number key", { payload: 1, partitionKey: 42 as unknown as string }, "invalid_argument", "partitionKey must be a string or null"],
    ["object dedup key", { payload: 1, dedupKey: { id: 1 } as unknown as string }, "invalid_argument", "dedupKey must be a string or null"],
    ["lone surrogate in json", { json: '{"s":"\ud800"}' }, "invalid_payload", "json holds a lone surrogate"],
    // JSON.stringify escapes it, and jsonb refuses the escape: a jsonb
    // reader would get the payload as a JSON string.
    ["lone surrogate in a payload", { payload: { s: "\ud800" } }, "invalid_payload", "payload holds a lone surrogate"],
    ["lone low surrogate in a payload", { payload: ["x\udc00"] }, "invalid_payload", "payload holds a lone surrogate"],
    ["NUL in a payload", { payload: { s: "a\u0000b" } }, "invalid_payload", "payload holds a NUL character"],
  ];
  for (const [what, ev, kind, says] of bad) {
    await assert.rejects(send(db.pool, q, ev), (err) => isPgqueError(err, kind as "invalid_argument") && (err as Error).message.includes(says), what);
    await assert.rejects(sendBatch(db.pool, q, [{ payload: 0 }, ev]), (err) => isPgqueError(err, kind as "invalid_argument"), `${what} in a batch`);
  }
  assert.equal((await stored(q)).length, 0, "a refused event was stored");
  // The server refuses the escape too (json text that jsonb cannot hold).
  await assert.rejects(send(db.pool, q, { json: '{"s":"\\ud800"}' }), (err) => isPgqueError(err, "invalid_payload") && (err as { code: string }).code === "22P02");
  assert.equal((await stored(q)).length, 0, "a refused event was stored");
  // Whole surrogate pairs are text like any other, and so is a backslash
  // followed by "ud800".
  const a = await send(db.pool, q, { payload: { s: "\ud83d\ude00", t: "\\ud800" }, partitionKey: "tenant-\ud83d\ude00", dedupKey: "file-\ud83d\ude00" });
  const b = await send(db.pool, q, { payload: 2, partitionKey: "tenant-\ud83d\ude01", dedupKey: "file-\ud83d\ude01" });
  assert.notEqual(a, b);
  assert.deepEqual((await stored(q)).map((r) => r.key), ["tenant-\ud83d\ude00", "tenant-\ud83d\ude01"]);
});

test("a batch the server refuses names the event it refused", async () => {
  const q = await newQueue("named");
  const ok = { json: '{"a": 1}' };
  const cases: [string, Parameters<typeof send>[2][], number, string][] = [
    ["invalid JSON", [ok, ok, { json: '{"a": ' }, ok], 2, "22P02"],
    ["a \\u0000 escape", [ok, { json: '["\\u0000"]' }, ok], 1, "22P05"],
    ["a lone surrogate escape", [{ json: '["\\ud83d\\ude00"]' }, { json: '["\\uD83D"]' }], 1, "22P02"],
    ["a NUL character in json text", [ok, ok, { json: '"a\u0000b"' }], 2, "22021"],
    ["nesting past the stack depth", [{ json: "[[[]]]" }, ok, { json: "[".repeat(100_000) + "]".repeat(100_000) }], 2, "54001"],
  ];
  for (const [what, events, at, code] of cases) {
    await assert.rejects(sendBatch(db.pool, q, events), (err) => {
      assert.ok(isPgqueError(err, "invalid_payload"), `${what}: ${String(err)}`);
      assert.equal(err.code, code, what);
      assert.match(err.message, new RegExp(`^sending batch to queue "${q}": event ${at}: `), what);
      return true;
    });
  }
  assert.equal((await stored(q)).length, 0);
});

test("JSON nested past the server's stack depth is refused as invalid_payload", async () => {
  const q = await newQueue("deep");
  const deep = "[".repeat(100_000) + "]".repeat(100_000);
  for (const sending of [() => send(db.pool, q, { json: deep }), () => sendBatch(db.pool, q, [{ payload: 1 }, { json: deep }])]) {
    await assert.rejects(sending(), (err) => isPgqueError(err, "invalid_payload") && (err as { code: string }).code === "54001");
  }
  assert.equal((await stored(q)).length, 0);
});

test("a json text with a number numeric cannot hold is refused before sending, naming it", async () => {
  const q = await newQueue("numeric");
  const zeros = "0".repeat(16382);
  const numbers = [
    "0", "-0.0", "1e1001", "1e-1001", "0e200000", "-12.5e3", "1E+5", "2.5E-3",
    "1" + "0".repeat(131071), "1" + "0".repeat(131072),
    "1e131071", "1e131072", "-0.5e131072", "0.5e131073", "0.05e131073", "12e131069", "12e131070",
    "1e-16383", "1e-16384", "0e-16383", "0e-16384", "0.0e-16383",
    "0." + zeros + "1", "0." + zeros + "01", "0." + zeros + "01e1", "12.5e-16382", "0.00e-16382",
    "1e1073741823", "1e-1073741823", "0e1073741824", "0e-2147483648", "1e99999999999999999999",
  ];
  for (const n of numbers) {
    const json = `{"n": "1e131072", "1e131072": [true, ${n}, "x\\\"1e131072"]}`;
    const short = n.length > 24 ? `${n.slice(0, 16)}... (${n.length} characters)` : n;
    // What the server's jsonb says of the text, on the major the suite runs on.
    const refused = await db.pool.query("select $1::text::jsonb", [json]).then(() => "", (err: { code?: string }) => err.code ?? "?");
    assert.equal(numericOverflow(json), refused === "22003" ? n : null, `${short}: the server says "${refused}"`);
    if (refused !== "22003") continue;
    await assert.rejects(send(db.pool, q, { json }), (err) =>
      isPgqueError(err, "invalid_payload") && /past the range of PostgreSQL's numeric/.test(err.message), short);
    await assert.rejects(sendBatch(db.pool, q, [{ payload: 1 }, { json }]), (err) =>
      isPgqueError(err, "invalid_payload") && new RegExp(`^sending batch to queue "${q}": event 1: `).test(err.message), short);
  }
  assert.equal((await stored(q)).length, 0);
});

test("event ids beyond 2^53 come back exact", async () => {
  const q = await newQueue("big");
  await db.pool.query(
    "select pg_catalog.setval(queue_event_seq::regclass, 9007199254740993) from pgque.queue where queue_name = $1",
    [q],
  );
  const id = await send(db.pool, q, { payload: 1 });
  const [b1, b2] = await sendBatch(db.pool, q, [{ payload: 2 }, { payload: 3 }]);
  assert.equal(id, "9007199254740994");
  assert.equal(b1, "9007199254740995");
  assert.equal(b2, "9007199254740996");
  assert.deepEqual((await stored(q)).map((r) => r.id), [id, b1, b2]);
});

test("errors map by SQLSTATE to kinds", async () => {
  await assert.rejects(send(db.pool, "no_such_queue", { payload: 1 }), (err) => {
    assert.ok(isPgqueError(err, "queue_not_found"));
    assert.equal(err.code, "PQ001");
    assert.match(err.message, /sending to queue "no_such_queue"/);
    return true;
  });
  await assert.rejects(sendBatch(db.pool, "no_such_queue", [{ payload: 1 }]), (err) => isPgqueError(err, "queue_not_found"));
  await assert.rejects(send(db.pool, "", { payload: 1 }), (err) => isPgqueError(err, "queue_not_found") || isPgqueError(err, "invalid_name"));
});

// PostgreSQL's permission errors name what was refused (a function, schema
// pgque), not the pgque role that grants it: the error names the roles too.
test("a send refused for want of a role names the pgque roles", async (t) => {
  const q = await newQueue("perm");
  const tag = `${process.pid}_${Date.now()}`;
  const cases = [
    { role: `perm_reader_${tag}`, grant: " in role pgque_reader", refused: /permission denied for function/ },
    { role: `perm_none_${tag}`, grant: "", refused: /permission denied for schema pgque/ },
  ];
  for (const c of cases) {
    await db.pool.query(`create role ${c.role} login${c.grant}`);
    t.after(() => db.pool.query(`drop role if exists ${c.role}`));
  }
  for (const c of cases) {
    const pool = new pg.Pool({ connectionString: db.urlAs(c.role), max: 1 });
    try {
      await assert.rejects(send(pool, q, { payload: 1 }), (err) => {
        assert.ok(isPgqueError(err, "permission_denied"), String(err));
        assert.match(err.message, c.refused);
        assert.match(err.message, /pgque_writer may send, pgque_reader may consume/);
        return true;
      });
    } finally {
      await pool.end();
    }
  }
});

test("concurrent sends on a pool coalesce, and a bad event fails alone", async () => {
  const q = await newQueue("coalesce");
  const pool = new pg.Pool({ connectionString: db.url, max: 4, allowExitOnIdle: true });
  try {
    // A patience longer than the test: on a loaded machine the first
    // statement (which opens a connection) may take longer than the default
    // 100 ms, and every waiting send would run its own.
    const sq = configureSends(pool, { concurrency: 1, patienceMs: 60_000 });
    const sends = Array.from({ length: 300 }, (_, n) =>
      n === 150
        ? send(pool, q, { type: "T", json: "{broken" })
        : send(pool, q, { type: n % 3 ? "T" : "U", payload: { n }, partitionKey: `k${n % 7}` }),
    );
    const results = await Promise.allSettled(sends);
    const failed = results.flatMap((r, n) => (r.status === "rejected" ? [n] : []));
    assert.deepEqual(failed, [150]);
    assert.ok(isPgqueError((results[150] as PromiseRejectedResult).reason, "invalid_payload"));
    assert.ok(sq.stats.statements > 0, "no statement carried coalesced sends");
    assert.ok(sq.stats.alone > 0, "the batch holding the bad event was not sent again one by one");
    const rows = await stored(q);
    assert.equal(rows.length, 299);
    const byN = new Map(rows.map((r) => [JSON.parse(r.data).n as number, r]));
    results.forEach((r, n) => {
      if (r.status !== "fulfilled") return;
      assert.equal(byN.get(n)?.id, r.value, `event ${n} stored under another id`);
      assert.equal(byN.get(n)?.type, n % 3 ? "T" : "U");
    });
  } finally {
    await pool.end();
  }
});

test("sends held up past their patience run alone at most concurrency at once; the rest wait to be coalesced", async () => {
  const q = await newQueue("impatient");
  const pool = new pg.Pool({ connectionString: db.url, max: 8, allowExitOnIdle: true });
  const locker = await db.pool.connect();
  try {
    const sq = configureSends(pool, { concurrency: 1, patienceMs: 20 });
    await locker.query("begin");
    const { rows } = await locker.query(
      "select pgque._event_table(queue_id, queue_cur_table) as t from pgque.queue where queue_name = $1", [q]);
    await locker.query(`lock table ${rows[0].t} in access exclusive mode`);
    // Every send of the queue waits on the lock: the first holds the one
    // statement, the next ones wait for it and, after their patience, for
    // their own.
    // Each its own key: sends of one key never overtake each other, so
    // they would wait for the first however long.
    const sends = Array.from({ length: 40 }, (_, n) => send(pool, q, { payload: { n }, partitionKey: `k${n}` }));
    await waitFor("a send to run alone", () => sq.stats.bypassed >= 1);
    // Each waiting send's patience timer has fired by the time a timer set
    // now for five times as long does (Node fires timers in order).
    await new Promise((r) => setTimeout(r, 100));
    assert.equal(sq.stats.bypassed, 1, "more sends than concurrency ran alone at once");
    await locker.query("rollback");
    const ids = await Promise.all(sends);
    assert.equal(new Set(ids).size, 40);
    assert.equal((await stored(q)).length, 40);
    assert.ok(sq.stats.statements > 0, "the sends that stayed were not coalesced");
  } finally {
    await locker.query("rollback").catch(() => {});
    locker.release();
    await pool.end();
  }
});

test("a stuck statement holds sends to other queues up for the patience only, dedup sends not at all", async () => {
  const stuck = await newQueue("stuck");
  const other = await newQueue("other");
  const pool = new pg.Pool({ connectionString: db.url, max: 4, allowExitOnIdle: true });
  const locker = await db.pool.connect();
  try {
    const sq = configureSends(pool, { concurrency: 1, patienceMs: 50 });
    // Lock the stuck queue's current event table: its send waits on it and
    // holds the pool's one statement.
    await locker.query("begin");
    const { rows } = await locker.query(
      "select pgque._event_table(queue_id, queue_cur_table) as t from pgque.queue where queue_name = $1", [stuck]);
    await locker.query(`lock table ${rows[0].t} in access exclusive mode`);
    let stuckDone = false;
    const stuckSend = send(pool, stuck, { payload: 0 }).finally(() => { stuckDone = true; });
    await waitFor("the send to wait on the lock", async () =>
      (await db.pool.query(
        `select count(*)::int as n from pg_locks
          where not granted and database = (select oid from pg_database where datname = current_database())`)).rows[0].n >= 1);

    await send(pool, other, { payload: 1, dedupKey: "d1" });
    assert.equal(sq.stats.bypassed, 0, "a dedup send waited for a statement");
    const t0 = Date.now();
    await send(pool, other, { payload: 2 });
    assert.ok(Date.now() - t0 >= 45, `the send behind the stuck statement returned after ${Date.now() - t0} ms, before its patience`);
    assert.equal(sq.stats.bypassed, 1);
    assert.equal(stuckDone, false, "the send to the locked queue returned while the lock was held");

    await locker.query("rollback");
    await stuckSend;
    assert.deepEqual((await stored(stuck)).length, 1);
    assert.deepEqual((await stored(other)).length, 2);
  } finally {
    await locker.query("rollback").catch(() => {});
    locker.release();
    await pool.end();
  }
});

test("sends of one key keep the order they were made in, awaited or not", async () => {
  const q = await newQueue("keyorder");
  const pool = new pg.Pool({ connectionString: db.url, max: 8, allowExitOnIdle: true });
  // The pool as send sees it, but the statement of the first event reaches
  // the server 300 ms late (a slow connection, a GC pause): the sends made
  // after it, of its key and of others, run meanwhile on other connections
  // (free statements, and alone past their patience).
  const slow: Executor & { connect(): Promise<pg.PoolClient>; totalCount: number } = {
    async query<R>(text: string, params?: unknown[]) {
      if (JSON.stringify(params ?? []).includes('\\"n\\":0}')) await new Promise((r) => setTimeout(r, 300));
      return (await pool.query(text, params)) as unknown as QueryResult<R>;
    },
    connect: () => pool.connect(),
    get totalCount() { return pool.totalCount; },
  };
  try {
    const sq = configureSends(slow, { concurrency: 4, patienceMs: 20 });
    const keys = ["a", "b", "c", "d", "e"];
    const made = Array.from({ length: 400 }, (_, n) => ({ key: keys[n % 5]!, n }));
    await Promise.all(made.map((e) => send(slow, q, { payload: e, partitionKey: e.key })));
    assert.ok(sq.stats.statements > 0, "no statement carried coalesced sends");
    const got = (await stored(q)).map((r) => JSON.parse(r.data) as { key: string; n: number });
    assert.equal(got.length, 400);
    for (const key of keys) {
      assert.deepEqual(got.filter((e) => e.key === key).map((e) => e.n), made.filter((e) => e.key === key).map((e) => e.n),
        `key ${key} stored out of the order its sends were made in`);
    }
  } finally {
    await pool.end();
  }
});
