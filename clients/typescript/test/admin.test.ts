import { test } from "node:test";
import assert from "node:assert/strict";
import pg from "pg";
import {
  blockedKeys, createQueue, deadLetters, dropQueue, hotKeys, isPgqueError, keyHeads, keyShares, purgeDeadLetters, queues,
  replayDeadLetter, retryKeyNow, send, setQueueConfig, slots, subscribeSlots, unblockKey, unsubscribeSlots, withTransaction,
} from "../src/index.js";
import { intervalParam } from "../src/executor.js";
import { testDb, type TestDb } from "./harness.js";
import { failFirst, tickNow } from "./worker_helpers.js";

const db: TestDb = await testDb();

const tick = (queue: string) => tickNow(db.pool, queue);

// On a pool the connection is fresh, outside any transaction: the work
// begins one at once. The SAVEPOINT that tells a caller's open transaction
// apart is refused outside one, an ERROR line in the server's log on every
// call. On a connection inside the caller's transaction it nests.
test("withTransaction on a pool begins at once, and nests in the caller's transaction", async () => {
  const seen: string[] = [];
  const pool = new pg.Pool({ connectionString: db.url, max: 1 });
  try {
    const connect = pool.connect.bind(pool) as () => Promise<pg.PoolClient>;
    const spied = new WeakSet<pg.PoolClient>();
    (pool as { connect: unknown }).connect = async () => {
      const c = await connect();
      if (spied.has(c)) return c; // the pool hands the same client out again
      spied.add(c);
      const query = c.query.bind(c) as (text: string, params?: unknown[]) => Promise<unknown>;
      (c as { query: unknown }).query = (text: string, params?: unknown[]) => {
        seen.push(text);
        return query(text, params);
      };
      return c;
    };
    const n = await withTransaction(pool, async (tx) => (await tx.query<{ n: number }>("select 1 as n")).rows[0]!.n);
    assert.equal(n, 1);
    assert.deepEqual(seen, ["begin", "select 1 as n", "commit"]);

    seen.length = 0;
    const c = await pool.connect();
    try {
      await c.query("begin");
      await withTransaction(c, async (tx) => tx.query("select 2"));
      await c.query("rollback");
    } finally {
      c.release();
    }
    assert.deepEqual(seen, ["begin", "savepoint pgque_tx", "select 2", "release savepoint pgque_tx", "rollback"]);
  } finally {
    await pool.end();
  }
});

test("queues and slot subscriptions", async () => {
  assert.equal(await createQueue(db.pool, "adm"), true);
  assert.equal(await createQueue(db.pool, "adm"), false);
  await assert.rejects(createQueue(db.pool, "bad/name"), (err) => isPgqueError(err, "invalid_name") && err.code === "PQ010");

  assert.equal(await subscribeSlots(db.pool, "adm", "c", 2, { policy: "pause" }), 2);
  assert.equal(await subscribeSlots(db.pool, "adm", "c", 2), 0);
  await assert.rejects(subscribeSlots(db.pool, "adm", "c", 3), (err) => isPgqueError(err, "slot_count_mismatch"));
  await assert.rejects(subscribeSlots(db.pool, "adm", "c", 2, { policy: "skip" }), (err) => isPgqueError(err, "policy_mismatch"));
  await assert.rejects(subscribeSlots(db.pool, "adm", "c", 0), (err) => isPgqueError(err, "invalid_argument"));

  const s = await slots(db.pool, "adm", "c");
  assert.deepEqual(s.map((r) => [r.slot, r.nslots, r.policy, r.owner, r.live, r.epoch]), [[0, 2, "pause", null, false, 0n], [1, 2, "pause", null, false, 0n]]);
  const [info] = await queues(db.pool, "adm");
  assert.equal(info!.name, "adm");
  assert.equal(info!.deadLetters, 0);
  await assert.rejects(queues(db.pool, "nope"), (err) => isPgqueError(err, "queue_not_found"));

  await unsubscribeSlots(db.pool, "adm", "c", 2);
  assert.deepEqual(await slots(db.pool, "adm", "c"), []);
  await dropQueue(db.pool, "adm");
  assert.deepEqual(await queues(db.pool, "adm").catch((err) => err.kind), "queue_not_found");
});

