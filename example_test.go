package pgque_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgque/pgque"
)

// FileEvent is the payload of the examples' file-lifecycle events.
type FileEvent struct {
	Tenant string `json:"tenant"`
	Path   string `json:"path"`
}

// Send an event inside your own transaction: it becomes visible to
// consumers exactly when the transaction commits, and vanishes when it rolls
// back.
func ExampleClient_SendTx() {
	ctx := context.Background()
	client, err := pgque.Connect(ctx, databaseURL(), nil)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	if _, err := client.CreateQueue(ctx, "files_tx"); err != nil {
		log.Fatal(err)
	}

	// Somebody must tick the queue; any number of processes may run a
	// Ticker, one of them leads.
	ticker, _ := client.NewTicker(nil)
	_ = ticker.Start(ctx)
	defer ticker.Stop(ctx)

	got := make(chan string, 10)
	consumer, _ := client.NewConsumer(&pgque.ConsumerConfig{
		Queue: "files_tx", Consumer: "indexer",
		Handler: func(ctx context.Context, m *pgque.Message) error {
			var ev FileEvent
			if err := m.Decode(&ev); err != nil {
				return err
			}
			got <- fmt.Sprintf("%s %s %s", m.Type, ev.Tenant, ev.Path)
			return nil
		},
	})
	if err := consumer.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer consumer.Stop(ctx)

	// Rolled back: never delivered.
	tx, _ := client.Pool().Begin(ctx)
	_, _ = client.SendTx(ctx, tx, "files_tx", pgque.Event{Type: "FileCreated",
		Payload: FileEvent{Tenant: "acme", Path: "/draft.txt"}, PartitionKey: "acme"})
	_ = tx.Rollback(ctx)

	// Committed together with the application's own writes.
	err = pgx.BeginFunc(ctx, client.Pool(), func(tx pgx.Tx) error {
		// ... the application's own INSERTs/UPDATEs go here ...
		_, err := client.SendTx(ctx, tx, "files_tx", pgque.Event{Type: "FileCreated",
			Payload: FileEvent{Tenant: "acme", Path: "/report.pdf"}, PartitionKey: "acme"})
		return err
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(<-got)
	// Output: FileCreated acme /report.pdf
}

// Consume one plain subscription: events arrive in ev_id order, chunk by
// chunk; a handler error (or panic) nacks the event for a later retry.
func ExampleConsumer() {
	ctx := context.Background()
	client, err := pgque.Connect(ctx, databaseURL(), nil)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	_, _ = client.CreateQueue(ctx, "files_consumer")
	ticker, _ := client.NewTicker(nil)
	_ = ticker.Start(ctx)
	defer ticker.Stop(ctx)

	var wg sync.WaitGroup
	wg.Add(3)
	consumer, err := client.NewConsumer(&pgque.ConsumerConfig{
		Queue: "files_consumer", Consumer: "audit",
		Handler: func(ctx context.Context, m *pgque.Message) error {
			defer wg.Done()
			fmt.Printf("%s %s\n", m.Type, m.Payload)
			return nil
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := consumer.Start(ctx); err != nil {
		log.Fatal(err)
	}

	_, err = client.SendBatch(ctx, "files_consumer", []pgque.Event{
		{Type: "FileCreated", Payload: FileEvent{Tenant: "acme", Path: "/a"}},
		{Type: "FileOverwritten", Payload: FileEvent{Tenant: "acme", Path: "/a"}},
		{Type: "FileDeleted", Payload: FileEvent{Tenant: "acme", Path: "/a"}},
	})
	if err != nil {
		log.Fatal(err)
	}
	wg.Wait()
	if err := consumer.Stop(ctx); err != nil {
		log.Fatal(err)
	}
	// Output:
	// FileCreated {"tenant":"acme","path":"/a"}
	// FileOverwritten {"tenant":"acme","path":"/a"}
	// FileDeleted {"tenant":"acme","path":"/a"}
}

// A pool of workers over N slots: events of one tenant (partition key) are
// handled in order by one worker at a time; tenants are handled in
// parallel. Run the same code in as many processes as you like: they share
// the slots without configuration.
func ExamplePartitionedConsumer() {
	ctx := context.Background()
	client, err := pgque.Connect(ctx, databaseURL(), nil)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	_, _ = client.CreateQueue(ctx, "files_pool")
	ticker, _ := client.NewTicker(nil)
	_ = ticker.Start(ctx)
	defer ticker.Stop(ctx)

	var mu sync.Mutex
	perTenant := map[string][]string{}
	var wg sync.WaitGroup
	pool, err := client.NewPartitionedConsumer(&pgque.PartitionedConsumerConfig{
		Queue: "files_pool", Consumer: "thumbnailer", Slots: 4,
		Handler: func(ctx context.Context, m *pgque.Message) error {
			defer wg.Done()
			// m.Slot and m.Epoch identify the lease: stamp side effects
			// with the epoch to fence out a worker that lost its slot.
			mu.Lock()
			defer mu.Unlock()
			perTenant[m.PartitionKey] = append(perTenant[m.PartitionKey], m.Type)
			return nil
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := pool.Start(ctx); err != nil {
		log.Fatal(err)
	}

	var events []pgque.Event
	for _, typ := range []string{"FileCreated", "FileOverwritten", "FileDeleted"} {
		for _, tenant := range []string{"acme", "globex", "initech"} {
			events = append(events, pgque.Event{Type: typ, PartitionKey: tenant,
				Payload: FileEvent{Tenant: tenant, Path: "/a"}})
		}
	}
	wg.Add(len(events))
	if _, err := client.SendBatch(ctx, "files_pool", events); err != nil {
		log.Fatal(err)
	}
	wg.Wait()
	_ = pool.Stop(ctx)

	tenants := make([]string, 0, len(perTenant))
	for tenant := range perTenant {
		tenants = append(tenants, tenant)
	}
	sort.Strings(tenants)
	for _, tenant := range tenants {
		fmt.Println(tenant+":", strings.Join(perTenant[tenant], " → "))
	}
	// Output:
	// acme: FileCreated → FileOverwritten → FileDeleted
	// globex: FileCreated → FileOverwritten → FileDeleted
	// initech: FileCreated → FileOverwritten → FileDeleted
}

// Shut down gracefully on SIGTERM: Stop stops fetching, lets the chunks in
// flight finish and be acked, and releases the slot leases so that the
// other processes take the slots over at once. If the deadline passes first,
// the work is abandoned unacked and redelivered to the next owner.
func ExamplePartitionedConsumer_Stop() {
	client, err := pgque.Connect(context.Background(), databaseURL(), nil)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	_, _ = client.CreateQueue(context.Background(), "files_shutdown")

	pool, err := client.NewPartitionedConsumer(&pgque.PartitionedConsumerConfig{
		Queue: "files_shutdown", Consumer: "billing", Slots: 8,
		Handler: func(ctx context.Context, m *pgque.Message) error { return nil },
	})
	if err != nil {
		log.Fatal(err)
	}
	// In a real program: ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM).
	signalled, stop := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer stop()
	// Start's context is the pool's lifetime: cancelling it is a hard stop,
	// like a crash. Keep it separate from the signal.
	if err := pool.Start(context.Background()); err != nil {
		log.Fatal(err)
	}
	<-signalled.Done()

	ctx, cancel := context.WithTimeout(context.Background(), 25*time.Second)
	defer cancel()
	if err := pool.Stop(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "abandoned work in flight:", err)
	}
	fmt.Println("stopped; slots still owned:", len(pool.OwnedSlots()))
	// Output: stopped; slots still owned: 0
}
