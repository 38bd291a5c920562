package securitytest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgque/pgque/internal/testing/pgtest"
)

// Roles of the matrix. "public" stands for PUBLIC: a role with no pgque
// role granted.
const (
	rolePublic = "pgque_st_nobody"
	roleReader = "pgque_reader"
	roleWriter = "pgque_writer"
	roleAdmin  = "pgque_admin"
)

var matrixRoles = []string{rolePublic, roleReader, roleWriter, roleAdmin}

// fn is one public SQL function: who may call it (r reader, w writer, a
// admin; PUBLIC never), valid arguments against the fixture (SQL text),
// the positions that may be NULL, and bad-input cases.
type fn struct {
	roles    string
	args     []string
	nullable []int
	// nullAs: arguments whose NULL is rejected with another SQLSTATE than
	// the documented 22004 (known deviations, listed in docs/security.md;
	// "" means NULL is accepted).
	nullAs map[int]string
	cases  []badCase
}

// badCase calls the function with args and wants SQLSTATE want ("" for
// success).
type badCase struct {
	args []string
	want string
}

func bc(want string, args ...string) badCase { return badCase{args: args, want: want} }

// q1ID is the fixture's queue q1 by id.
const q1ID = "(select queue_id from pgque.queue where queue_name = 'q1')"

// tok is a well-formed lease token that proves no lease of the fixture.
const tok = "'00000000-0000-4000-8000-000000000001'"

// long is a 64-byte name, one over the limit.
var long = "'" + strings.Repeat("n", 64) + "'"

