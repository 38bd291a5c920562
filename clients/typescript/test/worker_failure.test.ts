// Failure outcomes of the worker pool in both policies: retries with
// backoff, RetryAfter, dead letters (asked for, and past max_retries), the
// handler timeout, and what a failure does to its key's later events (G3).

import { test } from "node:test";
import assert from "node:assert/strict";
import { blockedKeys, deadLetter, deadLetters, HandlerTimeoutError, replayDeadLetterReport, RETRY_DELAY_MS_MAX, retryAfter, work, type FailurePolicy, type Message, type WorkOptions } from "../src/index.js";
import { gate, sendKeyed, setup } from "./worker_helpers.js";
import { waitFor } from "./harness.js";

const fast: Partial<WorkOptions> = { claimIntervalMs: 100, pollIntervalMs: 50, retryDelayMs: () => 20, listen: false };

/** Handled attempts in the order handlers finished: [id, retryCount, ok]. */
type Log = { id: string; key: string | null; retry: number; ok: boolean; at: number }[];

for (const policy of ["skip", "pause"] as FailurePolicy[]) {
  test(`${policy}: a failed event is retried, and its key's later events ${policy === "skip" ? "go on meanwhile" : "wait for it"}`, async (t) => {
    const db = await setup(t, "fail");
    const log: Log = [];
    const all = gate();
    const w = db.track(await work(db.pool, { ...fast, queue: "fail", consumer: "c", slots: 1, failurePolicy: policy }, async (m: Message) => {
      const ok = !((m.payload as { i: number }).i === 0 && m.key === "k" && m.retryCount === 0);
      log.push({ id: m.id, key: m.key, retry: m.retryCount, ok, at: Date.now() });
      if (log.filter((l) => l.ok).length === 6) all.open();
      if (!ok) throw new Error("first attempt fails");
    }));
    const ids = await sendKeyed(db.pool, "fail", ["k", "o"], 3);
    await all.wait;
    await w.stop();
    const k = log.filter((l) => l.key === "k");
    const [e0, , e1, , e2] = ids;
    assert.deepEqual(k.map((l) => [l.id, l.retry, l.ok]), policy === "skip"
      ? [[e0, 0, false], [e1, 0, true], [e2, 0, true], [e0, 1, true]]
      : [[e0, 0, false], [e0, 1, true], [e1, 0, true], [e2, 0, true]]);
    // The other key is never held back by k's failure.
    assert.deepEqual(log.filter((l) => l.key === "o").map((l) => l.ok), [true, true, true]);
  });

  test(`${policy}: deadLetter() dead-letters the event at once and releases its key`, async (t) => {
    const db = await setup(t, "dl");
    const log: Log = [];
    const all = gate();
    const w = db.track(await work(db.pool, { ...fast, queue: "dl", consumer: "c", slots: 1, failurePolicy: policy }, async (m: Message) => {
      const ok = (m.payload as { i: number }).i !== 0;
      log.push({ id: m.id, key: m.key, retry: m.retryCount, ok, at: Date.now() });
      if (log.length === 3) all.open();
      if (!ok) throw deadLetter(new Error("malformed file event"));
    }));
    const ids = await sendKeyed(db.pool, "dl", ["k"], 3);
    await all.wait;
    await w.stop();
    assert.deepEqual(log.map((l) => [l.id, l.ok]), [[ids[0], false], [ids[1], true], [ids[2], true]]);
    const { rows } = await db.pool.query("select ev_id::text as id, dl_reason, ev_retry from pgque.dead_letter");
    assert.deepEqual(rows, [{ id: ids[0], dl_reason: "malformed file event", ev_retry: 0 }]);
  });

  test(`${policy}: an event that keeps failing is dead-lettered after max_retries`, async (t) => {
    const db = await setup(t, "maxr");
    await db.pool.query("select pgque.set_queue_config('maxr', 'max_retries', '2')");
    const tries: number[] = [];
    const after = gate();
    const w = db.track(await work(db.pool, { ...fast, queue: "maxr", consumer: "c", slots: 1, failurePolicy: policy }, async (m: Message) => {
      if (m.key === "after") {
        after.open();
        return;
      }
      tries.push(m.retryCount);
      throw new Error(`attempt ${m.retryCount}`);
    }));
    const [bad] = await sendKeyed(db.pool, "maxr", ["bad"], 1);
    await sendKeyed(db.pool, "maxr", ["after"], 1);
    await after.wait;
    const deadline = Date.now() + 10_000;
    let rows: { id: string; dl_reason: string }[] = [];
    while (rows.length === 0 && Date.now() < deadline) {
      ({ rows } = await db.pool.query("select ev_id::text as id, dl_reason from pgque.dead_letter"));
      if (rows.length === 0) await new Promise((r) => setTimeout(r, 20));
    }
    await w.stop();
    assert.deepEqual(tries, [0, 1, 2]);
    assert.deepEqual(rows, [{ id: bad, dl_reason: "attempt 2" }]);
  });
}

