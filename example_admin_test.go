package pgque_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"sync/atomic"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgque/pgque"
)

// Check, before starting services, that the database holds the schema this
// library was built for. Connect does this itself; CheckSchema is for a
// client made with NewClient over an application's own pool.
func ExampleClient_CheckSchema() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, databaseURL())
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	client, err := pgque.NewClient(pool, nil)
	if err != nil {
		log.Fatal(err)
	}
	err = client.CheckSchema(ctx)
	var mismatch *pgque.SchemaVersionError
	switch {
	case errors.As(err, &mismatch):
		log.Fatalf("run the migrations first: database %s, library %s", mismatch.Installed, mismatch.Want)
	case err != nil:
		log.Fatal(err)
	}
	installed, _ := client.InstalledSchemaVersion(ctx)
	fmt.Println(installed == pgque.SchemaVersion)
	// Output: true
}

// List a consumer's dead letters and replay one: the event goes back into
// the queue for that consumer only, with its retry count reset.
func ExampleClient_DeadLetters() {
	ctx := context.Background()
	client, err := pgque.Connect(ctx, databaseURL(), nil)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	_, _ = client.CreateQueue(ctx, "files_dlq")
	// No retries: the first failure dead-letters the event.
	_ = client.SetQueueConfig(ctx, "files_dlq", pgque.QueueMaxRetries(0))
	ticker, _ := client.NewTicker(nil)
	_ = ticker.Start(ctx)
	defer ticker.Stop(ctx)

	attempts := make(chan int, 10)
	var calls atomic.Int32
	consumer, _ := client.NewConsumer(&pgque.ConsumerConfig{
		Queue: "files_dlq", Consumer: "thumbnailer",
		Handler: func(ctx context.Context, m *pgque.Message) error {
			defer func() { attempts <- m.RetryCount }()
			if calls.Add(1) == 1 {
				return errors.New("image decoder crashed")
			}
			return nil
		},
	})
	if err := consumer.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer consumer.Stop(ctx)
	id, _ := client.Send(ctx, "files_dlq", pgque.Event{Type: "FileCreated", Payload: FileEvent{Tenant: "acme", Path: "/cat.png"}})
	<-attempts // the failed attempt

	var dls []pgque.DeadLetterEntry
	for len(dls) == 0 { // the nack lands just after the handler returned
		dls, err = client.DeadLetters(ctx, "files_dlq", &pgque.DeadLetterFilter{Consumer: "thumbnailer"})
		if err != nil {
			log.Fatal(err)
		}
	}
	d := dls[0]
	fmt.Println(d.Consumer, d.Type, d.Reason, d.EventID == id, string(d.Payload))

	evID, err := client.ReplayDeadLetter(ctx, "files_dlq", d.ID)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("replayed", evID == id, "retry count", <-attempts)
	left, _ := client.DeadLetters(ctx, "files_dlq", nil)
	fmt.Println("dead letters left:", len(left))
	// Output:
	// thumbnailer FileCreated image decoder crashed true {"tenant":"acme","path":"/cat.png"}
	// replayed true retry count 0
	// dead letters left: 0
}

// Read who holds each slot of a partitioned consumer and how far behind it
// is: the data behind `pgque slots status`.
func ExampleClient_Slots() {
	ctx := context.Background()
	client, err := pgque.Connect(ctx, databaseURL(), nil)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	_, _ = client.CreateQueue(ctx, "files_slots")
	created, err := client.SubscribeSlots(ctx, "files_slots", "indexer", 4, pgque.FailurePolicyPause)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("new slots:", created)
	slots, err := client.Slots(ctx, "files_slots", "indexer")
	if err != nil {
		log.Fatal(err)
	}
	for _, s := range slots {
		owner := s.Owner
		if owner == "" {
			owner = "(none)"
		}
		fmt.Printf("slot %d/%d owner %s lag %d policy %v\n", s.Slot, s.NSlots, owner, s.Lag, s.Policy)
	}
	// Output:
	// new slots: 4
	// slot 0/4 owner (none) lag 0 policy pause
	// slot 1/4 owner (none) lag 0 policy pause
	// slot 2/4 owner (none) lag 0 policy pause
	// slot 3/4 owner (none) lag 0 policy pause
}
