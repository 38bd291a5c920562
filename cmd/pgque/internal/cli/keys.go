package cli

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgque/pgque"
	"github.com/pgque/pgque/cmd/pgque/internal/keyview"
)

func (a *app) keysCommand() *cobra.Command {
	var (
		consumer string
		slot     int
		o        keyview.Options
		asJSON   bool
	)
	cmd := &cobra.Command{
		Use:   "keys <queue> --consumer c [--slot k] [--json]",
		Short: "Show the keys of a partitioned consumer: oldest pending heads, hottest keys",
		Long: `Keys answers "which key is stuck, and why" for a partitioned consumer.

The first table lists the keys with the oldest pending head event, oldest
first: slot, key, state (flowing, in flight, retrying, held, releasing, blocked), head
ev_id and age, pending events, and for a failing key its failures, last
reason, when the retry is due and how many events wait behind it.

The second lists the keys that produced the most events over --window (from a
sample of the newest --scan events). A warning names every slot whose top key
holds more than --hot-share of its pending events: that slot can go no faster
than that key's handler.

At most --scan pending events are read, split between the slots; "~" marks
counts cut short by that budget (the heads shown are still the oldest).
Nothing is written.`,
		Args: exactArgs("queue"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if consumer == "" {
				return usagef("--consumer must not be empty")
			}
			if cmd.Flags().Changed("slot") {
				o.Slot = &slot
			}
			if o.HotShare < 0 || o.HotShare > 1 {
				return usagef("--hot-share must be between 0 and 1, not %v", o.HotShare)
			}
			ctx := cmd.Context()
			s, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer s.Close()
			r, err := keyview.Collect(ctx, s.Client, args[0], consumer, o)
			if err != nil {
				return err
			}
			if asJSON {
				return a.printJSON(r)
			}
			return a.printKeys(r)
		},
	}
	cmd.Flags().StringVar(&consumer, "consumer", "", "partitioned consumer name (required)")
	cmd.Flags().IntVar(&slot, "slot", 0, "only this slot (default every slot)")
	cmd.Flags().IntVar(&o.Limit, "limit", pgque.KeyLimitDefault, "how many keys to list per table")
	cmd.Flags().IntVar(&o.Scan, "scan", pgque.KeyScanDefault, "at most this many events are read")
	cmd.Flags().DurationVar(&o.Window, "window", pgque.HotKeyWindowDefault, "window of the hottest-keys rates")
	cmd.Flags().Float64Var(&o.HotShare, "hot-share", pgque.HotKeyShareDefault,
		"warn when one key holds more than this share of a slot's pending events")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the report as JSON")
	_ = cmd.MarkFlagRequired("consumer")
	return cmd
}

// printKeys renders a key report as two tables and the warnings.
func (a *app) printKeys(r *keyview.Report) error {
	rows := make([][]string, len(r.Heads))
	for i, h := range r.Heads {
		pending := strconv.FormatInt(h.Pending, 10)
		if h.Estimated {
			pending = "~" + pending
		}
		retry := "-"
		if h.RetryAt != nil {
			retry = "in " + fmtSeconds(max(0, time.Until(*h.RetryAt).Seconds()))
		}
		failures := "-"
		if h.Failures > 0 {
			failures = strconv.Itoa(h.Failures)
		}
		rows[i] = []string{strconv.Itoa(h.Slot), truncate(keyview.FormatKey(h.Key), 40), h.State,
			strconv.FormatInt(h.HeadID, 10), fmtSeconds(h.HeadAgeSec), pending, failures, retry,
			strconv.FormatInt(h.Deferred, 10), orDash(truncate(oneLine(h.Reason), 50))}
	}
	fmt.Fprintf(a.stdout, "Oldest pending heads of %s on %s:\n", r.Consumer, r.Queue)
	if err := table(a.stdout, []string{"SLOT", "KEY", "STATE", "HEAD EV_ID", "HEAD AGE", "PENDING", "FAILURES", "RETRY", "DEFERRED", "REASON"}, rows); err != nil {
		return err
	}
	rows = make([][]string, len(r.Hot))
	span := 0.0
	for i, h := range r.Hot {
		span = h.SpanSec
		events := strconv.FormatInt(h.Events, 10)
		if h.Estimated {
			events = "~" + events
		}
		rows[i] = []string{truncate(keyview.FormatKey(h.Key), 40), events, fmt.Sprintf("%.1f", h.Rate), fmt.Sprintf("%.0f%%", 100*h.Share)}
	}
	if len(rows) == 0 {
		// No recent events: there is no window to name ("last 0s").
		fmt.Fprintf(a.stdout, "\nHottest keys of %s: no events sent lately\n", r.Queue)
	} else {
		fmt.Fprintf(a.stdout, "\nHottest keys of %s (last %s):\n", r.Queue, fmtSeconds(span))
		if err := table(a.stdout, []string{"KEY", "EVENTS", "EV/S", "SHARE"}, rows); err != nil {
			return err
		}
	}
	for _, w := range r.Warnings {
		fmt.Fprintf(a.stdout, "\nWARNING: %s\n", w)
	}
	return nil
}

// statusKeyScan bounds the pending events status reads per consumer to find
// hot keys: enough to see which key dominates, cheap on any backlog.
const statusKeyScan = 20000

// hotKeyWarnings warns, for every partitioned consumer with pending events,
// about each slot whose top key holds more than HotKeyShareDefault of them.
func hotKeyWarnings(ctx context.Context, s *session, groupLag map[[2]string]int64) ([]string, error) {
	groups := make([][2]string, 0, len(groupLag))
	for g, lag := range groupLag {
		if lag > 0 {
			groups = append(groups, g)
		}
	}
	slices.SortFunc(groups, func(a, b [2]string) int { return strings.Compare(a[0]+"\x00"+a[1], b[0]+"\x00"+b[1]) })
	var out []string
	for _, g := range groups {
		shares, err := s.KeyShares(ctx, g[0], g[1], pgque.KeyQuery{Scan: statusKeyScan})
		if err != nil {
			return nil, err
		}
		for _, sh := range shares {
			if sh.Hot(pgque.HotKeyShareDefault) {
				out = append(out, fmt.Sprintf("queue %s, consumer %s, slot %d: hot key %s holds %.0f%% of %d pending events",
					g[0], g[1], sh.Slot, sh.TopKey, 100*sh.Share, sh.Pending))
			}
		}
	}
	return out, nil
}