// functions is the explicit table of every function granted to a pgque
// role. TestFunctionTableCoversGrants fails when a function is granted
// without an entry here (or an entry names a function that is gone), so a
// new function cannot ship without its bad-input and privilege cases.
//
// The fixture: queue q1 with 3 events of key k1 ticked; plain consumer
// c1; slot consumer sc with 2 slots.
var functions = map[string]fn{
	// ---- engine
	"pgque.create_queue(text)": {roles: "a", args: []string{"'qnew'"}, cases: []badCase{
		bc("PQ010", "''"), bc("PQ010", long), bc("PQ010", "'a''b'"), bc("PQ010", "'a;b'"), bc("PQ010", "'$$'"),
		bc("PQ010", "'q#1'"), bc("PQ010", "'q/1'"), bc("PQ010", "' q'"), bc("PQ010", "'-q'"),
		bc("PQ010", `'''); drop table pgque.queue; --'`), bc("", "'q1'"),
	}},
	"pgque.drop_queue(text)":         {roles: "a", args: []string{"'q1'"}, cases: []badCase{bc("PQ001", "'nope'"), bc("PQ001", "''")}},
	"pgque.drop_queue(text,boolean)": {roles: "a", args: []string{"'q1'", "true"}, nullAs: map[int]string{1: "PQ011"}, cases: []badCase{bc("PQ001", "'nope'", "true")}},
	"pgque.insert_event(text,text,text)": {roles: "wa", args: []string{"'q1'", "'t'", "'d'"}, nullable: []int{1, 2},
		cases: []badCase{bc("PQ001", "'nope'", "'t'", "'d'"), bc("", "'q1'", "'$$'", "'''); drop table x; --'")}},
	"pgque.insert_event(text,text,text,text,text,text,text)": {roles: "wa",
		args: []string{"'q1'", "'t'", "'d'", "'k'", "'e2'", "'e3'", "'e4'"}, nullable: []int{1, 2, 3, 4, 5, 6}},
	"pgque.ticker()":              {roles: "a"},
	"pgque.ticker(text)":          {roles: "a", args: []string{"'q1'"}, cases: []badCase{bc("PQ001", "'nope'")}},
	"pgque.force_next_tick(text)": {roles: "a", args: []string{"'q1'"}, cases: []badCase{bc("PQ001", "'nope'")}},
	"pgque.register_consumer(text,text)": {roles: "a", args: []string{"'q1'", "'c2'"}, cases: []badCase{
		bc("PQ001", "'nope'", "'c2'"), bc("PQ010", "'q1'", "''"), bc("PQ010", "'q1'", long), bc("", "'q1'", "'c#0/2'"), // the engine (admin-only) accepts slot-style names
		bc("PQ010", "'q1'", "'c;drop'"),
	}},
	"pgque.unregister_consumer(text,text)": {roles: "a", args: []string{"'q1'", "'c1'"}, cases: []badCase{bc("PQ002", "'q1'", "'nope'")}},
	"pgque.next_batch(text,text)":          {roles: "a", args: []string{"'q1'", "'c1'"}, cases: []badCase{bc("PQ002", "'q1'", "'nope'")}},
	"pgque.get_batch_events(bigint)":       {roles: "a", args: []string{"1"}, cases: []badCase{bc("PQ020", "-1"), bc("PQ020", "9223372036854775807")}},
	"pgque.get_batch_cursor(bigint,text,integer,text)": {roles: "a", args: []string{"1", "'cur'", "10", "null"}, nullable: []int{3},
		nullAs: map[int]string{1: "PQ020", 2: "PQ020"},
		cases:  []badCase{bc("PQ020", "-1", "'cur'", "10", "null")}},
	"pgque.finish_batch(bigint)": {roles: "a", args: []string{"1"}, cases: []badCase{bc("PQ020", "-1")}},
	"pgque.event_retry(bigint,bigint,integer)": {roles: "a", args: []string{"1", "1", "10"}, nullAs: map[int]string{1: "PQ020"},
		cases: []badCase{bc("PQ020", "-1", "1", "10")}},
	"pgque.event_defer(bigint,bigint,text)": {roles: "a", args: []string{"1", "1", "'g'"}, nullAs: map[int]string{1: "PQ020", 2: "PQ020"},
		cases: []badCase{bc("PQ020", "-1", "1", "'g'")}},
	"pgque.event_undefer(text,text,text)": {roles: "a", args: []string{"'q1'", "'c1'", "'g'"},
		cases: []badCase{bc("PQ001", "'nope'", "'c1'", "'g'"), bc("PQ002", "'q1'", "'nope'", "'g'")}},
	"pgque.maint_retry_events()":  {roles: "a"},
	"pgque.maint()":               {roles: "a"},
	"pgque.version()":             {roles: "rwa"},
	"pgque.maint_route_indexes()": {roles: "a"},
	"pgque.rotation_blockers()":   {roles: "a"},
	"pgque.grant_queue(text,text,text)": {roles: "a", args: []string{"'q1'", "'pgque_reader'", "'consume'"},
		cases: []badCase{bc("PQ001", "'nope'", "'pgque_reader'", "'consume'"), bc("PQ011", "'q1'", "'no_such_role'", "'consume'"),
			bc("PQ011", "'q1'", "'pgque_reader'", "'own'"), bc("PQ011", "'q1'", "'pgque_reader''; drop table x; --'", "'consume'")}},
	"pgque.revoke_queue(text,text,text)": {roles: "a", args: []string{"'q1'", "'pgque_reader'", "'consume'"},
		cases: []badCase{bc("PQ001", "'nope'", "'pgque_reader'", "'consume'"), bc("PQ011", "'q1'", "'no_such_role'", "'consume'"),
			bc("PQ011", "'q1'", "'pgque_reader'", "'x'")}},
	"pgque.unconfine_queue(text,text)": {roles: "a", args: []string{"'q1'", "'produce'"},
		cases: []badCase{bc("PQ001", "'nope'", "'produce'"), bc("PQ011", "'q1'", "'x'")}},
	"pgque.announce_worker(text,text,text,boolean,integer[],interval)": {roles: "ra",
		args: []string{"'q1'", "'sc'", "'w1'", "false", "array[0]", "'3 s'"}, nullable: []int{5},
		cases: []badCase{bc("PQ034", "'q1'", "'nope'", "'w1'", "false", "'{}'", "'3 s'"), bc("PQ001", "'nope'", "'sc'", "'w1'", "false", "'{}'", "'3 s'"),
			bc("PQ011", "'q1'", "'sc'", "repeat('w', 201)", "false", "'{}'", "'3 s'"), bc("PQ011", "'q1'", "'sc'", "''", "false", "'{}'", "'3 s'"),
			bc("PQ011", "'q1'", "'sc'", "'w1'", "false", "array(select generate_series(0, 1100))", "'3 s'"),
			bc("PQ011", "'q1'", "'sc'", "'w1'", "false", "'{}'", "'10000 years -3599999 days'"),
			bc("PQ010", "'q1'", "'a;b'", "'w1'", "false", "'{}'", "'3 s'")}},
	"pgque._maint_after_hooks()": {roles: "a"},
	"pgque._run_ticker_end(integer)": {roles: "a", args: []string{"1"}, nullAs: map[int]string{0: "PQ011"},
		cases: []badCase{bc("PQ011", "0"), bc("PQ011", "3601"), bc("PQ011", "-1")}},
	"pgque._run_ticker_round(text,timestamp with time zone,timestamp with time zone,timestamp with time zone)": {roles: "a",
		args: []string{"'w'", "now()", "now()", "now()"}, nullable: []int{0, 1, 2, 3}},
	"pgque._run_ticker_round(text,timestamp with time zone,timestamp with time zone,timestamp with time zone,timestamp with time zone)": {roles: "a",
		args: []string{"'w'", "now()", "now()", "now()", "now()"}, nullable: []int{0, 1, 2, 3, 4}},
	"pgque.get_queue_info(text)": {roles: "rwa", args: []string{"'q1'"}, nullable: []int{0},
		cases: []badCase{bc("PQ001", "'nope'")}},
	"pgque.get_consumer_info(text,text)": {roles: "rwa", args: []string{"'q1'", "'c1'"}, nullable: []int{0, 1},
		cases: []badCase{bc("PQ001", "'nope'", "null")}},
	"pgque.set_queue_config(text,text,text)": {roles: "a", args: []string{"'q1'", "'max_retries'", "'3'"}, cases: []badCase{
		bc("PQ012", "'q1'", "'nope'", "'1'"), bc("PQ011", "'q1'", "'max_retries'", "'-1'"),
		bc("PQ011", "'q1'", "'max_retries'", "'abc'"), bc("PQ011", "'q1'", "'max_retries'", "'99999999999999'"),
		bc("PQ011", "'q1'", "'ticker_max_count'", "'0'"), bc("PQ011", "'q1'", "'ticker_max_lag'", "'-1 s'"),
		bc("PQ011", "'q1'", "'ticker_idle_period'", "'0'"), bc("PQ011", "'q1'", "'rotation_period'", "'-1 h'"),
		bc("PQ011", "'q1'", "'rotation_period'", "'soon'"), bc("PQ012", "'q1'", "'max_retries; drop table x'", "'1'"),
	}},
	"pgque.dlq_list(text,text,integer)": {roles: "ra", args: []string{"'q1'", "'c1'", "10"}, nullable: []int{1},
		nullAs: map[int]string{2: "PQ011"}, cases: []badCase{bc("PQ011", "'q1'", "null", "-1"), bc("PQ001", "'nope'", "null", "10")}},
	"pgque.dlq_replay(text,bigint)":        {roles: "a", args: []string{"'q1'", "1"}, nullAs: map[int]string{1: "PQ040"}, cases: []badCase{bc("PQ040", "'q1'", "-1")}},
	"pgque.dlq_replay_report(text,bigint)": {roles: "a", args: []string{"'q1'", "1"}, nullAs: map[int]string{1: "PQ040"}, cases: []badCase{bc("PQ040", "'q1'", "-1")}},
	"pgque.dlq_purge(text,text,interval)": {roles: "a", args: []string{"'q1'", "'c1'", "'0'"}, nullable: []int{1},
		nullAs: map[int]string{2: "PQ011"}, cases: []badCase{bc("PQ011", "'q1'", "null", "'-1 day'")}},
	"pgque.ticker_lead(text,interval)": {roles: "a", args: []string{"'w'", "'10 s'"}, nullAs: map[int]string{0: "PQ011", 1: "PQ011"}, cases: []badCase{
		bc("PQ011", "''", "'10 s'"), bc("PQ011", "'w'", "'0'"), bc("PQ011", "'w'", "'-1 s'"),
	}},
	"pgque.ticker_resign(text)": {roles: "a", args: []string{"'w'"}, nullAs: map[int]string{0: ""}},
	"pgque.start()":             {roles: "a"},
	"pgque.stop()":              {roles: "a"},
	"pgque.run_ticker(integer,text)": {roles: "a", args: []string{"0", "'w'"}, nullAs: map[int]string{0: "PQ011", 1: "PQ011"},
		cases: []badCase{bc("PQ011", "-1", "'w'")}},

	// ---- api
	"pgque.send(text,jsonb)": {roles: "wa", args: []string{"'q1'", `'{"a":1}'`},
		cases: []badCase{bc("PQ001", "'nope'", "'{}'"), bc("PQ001", "''", "'{}'"), bc("22P02", "'q1'", "'{'")}},
	"pgque.send(text,text,jsonb)": {roles: "wa", args: []string{"'q1'", "'t'", `'{"a":1}'`}, nullable: []int{1}},
	"pgque.send(text,text,jsonb,text,text)": {roles: "wa", args: []string{"'q1'", "'t'", `'{"a":1}'`, "'k'", "'d1'"}, nullable: []int{1, 3, 4},
		cases: []badCase{bc("", "'q1'", "'t'", "'{}'", `'''); drop table pgque.queue; --'`, "null"), bc("", "'q1'", "'t'", "'{}'", "'$$'", "null"),
			bc("", "'q1'", "'t'", "'{}'", "null", `'''); drop table pgque.dedup_0; --'`),
			bc("PQ063", "'q1'", "'t'", "'{}'", "null", "''"), bc("PQ063", "'q1'", "'t'", "'{}'", "null", "repeat('x', 513)"),
			bc("PQ001", "'nope'", "'t'", "'{}'", "null", "'d'")}},
	"pgque.send(text,text,text,text,text)": {roles: "wa", args: []string{"'q1'", "'t'", `'{"a":1}'`, "'k'", "'d3'"}, nullable: []int{3, 4},
		cases: []badCase{bc("22P02", "'q1'", "'t'", "'{'", "'k'", "null"), bc("22P02", "'q1'", "'t'", "'not json'", "'k'", "null"),
			bc("22P05", "'q1'", "'t'", `'"a\u0000b"'`, "'k'", "null"), bc("", "'q1'", "'t'", `'"a\\u0000b"'`, "'k'", "null"),
			bc("", "'q1'", "'t'", "'{}'", `'''); drop table pgque.queue; --'`, "null"),
			bc("PQ063", "'q1'", "'t'", "'{}'", "null", "''"), bc("PQ001", "'nope'", "'t'", "'{}'", "null", "null"),
			bc("PQ001", "'nope'", "'t'", "'{}'", "null", "'d'")}},
	"pgque.send_batch(text,text,text[],text[],text[])": {roles: "wa", args: []string{"'q1'", "'t'", `array['{"a":1}']`, "array['k']", "array['d4']"},
		nullable: []int{3, 4}, cases: []badCase{
			bc("PQ011", "'q1'", "'t'", `array['{}','{}']`, "array['k']", "null"),
			bc("22004", "'q1'", "'t'", `array['{}', null]`, "null", "null"),
			bc("22P02", "'q1'", "'t'", `array['{}', '{']`, "null", "null"),
			bc("22P02", "'q1'", "'t'", `array['{}', '{']`, "null", "array['d5', 'd6']"),
			bc("22P05", "'q1'", "'t'", `array['"\u0000"']`, "null", "null"),
			bc("", "'q1'", "'t'", `array[]::text[]`, "null", "null"),
			bc("PQ063", "'q1'", "'t'", `array['{}','{}']`, "null", "array['d', '']"),
			bc("PQ001", "'nope'", "'t'", `array['{}']`, "null", "null")}},
	"pgque.send_batch(text,text,jsonb[],text[],text[])": {roles: "wa", args: []string{"'q1'", "'t'", `array['{"a":1}']::jsonb[]`, "array['k']", "array['d2']"},
		nullable: []int{1, 3, 4}, cases: []badCase{
			bc("PQ011", "'q1'", "'t'", `array['{}','{}']::jsonb[]`, "array['k']", "null"),
			bc("22004", "'q1'", "'t'", `array['{}', null]::jsonb[]`, "null", "null"),
			bc("", "'q1'", "'t'", `array[]::jsonb[]`, "null", "null"),
			bc("PQ011", "'q1'", "'t'", `array['{}','{}']::jsonb[]`, "null", "array['d']"),
			bc("PQ063", "'q1'", "'t'", `array['{}','{}']::jsonb[]`, "null", "array['d', '']"),
			bc("", "'q1'", "'t'", `array['{}','{}']::jsonb[]`, "null", "array['d', null]"),
		}},
	"pgque.send_batch(text,text[],text[],text[],text[])": {roles: "wa", args: []string{"'q1'", "array['t', 'u']", `array['{"a":1}', '[]']`, "array['k', null]", "array['d7', null]"},
		nullable: []int{3, 4}, cases: []badCase{
			bc("PQ011", "'q1'", "array['t']", `array['{}','{}']`, "null", "null"),
			bc("PQ011", "'q1'", "array['t', 'u']", `array['{}','{}']`, "array['k']", "null"),
			bc("22004", "'q1'", "array['t', null]", `array['{}','{}']`, "null", "null"),
			bc("22004", "'q1'", "array['t', 'u']", `array['{}', null]`, "null", "null"),
			bc("22P02", "'q1'", "array['t', 'u']", `array['{}', '{']`, "null", "null"),
			bc("22P02", "'q1'", "array['t', 'u']", `array['{}', '{']`, "null", "array['d8', 'd9']"),
			bc("22P05", "'q1'", "array['t']", `array['"\u0000"']`, "null", "null"),
			bc("", "'q1'", "array[]::text[]", `array[]::text[]`, "null", "null"),
			bc("", "'q1'", `array['$$', '''); drop table pgque.queue; --']`, `array['{}','{}']`, "null", "null"),
			bc("PQ063", "'q1'", "array['t', 'u']", `array['{}','{}']`, "null", "array['d', '']"),
			bc("PQ001", "'nope'", "array['t']", `array['{}']`, "null", "null")}},
	"pgque.send_batch(text,text[],jsonb[],text[],text[])": {roles: "wa", args: []string{"'q1'", "array['t', 'u']", `array['{"a":1}', '[]']::jsonb[]`, "array['k', null]", "array['d10', null]"},
		nullable: []int{3, 4}, cases: []badCase{
			bc("PQ011", "'q1'", "array['t', 'u', 'v']", `array['{}','{}']::jsonb[]`, "null", "null"),
			bc("22004", "'q1'", "array[null, 'u']", `array['{}','{}']::jsonb[]`, "null", "null"),
			bc("22004", "'q1'", "array['t', 'u']", `array['{}', null]::jsonb[]`, "null", "null"),
			bc("", "'q1'", "array[]::text[]", `array[]::jsonb[]`, "null", "null"),
			bc("PQ011", "'q1'", "array['t', 'u']", `array['{}','{}']::jsonb[]`, "null", "array['d']"),
			bc("", "'q1'", "array['t', 'u']", `array['{}','{}']::jsonb[]`, "null", "array['d', null]"),
		}},
	// Table attachment. The fixture's st_files is owned by pgque_admin (the
	// caller needs the TRIGGER privilege) and attached to q1; st_gone was
	// attached and its triggers dropped, so forgetting it succeeds.
	"pgque.attach_table(text,regclass,text,text[],text[],text[],text,boolean)": {roles: "a",
		args:     []string{"'q1'", "'public.st_files'", "'tenant'", "array['insert']", "null", "null", "null", "true"},
		nullable: []int{4, 5, 6}, nullAs: map[int]string{3: "PQ011"},
		cases: []badCase{
			bc("42703", "'q1'", "'public.st_files'", `'''); drop table pgque.queue; --'`, "array['insert']", "null", "null", "null", "true"),
			bc("42703", "'q1'", "'public.st_files'", "'tenant'", "array['insert']", `array['id', 'x"; drop']`, "null", "null", "true"),
			bc("PQ011", "'q1'", "'public.st_files'", "'tenant'", "array['insert; drop table x']", "null", "null", "null", "true"),
			bc("PQ001", "'nope'", "'public.st_files'", "'tenant'", "array['insert']", "null", "null", "null", "true"),
			bc("PQ011", "'q1'", "'pgque.queue'", "'queue_name'", "array['insert']", "null", "null", "null", "true"),
		}},
	"pgque.detach_table(text,regclass)": {roles: "a", args: []string{"'q1'", "'public.st_files'"},
		cases: []badCase{bc("PQ061", "'q1'", "'public.st_plain'"), bc("PQ001", "'nope'", "'public.st_files'")}},
	"pgque.attached_tables()": {roles: "a"},
	"pgque._table_source_record(text,regclass,text,text[],text[],text[],text,boolean)": {roles: "a",
		args:     []string{"'q1'", "'public.st_files'", "'tenant'", "array['insert']", "null", "null", "null", "true"},
		nullable: []int{4, 5, 6},
		cases:    []badCase{bc("42703", "'q1'", "'public.st_files'", `'a"; drop table x; --'`, "array['insert']", "null", "null", "null", "true")}},
	// The invoker helpers that put the triggers on and take them off: the
	// caller's own rights on the table decide.
	"pgque._table_source_hook(integer,regclass,text[],text,text[],text[],text,boolean)": {roles: "a",
		args:     []string{q1ID, "'public.st_files'", "array['insert']", "'tenant'", "null", "null", "null", "true"},
		nullable: []int{4, 5, 6},
		cases: []badCase{
			bc("PQ011", q1ID, "'public.st_files'", "array['insert; drop table x']", "'tenant'", "null", "null", "null", "true"),
			bc("PQ011", q1ID, "'public.st_files'", "'{}'", "'tenant'", "null", "null", "null", "true"),
		}},
	"pgque._table_source_unhook(integer,regclass)": {roles: "a", args: []string{q1ID, "'public.st_files'"}},
	"pgque._table_source_trigger_name(text)": {roles: "a", args: []string{"'q1'"},
		cases: []badCase{bc("PQ001", "'nope'")}},
	"pgque._table_source_forget(text,regclass)": {roles: "a", args: []string{"'q1'", "'public.st_gone'"}, nullAs: map[int]string{1: "PQ061"},
		cases: []badCase{bc("PQ061", "'q1'", "'public.st_plain'"), bc("PQ062", "'q1'", "'public.st_files'")}},
	"pgque.subscribe(text,text)":   {roles: "ra", args: []string{"'q1'", "'c3'"}, cases: []badCase{bc("PQ010", "'q1'", "'c#1/2'"), bc("PQ001", "'nope'", "'c3'")}},
	"pgque.unsubscribe(text,text)": {roles: "ra", args: []string{"'q1'", "'c1'"}, cases: []badCase{bc("", "'q1'", "'nope'")}}, // idempotent
	"pgque.receive(text,text,integer)": {roles: "ra", args: []string{"'q1'", "'c1'", "10"}, cases: []badCase{
		bc("PQ011", "'q1'", "'c1'", "0"), bc("PQ011", "'q1'", "'c1'", "-1"), bc("PQ033", "'q1'", "'sc#0/2'", "10"),
		bc("PQ002", "'q1'", "'nope'", "10"),
	}},
	"pgque.receive_raw(text,text,integer,bigint)": {roles: "ra", args: []string{"'q1'", "'c1'", "10", "null"}, nullable: []int{3},
		cases: []badCase{
			bc("PQ011", "'q1'", "'c1'", "0", "null"), bc("PQ033", "'q1'", "'sc#0/2'", "10", "null"),
			bc("PQ002", "'q1'", "'nope'", "10", "null"), bc("PQ020", "'q1'", "'c1'", "10", "-1"),
		}},
	"pgque.ack(bigint)": {roles: "ra", args: []string{"1"}, cases: []badCase{bc("PQ020", "-1")}},
	"pgque.complete_in_tx(text,text,bigint,bigint)": {roles: "ra", args: []string{"'q1'", "'c1'", "1", "1"},
		cases: []badCase{
			bc("PQ033", "'q1'", "'sc#0/2'", "1", "1"), bc("PQ002", "'q1'", "'nope'", "1", "1"),
			bc("PQ039", "'q1'", "'c1'", "-1", "1"),
		}},
	"pgque.nack(bigint,bigint,interval,text)": {roles: "ra", args: []string{"1", "1", "'1 s'", "'r'"}, nullable: []int{3},
		nullAs: map[int]string{1: "PQ020", 2: "PQ020"},
		cases:  []badCase{bc("PQ020", "-1", "1", "'1 s'", "null")}},

	// ---- partition
	"pgque.subscribe_slot(text,text,integer,integer)": {roles: "ra", args: []string{"'q1'", "'sc'", "0", "2"}, cases: []badCase{
		bc("PQ011", "'q1'", "'sd'", "-1", "2"), bc("PQ011", "'q1'", "'sd'", "2", "2"), bc("PQ011", "'q1'", "'sd'", "0", "0"),
		bc("PQ011", "'q1'", "'sd'", "0", "-5"), bc("PQ011", "'q1'", "'sd'", "0", "2147483647"),
		bc("PQ030", "'q1'", "'sc'", "0", "3"), bc("PQ010", "'q1'", "'s#d'", "0", "2"),
	}},
	"pgque.subscribe_slot(text,text,integer,integer,text)": {roles: "ra", args: []string{"'q1'", "'sc'", "0", "2", "'pause'"},
		nullable: []int{4}, cases: []badCase{bc("PQ011", "'q1'", "'se'", "0", "2", "'wait'")}},
	"pgque.unsubscribe_slot(text,text,integer,integer)": {roles: "ra", args: []string{"'q1'", "'sc'", "1", "2"},
		cases: []badCase{bc("PQ030", "'q1'", "'sc'", "1", "4"), bc("PQ011", "'q1'", "'sc'", "5", "2")}},
	"pgque.claim_slot(text,text,integer,text,interval,uuid,integer)": {roles: "ra",
		args:     []string{"'q1'", "'sc'", "0", "'w1'", "'30 s'", tok, "pg_backend_pid()"},
		nullable: []int{5, 6}, nullAs: map[int]string{1: "PQ034", 4: "PQ011"}, cases: []badCase{
			bc("PQ011", "'q1'", "'sc'", "0", "'w1'", "'30 s'", "null", "2147483647"), bc("PQ011", "'q1'", "'sc'", "0", "'w1'", "'30 s'", "null", "-1"),
			bc("PQ011", "'q1'", "'sc'", "0", "'w1'", "'0'"), bc("PQ011", "'q1'", "'sc'", "0", "'w1'", "'-1 s'"),
			bc("PQ011", "'q1'", "'sc'", "0", "'w1'", "'1000 years'"), bc("PQ011", "'q1'", "'sc'", "0", "''", "'30 s'"),
			bc("PQ011", "'q1'", "'sc'", "0", "repeat('w', 201)", "'30 s'"), bc("PQ011", "'q1'", "'sc'", "2", "'w1'", "'30 s'"),
			bc("PQ011", "'q1'", "'sc'", "-1", "'w1'", "'30 s'"), bc("PQ034", "'q1'", "'nope'", "0", "'w1'", "'30 s'"),
			bc("", "'q1'", "'sc'", "1", `'''); drop table pgque.slot_lease; --'`, "'30 s'"),
			bc("22P02", "'q1'", "'sc'", "0", "'w1'", "'30 s'", "'not-a-token'"),
		}},
	"pgque.release_slot(text,text,integer,text,uuid)": {roles: "ra", args: []string{"'q1'", "'sc'", "0", "'w1'", tok}, nullAs: map[int]string{1: "PQ034"},
		cases: []badCase{bc("PQ085", "'q1'", "'sc'", "0", "'not-owner'", tok)}},
	"pgque.receive_partitioned(text,text,integer,integer,text,uuid,integer)": {roles: "ra",
		args: []string{"'q1'", "'sc'", "0", "2", "'w1'", tok, "10"}, nullAs: map[int]string{1: "PQ034", 6: "PQ085"}, cases: []badCase{
			bc("PQ085", "'q1'", "'sc'", "0", "2", "'not-owner'", tok, "10"), bc("PQ030", "'q1'", "'sc'", "0", "3", "'w1'", tok, "10"),
		}},
	"pgque.receive_partitioned_raw_slots(text,text,text,integer,integer[],integer[],uuid[],bigint[],bigint[],bigint[])": {roles: "ra",
		args: []string{"'q1'", "'sc'", "'w1'", "10", "'{0}'", "'{2}'", "array[" + tok + "]::uuid[]", "null", "null", "null"}, nullable: []int{7, 8, 9},
		nullAs: map[int]string{1: "PQ034", 3: "PQ085"}, cases: []badCase{
			bc("PQ085", "'q1'", "'sc'", "'not-owner'", "10", "'{0}'", "'{2}'", "array["+tok+"]::uuid[]", "null", "null", "null"),
			// Names with quotes, a newline and $$ are values all the way down.
			bc("PQ085", "'q1'", "'sc'", "E'w''1\\n$$ drop table pgque.slot_lease; $$'", "10", "'{0}'", "'{2}'", "array["+tok+"]::uuid[]", "null", "null", "null"),
			bc("PQ034", "'q1'", "E's''c\\n$$'", "'w1'", "10", "'{0}'", "'{2}'", "array["+tok+"]::uuid[]", "null", "null", "null"),
			bc("22023", "'q1'", "'sc'", "'w1'", "10", "'{0,1}'", "'{2}'", "array["+tok+"]::uuid[]", "null", "null", "null"),
			bc("22023", "'q1'", "'sc'", "'w1'", "10", "'{0}'", "'{2}'", "array["+tok+"]::uuid[]", "'{1,2}'", "'{1,2}'", "'{1,2}'"),
			bc("22023", "'q1'", "'sc'", "'w1'", "10", "'{0,0}'", "'{2,2}'", "array["+tok+", "+tok+"]::uuid[]", "null", "null", "null"),
			bc("22023", "'q1'", "'sc'", "'w1'", "10", "'{{0}}'", "'{2}'", "array["+tok+"]::uuid[]", "null", "null", "null"),
			bc("", "'q1'", "'sc'", "'w1'", "10", "'{}'", "'{}'", "'{}'::uuid[]", "null", "null", "null"),
		}},
	"pgque.receive_partitioned_raw(text,text,integer,integer,text,uuid,integer,bigint,bigint,bigint)": {roles: "ra",
		args: []string{"'q1'", "'sc'", "0", "2", "'w1'", tok, "10", "null", "null", "null"}, nullable: []int{7, 8, 9},
		nullAs: map[int]string{1: "PQ034", 6: "PQ085"}, cases: []badCase{
			bc("PQ085", "'q1'", "'sc'", "0", "2", "'not-owner'", tok, "10", "null", "null", "null"),
			bc("PQ030", "'q1'", "'sc'", "0", "3", "'w1'", tok, "10", "null", "null", "null"),
			bc("PQ085", "'q1'", "'sc'", "0", "2", "'w1'", "'00000000-0000-4000-8000-000000000002'", "10", "1", "1", "1"),
			// The arguments _hold_lease tests before it calls the checks.
			bc("PQ011", "'q1'", "'sc'", "0", "2", "''", tok, "10", "null", "null", "null"),
			bc("PQ011", "'q1'", "'sc'", "0", "2", "repeat('w', 201)", tok, "10", "null", "null", "null"),
			bc("PQ011", "'q1'", "'sc'", "-1", "2", "'w1'", tok, "10", "null", "null", "null"),
			bc("PQ011", "'q1'", "'sc'", "2", "2", "'w1'", tok, "10", "null", "null", "null"),
			bc("PQ011", "'q1'", "'sc'", "0", "0", "'w1'", tok, "10", "null", "null", "null"),
			bc("PQ011", "'q1'", "'sc'", "0", "1025", "'w1'", tok, "10", "null", "null", "null"),
		}},
	"pgque.nack_partitioned(text,text,integer,integer,text,uuid,bigint,interval,text)": {roles: "ra",
		args: []string{"'q1'", "'sc'", "0", "2", "'w1'", tok, "1", "'1 s'", "'r'"}, nullable: []int{8},
		nullAs: map[int]string{1: "PQ034", 6: "PQ085", 7: "PQ085"},
		cases:  []badCase{bc("PQ085", "'q1'", "'sc'", "0", "2", "'not-owner'", tok, "1", "'1 s'", "null")}},
	"pgque.hold_key_partitioned(text,text,integer,integer,text,uuid,bigint,bigint,text,bigint)": {roles: "ra",
		args: []string{"'q1'", "'sc'", "0", "2", "'w1'", tok, "1", "1", "'k1'", "1"}, nullable: []int{8}, nullAs: map[int]string{1: "PQ034"},
		cases: []badCase{bc("PQ085", "'q1'", "'sc'", "0", "2", "'not-owner'", tok, "1", "1", "'k1'", "1")}},
	"pgque.hold_keys_partitioned(text,text,integer,integer,text,uuid,bigint,bigint,text[],bigint[])": {roles: "ra",
		args: []string{"'q1'", "'sc'", "0", "2", "'w1'", tok, "1", "1", "'{k1}'", "'{1}'"}, nullAs: map[int]string{1: "PQ034"},
		cases: []badCase{
			bc("PQ085", "'q1'", "'sc'", "0", "2", "'not-owner'", tok, "1", "1", "'{k1}'", "'{1}'"),
			bc("PQ011", "'q1'", "'sc'", "0", "2", "'w1'", tok, "1", "1", "'{k1}'", "'{1,2}'"),
			bc("PQ011", "'q1'", "'sc'", "0", "2", "'w1'", tok, "1", "1", "'{{k1}}'", "'{{1}}'"),
			bc("22004", "'q1'", "'sc'", "0", "2", "'w1'", tok, "1", "1", "'{k1}'", "'{null}'"),
		}},
	"pgque.settle_held_partitioned(text,text,integer,integer,text,uuid,bigint,text,bigint,bigint[],bigint[],interval[],text[])": {roles: "ra",
		args:     []string{"'q1'", "'sc'", "0", "2", "'w1'", tok, "1", "'k1'", "1", "'{}'", "'{}'", "'{}'", "'{}'"},
		nullable: []int{7, 9, 10, 11, 12}, nullAs: map[int]string{1: "PQ034"},
		cases: []badCase{
			bc("PQ085", "'q1'", "'sc'", "0", "2", "'not-owner'", tok, "1", "'k1'", "1", "'{}'", "'{}'", "'{}'", "'{}'"),
			bc("PQ011", "'q1'", "'sc'", "0", "2", "'w1'", tok, "1", "'k1'", "1", "'{}'", "'{1}'", "'{}'", "'{}'"),
			bc("PQ011", "'q1'", "'sc'", "0", "2", "'w1'", tok, "1", "'k1'", "1", "'{}'", "'{1}'", "'{-1 s}'", "'{r}'"),
			bc("22004", "'q1'", "'sc'", "0", "2", "'w1'", tok, "1", "'k1'", "1", "'{}'", "'{null}'", "'{1 s}'", "'{r}'"),
		}},
	"pgque.release_stale_holds_partitioned(text,text,integer,integer,text,uuid)": {roles: "ra",
		args: []string{"'q1'", "'sc'", "0", "2", "'w1'", tok}, nullAs: map[int]string{1: "PQ034"},
		cases: []badCase{bc("PQ085", "'q1'", "'sc'", "0", "2", "'not-owner'", tok)}},
	"pgque.complete_partitioned_in_tx(text,text,integer,integer,text,uuid,bigint,bigint,bigint)": {roles: "ra",
		args: []string{"'q1'", "'sc'", "0", "2", "'w1'", tok, "1", "1", "1"}, nullAs: map[int]string{1: "PQ034"},
		cases: []badCase{
			bc("PQ085", "'q1'", "'sc'", "0", "2", "'not-owner'", tok, "1", "1", "1"),
			bc("PQ030", "'q1'", "'sc'", "0", "3", "'w1'", tok, "1", "1", "1"),
		}},
	"pgque.ack_partitioned(text,text,integer,integer,text,uuid,bigint,bigint,bigint)": {roles: "ra",
		args: []string{"'q1'", "'sc'", "0", "2", "'w1'", tok, "1", "1", "1"}, nullAs: map[int]string{1: "PQ034"},
		cases: []badCase{bc("PQ085", "'q1'", "'sc'", "0", "2", "'not-owner'", tok, "1", "1", "1")}},
	"pgque.nack_partitioned(text,text,integer,integer,text,uuid,bigint,bigint,bigint,interval,text)": {roles: "ra",
		args: []string{"'q1'", "'sc'", "0", "2", "'w1'", tok, "1", "1", "1", "'1 s'", "'r'"}, nullable: []int{10},
		nullAs: map[int]string{1: "PQ034", 9: "PQ085"},
		cases:  []badCase{bc("PQ085", "'q1'", "'sc'", "0", "2", "'not-owner'", tok, "1", "1", "1", "'1 s'", "null")}},
	"pgque.set_failure_policy(text,text,text)": {roles: "a", args: []string{"'q1'", "'sc'", "'pause'"}, nullAs: map[int]string{1: "PQ034", 2: "PQ011"}, cases: []badCase{
		bc("PQ011", "'q1'", "'sc'", "'retry'"), bc("PQ034", "'q1'", "'nope'", "'pause'"),
	}},
	"pgque.resize_slots(text,text,integer)": {roles: "a", args: []string{"'q1'", "'sc'", "4"}, cases: []badCase{
		bc("PQ071", "'q1'", "'nope'", "4"), bc("PQ072", "'q1'", "'sc'", "2"), bc("PQ011", "'q1'", "'sc'", "0"),
		bc("PQ011", "'q1'", "'sc'", "1025"), bc("PQ001", "'nope'", "'sc'", "4"), bc("PQ010", "'q1'", "'sc#0/2'", "4"),
	}},
	"pgque.resize_status(text)": {roles: "rwa", args: []string{"'q1'"}, nullable: []int{0},
		cases: []badCase{bc("PQ001", "'nope'")}},
	"pgque.slot_group_info(text,text)": {roles: "ra", args: []string{"'q1'", "'sc'"}, nullAs: map[int]string{1: "PQ034"},
		cases: []badCase{bc("PQ034", "'q1'", "'nope'"), bc("PQ001", "'nope'", "'sc'")}},
	"pgque.blocked_keys(text,text)": {roles: "ra", args: []string{"'q1'", "'sc'"}, nullable: []int{1},
		cases: []badCase{bc("PQ001", "'nope'", "null"), bc("PQ034", "'q1'", "'nope'")}},
	"pgque.unblock_key(text,text,text)": {roles: "a", args: []string{"'q1'", "'sc'", "'k1'"}, nullable: []int{2}, nullAs: map[int]string{1: "PQ036"},
		cases: []badCase{bc("PQ036", "'q1'", "'sc'", "'k1'"), bc("PQ034", "'q1'", "'nope'", "'k1'")}},
	"pgque.retry_key_now(text,text,text)": {roles: "a", args: []string{"'q1'", "'sc'", "'k1'"}, nullable: []int{2}, nullAs: map[int]string{1: "PQ036"},
		cases: []badCase{bc("PQ036", "'q1'", "'sc'", "'k1'"), bc("PQ034", "'q1'", "'nope'", "'k1'")}},
	// The key views read only; a NULL slot means every slot.
	"pgque.key_heads(text,text,integer,integer,integer)": {roles: "rwa", args: []string{"'q1'", "'sc'", "0", "10", "1000"},
		nullable: []int{2}, nullAs: map[int]string{1: "PQ034"}, cases: []badCase{
			bc("PQ001", "'nope'", "'sc'", "null", "10", "10"), bc("PQ034", "'q1'", "'nope'", "null", "10", "10"),
			bc("PQ011", "'q1'", "'sc'", "2", "10", "10"), bc("PQ011", "'q1'", "'sc'", "null", "0", "10"),
			bc("PQ011", "'q1'", "'sc'", "null", "10", "0"), bc("PQ011", "'q1'", "'sc'", "null", "10001", "10"),
		}},
	"pgque.key_shares(text,text,integer)": {roles: "rwa", args: []string{"'q1'", "'sc'", "1000"}, nullAs: map[int]string{1: "PQ034"},
		cases: []badCase{bc("PQ034", "'q1'", "'c1'", "10"), bc("PQ011", "'q1'", "'sc'", "-1")}},
	"pgque.hot_keys(text,interval,integer,integer)": {roles: "rwa", args: []string{"'q1'", "'1 minute'", "10", "1000"},
		cases: []badCase{bc("PQ001", "'nope'", "'1 minute'", "10", "10"), bc("PQ011", "'q1'", "'-1 s'", "10", "10"),
			bc("PQ011", "'q1'", "'2 days'", "10", "10"), bc("PQ011", "'q1'", "'1 minute'", "0", "10")}},
	"pgque.slot_heads(text,text)": {roles: "rwa", args: []string{"'q1'", "'sc'"}, nullAs: map[int]string{1: "PQ034"},
		cases: []badCase{bc("PQ001", "'nope'", "'sc'"), bc("PQ034", "'q1'", "'c1'")}},
	// slot_of validates N like the other slot functions; a NULL key is the
	// NULL key (slot 0).
	"pgque.slot_of(text,integer)": {roles: "ra", args: []string{"'k'", "2"}, nullable: []int{0},
		cases: []badCase{bc("PQ011", "'k'", "0"), bc("PQ011", "'k'", "-3"), bc("PQ011", "'k'", "5000")}},
	// The view partition_slot_status calls it with the caller's rights, so
	// every role that may read the view may call it.
	// Internal, yet callable directly (the views call it with the caller's
	// rights): it validates slot and N like the public slot functions.
	// The slot views call it with the caller's rights; an unknown queue id
	// (or NULL) may not be read.
	"pgque._may_read(integer)": {roles: "rwa", args: []string{"1"}, nullAs: map[int]string{0: ""}},
	"pgque._slot_pending(integer,integer,integer)": {roles: "rwa", args: []string{"1", "0", "2"}, nullAs: map[int]string{0: ""},
		cases: []badCase{bc("PQ011", "1", "0", "0"), bc("PQ011", "1", "2", "2"), bc("PQ011", "1", "-1", "2")}},
	// c1 was subscribed by an earlier transaction: PQ011, whoever calls.
	"pgque.rewind_new_subscription(text,text)": {roles: "ra", args: []string{"'q1'", "'c1'"},
		cases: []badCase{bc("PQ011", "'q1'", "'c1'"), bc("PQ002", "'q1'", "'nobody'"), bc("PQ001", "'nope'", "'c1'"),
			bc("PQ010", "'q1'", "'sc#0/2'"), bc("PQ010", "'q1'", "'%'")}},
	"pgque.events_before_subscription(text,text)": {roles: "rwa", args: []string{"'q1'", "'c1'"},
		cases: []badCase{bc("", "'q1'", "'sc'"), bc("PQ002", "'q1'", "'nobody'"), bc("PQ001", "'nope'", "'c1'"), bc("PQ002", "'q1'", "'_'")}},
	// The same view's counts of held events and blocked keys: counts only.
	"pgque._slot_held(integer)": {roles: "rwa", args: []string{"1"}, nullAs: map[int]string{0: ""}},
	"pgque._session_gone(integer)": {roles: "rwa", args: []string{"pg_backend_pid()"}, nullAs: map[int]string{0: ""},
		cases: []badCase{bc("", "-1"), bc("", "2147483647")}},
}

