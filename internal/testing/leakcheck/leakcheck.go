// Package leakcheck tells a test whether the code under test left goroutines
// running after it was stopped.
//
// It is the small part of a goroutine-leak checker the tests need, kept in the
// repository so the library module depends on nothing for it: take a Snapshot
// before starting services, stop them, then call Verify. Goroutine ids are
// never reused by the runtime, so "a goroutine whose id was not in the
// snapshot" is exactly "a goroutine started since".
package leakcheck

import (
	"bytes"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// settle is how long Verify waits for goroutines that are already on their
// way out (a Stop returns once the work is done; the goroutine's last
// instructions may still be running).
const settle = 5 * time.Second

// Snapshot is the set of goroutines alive at one moment.
type Snapshot map[int64]bool

// TB is the part of testing.TB Verify uses.
type TB interface {
	Helper()
	Errorf(format string, args ...any)
}

// Take records the goroutines alive now.
func Take() Snapshot {
	s := Snapshot{}
	for _, g := range goroutines() {
		s[g.id] = true
	}
	return s
}

// Verify fails t when goroutines started after before are still alive once
// settle has passed, and prints their stacks. It polls the goroutine list, so
// it returns as soon as they are gone.
func Verify(t TB, before Snapshot) {
	t.Helper()
	deadline := time.Now().Add(settle)
	for {
		leaked := leakedSince(before)
		if len(leaked) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("leakcheck: %d goroutine(s) still running:\n\n%s", len(leaked), strings.Join(leaked, "\n\n"))
			return
		}
		runtime.Gosched()
		time.Sleep(10 * time.Millisecond)
	}
}

// leakedSince returns the stacks of goroutines absent from before, except the
// caller's own and the runtime's and testing's helpers.
func leakedSince(before Snapshot) []string {
	var out []string
	for _, g := range goroutines() {
		if before[g.id] || g.self || ignorable(g.stack) {
			continue
		}
		out = append(out, g.stack)
	}
	return out
}

// ignorable reports the goroutines that belong to the test binary rather than
// to the code under test.
func ignorable(stack string) bool {
	for _, s := range []string{
		"testing.(*T).Run(",
		"testing.tRunner(",
		"testing.runTests(",
		"testing.(*M).",
		"runtime.goexit0",
		"os/signal.signal_recv",
		"os/signal.loop",
		"runtime.ensureSigM",
	} {
		if strings.Contains(stack, s) && !strings.Contains(stack, "pgque") {
			return true
		}
	}
	return false
}

type goroutine struct {
	id    int64
	self  bool
	stack string
}

// goroutines parses runtime.Stack(all). The first entry is the calling
// goroutine, which the runtime always prints first.
func goroutines() []goroutine {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var out []goroutine
	for i, block := range bytes.Split(buf, []byte("\n\n")) {
		text := string(bytes.TrimSpace(block))
		rest, ok := strings.CutPrefix(text, "goroutine ")
		if !ok {
			continue
		}
		idText, _, _ := strings.Cut(rest, " ")
		id, err := strconv.ParseInt(idText, 10, 64)
		if err != nil {
			continue
		}
		out = append(out, goroutine{id: id, self: i == 0, stack: text})
	}
	return out
}
