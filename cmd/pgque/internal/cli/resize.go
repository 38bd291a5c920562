package cli

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgque/pgque"
)

// resizePoll is how often 'slots resize --wait' reads the resize's state.
const resizePoll = 100 * time.Millisecond

func (a *app) slotsResizeCommand() *cobra.Command {
	var (
		consumer string
		to       int
		wait     bool
		timeout  time.Duration
	)
	cmd := &cobra.Command{
		Use:   "resize <queue> --consumer c --to N [--wait]",
		Short: "Change a partitioned consumer's number of slots online, keeping per-key order",
		Long: `Slots resize starts an online resize of consumer c to N slots (up or down) and
returns; running workers keep working and follow the change by themselves.
The old slots finish every event sent before the resize began (the seal),
then, in one transaction, the new slots take over from the seal, with every
pending retry, blocked key and deferred event moved to the new slot of its key.
No key is handled by an old and a new slot at once, and each key's events
stay in order. 'pgque status' shows the resize and its phase: draining (old
slots still consume up to the seal), settling (a key lane on an old slot is
still running), cutover (due at the next receive), done.

--wait waits for the cutover (at most --timeout) and prints how long the
resize took. The resize needs the old slots to be worked: with no worker
running it stays in draining.`,
		Args: exactArgs("queue"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if consumer == "" {
				return usagef("--consumer must not be empty")
			}
			if to < 1 || to > pgque.SlotsMax {
				return usagef("--to must be between 1 and %d, not %d", pgque.SlotsMax, to)
			}
			ctx := cmd.Context()
			s, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer s.Close()
			start := time.Now()
			if err := s.ResizeSlots(ctx, args[0], consumer, to); err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "resizing %s on queue %s to %d slots\n", consumer, args[0], to)
			if !wait {
				return nil
			}
			wctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			if err := waitResized(wctx, s, args[0], consumer, to); err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "resized %s to %d slots in %s\n", consumer, to, fmtSeconds(time.Since(start).Seconds()))
			return nil
		},
	}
	cmd.Flags().StringVar(&consumer, "consumer", "", "consumer name (required)")
	cmd.Flags().IntVar(&to, "to", 0, "the new number of slots N (required)")
	cmd.Flags().BoolVar(&wait, "wait", false, "wait until the new slots took over")
	cmd.Flags().DurationVar(&timeout, "timeout", 10*time.Minute, "with --wait, give up waiting after this long")
	_ = cmd.MarkFlagRequired("consumer")
	_ = cmd.MarkFlagRequired("to")
	return cmd
}

// waitResized polls until consumer has n slots and no resize in progress.
func waitResized(ctx context.Context, s *session, queue, consumer string, n int) error {
	for {
		rs, err := s.Resizes(ctx, queue)
		if err != nil {
			if ctx.Err() != nil {
				// The deadline ran out during the query: the same outcome
				// as running out between two polls.
				return fmt.Errorf("waiting for the resize of %s to %d slots: %w (see pgque status)", consumer, n, ctx.Err())
			}
			return err
		}
		for _, r := range rs {
			if r.Consumer == consumer && r.Phase == pgque.ResizeDone && r.NSlots == n {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for the resize of %s to %d slots: %w (see pgque status)", consumer, n, ctx.Err())
		case <-time.After(resizePoll):
		}
	}
}

// resizeRow is one consumer's resize in the status report.
type resizeRow struct {
	Queue      string     `json:"queue"`
	Consumer   string     `json:"consumer"`
	NSlots     int        `json:"nslots"`
	To         int        `json:"resize_to,omitempty"`
	Phase      string     `json:"phase"`
	Started    time.Time  `json:"started"`
	Finished   *time.Time `json:"finished,omitempty"`
	SlotsDone  int        `json:"slots_done"`
	SlotsTotal int        `json:"slots_total"`
	HeldKeys   int        `json:"held_keys"`
}

// resizeRows reads the resizes of queue ("" for all): in progress, and
// each consumer's last completed one.
func resizeRows(ctx context.Context, s *session, queue string) ([]resizeRow, error) {
	rs, err := s.Resizes(ctx, queue)
	if err != nil {
		return nil, err
	}
	out := make([]resizeRow, len(rs))
	for i, r := range rs {
		out[i] = resizeRow{Queue: r.Queue, Consumer: r.Consumer, NSlots: r.NSlots, To: r.To, Phase: r.Phase,
			Started: r.Started, SlotsDone: r.SlotsDone, SlotsTotal: r.SlotsTotal, HeldKeys: r.HeldKeys}
		if !r.Finished.IsZero() {
			f := r.Finished
			out[i].Finished = &f
		}
	}
	return out, nil
}

// resizeWarnings names every resize in progress: the consumer's throughput
// pauses for the keys of the new slots until the cutover.
func resizeWarnings(rs []resizeRow, now time.Time) []string {
	var w []string
	for _, r := range rs {
		if r.Phase == pgque.ResizeDone {
			continue
		}
		w = append(w, fmt.Sprintf("queue %s, consumer %s: resize %d -> %d slots %s for %s (%d of %d old slots at the seal, %d keys held)",
			r.Queue, r.Consumer, r.NSlots, r.To, r.Phase, fmtSeconds(now.Sub(r.Started).Seconds()), r.SlotsDone, r.SlotsTotal, r.HeldKeys))
	}
	return w
}

// writeResizes renders the resizes section of status.
func writeResizes(w io.Writer, rs []resizeRow) error {
	if len(rs) == 0 {
		return nil
	}
	fmt.Fprintln(w, "\nRESIZES")
	rows := make([][]string, len(rs))
	for i, r := range rs {
		change := fmt.Sprintf("%d -> %d", r.NSlots, r.To)
		took := "-"
		if r.Finished != nil {
			change = fmt.Sprintf("now %d", r.NSlots)
			took = fmtSeconds(r.Finished.Sub(r.Started).Seconds())
		}
		rows[i] = []string{r.Queue, r.Consumer, change, r.Phase, strconv.Itoa(r.SlotsDone) + "/" + strconv.Itoa(r.SlotsTotal),
			r.Started.Format(time.RFC3339), took}
	}
	return table(w, []string{"QUEUE", "CONSUMER", "SLOTS", "PHASE", "AT SEAL", "STARTED", "TOOK"}, rows)
}
