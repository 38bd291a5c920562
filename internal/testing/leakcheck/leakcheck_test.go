package leakcheck

import (
	"fmt"
	"strings"
	"testing"
)

// recorder is a TB that keeps the failure instead of failing the test.
type recorder struct{ failed string }

func (r *recorder) Helper() {}
func (r *recorder) Errorf(format string, args ...any) {
	r.failed = fmt.Sprintf(format, args...)
}

// parkedForLeakcheckTest blocks until release is closed; its name shows up
// in the leaked stack Verify prints.
func parkedForLeakcheckTest(started chan<- struct{}, release <-chan struct{}) {
	close(started)
	<-release
}

func TestVerifyReportsALeakedGoroutine(t *testing.T) {
	before := Take()
	started, release := make(chan struct{}), make(chan struct{})
	go parkedForLeakcheckTest(started, release)
	<-started
	var r recorder
	Verify(&r, before)
	close(release)
	if !strings.Contains(r.failed, "parkedForLeakcheckTest") {
		t.Fatalf("Verify did not report the parked goroutine; reported %q", r.failed)
	}
}

func TestVerifyPassesOnceTheGoroutineEnds(t *testing.T) {
	before := Take()
	started, release := make(chan struct{}), make(chan struct{})
	go parkedForLeakcheckTest(started, release)
	<-started
	close(release)
	var r recorder
	Verify(&r, before)
	if r.failed != "" {
		t.Fatalf("Verify reported a goroutine that had ended: %s", r.failed)
	}
}
