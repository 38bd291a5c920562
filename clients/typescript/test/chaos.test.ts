// A short mixed chaos run: `pgque chaos` (cmd/pgque, run with the Go
// toolchain) with Go and TypeScript worker processes on one consumer,
// every fault kind injected (kill -9 of workers of both languages,
// SIGSTOP, Postgres restarts, PgBouncer kills, online resizes, ticker and
// producer kills), and the checker's verdict: nothing lost, no G1, G2 or
// G3 violation. The TypeScript workers run dist/test/chaos_worker.js, so
// this runs after `npm run build` (as `npm test` does).

import { test } from "node:test";
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, "../../../..");
const script = path.join(here, "chaos_worker.js");
const haveGo = spawnSync("go", ["version"]).status === 0;

interface Summary {
  drained: boolean;
  faults: Record<string, number>;
  report: { committed: number; successes: number; violations: unknown[] | null; by_guarantee: Record<string, number> };
  workers: number;
  ts_workers: number;
  ts_successes: number;
  ts_kills: number;
  claims: number;
  ts_claims?: number;
}

test("chaos: a mixed Go and TypeScript consumer group under every fault loses nothing and breaks no guarantee", { skip: haveGo ? false : "the Go toolchain is not on PATH", timeout: 15 * 60_000 }, async () => {
  const runDir = path.join(mkdtempSync(path.join(tmpdir(), "pgque-ts-chaos-")), "run");
  const args = ["run", "./cmd/pgque", "chaos", "-duration", "40s", "-fault-interval", "2500ms", "-drain-timeout", "90s",
    "-workers", "2", "-ts-workers", "2", "-ts-worker", script, "-rate", "100", "-keys", "32", "-seed", "38", "-run-dir", runDir];
  // The chaos run starts a cluster of its own (Postgres restarts need it).
  const env = { ...process.env };
  delete env.PGQUE_TEST_DSN;
  const child = spawn("go", args, { cwd: repo, env, stdio: ["ignore", "pipe", "pipe"] });
  let out = "";
  child.stdout.on("data", (b) => (out += b));
  child.stderr.on("data", (b) => (out += b));
  const code = await new Promise<number | null>((r) => child.on("exit", r));
  const sumFile = path.join(runDir, "summary.json");
  assert.ok(existsSync(sumFile), `no summary (exit ${code}):\n${out}`);
  const sum = JSON.parse(readFileSync(sumFile, "utf8")) as Summary;
  const story = `\n${out}\n(records in ${runDir})`;
  assert.equal(code, 0, `pgque chaos exited ${code}${story}`);
  assert.deepEqual(sum.report.violations ?? [], [], story);
  assert.deepEqual(sum.report.by_guarantee, {}, story);
  assert.ok(sum.drained, `the workers did not drain the queue${story}`);
  assert.ok(sum.report.committed >= 500, `only ${sum.report.committed} events committed${story}`);
  assert.equal(sum.ts_workers, 2);
  assert.ok(sum.ts_successes > 0 && sum.ts_successes < sum.report.successes, `both languages handled events (TypeScript ${sum.ts_successes} of ${sum.report.successes})${story}`);
  assert.ok(sum.ts_kills >= 1, `a TypeScript worker was killed${story}`);
  assert.ok((sum.ts_claims ?? 0) >= 2 && sum.claims > sum.ts_claims!, `both languages logged their claims (TypeScript ${sum.ts_claims} of ${sum.claims})${story}`);
  const kinds = ["worker-kill", "worker-stop", "pg-restart", "ticker-kill", "producer-kill", "resize"];
  if (existsSync("/usr/sbin/pgbouncer")) kinds.push("pgbouncer-kill");
  for (const k of kinds) assert.ok((sum.faults[k] ?? 0) > 0, `no ${k} fault was injected${story}`);
});

test("pgque chaos refuses TypeScript workers it cannot start", { skip: haveGo ? false : "the Go toolchain is not on PATH", timeout: 5 * 60_000 }, () => {
  const missing = path.join(tmpdir(), "pgque-no-such-dir", "chaos_worker.js");
  const r = spawnSync("go", ["run", "./cmd/pgque", "chaos", "-duration", "1s", "-ts-workers", "1", "-ts-worker", missing],
    { cwd: repo, encoding: "utf8" });
  assert.equal(r.status, 1, r.stderr);
  assert.match(r.stderr, /TypeScript workers need the built package/);
  assert.match(r.stderr, /no such file or directory/);
});
