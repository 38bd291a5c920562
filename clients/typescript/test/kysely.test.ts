// Example: sending an event inside a Kysely transaction, so the order row
// and its event commit together or not at all. Kysely is only a
// devDependency; the adapter is the three lines of kyselyExecutor.

import { test } from "node:test";
import assert from "node:assert/strict";
import { CompiledQuery, Kysely, PostgresDialect, type Transaction } from "kysely";
import { createQueue, send, sendBatch, type Executor } from "../src/index.js";
import { testDb } from "./harness.js";

const db = await testDb();

interface Database {
  orders: { id: number; tenant: string; total: number };
}

/** An Executor over a Kysely transaction (or the Kysely instance). */
function kyselyExecutor(trx: Kysely<Database> | Transaction<Database>): Executor {
  return {
    query: <R>(text: string, params: unknown[] = []) => trx.executeQuery<R>(CompiledQuery.raw(text, params)),
  };
}

test("an order and its events commit together in a Kysely transaction, or vanish together", async () => {
  const kysely = new Kysely<Database>({ dialect: new PostgresDialect({ pool: db.pool }) });
  await db.pool.query("create table orders (id int primary key, tenant text not null, total int not null)");
  await createQueue(db.pool, "orders");

  const id = await kysely.transaction().execute(async (trx) => {
    await trx.insertInto("orders").values({ id: 1, tenant: "t1", total: 30 }).execute();
    const exec = kyselyExecutor(trx);
    const [created, priced] = await sendBatch(exec, "orders", [
      { type: "OrderCreated", payload: { id: 1 }, partitionKey: "t1" },
      { type: "OrderPriced", payload: { id: 1, total: 30 }, partitionKey: "t1" },
    ]);
    assert.ok(BigInt(priced!) > BigInt(created!));
    return created;
  });

  await assert.rejects(
    kysely.transaction().execute(async (trx) => {
      await trx.insertInto("orders").values({ id: 2, tenant: "t2", total: 5 }).execute();
      await send(kyselyExecutor(trx), "orders", { type: "OrderCreated", payload: { id: 2 }, partitionKey: "t2" });
      throw new Error("payment declined");
    }),
    /payment declined/,
  );

  const orders = await kysely.selectFrom("orders").select(["id"]).execute();
  assert.deepEqual(orders, [{ id: 1 }]);
  const { rows } = await db.pool.query(
    `select e.ev_id::text as id, e.ev_type as type from pgque.event e join pgque.queue q on e.ev_part / 16 = q.queue_id
      where q.queue_name = 'orders' order by e.ev_id`);
  assert.deepEqual(rows.map((r) => r.type), ["OrderCreated", "OrderPriced"]);
  assert.equal(rows[0].id, id);
});