test("a settle the server rolls back as a deadlock victim runs again: its chunk is not delivered twice", async (t) => {
  const db = await setup(t, "rolled");
  // The first nack is refused as a deadlock, as when another session's
  // locks made the settle the victim.
  await db.pool.query(`
    create sequence public.nacks;
    create function public.deadlock_first_nack() returns trigger language plpgsql as $$
    begin
        if nextval('public.nacks') = 1 then
            raise exception using errcode = '40P01', message = 'deadlock injected by the test';
        end if;
        return new;
    end $$;
    create trigger deadlock_first_nack before insert on pgque.retry_queue
        for each row execute function public.deadlock_first_nack()`);
  const log: Log = [];
  const retried = gate();
  const w = db.track(await work(db.pool, { ...fast, queue: "rolled", consumer: "c", slots: 1 }, async (m: Message) => {
    const ok = !((m.payload as { i: number }).i === 0 && m.retryCount === 0);
    log.push({ id: m.id, key: m.key, retry: m.retryCount, ok, at: Date.now() });
    if (m.retryCount > 0) retried.open();
    if (!ok) throw new Error("first attempt fails");
  }));
  const [e0, e1] = await sendKeyed(db.pool, "rolled", ["k"], 2);
  await retried.wait;
  await w.stop();
  // The retry comes after the chunk's settle committed: a chunk delivered
  // again would show its calls before it.
  assert.deepEqual(log.map((l) => [l.id, l.retry, l.ok]), [[e0, 0, false], [e1, 0, true], [e0, 1, true]]);
  const { rows } = await db.pool.query("select last_value::int as n from public.nacks");
  assert.equal(rows[0].n, 2, "the retry queue was written twice: the refused nack and its second run");
});

test("retryAfter() asks for its own delay instead of the retry delay", async (t) => {
  const db = await setup(t, "ra");
  const seen: { retry: number; at: number }[] = [];
  const done = gate();
  const w = db.track(await work(db.pool, { ...fast, queue: "ra", consumer: "c", slots: 1 }, async (m: Message) => {
    seen.push({ retry: m.retryCount, at: Date.now() });
    if (m.retryCount === 0) throw retryAfter(new Error("downstream says wait"), 700);
    done.open();
  }));
  await sendKeyed(db.pool, "ra", ["k"], 1);
  await done.wait;
  await w.stop();
  assert.equal(seen.length, 2);
  // The retry delay is 20 ms; the retry came no sooner than asked.
  assert.ok(seen[1]!.at - seen[0]!.at >= 700, `retried after ${seen[1]!.at - seen[0]!.at} ms`);
});

test("a retry delay past 30 days is shortened to 30 days, and its chunk settles once", async (t) => {
  const db = await setup(t, "far");
  const day = 24 * 3600 * 1000;
  const attempts = new Map<string, number>();
  const retryIn = new Map<string, number | null | undefined>();
  const w = db.track(await work(db.pool, {
    ...fast, queue: "far", consumer: "c", slots: 1, retryDelayMs: () => 40 * day,
    onHandled: (m, r) => retryIn.set(m.key!, r.retryInMs),
  }, async (m: Message) => {
    attempts.set(m.id, (attempts.get(m.id) ?? 0) + 1);
    if (m.key === "after") throw retryAfter(new Error("come back next month"), 31 * day);
    if (m.key === "option") throw new Error("the retryDelayMs option's delay");
  }));
  const ids = await sendKeyed(db.pool, "far", ["after", "option", "a", "b", "c"], 2);
  // The nacks commit with the chunk's acknowledgement: once both retries
  // are stored, the chunk is settled. The server refused a delay past 30
  // days, so the settle failed and the chunk ran again, all keys, for ever.
  const retries = async () => (await db.pool.query<{ key: string; days: number }>(
    `select ev_extra1 as key, extract(epoch from ev_retry_after - clock_timestamp())::float8 / 86400 as days
       from pgque.retry_queue order by key`)).rows;
  await waitFor("both failures stored as retries", async () => (await retries()).length === 4);
  await waitFor("every other event handled", () => attempts.size === ids.length);
  await w.stop();
  for (const r of await retries()) assert.ok(r.days > 29.9 && r.days <= 30, `${r.key}: retry in ${r.days} days`);
  assert.deepEqual([...attempts.values()].filter((n) => n !== 1), [], "no event ran twice");
  assert.deepEqual(Object.fromEntries(retryIn), { after: RETRY_DELAY_MS_MAX, option: RETRY_DELAY_MS_MAX, a: undefined, b: undefined, c: undefined });
});

