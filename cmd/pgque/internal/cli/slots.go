package cli

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgque/pgque"
)

func (a *app) slotsCommand() *cobra.Command {
	return group("slots", "Manage and inspect the slots of partitioned consumers",
		a.slotsSubscribeCommand(), a.slotsUnsubscribeCommand(), a.slotsStatusCommand(),
		a.slotsPolicyCommand(), a.slotsBlockedCommand(), a.slotsUnblockCommand(), a.slotsRetryNowCommand(),
		a.slotsResizeCommand())
}

// slotFlags are the --consumer and --slots flags of slots subscribe and
// unsubscribe.
type slotFlags struct {
	consumer string
	slots    int
}

func (f *slotFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.consumer, "consumer", "", "consumer name (required)")
	cmd.Flags().IntVar(&f.slots, "slots", 0, "number of slots N (required)")
	_ = cmd.MarkFlagRequired("slots")
}

// validate checks the flags; the consumer may also come as the argument
// after the queue (see consumerOf).
func (f *slotFlags) validate(args []string) error {
	consumer, err := consumerOf(f.consumer, args)
	if err != nil {
		return err
	}
	f.consumer = consumer
	if f.slots < 1 {
		return usagef("--slots must be at least 1, not %d", f.slots)
	}
	return nil
}

func (a *app) slotsSubscribeCommand() *cobra.Command {
	var (
		f          slotFlags
		policy     string
		fromOldest bool
	)
	cmd := &cobra.Command{
		Use:   "subscribe <queue> --consumer c --slots N [--policy skip|pause] [--from-oldest]",
		Short: "Subscribe all N slots of a partitioned consumer, in one transaction",
		Long: `Slots subscribe subscribes slots 0..N-1 of consumer c (subscriptions named
c#k/N). N is persisted for (queue, consumer): subscribing again with another N
fails. Every slot starts at the queue's latest tick: it receives the events
sent from then on, not those sent before. So subscribe when you install,
before the producers start; a relay or worker pool started later then finds
every event waiting for it.

--from-oldest starts new slots at the oldest event the queue still keeps
for its other subscriptions instead (a queue nobody else subscribes to
keeps nothing: there it changes nothing). It prints an upper bound of the
earlier events that gives them.

--policy sets the failure policy when the consumer is new: skip (the default:
later events of a key may overtake a failed one) or pause (they wait until
the failed one succeeds or is dead-lettered). An existing consumer keeps its
policy; change it with 'pgque slots policy'.`,
		Args: rangeArgs([]string{"queue"}, "consumer"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := f.validate(args); err != nil {
				return err
			}
			if err := checkPolicy(policy, true); err != nil {
				return err
			}
			ctx := cmd.Context()
			s, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer s.Close()
			var pol pgque.FailurePolicy
			if policy != "" {
				if pol, err = pgque.ParseFailurePolicy(policy); err != nil {
					return usagef("%v", err)
				}
			}
			if fromOldest {
				created, gained, err := s.SubscribeSlotsFromOldest(ctx, args[0], f.consumer, f.slots, pol)
				if err != nil {
					return err
				}
				fmt.Fprintf(a.stdout, "subscribed %s to queue %s with %d slots (%d new), from the oldest kept event (up to %d earlier events)\n",
					f.consumer, args[0], f.slots, created, gained)
				return nil
			}
			created, err := s.SubscribeSlots(ctx, args[0], f.consumer, f.slots, pol)
			if err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "subscribed %s to queue %s with %d slots (%d new)\n", f.consumer, args[0], f.slots, created)
			return nil
		},
	}
	f.add(cmd)
	cmd.Flags().StringVar(&policy, "policy", "", "failure policy of a new consumer: skip or pause (default skip)")
	cmd.Flags().BoolVar(&fromOldest, "from-oldest", false, "start new slots at the oldest event the queue keeps for its other subscriptions, not at the latest tick")
	return cmd
}

