// A file-indexing service on pgque, with one npm dependency and no Go: an
// HTTP endpoint records a tenant's file changes and sends their events in
// the same transaction; a worker pool applies them in order per tenant; an
// in-process ticker cuts batches. Three logins, as in docs/typescript.md:
// MIGRATE_URL owns the database, DATABASE_URL is files_app (pgque_writer
// and pgque_reader), TICKER_URL is files_ticker (pgque_admin).
import { readFile } from "node:fs/promises";
import http from "node:http";
import { json } from "node:stream/consumers";
import pg from "pg";
import { createQueue, migrate, sendBatch, Ticker, work } from "pgque";

const owner = new pg.Pool({ connectionString: process.env.MIGRATE_URL });
await migrate(owner); // install or upgrade pgque, then the service's own tables
await owner.query(await readFile(new URL("../schema.sql", import.meta.url), "utf8"));
await createQueue(owner, "files");
await owner.end();

const app = new pg.Pool({ connectionString: process.env.DATABASE_URL });
const tickerDb = new pg.Pool({ connectionString: process.env.TICKER_URL });
const ticker = new Ticker(tickerDb);
await ticker.start(); // one leader among every ticker of the database
const worker = await work<{ path: string }>(app, { queue: "files", consumer: "indexer", slots: 8, failurePolicy: "pause",
    onHandled: (m, { error }) => error && console.error(`event ${m.id} of ${m.key} failed (retry ${m.retryCount}):`, error) },
  async ({ key, id, type, payload: { path } }) => {
    await app.query(`with log as (insert into applied (tenant, ev_id, type) values ($1, $3, $4))
      ${type === "FileDeleted" ? "delete from files where tenant = $1 and path = $2"
        : "insert into files values ($1, $2, 1) on conflict (tenant, path) do update set version = files.version + 1"}`,
      [key, path, id, type]);
  });

type Change = { type: "FileCreated" | "FileOverwritten" | "FileDeleted"; path: string };
const server = http.createServer(async (req, res) => {
  const client = await app.connect();
  try {
    const { requestId, tenant, changes } = (await json(req)) as { requestId: string; tenant: string; changes: Change[] };
    await client.query("begin");
    const ids = await sendBatch(client, "files", changes.map(({ type, path }) => ({ type, payload: { path }, partitionKey: tenant })));
    await client.query("insert into requests values ($1, $2, $3)", [requestId, tenant, ids]); // a repeated id rolls back
    await client.query("commit");
    res.writeHead(201).end(JSON.stringify(ids));
  } catch (err) {
    await client.query("rollback");
    res.writeHead((err as { code?: string }).code === "23505" ? 409 : 500).end(String(err));
  } finally {
    client.release();
  }
}).listen(Number(process.env.PORT ?? 8080), () => console.log(`listening on ${JSON.stringify(server.address())}`));

process.once("SIGTERM", async () => {
  await new Promise((done) => server.close(done)); // finish the requests in flight
  await worker.stop({ timeoutMs: 20_000 }); // finish, acknowledge, release the slots
  await ticker.stop(); // resign: another instance's ticker leads at once
  await Promise.all([app.end(), tickerDb.end()]);
  console.log("stopped"); // and the process exits: nothing is left running
});
