// The same producer and admin calls on postgres.js, through fromPostgresJs:
// sends inside sql.begin commit or roll back with it.

import { test } from "node:test";
import assert from "node:assert/strict";
import postgres from "postgres";
import { createQueue, fromPostgresJs, isPgqueError, send, sendBatch, deadLetters } from "../src/index.js";
import { testDb } from "./harness.js";

const db = await testDb();

test("sends in a postgres.js transaction commit with it, ids and errors as with pg", async (t) => {
  const sql = postgres(db.url, { max: 2, onnotice: () => {} });
  t.after(() => sql.end());
  await createQueue(fromPostgresJs(sql), "pj");

  const ids = await sql.begin(async (tx) => {
    const exec = fromPostgresJs(tx);
    const one = await send(exec, "pj", { type: "A", payload: { n: 1 }, partitionKey: "" });
    const many = await sendBatch(exec, "pj", [
      { type: "B", payload: { n: 2 }, partitionKey: "k" },
      { type: "A", payload: { n: 3 } },
    ]);
    return [one, ...many];
  });
  assert.equal(ids.length, 3);
  for (const id of ids) assert.equal(typeof id, "string");

  await assert.rejects(
    sql.begin(async (tx) => {
      await send(fromPostgresJs(tx), "pj", { payload: { n: 4 } });
      throw new Error("abort");
    }),
    /abort/,
  );
  await assert.rejects(send(fromPostgresJs(sql), "missing", { payload: 1 }), (err) => isPgqueError(err, "queue_not_found"));
  assert.deepEqual(await deadLetters(fromPostgresJs(sql), "pj"), []);

  const { rows } = await db.pool.query(
    `select e.ev_id::text as id, e.ev_type as type, e.ev_extra1 as key from pgque.event e
       join pgque.queue q on e.ev_part / 16 = q.queue_id where q.queue_name = 'pj' order by e.ev_id`);
  assert.deepEqual(rows, [
    { id: ids[0], type: "A", key: "" },
    { id: ids[1], type: "B", key: "k" },
    { id: ids[2], type: "A", key: null },
  ]);
});
