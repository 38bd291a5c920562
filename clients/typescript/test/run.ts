// `npm test`: runs every compiled test file with node's test runner against
// one PostgreSQL: PGQUE_TEST_DSN when it is set, else a throwaway cluster
// started here and stopped at the end. Each test file makes its own
// database in it (see harness.ts). Extra arguments go to `node --test`
// (e.g. `npm test -- --test-name-pattern=ticker`).

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
    const r = spawnSync(process.execPath, ["--test", ...process.argv.slice(2), ...files], { env, stdio: "inherit" });
    return r.status ?? 1;
  } finally {
    stop();
  }
}

process.exitCode = await main();
