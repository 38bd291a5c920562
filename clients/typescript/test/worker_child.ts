// A worker process for the crash tests: works (queue, consumer) of the
// database given as argv[2..4] with a 2 s lease and prints
// "handling <id> <epoch>" when a handler starts; handlers never return,
// so the process is in the middle of its chunk when the test kills it.
// With argv[5] "listen" it listens for wake-ups (its leases are then bound
// to its LISTEN session) under the default 30 s lease instead.

import pg from "pg";
import { work } from "../src/index.js";

const [url, queue, consumer, mode] = process.argv.slice(2) as [string, string, string, string | undefined];
const pool = new pg.Pool({ connectionString: url, max: 4 });
const listen = mode === "listen";
await work(pool, { queue, consumer, slots: 1, leaseTtlMs: listen ? undefined : 2000, claimIntervalMs: 100, pollIntervalMs: 50, listen: listen ? undefined : false }, async (m) => {
  process.stdout.write(`handling ${m.id} ${m.epoch}\n`);
  await new Promise(() => {});
});
process.stdout.write("started\n");