// fixture creates the objects the valid arguments refer to.
const fixture = `
select pgque.create_queue('q1');
select pgque.subscribe('q1', 'c1');
select pgque.subscribe_slot('q1', 'sc', s, 2) from generate_series(0, 1) s;
select pgque.send('q1', 't', '{"a":1}'::jsonb, 'k1') from generate_series(1, 3);
select pgque.force_next_tick('q1');
select pgque.ticker('q1');
create table public.st_files (id integer primary key, tenant text);
alter table public.st_files owner to pgque_admin;
select pgque.attach_table('q1', 'public.st_files', 'tenant');
create table public.st_gone (id integer primary key, tenant text);
create table public.st_plain (id integer primary key, tenant text);
select pgque.attach_table('q1', 'public.st_gone', 'tenant');
select pgque._table_source_unhook(queue_id, 'public.st_gone') from pgque.queue where queue_name = 'q1';
`

// setupDB returns a fresh installed database with the fixture and the
// PUBLIC stand-in role.
func setupDB(t *testing.T) (string, *pgx.Conn) {
	t.Helper()
	dsn := pgtest.NewInstalledDB(t)
	conn := pgtest.Conn(t, dsn)
	ctx := context.Background()
	if _, err := conn.Exec(ctx, fixture); err != nil {
		t.Fatal("fixture:", err)
	}
	// Cluster-wide role: create it once, tolerate a concurrent creator.
	_, _ = conn.Exec(ctx, `do $$ begin
		if not exists (select 1 from pg_roles where rolname = '`+rolePublic+`') then
			create role `+rolePublic+` nologin;
		end if;
	exception when unique_violation or duplicate_object then null; end $$`)
	return dsn, conn
}

