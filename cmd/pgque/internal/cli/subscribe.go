package cli

import (
	"fmt"

	"github.com/spf13/cobra"
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
			created, err := s.Subscribe(ctx, args[0], args[1])
			if err != nil {
				return err
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
			if _, err := s.Unsubscribe(ctx, args[0], args[1]); err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "unsubscribed %s from queue %s\n", args[1], args[0])
			return nil
		},
	}
}
