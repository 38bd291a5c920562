// Online resize of N under a running TypeScript worker: the worker follows
// the consumer's new N (as the Go pool does) and every event is handled
// once, each key's events in order, across the cutover; and a worker
// started with the N the consumer had before a resize works the current N.

import { test } from "node:test";
import assert from "node:assert/strict";
import { setTimeout as sleep } from "node:timers/promises";
import { isPgqueError, resizes, resizeSlots, slots, subscribeSlots, work, type Message } from "../src/index.js";
import { waitFor } from "./harness.js";
import { Recorder, sendKeyed, setup } from "./worker_helpers.js";

const fast = { claimIntervalMs: 100, pollIntervalMs: 50, leaseTtlMs: 2000, listen: false as const };
const range = (n: number) => Array.from({ length: n }, (_, i) => i);

function recording(rec: Recorder, ns: Map<string, number>) {
  return async (m: Message) => {
    rec.enter(m);
    await sleep(Math.floor(Math.random() * 3));
    ns.set(m.id, m.nslots);
    rec.leave(m, true);
  };
}

async function resize(pool: import("pg").Pool, queue: string, n: number): Promise<void> {
  await pool.query("select pgque.resize_slots($1, 'c', $2)", [queue, n]);
}

test("a running worker follows resizes up and down: every event once, in key order", async (t) => {
  const db = await setup(t, "rsz");
  const rec = new Recorder();
  const ns = new Map<string, number>();
  const w = db.track(await work(db.pool, { queue: "rsz", consumer: "c", slots: 4, ...fast }, recording(rec, ns)));
  const keys = range(24).map((i) => `tenant-${i}`);

  const before = await sendKeyed(db.pool, "rsz", keys, 4);
  await rec.handled(before.length / 2);
  // Resized while events of the old N are still being handled; more are
  // sent during the drain of the old slots and after the cutover.
  await resize(db.pool, "rsz", 8);
  const during = await sendKeyed(db.pool, "rsz", keys, 4);
  await waitFor("the worker to work the 8 new slots", () => w.ownedSlots().join() === range(8).join(), 30_000);
  const after8 = await sendKeyed(db.pool, "rsz", keys, 4);
  await rec.handled(before.length + during.length + after8.length, 30_000);

  await resize(db.pool, "rsz", 3);
  const after3 = await sendKeyed(db.pool, "rsz", keys, 4);
  await waitFor("the worker to work the 3 new slots", () => w.ownedSlots().join() === range(3).join(), 30_000);
  const all = [...before, ...during, ...after8, ...after3];
  await rec.handled(all.length, 30_000);
  await w.stop();

  assert.deepEqual(rec.violations, []);
  const handled = [...rec.seen.values()].flat();
  assert.deepEqual(handled.sort(), [...all].sort(), "every event handled exactly once");
  // Events sent after a cutover came from slots of the new N.
  for (const id of after8) assert.equal(ns.get(id), 8, `event ${id} sent after the resize to 8`);
  for (const id of after3) assert.equal(ns.get(id), 3, `event ${id} sent after the resize to 3`);
  const { rows } = await db.pool.query("select nslots, resize_to from pgque.slot_group_info('rsz', 'c')");
  assert.deepEqual(rows[0], { nslots: 3, resize_to: null });
});

test("a worker started with the N the consumer had before a resize works the current N", async (t) => {
  const db = await setup(t, "rsz2");
  const rec = new Recorder();
  const ns = new Map<string, number>();
  const first = db.track(await work(db.pool, { queue: "rsz2", consumer: "c", slots: 4, ...fast }, recording(rec, ns)));
  await resize(db.pool, "rsz2", 6);
  await waitFor("the first worker to work the 6 new slots", () => first.ownedSlots().length === 6, 30_000);
  await first.stop();

  // Deployed with the old config: 4.
  const w = db.track(await work(db.pool, { queue: "rsz2", consumer: "c", slots: 4, ...fast }, recording(rec, ns)));
  await waitFor("the worker to work the 6 slots", () => w.ownedSlots().join() === range(6).join(), 30_000);
  const ids = await sendKeyed(db.pool, "rsz2", range(12).map((i) => `k${i}`), 3);
  await rec.handled(ids.length, 30_000);
  await w.stop();
  assert.deepEqual(rec.violations, []);
  assert.deepEqual([...rec.seen.values()].flat().sort(), [...ids].sort());
  for (const id of ids) assert.equal(ns.get(id), 6);

  // Any other N is still refused.
  await assert.rejects(work(db.pool, { queue: "rsz2", consumer: "c", slots: 5, ...fast }, () => {}), { kind: "slot_count_mismatch" });
});

test("resizeSlots starts a resize that a worker completes, and resizes() follows it", async (t) => {
  const db = await setup(t, "rszapi");
  const rec = new Recorder();
  const ns = new Map<string, number>();
  // No worker yet: the cutover waits for one (a receive), so the resize is seen in progress.
  await subscribeSlots(db.pool, "rszapi", "c", 2);
  const tick = await resizeSlots(db.pool, "rszapi", "c", 5);
  assert.match(tick, /^[0-9]+$/);
  const [running] = await resizes(db.pool, "rszapi");
  assert.deepEqual([running!.nslots, running!.resizeTo, running!.sealTick, running!.phase === "done"], [2, 5, tick, false]);
  await assert.rejects(resizeSlots(db.pool, "rszapi", "c", 3), (err) => isPgqueError(err, "resize_in_progress"));
  await assert.rejects(resizeSlots(db.pool, "rszapi", "c", 0), (err) => isPgqueError(err, "invalid_argument"));
  const w = db.track(await work(db.pool, { queue: "rszapi", consumer: "c", slots: 2, ...fast }, recording(rec, ns)));
  await waitFor("the resize to finish", async () => (await resizes(db.pool, "rszapi"))[0]?.phase === "done");
  const [r] = await resizes(db.pool, "rszapi");
  assert.deepEqual([r!.consumer, r!.nslots, r!.resizeTo, r!.slotsDone, r!.finished instanceof Date], ["c", 5, null, 5, true]);
  await assert.rejects(resizeSlots(db.pool, "rszapi", "c", 5), (err) => isPgqueError(err, "invalid_argument"));
  const ids = await sendKeyed(db.pool, "rszapi", range(10).map((i) => `k${i}`), 2);
  await rec.handled(ids.length);
  await w.stop();
  assert.deepEqual(new Set([...ns.values()]), new Set([5]));
  assert.equal((await slots(db.pool, "rszapi", "c")).length, 5);
});