// grantedFunctions lists the functions of schema pgque that PUBLIC or any
// pgque role may execute, as regprocedure text. Trigger functions are left
// out: they cannot be called except as a trigger, and
// TestTableSourceTriggerFunctions checks their privileges.
func grantedFunctions(t *testing.T, conn *pgx.Conn) []string {
	t.Helper()
	return queryNames(t, conn, `
		select p.oid::regprocedure::text from pg_proc p
		 where p.pronamespace = 'pgque'::regnamespace
		   and p.prorettype <> 'trigger'::regtype
		   and (has_function_privilege('pgque_reader', p.oid, 'execute')
		     or has_function_privilege('pgque_writer', p.oid, 'execute')
		     or has_function_privilege('pgque_admin', p.oid, 'execute')
		     or has_function_privilege('`+rolePublic+`', p.oid, 'execute'))
		 order by 1`)
}

// queryNames runs a query of one text column and returns its rows.
func queryNames(t *testing.T, conn *pgx.Conn, sql string, args ...any) []string {
	t.Helper()
	rows, err := conn.Query(context.Background(), sql, args...)
	if err != nil {
		t.Fatal(err)
	}
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	return names
}

func TestFunctionTableCoversGrants(t *testing.T) {
	_, conn := setupDB(t)
	granted := grantedFunctions(t, conn)
	for _, f := range granted {
		if _, ok := functions[f]; !ok {
			t.Errorf("function %s is granted but has no entry in the functions table of securitytest: add its roles and bad-input cases", f)
		}
	}
	for _, f := range slices.Sorted(maps.Keys(functions)) {
		if !slices.Contains(granted, f) {
			t.Errorf("functions table names %s, which is not granted to any pgque role (gone or renamed?)", f)
		}
	}
}

