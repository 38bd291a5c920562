package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/pgque/pgque"
	"github.com/pgque/pgque/cmd/pgque/internal/view"
)

// Defaults of the status checks.
const (
	// StuckAfterDefault: a consumer or slot with pending events whose last
	// batch is older than this is reported as stuck.
	StuckAfterDefault = 30 * time.Second
	// rotationGrace is how long past its rotation period a queue may go
	// before status reports it pinned: maint() runs every
	// MaintIntervalDefault, so a healthy queue rotates within that.
	rotationGrace = 2 * pgque.MaintIntervalDefault
)

// thresholds are the status checks' settings.
type thresholds struct {
	stuckAfter time.Duration
}

func (th *thresholds) add(cmd *cobra.Command) {
	cmd.Flags().DurationVar(&th.stuckAfter, "stuck-after", StuckAfterDefault,
		"report a consumer or slot with pending events as stuck when its last batch is older than this")
}

// slotWarnings checks one slot: events pending with no live owner
// (unpolled), or no batch for too long (stuck). Either pins rotation.
func (th *thresholds) slotWarnings(s *slotRow) []string {
	var w []string
	switch {
	case s.Lag > 0 && s.Owner == nil:
		w = append(w, fmt.Sprintf("unpolled: %d pending, no live owner", s.Lag))
	case s.Lag > s.HeldBack && s.LastActiveSeconds > th.stuckAfter.Seconds():
		// Events held back for a failed head wait for its retry, not for
		// a batch: the blocked-key warning covers them.
		w = append(w, fmt.Sprintf("stuck: %d pending, last batch %s ago", s.Lag, fmtSeconds(s.LastActiveSeconds)))
	}
	return w
}

// slotKey names one slot.
type slotKey struct {
	queue, consumer string
	slot            int
}

// stallWarning describes a stalled slot (partition_slot_stalls): how long,
// why, and what to do.
func stallWarning(st pgque.SlotStall) string {
	who := "no live owner"
	if st.Owner != "" {
		who = "owner " + st.Owner
	}
	return fmt.Sprintf("stalled for %s (%s, %s; it pins rotation of the whole queue): %s",
		fmtSeconds(st.StalledFor.Seconds()), st.Reason, who, st.Action)
}

// consumerWarnings checks one plain subscription.
func (th *thresholds) consumerWarnings(c *consumerInfo) []string {
	if c.Pending > 0 && c.LastSeenSeconds > th.stuckAfter.Seconds() {
		return []string{fmt.Sprintf("stuck: %d pending, last batch %s ago", c.Pending, fmtSeconds(c.LastSeenSeconds))}
	}
	return nil
}

// queueStatus is one queue in the status report.
type queueStatus struct {
	queueInfo
	// Pending is the backlog of the queue's slowest consumer: its pending
	// events (for a partitioned consumer, the sum of its slots' lag).
	Pending int64 `json:"pending"`
	// RotationOverdue is true when the queue should have switched tables
	// more than a maintenance round ago and could not.
	RotationOverdue bool `json:"rotation_overdue"`
	// PinnedBy names the subscription with the oldest cursor when rotation
	// is overdue: the one holding the old table.
	PinnedBy string   `json:"pinned_by,omitempty"`
	Warnings []string `json:"warnings"`
}

// statusReport is what status shows.
type statusReport struct {
	Time      time.Time      `json:"time"` // when gathering began
	Queues    []queueStatus  `json:"queues"`
	Consumers []consumerInfo `json:"consumers"`
	Slots     []slotRow      `json:"slots"`
	// Blocked are the keys the pause policy holds back after a failure;
	// null when the role may not read them (blocked_keys is for readers
	// and admins: a producer's login sees the rest).
	Blocked []blockedKey `json:"blocked_keys"`
	// Resizes are the slot resizes in progress and the last completed ones.
	Resizes []resizeRow `json:"resizes"`
	// Blockers are what holds back due rotations and flips (sessions with
	// their pid, role and start; subscriptions); null when the role may
	// not read them (rotation_blockers is for admins).
	Blockers []view.Blocker `json:"rotation_blockers"`
	// Warnings collects every warning, each naming what it is about.
	Warnings []string `json:"warnings"`
}