func (a *app) slotsUnsubscribeCommand() *cobra.Command {
	var f slotFlags
	cmd := &cobra.Command{
		Use:   "unsubscribe <queue> --consumer c --slots N",
		Short: "Unsubscribe all N slots of a partitioned consumer, in one transaction",
		Args:  rangeArgs([]string{"queue"}, "consumer"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := f.validate(args); err != nil {
				return err
			}
			ctx := cmd.Context()
			s, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer s.Close()
			if err := s.UnsubscribeSlots(ctx, args[0], f.consumer, f.slots); err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "unsubscribed the %d slots of %s from queue %s\n", f.slots, f.consumer, args[0])
			return nil
		},
	}
	f.add(cmd)
	return cmd
}

func (a *app) slotsStatusCommand() *cobra.Command {
	var (
		consumer string
		asJSON   bool
		th       thresholds
	)
	cmd := &cobra.Command{
		Use:   "status [queue]",
		Short: "Show every slot: owner, epoch, lag, oldest pending event, warnings",
		Long: `Slots status reads the partition_slot_status view: one row per slot with its
lease owner (empty when no live worker holds it), epoch, lag (pending events
of that slot), the age of its oldest pending event, and warnings: a slot with
lag and no live owner, or whose last batch is older than --stuck-after, is
stuck or unpolled, and pins the queue's table rotation.`,
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
			if queue != "" {
				if _, err := s.Queues(ctx, queue); err != nil { // names an unknown queue
					return err
				}
			}
			slots, err := s.slotRows(ctx, queue, consumer)
			if err != nil {
				return err
			}
			for i := range slots {
				slots[i].Warnings = th.slotWarnings(&slots[i])
			}
			if asJSON {
				return a.printJSON(nonNil(slots))
			}
			return slotTable(a.stdout, slots)
		},
	}
	cmd.Flags().StringVar(&consumer, "consumer", "", "only this consumer")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the slots as JSON")
	th.add(cmd)
	return cmd
}

// slotRows renders slots for table.
func slotRows(slots []slotRow) [][]string {
	rows := make([][]string, len(slots))
	for i, sl := range slots {
		owner := "-"
		if sl.Owner != nil {
			owner = *sl.Owner
		}
		rows[i] = []string{sl.Queue, sl.Consumer, fmt.Sprintf("%d/%d", sl.Slot, sl.NSlots), owner,
			strconv.FormatInt(sl.Epoch, 10), strconv.FormatInt(sl.Lag, 10), fmtAge(sl.OldestPendingSeconds, sl.Lag > 0),
			strconv.Itoa(sl.BlockedKeys), fmtSeconds(sl.LastActiveSeconds) + " ago", joinWarnings(sl.Warnings)}
	}
	return rows
}

// checkPolicy validates a failure policy flag or argument.
func checkPolicy(policy string, optional bool) error {
	if (optional && policy == "") || policy == "skip" || policy == "pause" {
		return nil
	}
	return usagef("failure policy must be skip or pause, not %q", policy)
}

func (a *app) slotsPolicyCommand() *cobra.Command {
	var consumer string
	cmd := &cobra.Command{
		Use:   "policy <queue> --consumer c skip|pause",
		Short: "Change the failure policy of a partitioned consumer",
		Args:  exactArgs("queue", "policy"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if consumer == "" {
				return usagef("--consumer must not be empty")
			}
			if err := checkPolicy(args[1], false); err != nil {
				return err
			}
			ctx := cmd.Context()
			s, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer s.Close()
			pol, err := pgque.ParseFailurePolicy(args[1])
			if err != nil {
				return usagef("%v", err)
			}
			if err := s.SetFailurePolicy(ctx, args[0], consumer, pol); err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "consumer %s on queue %s now has failure policy %s\n", consumer, args[0], args[1])
			return nil
		},
	}
	cmd.Flags().StringVar(&consumer, "consumer", "", "consumer name (required)")
	_ = cmd.MarkFlagRequired("consumer")
	return cmd
}

