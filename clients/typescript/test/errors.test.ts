import { test } from "node:test";
import assert from "node:assert/strict";
import { installScript, kindOf, mapError, PgqueError, RETRY_DELAY_MS_MAX, RetryAfterError, retryAfter } from "../src/index.js";

// SQLSTATEs the SQL raises that have no kind of their own, as in the Go
// library: PQ050 (no free subscription id) and PQ051 (a fifth distinct
// slot count) are capacity errors a program cannot act on by kind, and
// PQ099 never leaves the function that raises it.
const unmapped = new Set(["PQ050", "PQ051", "PQ099"]);

test("every pgque SQLSTATE the install script raises maps to a kind", async () => {
  const script = await installScript();
  const codes = new Set([...script.matchAll(/errcode\s*=\s*'(PQ\d{3})'/g)].map((m) => m[1]!));
  assert.ok(codes.size > 20, `only ${codes.size} codes found: the pattern no longer matches the SQL`);
  const missing = [...codes].filter((c) => !unmapped.has(c) && kindOf(c) === "database").sort();
  assert.deepEqual(missing, []);
});

test("mapError keeps the driver error and chooses the kind by SQLSTATE alone", () => {
  const driver = Object.assign(new Error("some wording that may change"), { code: "PQ032" });
  const err = mapError("acknowledging", driver);
  assert.ok(err instanceof PgqueError);
  assert.equal(err.kind, "lease_lost");
  assert.equal(err.code, "PQ032");
  assert.equal(err.cause, driver);
  assert.match(err.message, /^acknowledging: some wording that may change \(SQLSTATE PQ032\)$/);

  // The server's detail says what was wrong where the message only says what failed.
  const detailed = Object.assign(new Error("invalid input syntax for type json"), { code: "22P02", detail: 'Token "not" is invalid.' });
  assert.equal((mapError("sending", detailed) as Error).message,
    'sending: invalid input syntax for type json: Token "not" is invalid (SQLSTATE 22P02)');

  const refused = Object.assign(new Error("connect ECONNREFUSED"), { code: "ECONNREFUSED" });
  assert.equal(mapError("sending", refused), refused, "an error that never reached the database is kept as is");
  assert.equal(kindOf("XX000"), "database");
});

test("RetryAfterError refuses a delay that is no number, and names swapped arguments", () => {
  const err = new Error("rate limited");
  const ok = new RetryAfterError(5000, err);
  assert.equal(ok.delayMs, 5000);
  assert.equal(ok.cause, err);
  assert.equal(retryAfter(err, 250).delayMs, 250);
  assert.equal(new RetryAfterError(-1).delayMs, 0, "a delay that is not positive retries at once");
  assert.equal(new RetryAfterError(NaN).delayMs, 0);
  // The server refuses a retry past 30 days, and with it the settle of the event's chunk.
  assert.equal(RETRY_DELAY_MS_MAX, 30 * 24 * 3600 * 1000);
  assert.equal(retryAfter(err, 31 * 24 * 3600 * 1000).delayMs, RETRY_DELAY_MS_MAX);
  assert.equal(new RetryAfterError(Infinity).delayMs, RETRY_DELAY_MS_MAX);
  // A JavaScript caller (or an `any`) can swap them; that must not read as "retry at once".
  const swapped = RetryAfterError as unknown as new (a: unknown, b?: unknown) => RetryAfterError;
  assert.throws(() => new swapped(err, 5000), (e: unknown) =>
    e instanceof TypeError && /delayMs must be a number/.test(e.message) && /swapped/.test(e.message));
  assert.throws(() => new swapped("5000"), (e: unknown) =>
    e instanceof TypeError && /not string/.test(e.message) && !/swapped/.test(e.message));
});
