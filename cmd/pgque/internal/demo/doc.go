// Package demo is the workload behind `pgque demo`: the multi-tenant file
// service pgque was designed for, run end to end and checked.
//
// Producers emit FileCreated, FileOverwritten and FileDeleted events for many
// tenants with PartitionKey = tenant. Each tenant's events form a valid
// lifecycle (a file is created before it is overwritten or deleted) and
// carry a per-tenant sequence number 1, 2, 3, ... A pool of partitioned
// workers — several "processes", each its own pgque.Client with its own
// worker id, sharing the N slots of one consumer — applies every event to a
// per-tenant state table (pgque_demo.files) inside the handler, through one
// SQL function that also logs the application (pgque_demo.applied). A
// Ticker runs beside them.
//
// # Strict and lenient runs
//
// Without injected failures the run is strict: the apply function refuses an
// event whose sequence number is not exactly the tenant's last + 1, or that
// breaks the file lifecycle, and the demo stops at once and fails. That is
// the guarantee under test (G1: per-key order; G2: one worker per key).
//
// With --failure-rate > 0 the handler fails that fraction of first
// deliveries before applying anything, and the library redelivers them.
// The workers then run under the pause policy (see pausePolicy): a tenant
// whose event failed is held until that event succeeds on its retry, so
// the run stays strict: every tenant's events are applied exactly in order,
// failures or not.
//
// The apply function also has a lenient mode, for a run under the skip
// policy (pausePolicy 0), where later events of a tenant may overtake a
// failed one: it is then idempotent and order-insensitive (each file keeps
// the state of its highest applied sequence number, and an event already
// applied is not applied twice), and every application that overtook a
// later one is counted as a reorder and reported, not failed.
//
// # Verification
//
// After the workers drained the queue, the demo checks, from the database:
// every (tenant, seq) the producers sent was applied exactly once and
// nothing else was; in a strict run every tenant's applications were in
// order 1..n, in a lenient run the reorders are counted; the final state of
// every file equals the state the producers computed; no two workers ever
// handled events of one tenant at the same time (checked in memory, across
// the worker processes); no event was dead-lettered. Run returns
// ErrVerificationFailed when any check fails.
package demo
