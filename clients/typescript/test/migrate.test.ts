import { test } from "node:test";
import assert from "node:assert/strict";
import { checkSchema, installScript, installedVersion, migrate, SCHEMA_VERSION, isPgqueError } from "../src/index.js";
import { testDb } from "./harness.js";

test("migrate installs a fresh database, then upgrades in place keeping data", async (t) => {
  const db = await testDb({ install: false, t });
  await assert.rejects(checkSchema(db.pool), (err) => isPgqueError(err, "not_installed"));

  const first = await migrate(db.pool);
  assert.deepEqual(first, { previous: "", version: SCHEMA_VERSION });
  await checkSchema(db.pool);

  await db.pool.query("select pgque.create_queue('keep')");
  await db.pool.query(`select pgque.send('keep', 't', '{"a":1}'::jsonb, null)`);
  const again = await migrate(db.pool);
  assert.deepEqual(again, { previous: SCHEMA_VERSION, version: SCHEMA_VERSION });
  const { rows } = await db.pool.query("select queue_name from pgque.get_queue_info('keep')");
  assert.deepEqual(rows, [{ queue_name: "keep" }]);
});

test("the bundled script is the schema version's", async (t) => {
  const script = await installScript();
  assert.match(script, new RegExp(`^-- pgque ${SCHEMA_VERSION.replace(/\./g, "\\.")} install script`));
  const db = await testDb({ t });
  assert.equal(await installedVersion(db.pool), SCHEMA_VERSION);
});
