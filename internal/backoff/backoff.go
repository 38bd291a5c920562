// Package backoff computes jittered exponential delays for retry loops: the
// notifier's reconnects, a slot worker's database errors, the default retry
// policy for failed events.
package backoff

import (
	"math/rand/v2"
	"time"
)

// Policy describes an exponential backoff: the n-th delay (n from 0) is
// Base·2ⁿ capped at Max, then spread by ±Jitter (a fraction in [0, 1]) so that
// many clients that failed together do not retry together.
type Policy struct {
	// Base is the first delay.
	Base time.Duration
	// Max caps every delay before jitter.
	Max time.Duration
	// Jitter is the fraction of the delay that is randomised, e.g. 0.2 for ±20%.
	Jitter float64
}

// Delay returns the delay before attempt n (0 for the first retry).
func (p Policy) Delay(n int) time.Duration {
	d := p.Base
	for i := 0; i < n && d < p.Max; i++ {
		d *= 2
	}
	if p.Max > 0 && d > p.Max {
		d = p.Max
	}
	return Jitter(d, p.Jitter)
}

// Jitter spreads d uniformly over [d·(1-frac), d·(1+frac)].
func Jitter(d time.Duration, frac float64) time.Duration {
	if frac <= 0 || d <= 0 {
		return d
	}
	spread := float64(d) * frac
	return time.Duration(float64(d) - spread + rand.Float64()*2*spread)
}

// Sleep waits for d or until done is closed, and reports whether the full
// delay elapsed.
func Sleep(done <-chan struct{}, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-done:
		return false
	}
}

// Errors paces a loop whose database calls keep failing (database down,
// connection lost): 100 ms doubling to 5 s, ±30%.
var Errors = Policy{Base: 100 * time.Millisecond, Max: 5 * time.Second, Jitter: 0.3}
