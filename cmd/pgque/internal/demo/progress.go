package demo

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

// plainEvery is how often plain progress lines are printed.
const plainEvery = 2 * time.Second

// progress shows how many events were handled: a progress bar on a
// terminal, a line every few seconds otherwise (logs, CI, tests).
type progress struct {
	w        io.Writer
	bar      *progressbar.ProgressBar
	total    int
	done     int
	start    time.Time
	lastLine time.Time
	printed  int // done as of the last plain line, -1 before any
}

// newProgress shows progress towards total; rates count from start.
func newProgress(w io.Writer, total int, start time.Time) *progress {
	p := &progress{w: w, total: total, start: start, lastLine: time.Now(), printed: -1}
	if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
		p.bar = progressbar.NewOptions(total,
			progressbar.OptionSetWriter(w),
			progressbar.OptionSetDescription("applying"),
			progressbar.OptionSetWidth(30),
			progressbar.OptionShowCount(),
			progressbar.OptionShowIts(),
			progressbar.OptionSetItsString("ev"),
			progressbar.OptionSetPredictTime(true),
			progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionOnCompletion(func() { fmt.Fprintln(w) }),
		)
	}
	return p
}

// setTotal changes the total once it is known (a run capped by Duration
// sends fewer events than asked for).
func (p *progress) setTotal(total int) {
	if total == p.total {
		return
	}
	p.total = total
	if p.bar != nil {
		p.bar.ChangeMax(total)
	}
}

// update shows that done events are handled.
func (p *progress) update(done int) {
	p.done = done
	if p.bar != nil {
		_ = p.bar.Set(done)
		return
	}
	if time.Since(p.lastLine) >= plainEvery {
		p.lastLine = time.Now()
		p.line()
	}
}

func (p *progress) line() {
	p.printed = p.done
	rate := float64(p.done) / time.Since(p.start).Seconds()
	fmt.Fprintf(p.w, "demo: applied %d/%d events (%.0f ev/s)\n", p.done, p.total, rate)
}

// finish completes the bar, or prints a last line.
func (p *progress) finish() {
	if p.bar != nil {
		if p.done >= p.total {
			_ = p.bar.Finish()
		} else {
			_ = p.bar.Exit()
			fmt.Fprintln(p.w)
		}
		return
	}
	if p.printed != p.done {
		p.line()
	}
}