// argTypes returns the argument types of a regprocedure text.
func argTypes(sig string) []string {
	inner := sig[strings.Index(sig, "(")+1 : len(sig)-1]
	if inner == "" {
		return nil
	}
	return strings.Split(inner, ",")
}

func fnName(sig string) string { return sig[:strings.Index(sig, "(")] }

// call builds the statement calling sig with args (cast to the declared
// types so overloads resolve).
func call(sig string, args []string) string {
	types := argTypes(sig)
	parts := make([]string, len(args))
	for i, a := range args {
		parts[i] = "(" + a + ")::" + types[i]
	}
	if procedures[sig] {
		return "call " + fnName(sig) + "(" + strings.Join(parts, ", ") + ")"
	}
	return "select * from " + fnName(sig) + "(" + strings.Join(parts, ", ") + ")"
}

// procedures are called with CALL.
var procedures = map[string]bool{"pgque.run_ticker(integer,text)": true}

// sqlstate runs stmt in a transaction that is rolled back, as role (""
// for the connection's own), and returns the SQLSTATE ("" on success).
func sqlstate(t *testing.T, conn *pgx.Conn, role, stmt string, autocommit ...bool) (string, string) {
	t.Helper()
	ctx := context.Background()
	if len(autocommit) > 0 && autocommit[0] {
		_, err := conn.Exec(ctx, stmt, pgx.QueryExecModeSimpleProtocol)
		return pgState(t, stmt, err)
	}
	tx, err := conn.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "set local statement_timeout = '20s'"); err != nil {
		t.Fatal(err)
	}
	if role != "" {
		if _, err := tx.Exec(ctx, "set local role "+role); err != nil {
			t.Fatal(err)
		}
	}
	// The simple protocol: a plan cached under one role (with an immutable
	// function folded to a constant) must not answer for another.
	rows, err := tx.Query(ctx, stmt, pgx.QueryExecModeSimpleProtocol)
	if err == nil {
		for rows.Next() {
		}
		rows.Close()
		err = rows.Err()
	}
	return pgState(t, stmt, err)
}