func (a *app) slotsBlockedCommand() *cobra.Command {
	var (
		consumer string
		asJSON   bool
	)
	cmd := &cobra.Command{
		Use:   "blocked <queue> [--consumer c]",
		Short: "List the keys the pause policy holds back after a failure",
		Long: `Blocked lists, for consumers with the pause failure policy, every key whose
head event failed: later events of the key are deferred until the head
succeeds on a retry or is dead-lettered. 'pgque slots retry-now' retries the
head at once; 'pgque slots unblock' dead-letters it and releases the rest.`,
		Args: exactArgs("queue"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			s, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer s.Close()
			keys, err := s.blockedKeys(ctx, args[0], consumer)
			if err != nil {
				return err
			}
			if asJSON {
				return a.printJSON(nonNil(keys))
			}
			rows := make([][]string, len(keys))
			for i, k := range keys {
				rows[i] = []string{k.Consumer, strconv.Itoa(k.Slot), fmtKey(k.Key), k.State, strconv.FormatInt(k.HeadEvID, 10),
					fmtSeconds(time.Since(k.Since).Seconds()) + " ago", strconv.Itoa(k.Failures), strconv.FormatInt(k.Deferred, 10),
					truncate(deref(k.Reason), 60)}
			}
			return table(a.stdout, []string{"CONSUMER", "SLOT", "KEY", "STATE", "HEAD EV_ID", "SINCE", "FAILURES", "DEFERRED", "REASON"}, rows)
		},
	}
	cmd.Flags().StringVar(&consumer, "consumer", "", "only this consumer")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the blocked keys as JSON")
	return cmd
}

// keyFlags are the --consumer and --key flags of unblock and retry-now.
type keyFlags struct {
	consumer string
	key      string
	nullKey  bool
}

func (f *keyFlags) add(cmd *cobra.Command) {
	cmd.Flags().StringVar(&f.consumer, "consumer", "", "consumer name (required)")
	cmd.Flags().StringVar(&f.key, "key", "", "the blocked partition key")
	cmd.Flags().BoolVar(&f.nullKey, "null-key", false, "the blocked key is the NULL key (events sent without a key)")
	_ = cmd.MarkFlagRequired("consumer")
}

// keyArg returns the key as SQL sees it (nil: the NULL key).
func (f *keyFlags) keyArg(cmd *cobra.Command) (*string, error) {
	switch {
	case f.consumer == "":
		return nil, usagef("--consumer must not be empty")
	case f.nullKey && cmd.Flags().Changed("key"):
		return nil, usagef("pass --key or --null-key, not both")
	case f.nullKey:
		return nil, nil
	case !cmd.Flags().Changed("key"):
		return nil, usagef("name the blocked key with --key (or --null-key)")
	}
	return &f.key, nil
}

// keyCommand is a command on one blocked key of a consumer: it parses
// --consumer and --key/--null-key, connects, and runs do with the queue.
func (a *app) keyCommand(use, short string, do func(ctx context.Context, s *session, queue, consumer string, key *string) error) *cobra.Command {
	var f keyFlags
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Args:  exactArgs("queue"),
		RunE: func(cmd *cobra.Command, args []string) error {
			key, err := f.keyArg(cmd)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			s, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer s.Close()
			return do(ctx, s, args[0], f.consumer, key)
		},
	}
	f.add(cmd)
	return cmd
}

func (a *app) slotsUnblockCommand() *cobra.Command {
	return a.keyCommand("unblock <queue> --consumer c --key k",
		"Dead-letter a blocked key's failing head and release the events behind it",
		func(ctx context.Context, s *session, queue, consumer string, key *string) error {
			evID, err := s.UnblockKey(ctx, queue, consumer, keyRefOf(key))
			if err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "dead-lettered event %d; key %s released for %s\n", evID, fmtKey(key), consumer)
			return nil
		})
}

func (a *app) slotsRetryNowCommand() *cobra.Command {
	return a.keyCommand("retry-now <queue> --consumer c --key k",
		"Redeliver a blocked key's failing head now instead of after its backoff",
		func(ctx context.Context, s *session, queue, consumer string, key *string) error {
			pending, err := s.RetryKeyNow(ctx, queue, consumer, keyRefOf(key))
			if err != nil {
				return err
			}
			if !pending {
				fmt.Fprintf(a.stdout, "key %s of %s has no pending retry to hurry (its events are being delivered)\n", fmtKey(key), consumer)
			} else {
				fmt.Fprintf(a.stdout, "key %s of %s: head scheduled for redelivery now\n", fmtKey(key), consumer)
			}
			return nil
		})
}

// fmtKey renders a partition key; nil is the NULL key.
func fmtKey(k *string) string {
	if k == nil {
		return "(null)"
	}
	return strconv.Quote(*k)
}