test("a blocked key: list, unblock into a dead letter, replay, purge", async () => {
  await createQueue(db.pool, "blk");
  await subscribeSlots(db.pool, "blk", "c", 2, { policy: "pause" });
  const head = await send(db.pool, "blk", { type: "T", payload: { n: 1 }, partitionKey: "" });
  await send(db.pool, "blk", { type: "T", payload: { n: 2 }, partitionKey: "" });
  await tick("blk");

  // A worker, through the SQL API: claim the key's slot, receive, fail the head.
  const { slot, failed } = await failFirst(db.pool, "blk", "c", 2, "");
  assert.equal(failed, head);

  const blocked = await blockedKeys(db.pool, "blk", "c");
  assert.equal(blocked.length, 1);
  assert.equal(blocked[0]!.key, "", "the empty key must not read as the NULL key");
  assert.equal(blocked[0]!.headEventId, head);
  assert.equal(blocked[0]!.slot, slot);
  assert.equal(typeof blocked[0]!.deferred, "number");
  assert.equal(blocked[0]!.state, "blocked");
  assert.equal(blocked[0]!.reason, "boom");
  await assert.rejects(unblockKey(db.pool, "blk", "c", null), (err) => isPgqueError(err, "key_not_blocked"));
  // A key is any text: an error quotes its start and its length, never all
  // of it (a 1 MB key made a 2 MB message).
  const huge = "K".repeat(1 << 20);
  for (const call of [() => unblockKey(db.pool, "blk", "c", huge), () => retryKeyNow(db.pool, "blk", "c", huge)]) {
    await assert.rejects(call(), (err) => {
      assert.ok(isPgqueError(err, "key_not_blocked"), String(err).slice(0, 300));
      assert.ok(err.message.length < 1500, `a message of ${err.message.length} characters`);
      assert.match(err.message, /… \(1048576 bytes\)/);
      return true;
    });
  }

  assert.equal(await unblockKey(db.pool, "blk", "c", ""), head);
  // The key's later events are being released to the slot again.
  assert.deepEqual((await blockedKeys(db.pool, "blk")).map((b) => [b.key, b.state]), [["", "releasing"]]);
  // A slot's dead letters belong to the slot's subscription, consumer#slot/N.
  const dls = await deadLetters(db.pool, "blk", { consumer: `c#${slot}/2` });
  assert.equal(dls.length, 1);
  assert.deepEqual((await deadLetters(db.pool, "blk", { consumer: "c" })).map((d) => d.id), [dls[0]!.id], "the consumer's name selects its slots'");
  await assert.rejects(deadLetters(db.pool, "blk", { consumer: "other" }), (err) => isPgqueError(err, "consumer_not_found"));
  assert.equal(dls[0]!.eventId, head);
  assert.equal(dls[0]!.key, "");
  assert.equal(dls[0]!.type, "T");
  assert.deepEqual(JSON.parse(dls[0]!.json!), { n: 1 });
  assert.match(dls[0]!.reason!, /boom/);
  assert.equal((await queues(db.pool, "blk"))[0]!.deadLetters, 1);

  assert.equal(await replayDeadLetter(db.pool, "blk", dls[0]!.id), head);
  assert.deepEqual(await deadLetters(db.pool, "blk"), []);
  await assert.rejects(replayDeadLetter(db.pool, "blk", dls[0]!.id), (err) => isPgqueError(err, "dead_letter_not_found"));
  await assert.rejects(replayDeadLetter(db.pool, "blk", "abc"), (err) => isPgqueError(err, "invalid_argument") && /"abc" is not an integer/.test(String(err)));
});

