// `npm test`: runs every compiled test file with node's test runner against
// one PostgreSQL: PGQUE_TEST_DSN when it is set, else a throwaway cluster
// started here and stopped at the end. Each test file makes its own
// database in it (see harness.ts). Extra arguments go to `node --test`
// (e.g. `npm test -- --test-name-pattern=ticker`, or
// `--test-concurrency=1` for one file at a time).

import { spawnSync } from "node:child_process";
import { readdirSync } from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import { startCluster } from "./cluster.js";

const here = path.dirname(fileURLToPath(import.meta.url));

async function main(): Promise<number> {
  const env = { ...process.env };
  let stop = () => {};
  if (!env.PGQUE_TEST_DSN) {
    const cluster = await startCluster();
    stop = cluster.stop;
    env.PGQUE_TEST_DSN = cluster.url("postgres");
  }
  try {
    const files = readdirSync(here, { recursive: true, encoding: "utf8" })
      .filter((f) => f.endsWith(".test.js"))
      .sort()
      .map((f) => path.join(here, f));
    // Two files at a time: each has its own database, and most of a file's
    // time is spent waiting on the server or on a fault it injected, so a
    // 2-core machine ran the suite in 116 s against 166 s one at a time
    // (node's default there).
    const args = process.argv.slice(2);
    if (!args.some((a) => a.startsWith("--test-concurrency"))) args.unshift("--test-concurrency=2");
    const r = spawnSync(process.execPath, ["--test", ...args, ...files], { env, stdio: "inherit" });
    return r.status ?? 1;
  } finally {
    stop();
  }
}

process.exitCode = await main();
