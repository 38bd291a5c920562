// The package under the type parsers an application may set: node-postgres's
// `types.setTypeParser` is global to the process, and services set int8 to
// numbers, numeric to floats, and timestamps to strings. The package's ids
// stay strings and its times Dates whatever they set. A file of its own:
// the parsers set here would change what the other files' tests read.

import { test } from "node:test";
import assert from "node:assert/strict";
import pg from "pg";
import {
  blockedKeys, createQueue, deadLetters, keyHeads, resizes, resizeSlots, send, subscribeSlots, unblockKey, work, type Message,
} from "../src/index.js";
import { testDb, type TestDb } from "./harness.js";
import { failFirst, gate, tickNow } from "./worker_helpers.js";

pg.types.setTypeParser(20, (v) => Number.parseInt(v, 10)); // int8
pg.types.setTypeParser(1700, (v) => Number.parseFloat(v)); // numeric
pg.types.setTypeParser(1184, (v) => `at ${v}`); // timestamptz
pg.types.setTypeParser(1114, (v) => `at ${v}`); // timestamp
pg.types.setTypeParser(1186, (v) => `for ${v}`); // interval

const db: TestDb = await testDb();

const tick = (queue: string) => tickNow(db.pool, queue);

/** The server's now() in milliseconds, read past the parsers. */
async function serverNow(): Promise<number> {
  const { rows } = await db.pool.query("select (extract(epoch from now()) * 1000)::float8 as ms");
  return rows[0].ms as number;
}

/** A Date within the last minute on the server, or up to two hours ahead. */
function assertRecent(what: string, d: unknown, now: number): void {
  assert.ok(d instanceof Date, `${what} is a Date, not ${JSON.stringify(d)}`);
  const at = (d as Date).getTime();
  assert.ok(at > now - 60_000 && at < now + 7_200_000, `${what}: ${(d as Date).toISOString()}`);
}

test("the parsers are in force in this file", async () => {
  const { rows } = await db.pool.query("select now() as t, 1::int8 as n");
  assert.match(rows[0].t, /^at /);
  assert.equal(rows[0].n, 1);
});

test("a worker's message: its ids are strings and its createdAt a Date, whatever parsers the application set", async (t) => {
  await createQueue(db.pool, "msg");
  const got: Message[] = [];
  const done = gate();
  const w = await work(db.pool, { queue: "msg", consumer: "c", slots: 2, pollIntervalMs: 50, listen: false }, (m) => {
    got.push(m);
    done.open();
  });
  t.after(() => w.kill());
  const id = await send(db.pool, "msg", { type: "T", payload: { n: 1 }, partitionKey: "k" });
  assert.equal(typeof id, "string");
  const now = await serverNow();
  await tick("msg");
  await done.wait;
  await w.stop();
  assert.equal(got[0]!.id, id);
  assert.equal(typeof got[0]!.batchId, "string");
  assert.equal(typeof got[0]!.epoch, "bigint");
  assertRecent("createdAt", got[0]!.createdAt, now);
});

test("admin calls: blocked keys, key heads, dead letters and resizes carry Dates", async () => {
  await createQueue(db.pool, "adm");
  await subscribeSlots(db.pool, "adm", "c", 2, { policy: "pause" });
  const head = await send(db.pool, "adm", { type: "T", payload: { n: 1 }, partitionKey: "k" });
  await send(db.pool, "adm", { type: "T", payload: { n: 2 }, partitionKey: "k" });
  await tick("adm");
  const now = await serverNow();
  // Through the SQL API: claim the key's slot, receive, fail the head for an hour.
  assert.equal((await failFirst(db.pool, "adm", "c", 2, "k")).failed, head);

  const [blocked] = await blockedKeys(db.pool, "adm", "c");
  assert.equal(blocked!.headEventId, head);
  assertRecent("blocked key's since", blocked!.since, now);
  const [kh] = await keyHeads(db.pool, "adm", "c");
  assert.equal(kh!.key, "k");
  assertRecent("key head's retryAt", kh!.retryAt, now);
  assert.ok(kh!.retryAt!.getTime() > now + 3_000_000, "retried in an hour");

  assert.equal(await unblockKey(db.pool, "adm", "c", "k"), head);
  const [dl] = await deadLetters(db.pool, "adm");
  assert.equal(dl!.eventId, head);
  assert.equal(typeof dl!.id, "string");
  assertRecent("dead letter's deadSince", dl!.deadSince, now);
  assertRecent("dead letter's eventTime", dl!.eventTime, now);

  await createQueue(db.pool, "rsz");
  await subscribeSlots(db.pool, "rsz", "c", 2);
  await resizeSlots(db.pool, "rsz", "c", 4);
  const [r] = await resizes(db.pool, "rsz");
  assertRecent("resize's started", r!.started, now);
  assert.equal(r!.finished, null);
});
