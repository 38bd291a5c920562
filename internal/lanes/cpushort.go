package lanes

import (
	"runtime/metrics"
	"sync"
	"time"
)

// The inline run's thresholds grow with the chunks running inline per CPU
// (Slot.slow), because on a process short of CPU a fast handler's wall
// time includes waiting for its turn. A handler that waits on I/O (a
// service, another database) takes no CPU while it waits: sixteen slots of
// such handlers on two CPUs are not short of CPU, and growing the
// thresholds eightfold kept each slot's chunk on one goroutine, its events
// one after another (at 500 events/s and 20 ms handlers, p50 latency
// 19.8 ms and p99 65.8 ms, against 12.2 and 32.3 ms without the growth;
// docs/benchmarks.md, "Handlers that take real time"). So the thresholds
// grow only while the process's goroutines actually wait for a CPU, as
// the Go scheduler reports it.

// schedSampleEvery is how often schedProbe reads the scheduler's latency
// histogram; between reads it answers from the last one.
const schedSampleEvery = 50 * time.Millisecond

// schedWaitLong is a wait for a CPU that counts as long: a runnable
// goroutine that waited this long had no CPU to go to.
const schedWaitLong = time.Millisecond

// schedShortShare: the process is short of CPU when at least one in
// schedShortShare of its goroutines' waits to run since the last read
// were long.
const schedShortShare = 10

// schedProbe tells whether the process's goroutines have been waiting for
// a CPU lately, from runtime/metrics' /sched/latencies:seconds.
type schedProbe struct {
	mu     sync.Mutex
	at     time.Time
	prev   []uint64
	short  bool
	sample [1]metrics.Sample
}

func newSchedProbe() *schedProbe {
	p := &schedProbe{}
	p.sample[0].Name = "/sched/latencies:seconds"
	return p
}

// cpuShort reports whether at least one in schedShortShare of the
// goroutine waits to run since the last read (at most schedSampleEvery
// ago) lasted schedWaitLong or more.
func (p *schedProbe) cpuShort(now time.Time) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.at.IsZero() && now.Sub(p.at) < schedSampleEvery {
		return p.short
	}
	p.at = now
	metrics.Read(p.sample[:])
	if p.sample[0].Value.Kind() != metrics.KindFloat64Histogram {
		return false // a runtime without the metric: as if never short
	}
	h := p.sample[0].Value.Float64Histogram()
	p.short = schedShort(p.prev, h.Counts, h.Buckets)
	p.prev = append(p.prev[:0], h.Counts...)
	return p.short
}

// schedShort reports whether the waits counted between prev and cur (the
// counts of a cumulative histogram whose bucket i holds waits from
// buckets[i] seconds up to buckets[i+1]) hold at least one long wait in
// schedShortShare. No earlier read (prev of another length) counts
// everything since the start.
func schedShort(prev, cur []uint64, buckets []float64) bool {
	var all, long uint64
	for i, c := range cur {
		if len(prev) == len(cur) {
			c -= prev[i]
		}
		all += c
		if buckets[i] >= schedWaitLong.Seconds() {
			long += c
		}
	}
	return all > 0 && long*schedShortShare >= all
}
