package cli

import (
	"fmt"
	"strconv"
	"time"

	"github.com/pgque/pgque"
	"github.com/pgque/pgque/cmd/pgque/internal/view"
	"github.com/spf13/cobra"
)

func (a *app) dlqCommand() *cobra.Command {
	return group("dlq", "List, replay and purge dead letters (events that failed max_retries times)",
		a.dlqListCommand(), a.dlqReplayCommand(), a.dlqPurgeCommand())
}

func (a *app) dlqListCommand() *cobra.Command {
	var (
		consumer string
		max      int
		asJSON   bool
	)
	cmd := &cobra.Command{
		Use:   "list <queue>",
		Short: "List a queue's dead letters, oldest first",
		Args:  exactArgs("queue"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if max < 0 {
				return usagef("--max must not be negative")
			}
			ctx := cmd.Context()
			s, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer s.Close()
			dls, err := s.deadLetters(ctx, args[0], consumer, max)
			if err != nil {
				return err
			}
			if asJSON {
				return a.printJSON(nonNil(dls))
			}
			rows := make([][]string, len(dls))
			for i, d := range dls {
				slot := "-"
				if d.Slot != nil {
					slot = strconv.Itoa(*d.Slot)
				}
				rows[i] = []string{strconv.FormatInt(d.ID, 10), d.Consumer, slot, d.DeadSince.Format(time.DateTime),
					strconv.FormatInt(d.EvID, 10), deref(d.Type), deref(d.Key), strconv.Itoa(d.RetryCount),
					truncate(deref(d.Reason), 60), truncate(d.PayloadString(), 60)}
			}
			return table(a.stdout, []string{"DL_ID", "CONSUMER", "SLOT", "DEAD SINCE", "EV_ID", "TYPE", "KEY", "RETRIES", "REASON", "PAYLOAD"}, rows)
		},
	}
	cmd.Flags().StringVar(&consumer, "consumer", "", "only this consumer's dead letters (every slot's for a partitioned consumer)")
	cmd.Flags().IntVar(&max, "max", 100, "list at most this many")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the dead letters as JSON (full reason; the payload as JSON, or as payload_text when it is not JSON)")
	return cmd
}

func (a *app) dlqReplayCommand() *cobra.Command {
	var (
		all      bool
		consumer string
	)
	cmd := &cobra.Command{
		Use:   "replay <queue> (<dl_id>... | --all)",
		Short: "Put dead letters back into the queue for the consumer they failed for",
		Long: `Replay re-inserts dead letters into the queue, each for the consumer it failed
for only, and removes them from the dead-letter table. A replay keeps its
ev_id and retry count and reaches the handler marked as a replay
(Message.Replay, the relay's pgque-replay header, a negative retry_count
from receive), after every event the consumer has already had. When those
include later events of the same key, the replay will be handled out of
the key's order, and a warning on stderr says so (the replay is done
either way). Name them by id, or pass --all (optionally with --consumer).
Each replay is its own transaction.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			queue, ids := args[0], args[1:]
			if all == (len(ids) > 0) {
				return usagef("name the dead letters to replay by id, or pass --all (not both)")
			}
			if consumer != "" && !all {
				return usagef("--consumer goes with --all")
			}
			dlIDs := make([]int64, len(ids))
			for i, s := range ids {
				id, err := strconv.ParseInt(s, 10, 64)
				if err != nil {
					return usagef("dead letter id %q is not a number", s)
				}
				dlIDs[i] = id
			}
			ctx := cmd.Context()
			s, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer s.Close()
			for all {
				// Replaying removes them, so every page is new.
				dls, err := s.deadLetters(ctx, queue, consumer, 1000)
				if err != nil || len(dls) == 0 {
					return err
				}
				page := make([]int64, len(dls))
				for i, d := range dls {
					page[i] = d.ID
				}
				if err := a.replay(cmd, s, queue, page); err != nil {
					return err
				}
			}
			return a.replay(cmd, s, queue, dlIDs)
		},
	}
	cmd.Flags().BoolVar(&all, "all", false, "replay every dead letter of the queue")
	cmd.Flags().StringVar(&consumer, "consumer", "", "with --all: only this consumer's dead letters (every slot's for a partitioned consumer)")
	return cmd
}

// replay replays ids one by one, prints each event id and warns of each
// replay that comes after later events of its key.
func (a *app) replay(cmd *cobra.Command, s *session, queue string, ids []int64) error {
	for _, id := range ids {
		r, err := s.ReplayDeadLetterReport(cmd.Context(), queue, id)
		if err != nil {
			return err
		}
		fmt.Fprintf(a.stdout, "replayed dead letter %d as event %d\n", id, r.EventID)
		if w := view.ReplayWarning(r); w != "" {
			fmt.Fprintf(a.stderr, "warning: dead letter %d: %s\n", id, w)
		}
	}
	return nil
}

func (a *app) dlqPurgeCommand() *cobra.Command {
	var (
		consumer  string
		olderThan time.Duration
		yes       bool
	)
	cmd := &cobra.Command{
		Use:   "purge <queue> --yes",
		Short: "Delete dead letters for good",
		Args:  exactArgs("queue"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if olderThan < 0 {
				return usagef("--older-than must not be negative")
			}
			if !yes {
				return usagef("purging deletes dead letters for good; pass --yes to confirm")
			}
			ctx := cmd.Context()
			s, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer s.Close()
			n, err := s.PurgeDeadLetters(ctx, args[0], &pgque.PurgeFilter{Consumer: consumer, OlderThan: olderThan})
			if err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "purged %d dead letters from queue %s\n", n, args[0])
			return nil
		},
	}
	cmd.Flags().StringVar(&consumer, "consumer", "", "only this consumer's dead letters (every slot's for a partitioned consumer)")
	cmd.Flags().DurationVar(&olderThan, "older-than", 0, "only dead letters older than this, e.g. 72h")
	cmd.Flags().BoolVar(&yes, "yes", false, "confirm")
	return cmd
}

// deref returns *s, or "" for nil.
func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// truncate shortens s to n runes, marking the cut.
func truncate(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}
