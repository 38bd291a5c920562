// Package partitiontest holds the guarantee tests of pgque's partition
// layer, each named after the guarantee it pins (G1, G2 and the rest are
// stated in docs/guarantees.md): T-G1a, T-G1b,
// T-retry-affinity, T-G2-block, T-G2-parallel, T-no-drop, T-security,
// T-N-invariant, T-lease, T-fencing, T-no-bloat, T-engine-untouched and
// T-idempotent-install, plus the plain API's refusal of slot subscriptions,
// empty slot batches, partition_slot_status and the protocol through
// PgBouncer in transaction mode.
//
// The tests speak SQL to a real PostgreSQL (internal/testing/pgtest), each in a
// database of its own, so they pin the SQL contract itself rather than a Go
// wrapper. Ticks are made deterministic with force_next_tick followed by
// ticker in one transaction. Expected values never come from the code under
// test: slots are pinned literals (computed once with plain SQL) or computed
// with PostgreSQL's hashtextextended alone.
package partitiontest