test("dead letters of a plain consumer are purged, and a consumer the queue does not know is an error", async () => {
  await createQueue(db.pool, "dlq");
  await setQueueConfig(db.pool, "dlq", "max_retries", "0");
  await db.pool.query("select pgque.subscribe('dlq', 'p')");
  const id = await send(db.pool, "dlq", { payload: 1 });
  await tick("dlq");
  const [m] = (await db.pool.query("select msg_id::text as id, batch_id from pgque.receive('dlq', 'p', 10)")).rows;
  assert.equal(m.id, id);
  await db.pool.query("select pgque.nack($1, $2, null, 'bad')", [m.batch_id, id]);
  await db.pool.query("select pgque.ack($1)", [m.batch_id]);
  const [dl] = await deadLetters(db.pool, "dlq");
  assert.equal(dl!.reason, "bad");
  assert.equal(await purgeDeadLetters(db.pool, "dlq", { olderThanMs: 3_600_000 }), 0);
  // 90 days is past 2^31 milliseconds, which PostgreSQL 14 refuses as a count of milliseconds.
  assert.equal(await purgeDeadLetters(db.pool, "dlq", { olderThanMs: 90 * 86_400_000 }), 0);
  assert.equal(await purgeDeadLetters(db.pool, "dlq", { consumer: "p" }), 1);
  assert.deepEqual(await deadLetters(db.pool, "dlq"), []);
  assert.deepEqual(await deadLetters(db.pool, "dlq", { consumer: "p" }), []);
  // A misspelt consumer is an error, not an empty list or a count of 0.
  await assert.rejects(deadLetters(db.pool, "dlq", { consumer: "P" }), (err) => isPgqueError(err, "consumer_not_found"));
  await assert.rejects(purgeDeadLetters(db.pool, "dlq", { consumer: "P" }), (err) => isPgqueError(err, "consumer_not_found"));
  await assert.rejects(setQueueConfig(db.pool, "dlq", "no_such_param", "1"), (err) => isPgqueError(err, "unknown_parameter"));
});

test("an interval goes to the server as seconds, to the millisecond, past 2^31 milliseconds too", async () => {
  for (const ms of [0, 1, 999, 1_000, 86_400_123, 2 ** 31 - 1, 2 ** 31, 2_592_000_000, 90 * 86_400_000]) {
    const p = intervalParam(ms);
    assert.match(p, /^\d+\.\d{3} seconds$/);
    // Each field within 2^31, as PostgreSQL 14 requires.
    assert.ok(Number(p.split(".")[0]) < 2 ** 31, p);
    const { rows } = await db.pool.query<{ ms: string }>("select (extract(epoch from $1::interval) * 1000)::text as ms", [p]);
    assert.equal(Number(rows[0]!.ms), ms, p);
  }
});

test("key views: the keys behind, each slot's busiest key, the hot keys", async () => {
  await createQueue(db.pool, "kv");
  await subscribeSlots(db.pool, "kv", "c", 2);
  const first = await send(db.pool, "kv", { payload: { n: 0 }, partitionKey: "hot" });
  for (let n = 1; n < 6; n++) await send(db.pool, "kv", { payload: { n }, partitionKey: "hot" });
  await send(db.pool, "kv", { payload: {}, partitionKey: "cold" });
  await send(db.pool, "kv", { payload: {} });
  await tick("kv");

  const heads = await keyHeads(db.pool, "kv", "c");
  assert.deepEqual(heads.map((h) => [h.key, h.pending, h.state, h.estimated]),
    [["hot", 6, "flowing", false], ["cold", 1, "flowing", false], [null, 1, "flowing", false]]);
  assert.equal(heads[0]!.headEventId, first);
  assert.ok(heads[0]!.headAgeSec >= 0 && heads[0]!.retryAt === null && heads[0]!.deferred === 0);
  const hotSlot = (await db.pool.query("select pgque.slot_of('hot', 2) as s")).rows[0].s as number;
  assert.deepEqual((await keyHeads(db.pool, "kv", "c", { slot: hotSlot, limit: 1 })).map((h) => h.key), ["hot"]);

  const shares = await keyShares(db.pool, "kv", "c");
  assert.deepEqual(shares.map((r) => r.slot), [0, 1]);
  assert.equal(shares.reduce((n, r) => n + r.pending, 0), 8);
  const mine = shares.find((r) => r.slot === hotSlot)!;
  assert.equal(mine.topKey, "hot");
  assert.equal(mine.topPending, 6);

  const hot = await hotKeys(db.pool, "kv", { limit: 1 });
  assert.deepEqual(hot.map((k) => [k.key, k.events, k.share]), [["hot", 6, 0.75]]);
  assert.ok(hot[0]!.rate > 0 && hot[0]!.spanSec > 0);

  await assert.rejects(keyHeads(db.pool, "kv", "nope"), (err) => isPgqueError(err) && err.code === "PQ034");
  await assert.rejects(keyHeads(db.pool, "kv", "c", { limit: 0 }), (err) => isPgqueError(err) && err.code === "PQ011");
  await assert.rejects(hotKeys(db.pool, "kv", { windowMs: -1 }), (err) => isPgqueError(err) && err.code === "PQ011");
});