test("a handler past handlerTimeoutMs sees its signal aborted, and the event is retried", async (t) => {
  const db = await setup(t, "to");
  let reason: unknown;
  const done = gate();
  const w = db.track(await work(db.pool, { ...fast, queue: "to", consumer: "c", slots: 1, handlerTimeoutMs: 100 }, async (m: Message, { signal }) => {
    if (m.retryCount > 0) {
      done.open();
      return;
    }
    // Waits for nothing but the signal: only the timeout ends it.
    await new Promise<void>((_, reject) => signal.addEventListener("abort", () => {
      reason = signal.reason;
      reject(signal.reason);
    }, { once: true }));
  }));
  await sendKeyed(db.pool, "to", ["k"], 1);
  await done.wait;
  await w.stop();
  assert.ok(reason instanceof HandlerTimeoutError, `aborted with ${String(reason)}`);
  const { rows } = await db.pool.query("select count(*)::int as n from pgque.dead_letter");
  assert.deepEqual(rows, [{ n: 0 }]);
});

test("a handler that never reads its signal and throws past handlerTimeoutMs fails as a timeout", async (t) => {
  const db = await setup(t, "tonr");
  const errors: unknown[] = [];
  const done = gate();
  const w = db.track(await work(db.pool, {
    ...fast, queue: "tonr", consumer: "c", slots: 1, handlerTimeoutMs: 30,
    onHandled: (_m, r) => {
      errors.push(r.error);
      if (errors.length === 2) done.open();
    },
  }, async (m: Message) => {
    // No signal is made for this call (it is made when read): the
    // timeout is judged by the clock.
    if (m.retryCount === 0) {
      await new Promise((r) => setTimeout(r, 60));
      throw new Error("gave up late");
    }
  }));
  await sendKeyed(db.pool, "tonr", ["k"], 1);
  await done.wait;
  await w.stop();
  assert.ok(errors[0] instanceof HandlerTimeoutError, `failed with ${String(errors[0])}`);
  assert.equal(((errors[0] as Error).cause as Error).message, "gave up late");
  assert.equal(errors[1], undefined, "the retry succeeded");
});

test("every event's handler gets a signal of its own", async (t) => {
  const db = await setup(t, "sig");
  const signals = new Set<AbortSignal>();
  let calls = 0;
  const done = gate();
  const w = db.track(await work(db.pool, { ...fast, queue: "sig", consumer: "c", slots: 1 }, async (_m: Message, { signal }) => {
    signals.add(signal);
    signal.addEventListener("abort", () => {});
    if (++calls === 20) done.open();
  }));
  await sendKeyed(db.pool, "sig", ["k"], 20);
  await done.wait;
  await w.stop();
  assert.equal(signals.size, 20);
});

test("a handler that throws undefined has failed, and onHandled says so", async (t) => {
  const db = await setup(t, "undef");
  const errors: unknown[] = [];
  const seen: number[] = [];
  const done = gate();
  // onHandled sees the handler's payload type (P), as the handler does.
  const w = db.track(await work<{ i: number }>(db.pool, {
    ...fast, queue: "undef", consumer: "c", slots: 1,
    onHandled: (m, r) => {
      seen.push(m.payload.i);
      errors.push(r.error);
      if (errors.length === 2) done.open();
    },
  }, async (m) => {
    if (m.retryCount === 0) throw undefined;
  }));
  await sendKeyed(db.pool, "undef", ["k"], 1);
  await done.wait;
  await w.stop();
  assert.ok(errors[0] instanceof Error && /the handler threw undefined/.test(errors[0].message), String(errors[0]));
  assert.equal(errors[1], undefined);
  assert.deepEqual(seen, [0, 0]);
});

test("a thrown object that is no Error fails its event, with its JSON as the reason", async (t) => {
  const db = await setup(t, "objs");
  const failed: unknown[] = [];
  // String() of an object without a prototype throws; of a plain object it is "[object Object]".
  const bare = Object.assign(Object.create(null) as object, { code: "E_BARE" });
  const w = db.track(await work<{ i: number }>(db.pool, {
    ...fast, queue: "objs", consumer: "c", slots: 1, failurePolicy: "pause", retryDelayMs: () => 60_000,
    onHandled: (_m, r) => failed.push(r.error),
  }, async (m) => {
    throw m.key === "plain" ? { code: "E_QUOTA", tenant: "t1" } : bare;
  }));
  await sendKeyed(db.pool, "objs", ["plain", "bare"], 1);
  await waitFor("both failures reported", () => failed.length === 2);
  await waitFor("both keys blocked", async () => (await blockedKeys(db.pool, "objs", "c")).length === 2);
  await w.stop();
  const reasons = Object.fromEntries((await blockedKeys(db.pool, "objs", "c")).map((b) => [b.key, b.reason]));
  assert.deepEqual(reasons, { plain: '{"code":"E_QUOTA","tenant":"t1"}', bare: '{"code":"E_BARE"}' });
});

