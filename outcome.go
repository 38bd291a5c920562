package pgque

import (
	"errors"
	"fmt"
	"time"
)

// A handler's error may say more than "failed": RetryAfter asks for a
// particular redelivery delay, DeadLetter (handler.go) gives up on the event
// at once. Both wrap the handler's own error, which stays the nack reason and
// stays visible to errors.Is and errors.As.

// RetryAfter wraps err so that the failed event is redelivered after d
// instead of after the consumer's RetryDelay (for instance when a
// downstream service said how long to wait). A negative d counts as 0.
// Past the queue's max_retries the event is dead-lettered as usual.
func RetryAfter(err error, d time.Duration) error {
	if d < 0 {
		d = 0
	}
	return &retryAfterError{err: orFailed(err), after: d}
}

// IsDeadLetter reports whether err asks for the event to be dead-lettered
// at once (it wraps an error made by DeadLetter); the same as
// errors.Is(err, ErrDeadLetter).
func IsDeadLetter(err error) bool { return errors.Is(err, ErrDeadLetter) }

// RetryDelayOf returns the delay err asks for with RetryAfter, and false
// when it asks for none.
func RetryDelayOf(err error) (time.Duration, bool) {
	var r *retryAfterError
	if errors.As(err, &r) {
		return r.after, true
	}
	return 0, false
}

type retryAfterError struct {
	err   error
	after time.Duration
}

func (e *retryAfterError) Error() string {
	return fmt.Sprintf("%v (retry after %v)", e.err, e.after)
}

func (e *retryAfterError) Unwrap() error { return e.err }

// orFailed keeps a nil error from turning into a success.
func orFailed(err error) error {
	if err == nil {
		return errors.New("handler failed")
	}
	return err
}
