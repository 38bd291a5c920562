package pgqueprom_test

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/pgque/pgque"
	"github.com/pgque/pgque/pgqueprom"
)

// TestMetricNames pins the exported names, labels and types that
// dashboards rely on.
func TestMetricNames(t *testing.T) {
	reg := prometheus.NewRegistry()
	obs, err := pgqueprom.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	obs.Metric(pgque.Measurement{Name: pgque.MetricEventsSent, Kind: pgque.MetricCounter, Value: 3, Queue: "files"})
	obs.Metric(pgque.Measurement{Name: pgque.MetricEventsProcessed, Kind: pgque.MetricCounter, Value: 1, Queue: "files", Consumer: "c"})
	obs.Metric(pgque.Measurement{Name: pgque.MetricHandlerDuration, Kind: pgque.MetricDuration, Value: 0.002, Queue: "files", Consumer: "c"})
	obs.Metric(pgque.Measurement{Name: pgque.MetricSlotLag, Kind: pgque.MetricGauge, Value: 7, Queue: "files", Consumer: "c", Slot: "0"})
	obs.Metric(pgque.Measurement{Name: pgque.MetricTickerLeader, Kind: pgque.MetricGauge, Value: 1})
	obs.Metric(pgque.Measurement{Name: "from_a_newer_library", Kind: pgque.MetricCounter, Value: 1})
	want := `
# HELP pgque_events_sent_total Events committed by this process's producers.
# TYPE pgque_events_sent_total counter
pgque_events_sent_total{queue="files"} 3
# HELP pgque_events_processed_total Events whose handler succeeded.
# TYPE pgque_events_processed_total counter
pgque_events_processed_total{consumer="c",queue="files"} 1
# HELP pgque_slot_lag_events Events of each slot committed after its cursor (pending).
# TYPE pgque_slot_lag_events gauge
pgque_slot_lag_events{consumer="c",queue="files",slot="0"} 7
# HELP pgque_ticker_leader 1 while this process's ticker holds the ticker lease.
# TYPE pgque_ticker_leader gauge
pgque_ticker_leader 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want),
		"pgque_events_sent_total", "pgque_events_processed_total", "pgque_slot_lag_events", "pgque_ticker_leader"); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(reg, "pgque_handler_duration_seconds"); n != 1 {
		t.Fatalf("pgque_handler_duration_seconds has %d series, want 1", n)
	}
}

// TestSharedRegistry: two observers on one registry (two Clients in one
// process) share the collectors, so both count into the same series.
func TestSharedRegistry(t *testing.T) {
	reg := prometheus.NewRegistry()
	a, err := pgqueprom.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	b, err := pgqueprom.New(reg)
	if err != nil {
		t.Fatalf("second observer on the same registry: %v", err)
	}
	for _, o := range []*pgqueprom.Observer{a, b} {
		o.Metric(pgque.Measurement{Name: pgque.MetricEventsSent, Kind: pgque.MetricCounter, Value: 2, Queue: "q"})
	}
	want := `
# HELP pgque_events_sent_total Events committed by this process's producers.
# TYPE pgque_events_sent_total counter
pgque_events_sent_total{queue="q"} 4
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "pgque_events_sent_total"); err != nil {
		t.Fatal(err)
	}
}

// TestConflictingRegistration: a registry that already has a metric of one
// of pgque's names with another type makes New fail instead of silently
// exporting nothing.
func TestConflictingRegistration(t *testing.T) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewGauge(prometheus.GaugeOpts{Name: "pgque_events_sent_total", Help: "not ours"}))
	if _, err := pgqueprom.New(reg); err == nil || !strings.Contains(err.Error(), "pgque_events_sent_total") {
		t.Fatalf("New over a conflicting collector = %v, want an error naming it", err)
	}
	if _, err := pgqueprom.New(nil); err == nil {
		t.Fatal("New(nil) succeeded")
	}
}
