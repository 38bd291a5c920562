import { test } from "node:test";
import assert from "node:assert/strict";
import pg from "pg";
import { ListenNotDeliveringError, work, type Message } from "../src/index.js";
import { Listener, tickChannel } from "../src/worker/listener.js";
import { testDb, waitFor } from "./harness.js";
import { startPgBouncer } from "./bouncer.js";

function clientOf(url: string): () => Promise<pg.Client> {
  return async () => {
    const c = new pg.Client({ connectionString: url });
    await c.connect();
    return c;
  };
}

test("a LISTEN connection that gets its probe back warns of nothing", async (t) => {
  const db = await testDb({ t });
  const errors: unknown[] = [];
  const l = new Listener(clientOf(db.url), (err) => errors.push(err), [tickChannel],
    async (channel, payload) => void (await db.pool.query("select pg_notify($1, $2)", [channel, payload])), 500);
  t.after(() => l.close());
  await l.ready;
  await waitFor("the probe's notification", () => l.probeState === "ok");
  assert.deepEqual(errors, []);
});

test("behind PgBouncer in transaction mode, the listener and the worker say that wake-ups do not arrive", async (t) => {
  const db = await testDb({ t });
  const b = await startPgBouncer(db.url);
  t.after(() => b.stop());
  const dbname = new URL(db.url).pathname.slice(1);
  const pooled = new pg.Pool({ connectionString: b.url(dbname), max: 4 });
  pooled.on("error", () => {});
  t.after(() => pooled.end());

  // The listener alone: its probe, sent through the pooler, never arrives.
  let warned: unknown;
  const l = new Listener(clientOf(b.url(dbname)), (err) => (warned ??= err), [tickChannel],
    async (channel, payload) => void (await pooled.query("select pg_notify($1, $2)", [channel, payload])), 500);
  t.after(() => l.close());
  await l.ready;
  await waitFor("the probe to fail", () => l.probeState === "failed", 5000);
  assert.ok(warned instanceof ListenNotDeliveringError, `onError got ${String(warned)}`);
  assert.match((warned as Error).message, /listen: false/);

  // A worker on the pooled pool, listening as by default, reports it to
  // onError (and still delivers, by its polls).
  await db.pool.query("select pgque.create_queue('q')");
  const errs: unknown[] = [];
  const seen: string[] = [];
  const w = await work(pooled, { queue: "q", consumer: "c", slots: 2, pollIntervalMs: 100, onError: (err) => errs.push(err) },
    async (m: Message) => void seen.push(m.id));
  t.after(() => w.stop());
  await waitFor("the worker's warning", () => errs.some((e) => e instanceof ListenNotDeliveringError), 10_000);
  const id = (await db.pool.query("select pgque.send('q', 't', '{}'::jsonb, 'k')::text as id")).rows[0].id as string;
  await db.pool.query("select pgque.force_next_tick('q'), pgque.ticker('q')");
  await waitFor("the event, by a poll", () => seen.includes(id), 10_000);
});
