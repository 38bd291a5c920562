// Watching a worker: onHandled sees every handler call with its outcome,
// stats() counts them and the errors the pool recovered from.

import { test } from "node:test";
import assert from "node:assert/strict";
import { deadLetter, HandlerTimeoutError, retryAfter, work, type HandleResult, type Message, type WorkOptions } from "../src/index.js";
import { gate, sendKeyed, setup } from "./worker_helpers.js";
import { waitFor } from "./harness.js";

const fast: Partial<WorkOptions> = { claimIntervalMs: 100, pollIntervalMs: 50, retryDelayMs: () => 20, listen: false };

test("onHandled reports each handler call's outcome, and stats() counts them", async (t) => {
  const db = await setup(t, "obs");
  const seen: { id: string; retry: number; error: string | undefined; retryInMs: number | null | undefined; ms: number }[] = [];
  const done = gate();
  const running = gate();
  let during: ReturnType<typeof w.stats> | undefined;
  const w = db.track(await work(db.pool, {
    ...fast, queue: "obs", consumer: "c", slots: 1, handlerTimeoutMs: 200,
    onHandled: (m: Message, r: HandleResult) => {
      seen.push({ id: m.id, retry: m.retryCount, error: (r.error as Error | undefined)?.name, retryInMs: r.retryInMs, ms: r.durationMs });
      if (seen.length === 6) done.open();
    },
  }, async (m: Message, { signal }) => {
    const i = (m.payload as { i: number }).i;
    if (i === 0 && m.retryCount === 0) throw retryAfter(new Error("busy"), 30);
    if (i === 1) throw deadLetter(new Error("malformed"));
    if (i === 2 && m.retryCount === 0) {
      during = w.stats();
      running.open();
      await new Promise((_, reject) => signal.addEventListener("abort", () => reject(signal.reason)));
    }
  }));
  const [e0, e1, e2, e3] = await sendKeyed(db.pool, "obs", ["k"], 4);
  await running.wait;
  assert.equal(during!.running, 1, "stats().running while a handler runs");
  assert.deepEqual(during!.ownedSlots, [0]);
  await done.wait;
  await w.stop();

  // The two retries come back in either order (skip policy: the key goes on).
  const calls = seen.map(({ id, retry, error, retryInMs }) => ({ id, retry, error, retryInMs }));
  calls.splice(4, 2, ...calls.slice(4).sort((a, b) => Number(BigInt(a.id) - BigInt(b.id))));
  assert.deepEqual(calls, [
    { id: e0, retry: 0, error: "RetryAfterError", retryInMs: 30 },
    { id: e1, retry: 0, error: "DeadLetterError", retryInMs: null },
    { id: e2, retry: 0, error: new HandlerTimeoutError(200).name, retryInMs: 20 },
    { id: e3, retry: 0, error: undefined, retryInMs: undefined },
    { id: e0, retry: 1, error: undefined, retryInMs: undefined },
    { id: e2, retry: 1, error: undefined, retryInMs: undefined },
  ]);
  assert.ok(seen[2]!.ms >= 190, `the timed-out call ran ${seen[2]!.ms} ms`);
  const s = w.stats();
  assert.deepEqual({ handled: s.handled, failed: s.failed, running: s.running, ownedSlots: s.ownedSlots }, { handled: 3, failed: 3, running: 0, ownedSlots: [] });
});

test("stats() counts the errors the pool recovers from, and onHandled's own throws are among them", async (t) => {
  const db = await setup(t, "obserr");
  const reported: unknown[] = [];
  const refused = new Error("no LISTEN connection today");
  const w = db.track(await work(db.pool, {
    ...fast, queue: "obserr", consumer: "c", slots: 1,
    listen: async () => {
      throw refused;
    },
    onError: (err) => reported.push(err),
    onHandled: () => {
      throw new Error("a broken metrics hook");
    },
  }, () => {}));
  await sendKeyed(db.pool, "obserr", ["k"], 1);
  await waitFor("the event handled and the hook's throw reported", () => w.stats().handled === 1 && reported.some((e) => (e as Error).message === "a broken metrics hook"));
  await w.stop();
  const s = w.stats();
  assert.equal(s.errors, reported.length);
  assert.ok(reported.some((e) => (e as Error).cause === refused || e === refused), "the LISTEN failure was not reported");
  assert.ok(s.lastError !== undefined);
});
