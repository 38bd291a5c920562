// The worker's coordination primitives, without a database.

import { test } from "node:test";
import assert from "node:assert/strict";
import { getEventListeners } from "node:events";
import { Semaphore } from "../src/worker/sync.js";

test("semaphore waiters on one signal share one abort listener, go in arrival order, and all give up when it aborts", async () => {
  const sem = new Semaphore(1);
  const ctl = new AbortController();
  assert.equal(sem.tryAcquire(), true);
  assert.equal(sem.tryAcquire(), false);
  const order: number[] = [];
  const waiting = Array.from({ length: 50 }, (_, i) => sem.acquire(ctl.signal).then(() => order.push(i)));
  // One listener for fifty waiters: a listener each made every wait
  // linear in the waiters, and Node warned of a leak past ten.
  assert.equal(getEventListeners(ctl.signal, "abort").length, 1);
  sem.release();
  sem.release();
  await Promise.all(waiting.slice(0, 2));
  assert.deepEqual(order, [0, 1], "the longest waiters go first");
  const rest = waiting.slice(2).map((p) => p.then(() => "acquired", (e: unknown) => e));
  ctl.abort(new Error("stop"));
  for (const r of await Promise.all(rest)) assert.equal((r as Error).message, "stop");
  assert.equal(getEventListeners(ctl.signal, "abort").length, 0);
  // The aborted waiters took no place: a release frees one again.
  sem.release();
  assert.equal(sem.tryAcquire(), true);
});

test("the last waiter of a signal removes its listener when released", async () => {
  const sem = new Semaphore(0);
  const ctl = new AbortController();
  const a = sem.acquire(ctl.signal);
  const b = sem.acquire(ctl.signal);
  sem.release();
  sem.release();
  await Promise.all([a, b]);
  assert.equal(getEventListeners(ctl.signal, "abort").length, 0);
});
