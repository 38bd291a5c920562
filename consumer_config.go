package pgque

import "time"

// Defaults for consumer configuration.
const (
	// BatchSizeDefault is the default number of events received per chunk.
	// It is twice a queue's default ticker_max_count, so a batch usually
	// arrives as one chunk: each further chunk of a batch costs the server
	// another read of the batch's rows.
	BatchSizeDefault = 1000
	// PollIntervalDefault is how often an idle consumer looks for work when
	// no notification arrives (jittered ±20%). Notifications normally wake it
	// within milliseconds of a tick; the poll covers lost notifications and
	// poolers without LISTEN.
	PollIntervalDefault = time.Second
)

// ConsumerConfig configures a Consumer: one plain subscription whose events
// are handled in ev_id order by one goroutine.
type ConsumerConfig struct {
	// Queue is the queue to consume. Required.
	Queue string
	// Consumer is the subscription name. Required; Start subscribes it if
	// needed (a new subscription starts at the queue's latest tick).
	Consumer string
	// Handler processes each message. Exactly one of Handler and HandlerTx
	// is required.
	Handler HandlerFunc
	// HandlerTx processes each message in a transaction whose writes commit
	// together with the event's completion (exactly-once effects, see
	// HandlerTxFunc). Exactly one of Handler and HandlerTx is required.
	HandlerTx HandlerTxFunc
	// BatchSize is the maximum number of events per chunk. Default
	// BatchSizeDefault.
	BatchSize int
	// PollInterval is the fallback poll period. Default PollIntervalDefault.
	PollInterval time.Duration
	// RetryDelay returns how long a failed event waits before redelivery,
	// given its retry count. Default RetryDelayDefault. Results are clamped
	// into [0, RetryDelayMax]; if it panics, RetryDelayDefault is used.
	RetryDelay func(retryCount int) time.Duration
	// HandlerTimeout, when positive, bounds each handler call: its context
	// ends after that long with cause ErrHandlerTimeout, and an error it
	// then returns is a failure wrapping ErrHandlerTimeout (a handler that
	// ignores its context still runs to its end). Zero means no timeout.
	HandlerTimeout time.Duration
}

func (c *ConsumerConfig) withDefaults() ConsumerConfig {
	out := *c
	if out.BatchSize == 0 {
		out.BatchSize = BatchSizeDefault
	}
	if out.PollInterval == 0 {
		out.PollInterval = PollIntervalDefault
	}
	if out.RetryDelay == nil {
		out.RetryDelay = RetryDelayDefault
	}
	return out
}

func (c *ConsumerConfig) validate() error {
	switch {
	case c == nil:
		return invalidConfig("ConsumerConfig is nil")
	case c.Queue == "":
		return invalidConfig("ConsumerConfig.Queue is empty")
	case c.Consumer == "":
		return invalidConfig("ConsumerConfig.Consumer is empty")
	case c.Handler == nil && c.HandlerTx == nil:
		return invalidConfig("ConsumerConfig.Handler and HandlerTx are nil: set one")
	case c.Handler != nil && c.HandlerTx != nil:
		return invalidConfig("ConsumerConfig.Handler and HandlerTx are both set: set one")
	case checkText(c.Queue, NameMaxBytes) != "":
		return invalidConfig("ConsumerConfig.Queue %s", checkText(c.Queue, NameMaxBytes))
	case checkText(c.Consumer, NameMaxBytes) != "":
		return invalidConfig("ConsumerConfig.Consumer %s", checkText(c.Consumer, NameMaxBytes))
	case c.BatchSize < 0 || c.BatchSize > BatchSizeMax:
		return invalidConfig("ConsumerConfig.BatchSize must be between 1 and %d (got %d)", BatchSizeMax, c.BatchSize)
	case c.PollInterval < 0:
		return invalidConfig("ConsumerConfig.PollInterval is negative (%v)", c.PollInterval)
	case c.HandlerTimeout < 0:
		return invalidConfig("ConsumerConfig.HandlerTimeout is negative (%v)", c.HandlerTimeout)
	}
	return nil
}
