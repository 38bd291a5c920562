// The package loads the way a project that installed it loads it: through
// its exports map, by import from an ES module and by require from
// CommonJS (Node.js 20.19 and later load an ES module from require). A
// project's node_modules/pgque is a link to the package directory here, as
// a file: dependency makes it.

import { test } from "node:test";
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import path from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const pkgDir = path.resolve(path.dirname(fileURLToPath(import.meta.url)), "../..");

test("the package loads by import from ESM and by require from CommonJS", (t) => {
  const project = mkdtempSync(path.join(tmpdir(), "pgque-entry-"));
  t.after(() => rmSync(project, { recursive: true, force: true }));
  mkdirSync(path.join(project, "node_modules"));
  symlinkSync(pkgDir, path.join(project, "node_modules", "pgque"), "dir");
  const probe = "[typeof p.work, typeof p.workTx, typeof p.send, typeof p.migrate, typeof p.Ticker].join(',')";
  writeFileSync(path.join(project, "a.mjs"), `import * as p from "pgque"; console.log(${probe});\n`);
  writeFileSync(path.join(project, "a.cjs"), `const p = require("pgque"); console.log(${probe});\n`);
  const want = "function,function,function,function,function";
  for (const file of ["a.mjs", "a.cjs"]) {
    const out = execFileSync(process.execPath, [file], { cwd: project, encoding: "utf8" }).trim();
    assert.equal(out, want, `${file}: the package's exports as loaded`);
  }
});

// A name the package exports is API: the guide says what it is for, or the
// name is internal and stays out of the package's entry.
test("every name the package exports is in the guide", async () => {
  const guide = readFileSync(path.resolve(pkgDir, "../../docs/typescript.md"), "utf8");
  const names = Object.keys(await import(pathToFileURL(path.join(pkgDir, "dist/src/index.js")).href));
  assert.ok(names.length > 40, `only ${names.length} exports found`);
  assert.deepEqual(names.filter((n) => !new RegExp(`\\b${n}\\b`).test(guide)).sort(), []);
});
