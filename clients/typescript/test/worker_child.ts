// A worker process for the crash tests: works (queue, consumer) of the
// database given as argv[2..4] with a 2 s lease and prints
// "handling <id> <epoch>" when a handler starts; handlers never return,
// so the process is in the middle of its chunk when the test kills it.

import pg from "pg";
import { work } from "../src/index.js";

const [url, queue, consumer] = process.argv.slice(2) as [string, string, string];
const pool = new pg.Pool({ connectionString: url, max: 4 });
await work(pool, { queue, consumer, slots: 1, leaseTtlMs: 2000, claimIntervalMs: 100, pollIntervalMs: 50, listen: false }, async (m) => {
  process.stdout.write(`handling ${m.id} ${m.epoch}\n`);
  await new Promise(() => {});
});
process.stdout.write("started\n");