// gatherStatus reads everything and runs the checks.
func gatherStatus(ctx context.Context, s *session, queue string, th *thresholds) (*statusReport, error) {
	began := time.Now()
	queues, err := s.queueInfos(ctx, queue)
	if err != nil {
		return nil, err
	}
	subs, err := s.consumerInfos(ctx, queue)
	if err != nil {
		return nil, err
	}
	slots, err := s.slotRows(ctx, queue, "")
	if err != nil {
		return nil, err
	}
	stalls, err := s.SlotStalls(ctx, queue, "")
	if err != nil {
		return nil, err
	}
	stalled := map[slotKey]pgque.SlotStall{}
	for _, st := range stalls {
		if st.Stalled {
			stalled[slotKey{st.Queue, st.Consumer, st.Slot}] = st
		}
	}
	rep := &statusReport{Time: began, Consumers: []consumerInfo{}, Slots: nonNil(slots), Blocked: []blockedKey{}, Warnings: []string{}}
	hideBlocked := false
	blockers, canSee, err := view.Blockers(ctx, s.Client)
	if err != nil {
		return nil, err
	}
	if canSee {
		rep.Blockers = nonNil(blockers)
	}
	for _, b := range rep.Blockers {
		if queue == "" || b.Queue == nil || *b.Queue == queue {
			rep.Warnings = append(rep.Warnings, b.Describe(rep.Time))
		}
	}
	for _, c := range subs {
		if strings.Contains(c.Consumer, "#") {
			continue // a slot: reported with its slot group
		}
		c.Warnings = nonNil(th.consumerWarnings(&c))
		for _, w := range c.Warnings {
			rep.Warnings = append(rep.Warnings, fmt.Sprintf("queue %s, consumer %s: %s", c.Queue, c.Consumer, w))
		}
		rep.Consumers = append(rep.Consumers, c)
	}
	groupLag := map[[2]string]int64{}
	for i := range rep.Slots {
		sl := &rep.Slots[i]
		sl.Warnings = nonNil(th.slotWarnings(sl))
		if st, ok := stalled[slotKey{sl.Queue, sl.Consumer, sl.Slot}]; ok {
			sl.Warnings = append(sl.Warnings, stallWarning(st))
		}
		groupLag[[2]string{sl.Queue, sl.Consumer}] += sl.Lag
		for _, w := range sl.Warnings {
			rep.Warnings = append(rep.Warnings, fmt.Sprintf("queue %s, consumer %s, slot %d/%d: %s", sl.Queue, sl.Consumer, sl.Slot, sl.NSlots, w))
		}
	}
	hot, err := hotKeyWarnings(ctx, s, groupLag)
	if err != nil {
		return nil, err
	}
	rep.Warnings = append(rep.Warnings, hot...)
	for _, q := range queues {
		qs := queueStatus{queueInfo: q}
		for _, c := range rep.Consumers {
			if c.Queue == q.Name {
				qs.Pending = max(qs.Pending, c.Pending)
			}
		}
		for k, lag := range groupLag {
			if k[0] == q.Name {
				qs.Pending = max(qs.Pending, lag)
			}
		}
		qs.Warnings = queueWarnings(&qs, subs, rep.Blockers)
		for _, w := range qs.Warnings {
			rep.Warnings = append(rep.Warnings, fmt.Sprintf("queue %s: %s", q.Name, w))
		}
		rep.Queues = append(rep.Queues, qs)
		blocked, err := s.blockedKeys(ctx, q.Name, "")
		if errors.Is(err, pgque.ErrPermissionDenied) {
			hideBlocked = true
			continue
		}
		if err != nil {
			return nil, err
		}
		for _, b := range blocked {
			if b.State == string(pgque.BlockStateHeld) {
				// A key held while its lane runs is normal operation: it
				// is shown with its slot, and warned about only when the
				// hold lasts as long as a stuck slot would.
				age := view.AddHold(rep.Slots, b.Queue, b.Consumer, b.Slot, b.Since, b.Deferred, time.Now())
				if age > th.stuckAfter.Seconds() {
					rep.Warnings = append(rep.Warnings, fmt.Sprintf("queue %s, consumer %s, slot %d: key %s held for %s while its handler runs (head event %d, %d deferred)",
						b.Queue, b.Consumer, b.Slot, fmtKey(b.Key), fmtSeconds(age), b.HeadEvID, b.Deferred))
				}
				continue
			}
			rep.Warnings = append(rep.Warnings, fmt.Sprintf("queue %s, consumer %s, slot %d: key %s %s for %s (head event %d, %d failures, %d deferred): %s",
				b.Queue, b.Consumer, b.Slot, fmtKey(b.Key), b.State, fmtSeconds(time.Since(b.Since).Seconds()), b.HeadEvID, b.Failures, b.Deferred, deref(b.Reason)))
		}
		rep.Blocked = append(rep.Blocked, blocked...)
	}
	if hideBlocked {
		rep.Blocked = nil
	}
	rep.Queues = nonNil(rep.Queues)
	if rep.Resizes, err = resizeRows(ctx, s, queue); err != nil {
		return nil, err
	}
	rep.Resizes = nonNil(rep.Resizes)
	rep.Warnings = append(rep.Warnings, resizeWarnings(rep.Resizes, rep.Time)...)
	return rep, nil
}