// pgState returns err's SQLSTATE and message ("" for nil); other errors
// fail the test.
func pgState(t *testing.T, stmt string, err error) (string, string) {
	t.Helper()
	var pgErr *pgconn.PgError
	switch {
	case err == nil, errors.Is(err, pgx.ErrNoRows):
		return "", ""
	case errors.As(err, &pgErr):
		return pgErr.Code, pgErr.Message
	default:
		t.Fatalf("%s: %v", stmt, err)
		return "", ""
	}
}

// TestRoleMatrixFunctions: each role may execute exactly the functions the
// table (and docs/security.md) gives it; the others get 42501 when they
// call, before any argument is looked at.
func TestRoleMatrixFunctions(t *testing.T) {
	_, conn := setupDB(t)
	letter := map[string]string{roleReader: "r", roleWriter: "w", roleAdmin: "a"}
	for _, sig := range slices.Sorted(maps.Keys(functions)) {
		spec := functions[sig]
		for _, role := range matrixRoles {
			allowed := letter[role] != "" && strings.Contains(spec.roles, letter[role])
			var has bool
			if err := conn.QueryRow(context.Background(), `select has_function_privilege($1, $2::regprocedure, 'execute')`,
				role, sig).Scan(&has); err != nil {
				t.Fatal(err)
			}
			if has != allowed {
				t.Errorf("%s: %s may execute = %v, want %v", sig, role, has, allowed)
			}
			if sig == "pgque.run_ticker(integer,text)" && allowed {
				continue // runs for its argument's seconds; the privilege check above suffices
			}
			code, msg := sqlstate(t, conn, role, call(sig, spec.args))
			if allowed && code == "42501" {
				t.Errorf("%s as %s: permission denied although granted: %s", sig, role, msg)
			}
			if !allowed && code != "42501" {
				t.Errorf("%s as %s: SQLSTATE %q (%s), want 42501", sig, role, code, msg)
			}
		}
	}
}

