// The claim plan (makePlan) alone, no database: the same fair share as the
// Go pool's makePlan, so mixed groups converge.

import { test } from "node:test";
import assert from "node:assert/strict";
import { HintGate, left, makePlan, type PlanInput } from "../src/worker/fairshare.js";
import { hintTag, leaveTag } from "../src/worker/listener.js";

function input(p: Partial<PlanInput>): PlanInput {
  return { self: "me", slots: 8, maxActive: 8, owners: Array(8).fill(null), running: new Map(), peers: new Map(), holdoff: new Set(), prevFree: new Set(), ...p };
}

test("alone, a worker claims every slot", () => {
  const plan = makePlan(input({}));
  assert.equal(plan.target, 8);
  assert.deepEqual([...plan.claim].sort((a, b) => a - b), [0, 1, 2, 3, 4, 5, 6, 7]);
});

test("a hungry peer makes a worker above its share release the excess, highest slots first", () => {
  const running = new Map(Array.from({ length: 8 }, (_, s) => [s, false] as [number, boolean]));
  const owners = Array(8).fill("me");
  const plan = makePlan(input({ running, owners, peers: new Map([["go-worker", true]]) }));
  assert.equal(plan.live, 2);
  assert.equal(plan.target, 4);
  assert.deepEqual(plan.release, [7, 6, 5, 4]);
  assert.deepEqual(plan.claim, []);
});

test("a newcomer claims up to its share of the free slots, not slots held by a live owner", () => {
  const owners = ["go", "go", "go", "go", null, null, null, null];
  const plan = makePlan(input({ owners, slots: 8 }));
  assert.equal(plan.target, 4);
  assert.deepEqual([...plan.claim].sort(), [4, 5, 6, 7]);
});

test("beyond its share a worker claims a free slot only once it stayed free a whole pass and nobody is hungry", () => {
  const owners = ["go", "go", "go", null];
  const running = new Map<number, boolean>();
  const first = makePlan(input({ slots: 4, owners, running, peers: new Map([["go", false]]) }));
  // live 2, target 2: slot 3 is claimed within the share.
  assert.deepEqual(first.claim, [3]);
  const full = makePlan(input({ slots: 4, owners: ["go", "go", null, null], running: new Map([[3, false], [2, false]]), peers: new Map([["go", false]]) }));
  assert.deepEqual(full.claim, []);
  // Two live workers, four slots: this one runs two (its share), slot 3 is free.
  const base = { slots: 4, owners: ["go", null, null, null], running: new Map([[1, false], [2, false]]) };
  const held = makePlan(input({ ...base, peers: new Map([["go", false]]) }));
  assert.equal(held.target, 2);
  assert.deepEqual(held.claim, [], "slot 3 was not seen free on the previous pass");
  const later = makePlan(input({ ...base, peers: new Map([["go", false]]), prevFree: new Set([3]) }));
  assert.deepEqual(later.claim, [3]);
  const hungry = makePlan(input({ ...base, peers: new Map([["go", true]]), prevFree: new Set([3]) }));
  assert.deepEqual(hungry.claim, [], "a hungry peer gets the spare slot");
});

test("an announcement of no slots and no hunger is a worker that left; one with no slots that is hungry is a peer", () => {
  assert.equal(left({ hungry: false, slots: [] }), true);
  assert.equal(left({ hungry: true, slots: [] }), false);
  assert.equal(left({ hungry: false, slots: [0] }), false);
});

test("the leave tag is the Go pool's, names nothing, and is not the hint tag", () => {
  // internal/workerpool's leaveTag("files", "thumbs"), as Go computes it.
  assert.equal(leaveTag("files", "thumbs"), "ce3fd733220ff6c1");
  assert.notEqual(leaveTag("files", "thumbs"), hintTag("files", "thumbs"));
  assert.ok(!leaveTag("files", "thumbs").includes("files"));
});

test("a hint gate runs at once, then once at the end of its gap for every hint that came within it", async () => {
  const runs: number[] = [];
  let ran: () => void = () => {};
  const gate = new HintGate(80, () => {
    runs.push(performance.now());
    ran();
  });
  // The gate's timer does not hold the process open (a worker's other
  // timers and connections do): this one does, for the test.
  const alive = setInterval(() => {}, 1000);
  try {
    const t0 = performance.now();
    gate.take();
    assert.equal(runs.length, 1, "the first hint runs at once");
    const second = new Promise<void>((r) => (ran = r));
    for (let i = 0; i < 5; i++) gate.take();
    assert.equal(runs.length, 1, "hints within the gap wait");
    await second;
    assert.equal(runs.length, 2);
    assert.ok(runs[1]! - t0 >= 79, `the deferred run came ${runs[1]! - t0} ms after the first, within the gap`);
    // Stopped, a deferred run does not come: the next take after the gap
    // runs at once and is the only run.
    gate.take();
    gate.stop();
    const stoppedAt = performance.now();
    await new Promise<void>((r) => {
      ran = r;
      setTimeout(() => {
        gate.take();
      }, 100);
    });
    assert.equal(runs.length, 3);
    assert.ok(runs[2]! - stoppedAt >= 99, `a run ${runs[2]! - stoppedAt} ms after the stop, before the next take`);
  } finally {
    clearInterval(alive);
  }
});
