// Package workerpool runs one process's share of a partitioned consumer: it
// claims slot leases, runs one goroutine per claimed slot, keeps the leases
// alive, fences slots it lost, and converges with the other processes on an
// even spread of slots. The algorithm and the goroutine inventory are
// described in docs/worker-pool.md.
//
// The package knows nothing about handlers or messages: the work done on a
// slot is a WorkFunc that processes one chunk under a held lease.
package workerpool
