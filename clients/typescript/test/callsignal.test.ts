// A handler call's signal (CallSignal), without a database: made only when
// read, aborted by its timeout or its slot, and no timer left behind.

import { test } from "node:test";
import assert from "node:assert/strict";
import { CallSignal } from "../src/worker/callsignal.js";
import { HandlerTimeoutError } from "../src/worker/outcome.js";

/** The process's active timers. */
function timers(): number {
  return process.getActiveResourcesInfo().filter((r) => r === "Timeout").length;
}

test("a call's signal is made when read, with a timer for the time left, which aborts it with a HandlerTimeoutError", async () => {
  const before = timers();
  const call = new CallSignal(performance.now(), 30);
  assert.equal(timers(), before, "no timer before the signal is read");
  const signal = call.signal;
  assert.equal(call.signal, signal, "one signal per call");
  assert.equal(timers(), before + 1);
  assert.equal(signal.aborted, false);
  await new Promise<void>((resolve) => signal.addEventListener("abort", () => resolve(), { once: true }));
  assert.ok(signal.reason instanceof HandlerTimeoutError);
  assert.equal(call.timedOut(), true);
  call.end();
  assert.equal(timers(), before);
});

test("a call that ran past its timeout has timed out by the clock, read or not, and its signal is aborted when read", () => {
  const before = timers();
  const call = new CallSignal(performance.now() - 100, 50);
  assert.equal(call.timedOut(), true, "by the clock, with no signal made");
  assert.equal(call.signal.aborted, true);
  assert.ok(call.signal.reason instanceof HandlerTimeoutError);
  assert.equal(timers(), before, "no timer for a timeout already past");
  assert.equal(new CallSignal(performance.now(), 0).timedOut(), false, "0 is no timeout");
  assert.equal(new CallSignal(performance.now() - 1e6, 0).timedOut(), false);
});

test("the slot's abort reaches the signal, read before or after it, and the first reason stays", () => {
  const lost = new Error("lease lost");
  const early = new CallSignal(performance.now(), 0);
  const s = early.signal;
  early.abort(lost);
  assert.equal(s.aborted, true);
  assert.equal(s.reason, lost);
  early.abort(new Error("later"));
  assert.equal(s.reason, lost);

  const before = timers();
  const late = new CallSignal(performance.now(), 10_000);
  late.abort(lost);
  assert.equal(late.signal.aborted, true);
  assert.equal(late.signal.reason, lost);
  assert.equal(late.timedOut(), false);
  assert.equal(timers(), before, "an aborted call starts no timer");
});

test("a call that has ended leaves no timer, and a signal read afterwards starts none", () => {
  const before = timers();
  const read = new CallSignal(performance.now(), 10_000);
  void read.signal;
  assert.equal(timers(), before + 1);
  read.end();
  assert.equal(timers(), before, "end() clears the timer");
  const unread = new CallSignal(performance.now(), 10_000);
  unread.end();
  assert.equal(unread.signal.aborted, false);
  assert.equal(timers(), before, "a signal first read after the call starts no timer");
});