// tableCounts returns the row count of every table in schema pgque
// (event tables included), to show that a failed call wrote nothing.
func tableCounts(t *testing.T, conn *pgx.Conn) map[string]int64 {
	t.Helper()
	ctx := context.Background()
	rows, err := conn.Query(ctx, `select c.oid::regclass::text from pg_class c
		where c.relnamespace = 'pgque'::regnamespace and c.relkind = 'r' order by 1`)
	if err != nil {
		t.Fatal(err)
	}
	tables, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	var parts []string
	for _, tb := range tables {
		parts = append(parts, fmt.Sprintf("select '%s', count(*) from %s", tb, tb))
	}
	out := map[string]int64{}
	rows, err = conn.Query(ctx, strings.Join(parts, " union all "))
	if err != nil {
		t.Fatal(err)
	}
	var name string
	var n int64
	if _, err := pgx.ForEachRow(rows, []any{&name, &n}, func() error { out[name] = n; return nil }); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestBadInputs calls every function with a NULL in each argument that may
// not be NULL (22004) and with its bad-input cases, as the superuser so the
// checks themselves are reached; a failing call must leave every pgque
// table as it was.
func TestBadInputs(t *testing.T) {
	_, conn := setupDB(t)
	before := tableCounts(t, conn)
	for _, sig := range slices.Sorted(maps.Keys(functions)) {
		spec := functions[sig]
		var cases []badCase
		for i := range spec.args {
			if slices.Contains(spec.nullable, i) {
				continue
			}
			args := slices.Clone(spec.args)
			args[i] = "null"
			want := "22004"
			if w, ok := spec.nullAs[i]; ok {
				want = w
			}
			cases = append(cases, badCase{args: args, want: want})
		}
		cases = append(cases, spec.cases...)
		for _, c := range cases {
			stmt := call(sig, c.args)
			if sig == "pgque.run_ticker(integer,text)" && c.want == "" {
				continue
			}
			// Cases that must fail run in autocommit, so that anything
			// they wrote before failing would stay; successes roll back.
			code, msg := sqlstate(t, conn, "", stmt, c.want != "")
			if code != c.want {
				t.Errorf("%s: SQLSTATE %q (%s), want %q", stmt, code, msg, c.want)
			}
			if c.want != "" {
				if after := tableCounts(t, conn); !maps.Equal(before, after) {
					t.Errorf("%s failed but changed table counts: before %v after %v", stmt, before, after)
					before = after
				}
			}
		}
	}
}

// TestTableSourceTriggerFunctions: the trigger functions of table
// attachments are the only trigger functions granted to a pgque role:
// _table_source_capture is SECURITY INVOKER (it evaluates the table's
// types, as the writer), _table_source_emit SECURITY DEFINER; both pin
// search_path, are executable only by pgque_admin (which attach_table
// needs to create the triggers), and cannot be called directly. No
// per-attachment function exists.
func TestTableSourceTriggerFunctions(t *testing.T) {
	_, conn := setupDB(t)
	rows, err := conn.Query(context.Background(), `
		select p.oid::regprocedure::text, p.prosecdef, coalesce(array_to_string(p.proconfig, ','), ''),
		       has_function_privilege('pgque_reader', p.oid, 'execute'), has_function_privilege('pgque_writer', p.oid, 'execute'),
		       has_function_privilege('pgque_admin', p.oid, 'execute'), has_function_privilege('`+rolePublic+`', p.oid, 'execute')
		  from pg_proc p where p.pronamespace = 'pgque'::regnamespace and p.prorettype = 'trigger'::regtype
		   and (has_function_privilege('pgque_admin', p.oid, 'execute') or has_function_privilege('`+rolePublic+`', p.oid, 'execute'))
		 order by 1`)
	if err != nil {
		t.Fatal(err)
	}
	type trg struct {
		Sig                   string
		Definer               bool
		Config                string
		Reader, Writer, Admin bool
		Public                bool
	}
	got, err := pgx.CollectRows(rows, pgx.RowToStructByPos[trg])
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]bool{"pgque._table_source_capture()": false, "pgque._table_source_emit()": true}
	if len(got) != len(want) {
		t.Fatalf("granted trigger functions %+v, want exactly %v", got, want)
	}
	for _, g := range got {
		definer, ok := want[g.Sig]
		if !ok || g.Definer != definer || g.Config != "search_path=pg_catalog, pg_temp" || g.Reader || g.Writer || !g.Admin || g.Public {
			t.Errorf("%+v: want SECURITY DEFINER %v, search_path pinned, executable by pgque_admin only", g, definer)
		}
		if code, _ := sqlstate(t, conn, "", "select "+g.Sig); code != "0A000" {
			t.Errorf("calling %s directly: SQLSTATE %q, want 0A000", g.Sig, code)
		}
	}
	var n int
	if err := conn.QueryRow(context.Background(), `select count(*) from pg_proc
		 where pronamespace = 'pgque'::regnamespace and proname like '\_src\_%'`).Scan(&n); err != nil || n != 0 {
		t.Fatalf("%d per-attachment functions (%v), want none", n, err)
	}
}
