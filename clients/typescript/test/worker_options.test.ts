// work()'s options and stop()'s timeout: a value the server or a timer
// cannot take is refused at once, naming the option and the value, rather
// than failing every receive or claim for ever (the server refuses it) or
// firing its timer after 1 ms (setTimeout clamps anything past 2^31 − 1 ms,
// Infinity too, to 1 ms); Infinity means "no limit" where a limit is
// optional.

import { test } from "node:test";
import assert from "node:assert/strict";
import { isPgqueError, work, type ConnectionSource, type Message, type WorkOptions } from "../src/index.js";
import { gate, sendKeyed, setup } from "./worker_helpers.js";

const fast: Partial<WorkOptions> = { claimIntervalMs: 100, pollIntervalMs: 50, retryDelayMs: () => 20, listen: false };

/** A database work() must not reach: the options are checked first. */
const untouched = {
  query: () => Promise.reject(new Error("work() touched the database")),
  connect: () => Promise.reject(new Error("work() touched the database")),
} as unknown as ConnectionSource;

test("work() refuses options the server or a timer cannot take, naming the option and the value", async () => {
  const base = { queue: "q", consumer: "c", slots: 1 };
  const cases: [Partial<WorkOptions> | Record<string, unknown>, RegExp][] = [
    [{ batchSize: 1.5 }, /batchSize must be an integer from 1 to 100000, not 1\.5/],
    [{ batchSize: 1e12 }, /batchSize .* not 1000000000000/],
    [{ batchSize: 0 }, /batchSize .* not 0/],
    [{ leaseTtlMs: 1e12 }, /leaseTtlMs must be a number from 1000 to 86400000, not 1000000000000/],
    [{ leaseTtlMs: 999 }, /leaseTtlMs .* not 999/],
    [{ leaseTtlMs: NaN }, /leaseTtlMs .* not NaN/],
    [{ workerId: "" }, /workerId must be 1 to 200 bytes of UTF-8, not 0/],
    [{ workerId: "é".repeat(101) }, /workerId must be 1 to 200 bytes of UTF-8, not 202/],
    [{ workerId: "w\u0000" }, /workerId holds a NUL character/],
    [{ workerId: 7 }, /workerId must be a string, not 7/],
    [{ slots: "4" }, /slots must be an integer from 1 to 1024, not the string "4"/],
    [{ gatherReceives: "yes" }, /gatherReceives must be true or false, not the string "yes"/],
    [{ slots: 1.5 }, /slots .* not 1\.5/],
    [{ slots: 2000 }, /slots .* not 2000/],
    [{ handlerTimeoutMs: 2 ** 31 }, /handlerTimeoutMs must be a number from 0 to 2147483647, not 2147483648/],
    [{ handlerTimeoutMs: -1 }, /handlerTimeoutMs .* not -1/],
    [{ handlerTimeoutMs: NaN }, /handlerTimeoutMs .* not NaN/],
    [{ claimIntervalMs: 1e9 }, /claimIntervalMs must be a number from 10 to 200000, not 1000000000/],
    [{ pollIntervalMs: Infinity }, /pollIntervalMs .* not Infinity/],
    [{ holdAfterMs: 2 ** 31 }, /holdAfterMs .* not 2147483648/],
    [{ concurrency: 1.5 }, /concurrency must be an integer .* not 1\.5/],
    [{ maxActiveSlots: 0.5 }, /maxActiveSlots must be an integer .* not 0\.5/],
  ];
  for (const [opts, says] of cases) {
    await assert.rejects(work(untouched, { ...base, ...opts } as WorkOptions, () => {}),
      (err) => isPgqueError(err, "invalid_argument") && says.test((err as Error).message), JSON.stringify(opts, (_k, v) => (typeof v === "number" && !Number.isFinite(v) ? String(v) : v)));
  }
});

test("handlerTimeoutMs: Infinity is no timeout, and 2^31 − 1 ms is a timeout that long", async (t) => {
  const db = await setup(t, "hto");
  for (const handlerTimeoutMs of [Infinity, 2 ** 31 - 1]) {
    const aborted: boolean[] = [];
    const done = gate();
    const w = db.track(await work(db.pool, { ...fast, queue: "hto", consumer: "c", slots: 1, handlerTimeoutMs }, async (_m: Message, { signal }) => {
      // setTimeout turned either timeout into 1 ms, which fires first.
      await new Promise((r) => setTimeout(r, 20));
      aborted.push(signal.aborted);
      done.open();
    }));
    await sendKeyed(db.pool, "hto", ["k"], 1);
    await done.wait;
    await w.stop();
    assert.deepEqual(aborted, [false], `handlerTimeoutMs ${handlerTimeoutMs}`);
  }
});

test("stop({ timeoutMs: Infinity }) waits for the handler without limit, as does one past 2^31 − 1 ms", async (t) => {
  const db = await setup(t, "sto");
  for (const timeoutMs of [Infinity, 2 ** 31, 1e15]) {
    const started = gate();
    const release = gate();
    const signals: AbortSignal[] = [];
    const handled: string[] = [];
    const w = db.track(await work(db.pool, { ...fast, queue: "sto", consumer: "c", slots: 1 }, async (m: Message, { signal }) => {
      signals.push(signal);
      started.open();
      await release.wait;
      handled.push(m.id);
    }));
    const [id] = await sendKeyed(db.pool, "sto", ["k"], 1);
    await started.wait;
    const stopping = w.stop({ timeoutMs });
    // A timeout setTimeout clamped to 1 ms made the stop a kill by now.
    await new Promise((r) => setTimeout(r, 20));
    assert.equal(signals[0]!.aborted, false, `stop({ timeoutMs: ${timeoutMs} }) aborted the handler: ${String(signals[0]!.reason)}`);
    release.open();
    await stopping;
    assert.deepEqual(handled, [id]);
    const { rows } = await db.pool.query("select owner from pgque.partition_slot_leases");
    assert.deepEqual(rows, [{ owner: null }], "a graceful stop released the lease");
  }
});

test("stop() refuses a negative or NaN timeoutMs and stops nothing", async (t) => {
  const db = await setup(t, "stn");
  const got = gate();
  const w = db.track(await work(db.pool, { ...fast, queue: "stn", consumer: "c", slots: 1 }, () => got.open()));
  for (const timeoutMs of [-1, NaN, "100" as unknown as number]) {
    await assert.rejects(w.stop({ timeoutMs }), (err) => isPgqueError(err, "invalid_argument") && /timeoutMs/.test((err as Error).message), String(timeoutMs));
  }
  // Still working: it handles what comes after.
  await sendKeyed(db.pool, "stn", ["k"], 1);
  await got.wait;
  await w.stop({ timeoutMs: 0 });
});