test("a thrown value that cannot be read fails its event like any other, and the slot goes on", async (t) => {
  const db = await setup(t, "unread");
  const failed: string[] = [];
  const handled: string[] = [];
  // instanceof throws on a revoked Proxy; reading this Error's message throws.
  const { proxy, revoke } = Proxy.revocable({}, {});
  revoke();
  const getter = new Error("x");
  Object.defineProperty(getter, "message", { get() { throw new Error("no message for you"); } });
  const w = db.track(await work<{ i: number }>(db.pool, {
    ...fast, queue: "unread", consumer: "c", slots: 1, failurePolicy: "pause", retryDelayMs: () => 60_000,
    onHandled: (m, r) => (r.error === undefined ? handled : failed).push(m.key!),
  }, async (m) => {
    if (m.key === "proxy") throw proxy;
    if (m.key === "getter") throw getter;
  }));
  await sendKeyed(db.pool, "unread", ["proxy", "getter", "good"], 1);
  // Blocked under pause: the chunk was settled (the nacks commit with its
  // acknowledgement).
  await waitFor("both keys blocked", async () => (await blockedKeys(db.pool, "unread", "c")).length === 2);
  await w.stop();
  // Before, the runner died on the throw with its chunk unsettled: the
  // chunk ran again after each lease TTL, the good event with it.
  assert.deepEqual(handled, ["good"]);
  assert.deepEqual(failed.sort(), ["getter", "proxy"]);
  const reasons = Object.fromEntries((await blockedKeys(db.pool, "unread", "c")).map((b) => [b.key, b.reason]));
  assert.equal(reasons.proxy, "the handler threw a value that cannot be read as text");
  assert.equal(reasons.getter, "the handler threw a value that cannot be read as text");
});

test("a handler that ignores its signal and returns after its timeout has handled the event", async (t) => {
  const db = await setup(t, "late");
  const results: unknown[] = [];
  const done = gate();
  const w = db.track(await work(db.pool, {
    ...fast, queue: "late", consumer: "c", slots: 1, handlerTimeoutMs: 50,
    onHandled: (_m, r) => {
      results.push(r.error);
      if (results.length === 3) done.open();
    },
  }, async (m: Message, { signal }) => {
    // The first event runs past its timeout, sees its signal aborted, and returns.
    if ((m.payload as { i: number }).i === 0) {
      await new Promise((r) => setTimeout(r, 150));
      assert.ok(signal.aborted && signal.reason instanceof HandlerTimeoutError);
    }
  }));
  await sendKeyed(db.pool, "late", ["k"], 3);
  await done.wait;
  await w.stop();
  assert.deepEqual(results, [undefined, undefined, undefined]);
  const { rows } = await db.pool.query("select count(*)::int as n from pgque.retry_queue");
  assert.deepEqual(rows, [{ n: 0 }]);
});

test("a replayed dead letter arrives marked, keeps its retries, and the report says what it overtook", async (t) => {
  const db = await setup(t, "rp");
  const seen: { id: string; replay: boolean; retry: number }[] = [];
  const three = gate();
  const replayed = gate();
  const w = db.track(await work(db.pool, { ...fast, queue: "rp", consumer: "c", slots: 1, failurePolicy: "skip" }, async (m: Message) => {
    seen.push({ id: m.id, replay: m.replay, retry: m.retryCount });
    if (m.replay) replayed.open();
    if (seen.length === 3) three.open();
    if ((m.payload as { i: number }).i === 0 && !m.replay) throw deadLetter(new Error("first event refused"));
  }));
  const ids = await sendKeyed(db.pool, "rp", ["k"], 3);
  await three.wait;
  // The dead letter is written when the chunk settles, after the handlers.
  await waitFor("the dead letter", async () => (await deadLetters(db.pool, "rp", { consumer: "c" })).length === 1);
  const [dl] = await deadLetters(db.pool, "rp", { consumer: "c" });
  assert.ok(dl, "the first event is a dead letter");
  assert.equal(dl.replayed, false);
  const report = await replayDeadLetterReport(db.pool, "rp", dl.id);
  assert.equal(report.eventId, ids[0]);
  assert.equal(report.key, "k");
  // Both later events of k were handled before the replay: it overtakes them.
  assert.equal(report.laterDelivered, 2);
  assert.equal(report.historyComplete, true);
  await replayed.wait;
  await w.stop();
  assert.deepEqual(seen.map((s) => [s.id, s.replay]), [[ids[0], false], [ids[1], false], [ids[2], false], [ids[0], true]]);
  assert.equal(seen[3]!.retry, 0, "deadLetter() at the first attempt: no retries to keep");
});
