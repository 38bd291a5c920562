package demo

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"
)

// Result is what a run measured and what its checks found.
type Result struct {
	Tenants     int     `json:"tenants"`
	Slots       int     `json:"slots"`
	Workers     int     `json:"workers"`
	FailureRate float64 `json:"failure_rate"`
	// Rate is the production cap, 0 when unthrottled.
	Rate float64 `json:"rate"`
	// Policy is the failure policy the workers ran with.
	Policy string `json:"policy"`
	// Strict is true when per-tenant order was required exactly (no
	// injected failures, or a pause policy).
	Strict   bool   `json:"strict"`
	Database string `json:"database"`

	// Sent is the number of events produced; Applied the number of
	// distinct (tenant, seq) applied exactly once; Files the number of
	// files in the final state.
	Sent    int `json:"sent"`
	Applied int `json:"applied"`
	Files   int `json:"files"`

	// ProduceElapsed is how long producing took; Elapsed is from the first
	// send until the last event was handled.
	ProduceElapsed time.Duration `json:"produce_elapsed_ns"`
	Elapsed        time.Duration `json:"elapsed_ns"`
	// ProduceRate and Throughput are Sent / ProduceElapsed and Applied /
	// Elapsed, in events per second.
	ProduceRate float64 `json:"produce_rate"`
	Throughput  float64 `json:"throughput"`
	// Latency is from the producer's commit to the start of the event's
	// first delivery to a handler.
	Latency Latency `json:"latency"`

	InjectedFailures int64 `json:"injected_failures"`
	// Reorders counts applications that came after a later event of the
	// same tenant (only after retries, and only under the skip policy).
	Reorders int `json:"reorders"`
	// Duplicates counts redeliveries of events already applied (skipped by
	// the idempotent apply).
	Duplicates int64 `json:"duplicates"`
	// PerWorker is how many events each worker process handled.
	PerWorker map[string]int64 `json:"per_worker"`

	Checks []Check `json:"checks"`
	// Passed is true when every check passed.
	Passed bool `json:"passed"`
}

// Check is one verification.
type Check struct {
	Name   string `json:"name"`
	OK     bool   `json:"ok"`
	Detail string `json:"detail"`
}

// Latency holds percentiles of a latency distribution.
type Latency struct {
	Count int           `json:"count"`
	P50   time.Duration `json:"p50_ns"`
	P95   time.Duration `json:"p95_ns"`
	P99   time.Duration `json:"p99_ns"`
	Max   time.Duration `json:"max_ns"`
}

func newResult(o *Options) *Result {
	return &Result{Tenants: o.Tenants, Slots: o.Slots, Workers: o.Workers, FailureRate: o.FailureRate, Rate: o.Rate,
		PerWorker: map[string]int64{}, Passed: true}
}

func (r *Result) pass(name, detail string) {
	r.Checks = append(r.Checks, Check{Name: name, OK: true, Detail: detail})
}

func (r *Result) fail(name, detail string) {
	r.Checks = append(r.Checks, Check{Name: name, OK: false, Detail: detail})
	r.Passed = false
}

// collect takes the counters and the latencies from the run.
func (r *Result) collect(ws *workers, commits *commitLog) {
	r.InjectedFailures = ws.injected.Load()
	r.Duplicates = ws.duplicates.Load()
	for i := range ws.perWorker {
		r.PerWorker[fmt.Sprintf("worker-%d", i+1)] = ws.perWorker[i].Load()
	}
	r.Latency = percentiles(commits.latencies())
	if s := r.ProduceElapsed.Seconds(); s > 0 {
		r.ProduceRate = float64(r.Sent) / s
	}
	if n, _ := ws.progress(); r.Elapsed > 0 {
		r.Throughput = float64(n) / r.Elapsed.Seconds()
	}
}

// percentiles computes the nearest-rank percentiles of d.
func percentiles(d []time.Duration) Latency {
	if len(d) == 0 {
		return Latency{}
	}
	slices.Sort(d)
	at := func(q float64) time.Duration {
		i := int(math.Ceil(q*float64(len(d)))) - 1
		return d[min(max(i, 0), len(d)-1)]
	}
	return Latency{Count: len(d), P50: at(0.50), P95: at(0.95), P99: at(0.99), Max: d[len(d)-1]}
}

// WriteSummary prints the run's figures and checks for a person.
func (r *Result) WriteSummary(w io.Writer) {
	mode := "strict order"
	if !r.Strict {
		mode = "retries may reorder"
	}
	fmt.Fprintf(w, "\npgque demo: %d events, %d tenants, %d slots, %d worker processes, failure rate %g, policy %s (%s)\n",
		r.Sent, r.Tenants, r.Slots, r.Workers, r.FailureRate, r.Policy, mode)
	fmt.Fprintf(w, "  database    %s\n", r.Database)
	fmt.Fprintf(w, "  produced    %d events in %s (%.0f ev/s, batches of %d per transaction)\n",
		r.Sent, r.ProduceElapsed.Round(time.Millisecond), r.ProduceRate, sendBatchSize)
	fmt.Fprintf(w, "  applied     %d events in %s from first send to last apply (%.0f ev/s end to end)\n",
		r.Applied, r.Elapsed.Round(time.Millisecond), r.Throughput)
	l := r.Latency
	fmt.Fprintf(w, "  latency     send commit → handler start, %d events: p50 %s  p95 %s  p99 %s  max %s\n",
		l.Count, ms(l.P50), ms(l.P95), ms(l.P99), ms(l.Max))
	if r.Rate == 0 {
		fmt.Fprintln(w, "              (producers ran unthrottled, so latency includes the backlog; --rate measures it below saturation)")
	}
	fmt.Fprintf(w, "  retries     %d injected failures, %d reorders after retries, %d duplicate deliveries\n",
		r.InjectedFailures, r.Reorders, r.Duplicates)
	var parts []string
	for _, k := range sortedKeys(r.PerWorker) {
		parts = append(parts, fmt.Sprintf("%s %d", k, r.PerWorker[k]))
	}
	fmt.Fprintf(w, "  workers     events handled: %s\n", strings.Join(parts, ", "))
	fmt.Fprintln(w, "verification")
	for _, c := range r.Checks {
		mark := "ok  "
		if !c.OK {
			mark = "FAIL"
		}
		fmt.Fprintf(w, "  %s %-22s %s\n", mark, c.Name, c.Detail)
	}
	if r.Passed {
		fmt.Fprintln(w, "PASSED")
	} else {
		fmt.Fprintln(w, "FAILED")
	}
}

// ms renders a duration in milliseconds.
func ms(d time.Duration) string {
	return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond))
}
