package backoff

import (
	"testing"
	"time"
)

func TestDelayGrowsAndCaps(t *testing.T) {
	t.Parallel()
	p := Policy{Base: 10 * time.Millisecond, Max: 100 * time.Millisecond}
	want := []time.Duration{10, 20, 40, 80, 100, 100}
	for n, w := range want {
		if got := p.Delay(n); got != w*time.Millisecond {
			t.Errorf("Delay(%d) = %v, want %v", n, got, w*time.Millisecond)
		}
	}
}

func TestJitterStaysInRange(t *testing.T) {
	t.Parallel()
	for range 1000 {
		d := Jitter(time.Second, 0.2)
		if d < 800*time.Millisecond || d > 1200*time.Millisecond {
			t.Fatalf("Jitter(1s, 0.2) = %v, outside [0.8s, 1.2s]", d)
		}
	}
}

func TestSleepInterrupted(t *testing.T) {
	t.Parallel()
	done := make(chan struct{})
	close(done)
	if Sleep(done, time.Hour) {
		t.Fatal("Sleep returned true although done was closed")
	}
}
