// A TypeScript worker and a Go worker pool (testdata/tsinterop, built with
// the Go toolchain) working one consumer at once: they share its slots,
// and every event is handled once, each key's events in order and never
// two of a key at a time, whichever language handled them.

import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { createInterface } from "node:readline";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { work, type Message } from "../src/index.js";
import { waitFor } from "./harness.js";
import { sendKeyed, setup } from "./worker_helpers.js";

const repo = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../../../..");
const haveGo = spawnSync("go", ["version"]).status === 0;

test("a TypeScript worker and a Go pool share one consumer without breaking G1 or G2", { skip: haveGo ? false : "the Go toolchain is not on PATH" }, async (t) => {
  const bin = path.join(mkdtempSync(path.join(tmpdir(), "pgque-ts-")), "tsinterop");
  const built = spawnSync("go", ["build", "-o", bin, "./testdata/tsinterop"], { cwd: repo, stdio: ["ignore", "inherit", "inherit"] });
  assert.equal(built.status, 0, "building testdata/tsinterop");

  const db = await setup(t, "mix");
  await db.pool.query("create sequence ts_interop_seq; create table ts_interop (key text, id bigint, who text, began bigint, ended bigint)");
  const record = async (m: Message) => {
    const { rows } = await db.pool.query<{ b: string }>("select nextval('ts_interop_seq')::text as b");
    await db.pool.query("insert into ts_interop values ($1, $2, 'ts', $3, nextval('ts_interop_seq'))", [m.key, m.id, rows[0]!.b]);
  };
  const opts = { queue: "mix", consumer: "c", slots: 4, claimIntervalMs: 100, pollIntervalMs: 50, leaseTtlMs: 2000, listen: false as const };
  const ts = db.track(await work(db.pool, opts, record));

  const child = spawn(bin, [db.url, "mix", "c", "4"], { stdio: ["ignore", "pipe", "inherit"] });
  t.after(() => {
    if (child.exitCode === null) child.kill("SIGKILL");
  });
  await new Promise<void>((resolve, reject) => {
    createInterface({ input: child.stdout! }).on("line", (l) => l === "started" && resolve());
    child.on("exit", (code) => reject(new Error(`the Go pool exited (${code}) before starting`)));
  });
  // Both hold slots: the TypeScript worker gave up its excess to the
  // hungry Go pool (or the other way round).
  await waitFor("both workers to hold slots", async () => {
    const { rows } = await db.pool.query("select count(distinct owner)::int as n from pgque.partition_slot_leases where owner is not null");
    return rows[0].n === 2 && ts.ownedSlots().length > 0;
  }, 20_000);

  const keys = Array.from({ length: 30 }, (_, i) => `tenant-${i}`);
  const ids = await sendKeyed(db.pool, "mix", keys, 10);
  await waitFor("every event handled", async () => {
    const { rows } = await db.pool.query("select count(*)::int as n from ts_interop");
    return rows[0].n >= ids.length;
  }, 60_000);
  const exited = new Promise((r) => child.on("exit", r));
  child.kill("SIGTERM");
  await Promise.all([ts.stop(), exited]);

  const { rows } = await db.pool.query<{ key: string; id: string; who: string; began: string; ended: string }>(
    "select key, id::text, who, began::text, ended::text from ts_interop order by ts_interop.began");
  assert.deepEqual(rows.map((r) => r.id).sort(), [...ids].sort(), "each event handled exactly once");
  assert.ok(rows.some((r) => r.who === "go") && rows.some((r) => r.who === "ts"), "both languages handled events");
  const last = new Map<string, { id: bigint; ended: bigint }>();
  for (const r of rows) {
    const prev = last.get(r.key);
    if (prev) {
      const story = () => JSON.stringify(rows.filter((x) => x.key === r.key));
      assert.ok(BigInt(r.id) > prev.id, `G1: key ${r.key} handled ${r.id} after ${prev.id}: ${story()}`);
      assert.ok(BigInt(r.began) > prev.ended, `G2: key ${r.key} event ${r.id} began before ${prev.id} ended: ${story()}`);
    }
    last.set(r.key, { id: BigInt(r.id), ended: BigInt(r.ended) });
  }
});