// queueWarnings checks a queue: overdue rotation (and who pins it), a
// ticker that does not run, dead letters. The subscription named as the
// pin is the one rotation_blockers names when the role may read it (the
// blockers themselves are warned about separately), else the one with the
// oldest cursor, a guess.
func queueWarnings(q *queueStatus, subs []consumerInfo, blockers []view.Blocker) []string {
	w := []string{}
	if q.SinceRotation > q.Config.RotationSeconds+rotationGrace.Seconds() {
		q.RotationOverdue = true
		var oldest *consumerInfo
		for i := range subs {
			if subs[i].Queue == q.Name && (oldest == nil || subs[i].LagSeconds > oldest.LagSeconds) {
				oldest = &subs[i]
			}
		}
		msg := fmt.Sprintf("table rotation overdue by %s", fmtSeconds(q.SinceRotation-q.Config.RotationSeconds))
		if blockers != nil {
			for _, b := range blockers {
				if b.Kind == pgque.BlockerSubscription && b.Queue != nil && *b.Queue == q.Name && q.PinnedBy == "" {
					q.PinnedBy = b.What
				}
			}
			msg += " (see the rotation blockers)"
		} else if oldest != nil {
			q.PinnedBy = oldest.Consumer
			msg += fmt.Sprintf(", pinned by subscription %s (cursor %s old)", oldest.Consumer, fmtSeconds(oldest.LagSeconds))
		}
		w = append(w, msg)
	}
	if q.TickerLagSeconds > q.Config.IdleSeconds+StuckAfterDefault.Seconds() {
		w = append(w, fmt.Sprintf("no tick for %s: is a ticker running? (pgque ticker)", fmtSeconds(q.TickerLagSeconds)))
	}
	if q.DeadLetters > 0 {
		w = append(w, fmt.Sprintf("%d dead letters (pgque dlq list %s)", q.DeadLetters, q.Name))
	}
	return w
}

