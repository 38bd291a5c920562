package cli

import (
	"context"

	"github.com/pgque/pgque"
	"github.com/pgque/pgque/cmd/pgque/internal/view"
)

// The rows the CLI prints live in package view, which the web console
// shares; these names keep the commands' code short.
type (
	queueInfo    = view.QueueInfo
	consumerInfo = view.ConsumerInfo
	slotRow      = view.SlotRow
	blockedKey   = view.BlockedKey
	deadLetter   = view.DeadLetter
)

var (
	fmtInterval = view.FmtInterval
	nilIfEmpty  = view.NilIfEmpty
	keyArgOf    = view.KeyArgOf
	keyRefOf    = view.KeyRefOf
)

// queueInfos reads queue, or every queue for "".
func (s *session) queueInfos(ctx context.Context, queue string) ([]queueInfo, error) {
	qs, err := s.Queues(ctx, queue)
	if err != nil {
		return nil, err
	}
	out := make([]queueInfo, len(qs))
	for i, q := range qs {
		out[i] = view.QueueInfoOf(q)
	}
	return out, nil
}

// consumerInfos reads the subscriptions of queue, or of every queue for "".
func (s *session) consumerInfos(ctx context.Context, queue string) ([]consumerInfo, error) {
	cs, err := s.Consumers(ctx, queue)
	if err != nil {
		return nil, err
	}
	out := make([]consumerInfo, len(cs))
	for i, c := range cs {
		out[i] = view.ConsumerInfoOf(c)
	}
	return out, nil
}

// slotRows reads the slots of consumer on queue ("" matches every one).
func (s *session) slotRows(ctx context.Context, queue, consumer string) ([]slotRow, error) {
	slots, err := s.Slots(ctx, queue, consumer)
	if err != nil {
		return nil, err
	}
	return view.SlotRowsOf(slots), nil
}

// blockedKeys reads the blocked keys of consumer ("" for every consumer).
func (s *session) blockedKeys(ctx context.Context, queue, consumer string) ([]blockedKey, error) {
	keys, err := s.BlockedKeys(ctx, queue, consumer)
	if err != nil {
		return nil, err
	}
	return view.BlockedKeysOf(keys), nil
}

// deadLetters lists up to max dead letters of queue (of consumer when set).
func (s *session) deadLetters(ctx context.Context, queue, consumer string, max int) ([]deadLetter, error) {
	if max == 0 {
		return nil, nil
	}
	dls, err := s.DeadLetters(ctx, queue, &pgque.DeadLetterFilter{Consumer: consumer, Limit: max})
	if err != nil {
		return nil, err
	}
	return view.DeadLettersOf(dls), nil
}
