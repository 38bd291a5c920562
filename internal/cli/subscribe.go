package cli

import (
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/spf13/cobra"

	"github.com/pgque/pgque/internal/dbq"
)

func (a *app) subscribeCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "subscribe <queue> <consumer>",
		Short: "Subscribe a consumer to a queue (it starts at the queue's latest tick)",
		Args:  exactArgs("queue", "consumer"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			s, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer s.Close()
			created, err := s.dbq.Subscribe(ctx, args[0], args[1])
			if err != nil {
				return dbErr(fmt.Sprintf("subscribing %q to queue %q", args[1], args[0]), err)
			}
			if created {
				fmt.Fprintf(a.stdout, "subscribed %s to queue %s\n", args[1], args[0])
			} else {
				fmt.Fprintf(a.stdout, "%s was already subscribed to queue %s\n", args[1], args[0])
			}
			return nil
		},
	}
}

func (a *app) unsubscribeCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "unsubscribe <queue> <consumer>",
		Short: "Remove a subscription (its pending events are dropped for it)",
		Args:  exactArgs("queue", "consumer"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			s, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer s.Close()
			if err := s.dbq.Unsubscribe(ctx, args[0], args[1]); err != nil {
				return dbErr(fmt.Sprintf("unsubscribing %q from queue %q", args[1], args[0]), err)
			}
			fmt.Fprintf(a.stdout, "unsubscribed %s from queue %s\n", args[1], args[0])
			return nil
		},
	}
}

func (a *app) slotsCommand() *cobra.Command {
	return group("slots", "Manage and inspect the slots of partitioned consumers",
		a.slotsSubscribeCommand(), a.slotsUnsubscribeCommand(), a.slotsStatusCommand())
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
	_ = cmd.MarkFlagRequired("consumer")
	_ = cmd.MarkFlagRequired("slots")
}

func (f *slotFlags) validate() error {
	if f.consumer == "" {
		return usagef("--consumer must not be empty")
	}
	if f.slots < 1 {
		return usagef("--slots must be at least 1, not %d", f.slots)
	}
	return nil
}

func (a *app) slotsSubscribeCommand() *cobra.Command {
	var f slotFlags
	cmd := &cobra.Command{
		Use:   "subscribe <queue> --consumer c --slots N",
		Short: "Subscribe all N slots of a partitioned consumer, in one transaction",
		Long: `Slots subscribe subscribes slots 0..N-1 of consumer c (subscriptions named
c#k/N). N is persisted for (queue, consumer): subscribing again with another N
fails. Every slot starts at the queue's latest tick.`,
		Args: exactArgs("queue"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := f.validate(); err != nil {
				return err
			}
			ctx := cmd.Context()
			s, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer s.Close()
			created := 0
			err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
				q := dbq.New(tx)
				created = 0
				for slot := range f.slots {
					isNew, err := q.SubscribeSlot(ctx, args[0], f.consumer, slot, f.slots)
					if err != nil {
						return err
					}
					if isNew {
						created++
					}
				}
				return nil
			})
			if err != nil {
				return dbErr(fmt.Sprintf("subscribing %d slots of %q to queue %q", f.slots, f.consumer, args[0]), err)
			}
			fmt.Fprintf(a.stdout, "subscribed %s to queue %s with %d slots (%d new)\n", f.consumer, args[0], f.slots, created)
			return nil
		},
	}
	f.add(cmd)
	return cmd
}

func (a *app) slotsUnsubscribeCommand() *cobra.Command {
	var f slotFlags
	cmd := &cobra.Command{
		Use:   "unsubscribe <queue> --consumer c --slots N",
		Short: "Unsubscribe all N slots of a partitioned consumer, in one transaction",
		Args:  exactArgs("queue"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := f.validate(); err != nil {
				return err
			}
			ctx := cmd.Context()
			s, err := a.connect(ctx)
			if err != nil {
				return err
			}
			defer s.Close()
			err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
				q := dbq.New(tx)
				for slot := range f.slots {
					if err := q.UnsubscribeSlot(ctx, args[0], f.consumer, slot, f.slots); err != nil {
						return err
					}
				}
				return nil
			})
			if err != nil {
				return dbErr(fmt.Sprintf("unsubscribing %d slots of %q from queue %q", f.slots, f.consumer, args[0]), err)
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
				if _, err := s.q.queueInfo(ctx, queue); err != nil { // names an unknown queue
					return err
				}
			}
			slots, err := s.q.slotStatus(ctx, queue, consumer)
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
			fmtSeconds(sl.LastActiveSeconds) + " ago", joinWarnings(sl.Warnings)}
	}
	return rows
}