func (a *app) statusCommand() *cobra.Command {
	var (
		asJSON bool
		watch  bool
		th     thresholds
	)
	cmd := &cobra.Command{
		Use:   "status [queue]",
		Short: "Show queues, consumers and slots: rate, backlog, lag, owners and warnings",
		Long: `Status shows, for every queue (or one): its rate (events/s), backlog (pending
events of its slowest consumer), events not yet ticked and ticker lag; every
plain consumer with its cursor's age and pending events; every slot of every
partitioned consumer with its owner, epoch, lag and oldest pending event; and
warnings: stuck, unpolled or stalled slots and consumers (they pin table
rotation; a slot is stalled when it is behind and has not moved for twice its
lease TTL: the warning says why and what to do), a
rotation that is overdue and the subscription pinning it, what holds back a
due rotation or the tick/state flips (ROTATION BLOCKERS, for an admin: the
subscription, or the session with its pid, role, transaction start and the
lock it holds; end it with pg_terminate_backend), a ticker that does
not run, dead letters, keys blocked by the pause policy, and a key that holds
most of a slot's pending events (see 'pgque keys'). HELD shows, per slot, the
keys whose handlers run on after their chunk was acknowledged (key lanes): how
many, the events deferred for them and the oldest hold's age.

--watch refreshes every second until interrupted; with --json it prints one
JSON document per line per refresh.`,
		Args: rangeArgs(nil, "queue"),
		RunE: func(cmd *cobra.Command, args []string) error {
			queue := ""
			if len(args) == 1 {
				queue = args[0]
			}
			ctx := cmd.Context()
			s, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer s.Close()
			if !watch {
				rep, err := gatherStatus(ctx, s, queue, &th)
				if err != nil {
					return err
				}
				if asJSON {
					return a.printJSON(rep)
				}
				return writeStatus(a.stdout, rep)
			}
			return a.watchStatus(ctx, s, queue, &th, asJSON)
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the status as JSON")
	cmd.Flags().BoolVarP(&watch, "watch", "w", false, "refresh every second until interrupted")
	th.add(cmd)
	return cmd
}

// watchStatus refreshes the status every second until ctx ends.
func (a *app) watchStatus(ctx context.Context, s *session, queue string, th *thresholds, asJSON bool) error {
	tty := isTerminal(a.stdout)
	tk := time.NewTicker(time.Second)
	defer tk.Stop()
	for {
		rep, err := gatherStatus(ctx, s, queue, th)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			return err
		}
		switch {
		case asJSON:
			err = a.printJSONLine(rep)
		case tty:
			fmt.Fprint(a.stdout, "\033[H\033[2J") // home, clear screen
			fmt.Fprintf(a.stdout, "pgque status  %s  (Ctrl-C to stop)\n\n", rep.Time.Format(time.TimeOnly))
			err = writeStatus(a.stdout, rep)
		default:
			fmt.Fprintf(a.stdout, "--- %s\n", rep.Time.Format(time.RFC3339))
			err = writeStatus(a.stdout, rep)
		}
		if err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tk.C:
		}
	}
}

