package pgque

import (
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Limits the server enforces. The client checks configuration against them
// up front (so a bad value fails NewConsumer/NewPartitionedConsumer with
// ErrInvalidConfig instead of every later call), and makes the values a
// handler produces (error texts, retry delays) fit them, so that settling a
// chunk can never fail forever on what a handler returned.
const (
	// NameMaxBytes is the longest queue or consumer name the server
	// accepts.
	NameMaxBytes = 63
	// BatchSizeMax is the largest chunk the server delivers at once.
	BatchSizeMax = 100000
	// WorkerIDMaxBytes is the longest worker id the server accepts in a
	// slot lease.
	WorkerIDMaxBytes = 200
	// LeaseTTLMax is the longest slot lease the server grants.
	LeaseTTLMax = 24 * time.Hour
	// SlotsMax is the largest N (slots per consumer) the server accepts.
	SlotsMax = 1024
	// RetryDelayMax is the longest retry delay the server accepts; longer
	// delays a RetryDelay function returns are shortened to it, negative
	// ones raised to zero.
	RetryDelayMax = 30 * 24 * time.Hour
	// ReasonMaxBytes bounds the failure reason stored with a nack (and in
	// dead letters).
	ReasonMaxBytes = 1000
)

// sanitizeReason makes an error text storable as a PostgreSQL text value of
// at most ReasonMaxBytes: invalid UTF-8 becomes U+FFFD, NUL bytes (which
// text cannot hold) become U+FFFD, and the text is cut on a rune boundary.
func sanitizeReason(s string) string {
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	if strings.IndexByte(s, 0) >= 0 {
		s = strings.ReplaceAll(s, "\x00", "\uFFFD")
	}
	if len(s) <= ReasonMaxBytes {
		return s
	}
	cut := ReasonMaxBytes
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut]
}

// clampRetryDelay brings a retry delay into [0, RetryDelayMax].
func clampRetryDelay(d time.Duration) time.Duration {
	switch {
	case d < 0:
		return 0
	case d > RetryDelayMax:
		return RetryDelayMax
	}
	return d
}

// safeRetryDelay calls the configured RetryDelay, clamping its result; a
// panicking RetryDelay falls back to RetryDelayDefault rather than failing
// the settle.
func safeRetryDelay(f func(int) time.Duration, retryCount int) (d time.Duration) {
	defer func() {
		if recover() != nil {
			d = clampRetryDelay(RetryDelayDefault(retryCount))
		}
	}()
	return clampRetryDelay(f(retryCount))
}

// checkText reports why s cannot be sent as a PostgreSQL text value of at
// most max bytes, or "" when it can.
func checkText(s string, max int) string {
	switch {
	case !utf8.ValidString(s):
		return "is not valid UTF-8"
	case strings.IndexByte(s, 0) >= 0:
		return "contains a NUL byte"
	case len(s) > max:
		return "is " + strconv.Itoa(len(s)) + " bytes long; the limit is " + strconv.Itoa(max)
	}
	return ""
}