// writeStatus renders the report as aligned tables.
func writeStatus(w io.Writer, rep *statusReport) error {
	fmt.Fprintln(w, "QUEUES")
	rows := make([][]string, len(rep.Queues))
	for i, q := range rep.Queues {
		rotated := fmtSeconds(q.SinceRotation) + " ago"
		if q.RotationOverdue {
			rotated += " (overdue, pinned by " + orDash(q.PinnedBy) + ")"
		}
		rows[i] = []string{q.Name, fmtRate(q.EvPerSec), strconv.FormatInt(q.Pending, 10), strconv.FormatInt(q.Unticked, 10),
			fmtTickerLag(&q.queueInfo), strconv.FormatInt(q.RetryPending, 10), strconv.FormatInt(q.DeadLetters, 10), rotated}
	}
	if err := table(w, []string{"QUEUE", "EV/S", "PENDING", "UNTICKED", "TICKER LAG", "RETRIES", "DEAD", "ROTATED"}, rows); err != nil {
		return err
	}
	if len(rep.Consumers) > 0 {
		fmt.Fprintln(w, "\nCONSUMERS")
		rows = make([][]string, len(rep.Consumers))
		for i, c := range rep.Consumers {
			rows[i] = []string{c.Queue, c.Consumer, fmtSeconds(c.LagSeconds), strconv.FormatInt(c.Pending, 10),
				fmtSeconds(c.LastSeenSeconds) + " ago", strconv.FormatInt(c.RetryPending, 10), joinWarnings(c.Warnings)}
		}
		if err := table(w, []string{"QUEUE", "CONSUMER", "LAG", "PENDING", "LAST BATCH", "RETRIES", "WARNINGS"}, rows); err != nil {
			return err
		}
	}
	if len(rep.Slots) > 0 {
		fmt.Fprintln(w, "\nSLOTS")
		rows := slotRows(rep.Slots)
		for i, sl := range rep.Slots {
			held := "-"
			if sl.HeldKeys > 0 {
				held = fmt.Sprintf("%d keys, %d ev, %s", sl.HeldKeys, sl.HeldEvents, fmtSeconds(sl.OldestHoldSeconds))
			}
			n := len(rows[i])
			rows[i] = append(rows[i][:n-1:n-1], held, rows[i][n-1])
		}
		if err := table(w, []string{"QUEUE", "CONSUMER", "SLOT", "OWNER", "EPOCH", "LAG", "OLDEST", "BLOCKED", "LAST BATCH", "HELD", "WARNINGS"}, rows); err != nil {
			return err
		}
	}
	if err := writeResizes(w, rep.Resizes); err != nil {
		return err
	}
	if err := writeBlockers(w, rep.Blockers, rep.Time); err != nil {
		return err
	}
	if len(rep.Warnings) > 0 {
		fmt.Fprintln(w, "\nWARNINGS")
		for _, msg := range rep.Warnings {
			fmt.Fprintln(w, "  - "+msg)
		}
	}
	return nil
}

// writeBlockers renders what holds back rotations and flips, one row per
// blocker: for a session its pid, role, how long its transaction has been
// open and the lock it holds.
func writeBlockers(w io.Writer, bs []view.Blocker, now time.Time) error {
	if len(bs) == 0 {
		return nil
	}
	fmt.Fprintln(w, "\nROTATION BLOCKERS")
	rows := make([][]string, len(bs))
	for i, b := range bs {
		queue, pid, since := "(flips)", "-", "-"
		if b.Queue != nil {
			queue = *b.Queue
		}
		if b.PID != nil {
			pid = strconv.Itoa(*b.PID)
		}
		if b.Since != nil {
			since = fmtSeconds(now.Sub(*b.Since).Seconds()) + " ago"
		}
		rows[i] = []string{queue, b.Kind, pid, orDash(deref(b.Role)), since, orDash(deref(b.Holds)), b.What}
	}
	return table(w, []string{"QUEUE", "KIND", "PID", "ROLE", "SINCE", "HOLDS", "WHAT"}, rows)
}

// slotTable renders slots as an aligned table.
func slotTable(w io.Writer, slots []slotRow) error {
	return table(w, []string{"QUEUE", "CONSUMER", "SLOT", "OWNER", "EPOCH", "LAG", "OLDEST", "BLOCKED", "LAST BATCH", "WARNINGS"}, slotRows(slots))
}

// isTerminal reports whether the stream s is a terminal.
func isTerminal(s any) bool {
	f, ok := s.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// fmtTickerLag renders a queue's ticker lag. With nothing unticked the age
// of the last tick says nothing about delivery: an idle queue ticks only
// every ticker_idle_period (60 s by default), so its lag climbs toward
// that while all is well. It shows as "idle" then, unless the ticker has
// been silent past the idle period (the "no tick" warning's condition).
func fmtTickerLag(q *queueInfo) string {
	if q.Unticked == 0 && q.TickerLagSeconds <= q.Config.IdleSeconds+StuckAfterDefault.Seconds() {
		return "idle"
	}
	return fmtSeconds(q.TickerLagSeconds)
}
