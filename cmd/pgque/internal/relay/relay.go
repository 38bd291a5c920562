package relay

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/pgque/pgque"
)

// Headers the relay sends besides the CloudEvents ones. Values are ASCII;
// the partition key is percent-encoded (see EncodeKey), the CloudEvents
// attributes as their binding asks (see EncodeAttr).
const (
	HeaderKey        = "pgque-partition-key"
	HeaderKeyNull    = "pgque-partition-key-null"
	HeaderSlot       = "pgque-slot"
	HeaderEpoch      = "pgque-epoch"
	HeaderRetryCount = "pgque-retry-count"
	HeaderEvID       = "pgque-ev-id"
	HeaderQueue      = "pgque-queue"
	HeaderConsumer   = "pgque-consumer"
	// HeaderReplay is "1" on a dead letter an operator replayed (only
	// then): it may come after later events of its key. pgque-ev-id is
	// the original event's id, which a replay keeps.
	HeaderReplay = "pgque-replay"
	// HeaderDeadLetter in a response: "1" dead-letters the event at once,
	// whatever the (non-2xx) status.
	HeaderDeadLetter = "pgque-dead-letter"
)

// maxReasonBody is how much of a failed response's body is kept as the
// nack reason; maxDrainBody is how much is read so that the connection can
// be reused.
const (
	maxReasonBody = 256
	maxDrainBody  = 64 << 10
)

// Relay posts events to one endpoint. Its Handle method is a
// pgque.HandlerFunc; it is safe for concurrent use.
type Relay struct {
	cfg      Config
	url      string
	source   string
	client   *http.Client
	inFlight chan struct{}
	// stopping, once closed, makes requests waiting for an unreachable
	// endpoint give up, so that a graceful stop is not held by an outage.
	stopping chan struct{}
	stopOnce atomic.Bool
	waiting  atomic.Int64 // requests waiting for an unreachable endpoint
	// probe is held by the one waiting request that tries an unreachable
	// endpoint again; lastDown is when such a try last found it still
	// down. With key lanes many requests wait at once, and each of them
	// trying on its own schedule would multiply the attempts by the number
	// of keys in flight: a waiter whose sleep began before the last failed
	// try sleeps on instead.
	probe    chan struct{}
	lastDown atomic.Int64 // unix nanoseconds
}

// New returns a Relay, or an error wrapping ErrInvalidConfig.
func New(config *Config) (*Relay, error) {
	u, err := config.validate()
	if err != nil {
		return nil, err
	}
	cfg := config.withDefaults()
	client, err := cfg.httpClient(u)
	if err != nil {
		return nil, err
	}
	if cfg.InsecureSkipVerify {
		cfg.Logger.Warn("pgque relay: TLS certificate verification is OFF (--insecure-skip-verify): anyone on the network path can read and forge deliveries",
			slog.String("to", u.Redacted()))
	}
	return &Relay{
		cfg:      cfg,
		url:      u.String(),
		source:   "pgque://" + url.PathEscape(cfg.Queue) + "/" + url.PathEscape(cfg.Consumer),
		client:   client,
		inFlight: make(chan struct{}, cfg.MaxInFlight),
		stopping: make(chan struct{}),
		probe:    make(chan struct{}, 1),
	}, nil
}

// BeginStop makes requests that wait for an unreachable endpoint give up
// (their events are handed back at once, charged one retry) so that a
// graceful stop of the consumer finishes; requests in flight are not
// interrupted.
func (r *Relay) BeginStop() {
	if r.stopOnce.CompareAndSwap(false, true) {
		close(r.stopping)
	}
}

// Close releases idle connections.
func (r *Relay) Close() { r.client.CloseIdleConnections() }

// Handle posts m and maps the answer to the consumer's outcome: nil (ack),
// an error wrapped with pgque.DeadLetter, one wrapped with
// pgque.RetryAfter, or a plain error (the consumer's backoff).
func (r *Relay) Handle(ctx context.Context, m *pgque.Message) error {
	backoff := r.cfg.UnreachableBackoffMin
	var slept time.Time
	for attempt := 1; ; attempt++ {
		var res result
		if attempt == 1 {
			res = r.attempt(ctx, m)
		} else {
			var tried bool
			var err error
			res, tried, err = r.retryAttempt(ctx, m, slept)
			if err != nil {
				return err
			}
			if !tried {
				// Another waiting request found the endpoint still down
				// while this one slept.
				slept = time.Now()
				if err := r.sleep(ctx, jitter(backoff)); err != nil {
					return err
				}
				backoff = min(backoff*2, r.cfg.UnreachableBackoffMax)
				attempt--
				continue
			}
		}
		if !res.unreachable {
			if attempt > 1 {
				r.endpointBack(ctx, m, attempt)
			}
			if res.err != nil && ctx.Err() == nil {
				r.cfg.Logger.WarnContext(ctx, "pgque relay: delivery failed; the event is handed back to the consumer",
					slog.String("to", r.url), slog.Any("error", res.err), slog.Int64("ev_id", m.ID), slog.Int("slot", m.Slot),
					slog.Int("retry_count", m.RetryCount), slog.Bool("dead_letter", pgque.IsDeadLetter(res.err)))
			}
			return res.err
		}
		if attempt == 1 {
			// This request now waits for the endpoint until it returns.
			r.endpointDown()
			defer r.endpointUp()
		}
		r.cfg.Metrics.Unreachable.WithLabelValues(res.reason).Inc()
		wait := jitter(backoff)
		log := r.cfg.Logger.WarnContext
		if attempt == 1 {
			log = r.cfg.Logger.ErrorContext
		}
		log(ctx, "pgque relay: endpoint unreachable or misconfigured; the event is not charged a retry, the request is repeated",
			slog.String("to", r.url), slog.String("reason", res.reason), slog.Any("error", res.err),
			slog.Int64("ev_id", m.ID), slog.Int("slot", m.Slot), slog.Int("attempt", attempt), slog.Duration("next_in", wait))
		slept = time.Now()
		if err := r.sleep(ctx, wait); err != nil {
			return err
		}
		backoff = min(backoff*2, r.cfg.UnreachableBackoffMax)
	}
}

// retryAttempt tries m again at an endpoint found unreachable, as the only
// waiting request doing so at the time. It does not try (tried false) when
// another waiter found the endpoint still down after slept, when this
// request began to wait. err, as from sleep, when the relay stops or ctx
// ends first.
func (r *Relay) retryAttempt(ctx context.Context, m *pgque.Message, slept time.Time) (res result, tried bool, err error) {
	select {
	case r.probe <- struct{}{}:
	case <-r.stopping:
		return result{}, false, pgque.RetryAfter(errors.New("relay stopping while the endpoint was unreachable"), 0)
	case <-ctx.Done():
		return result{}, false, context.Cause(ctx)
	}
	defer func() { <-r.probe }()
	if r.lastDown.Load() > slept.UnixNano() {
		return result{}, false, nil
	}
	res = r.attempt(ctx, m)
	if res.unreachable {
		r.lastDown.Store(time.Now().UnixNano())
	}
	return res, true, nil
}

// endpointDown and endpointUp count the requests waiting for an
// unreachable endpoint; the gauge is 0 while there is any.
func (r *Relay) endpointDown() {
	if r.waiting.Add(1) == 1 {
		r.cfg.Metrics.EndpointUp.Set(0)
	}
}

func (r *Relay) endpointUp() {
	if r.waiting.Add(-1) == 0 {
		r.cfg.Metrics.EndpointUp.Set(1)
	}
}

// sleep waits d before the next attempt at an unreachable endpoint. It
// returns an error (the event is handed back) when the relay is stopping
// or ctx ends.
func (r *Relay) sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-r.stopping:
		return pgque.RetryAfter(errors.New("relay stopping while the endpoint was unreachable"), 0)
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

func (r *Relay) endpointBack(ctx context.Context, m *pgque.Message, attempts int) {
	r.cfg.Logger.InfoContext(ctx, "pgque relay: endpoint answers again", slog.String("to", r.url),
		slog.Int64("ev_id", m.ID), slog.Int("slot", m.Slot), slog.Int("attempts", attempts))
}

// result is the outcome of one attempt. unreachable: no event is at fault
// (reason says why); err is then the cause, else the handler's result.
type result struct {
	err         error
	unreachable bool
	reason      string
}

// attempt sends one request.
func (r *Relay) attempt(ctx context.Context, m *pgque.Message) result {
	select {
	case r.inFlight <- struct{}{}:
	case <-ctx.Done():
		return result{err: context.Cause(ctx)}
	}
	defer func() { <-r.inFlight }()
	r.cfg.Metrics.InFlight.Inc()
	defer r.cfg.Metrics.InFlight.Dec()

	reqCtx, cancel := context.WithTimeout(ctx, r.cfg.Timeout)
	defer cancel()
	// wrote tells a failure before the request was sent (the endpoint
	// cannot be reached: no event is at fault) from one after it (the
	// endpoint may have choked on this event).
	// fresh tells a connection the endpoint accepted for this request. A
	// reset while a large body is being sent on it is the endpoint
	// refusing the request's size (a server that drops such clients),
	// which no wait for the endpoint cures: counted as unreachable, the
	// event was never charged and its key stalled for good. A small
	// request dropped so is the endpoint's trouble (a load balancer
	// without backends), and waits as before. Headers too large are
	// refused before sending (MaxEventHeaderBytes).
	var wrote, fresh atomic.Bool
	reqCtx = httptrace.WithClientTrace(reqCtx, &httptrace.ClientTrace{
		GotConn: func(info httptrace.GotConnInfo) {
			if !info.Reused {
				fresh.Store(true)
			}
		},
		WroteRequest: func(info httptrace.WroteRequestInfo) {
			if info.Err == nil {
				wrote.Store(true)
			}
		},
	})
	req, err := http.NewRequestWithContext(reqCtx, http.MethodPost, r.url, bytes.NewReader(m.Payload))
	if err != nil {
		return result{err: fmt.Errorf("building the request: %w", err), unreachable: true, reason: "request"}
	}
	r.setHeaders(req.Header, m)
	if n := headerBytes(req.Header); n > MaxEventHeaderBytes {
		// The same every time: no endpoint takes them, and retries would
		// only hold the key. Straight to the dead letter queue.
		r.cfg.Metrics.Requests.WithLabelValues("error").Inc()
		r.cfg.Metrics.DeadLetters.Inc()
		return result{err: pgque.DeadLetter(fmt.Errorf("event %d's type and key take %d bytes of request headers, over the relay's %d: "+
			"endpoints refuse (or drop) requests with headers that large", m.ID, n, MaxEventHeaderBytes))}
	}
	if err := checkHeaders(req.Header); err != nil {
		// The transport would refuse the request before connecting, and
		// that failure looks like an unreachable endpoint. Whatever made
		// it came from the event: charge the event (its retries, then the
		// dead letter queue), not the endpoint.
		r.cfg.Metrics.Requests.WithLabelValues("error").Inc()
		r.cfg.Metrics.Retries.WithLabelValues("request").Inc()
		return result{err: fmt.Errorf("building the request for event %d: %w", m.ID, err)}
	}
	start := time.Now()
	resp, err := r.client.Do(req)
	if err != nil {
		r.cfg.Metrics.Duration.Observe(time.Since(start).Seconds())
		return r.transportFailure(ctx, reqCtx, err, wrote.Load() || (fresh.Load() && len(m.Payload) > largeBody))
	}
	body, readErr := readBody(resp.Body)
	r.cfg.Metrics.Duration.Observe(time.Since(start).Seconds())
	r.cfg.Metrics.Requests.WithLabelValues(statusClass(resp.StatusCode)).Inc()
	if readErr != nil && resp.StatusCode/100 != 2 {
		body = append(body, []byte(" (body: "+readErr.Error()+")")...)
	}
	return r.classify(resp, body)
}

// transportFailure maps an error without a response. wrote: the request
// was sent, or went out on a connection the endpoint accepted for it.
func (r *Relay) transportFailure(ctx, reqCtx context.Context, err error, wrote bool) result {
	if ctx.Err() != nil {
		// The consumer abandons the work (lease lost, hard stop).
		r.cfg.Metrics.Requests.WithLabelValues("error").Inc()
		return result{err: context.Cause(ctx)}
	}
	if errors.Is(reqCtx.Err(), context.DeadlineExceeded) {
		r.cfg.Metrics.Requests.WithLabelValues("timeout").Inc()
		if !wrote {
			// Not even sent within the timeout: the endpoint is not there.
			return result{err: fmt.Errorf("no connection to the endpoint within %v: %w", r.cfg.Timeout, err), unreachable: true, reason: "connect_timeout"}
		}
		r.cfg.Metrics.Retries.WithLabelValues("timeout").Inc()
		return result{err: fmt.Errorf("the endpoint did not answer within %v", r.cfg.Timeout)}
	}
	r.cfg.Metrics.Requests.WithLabelValues("error").Inc()
	if !wrote {
		return result{err: err, unreachable: true, reason: "connection"}
	}
	r.cfg.Metrics.Retries.WithLabelValues("connection").Inc()
	return result{err: fmt.Errorf("connection failed after the request was sent: %w", err)}
}

// classify maps a response to the outcome (see the package doc).
func (r *Relay) classify(resp *http.Response, body []byte) result {
	code := resp.StatusCode
	if code/100 == 2 {
		return result{}
	}
	failure := fmt.Errorf("endpoint answered %d %s%s", code, http.StatusText(code), bodySuffix(body))
	if code == DeadLetterStatus || resp.Header.Get(HeaderDeadLetter) == "1" {
		r.cfg.Metrics.DeadLetters.Inc()
		return result{err: pgque.DeadLetter(failure)}
	}
	switch {
	case code/100 == 3:
		return result{err: fmt.Errorf("%w; redirects are not followed: point the relay at %q", failure, resp.Header.Get("Location")),
			unreachable: true, reason: "redirect"}
	case code == http.StatusUnauthorized, code == http.StatusForbidden, code == http.StatusNotFound,
		code == http.StatusMethodNotAllowed, code == http.StatusProxyAuthRequired, code == http.StatusMisdirectedRequest:
		// These describe the endpoint or the credentials, not the event.
		return result{err: failure, unreachable: true, reason: "status_" + strconv.Itoa(code)}
	}
	r.cfg.Metrics.Retries.WithLabelValues("status").Inc()
	if d, ok := parseRetryAfter(resp.Header.Get("Retry-After"), time.Now()); ok {
		return result{err: pgque.RetryAfter(failure, min(d, r.cfg.RetryAfterMax))}
	}
	return result{err: failure}
}

// setHeaders writes the CloudEvents binary-mode and pgque headers.
func (r *Relay) setHeaders(h http.Header, m *pgque.Message) {
	h.Set("Content-Type", "application/json")
	h.Set("ce-specversion", "1.0")
	id := EncodeAttr(r.cfg.Queue + "/" + strconv.FormatInt(m.ID, 10))
	h.Set("ce-id", id)
	// The event id is the request's idempotency key. It also lets the
	// transport resend the POST when a kept-alive connection turns out to
	// have been closed by the server before the request went out, instead
	// of failing (and charging) the event.
	h.Set("Idempotency-Key", id)
	h.Set("ce-source", EncodeAttr(r.source))
	// The type is the one attribute an event's sender chooses freely.
	h.Set("ce-type", EncodeAttr(m.Type))
	h.Set("ce-time", m.CreatedAt.UTC().Format(time.RFC3339Nano))
	if key, ok := m.Key().Value(); ok {
		// Set would drop nothing, but an empty value must be sent too.
		h[HeaderKey] = []string{EncodeKey(key)}
	} else {
		h.Set(HeaderKeyNull, "1")
	}
	h.Set(HeaderSlot, strconv.Itoa(m.Slot))
	h.Set(HeaderEpoch, strconv.FormatInt(m.Epoch, 10))
	h.Set(HeaderRetryCount, strconv.Itoa(m.RetryCount))
	h.Set(HeaderEvID, strconv.FormatInt(m.ID, 10))
	h.Set(HeaderQueue, r.cfg.Queue)
	h.Set(HeaderConsumer, r.cfg.Consumer)
	if m.Replay {
		h.Set(HeaderReplay, "1")
	}
	if r.cfg.AuthValue != "" {
		h.Set(r.cfg.AuthHeader, r.cfg.AuthValue)
	}
}

// largeBody is the body size past which a connection the endpoint drops
// while the request is being sent charges the event.
const largeBody = 1 << 20

// MaxEventHeaderBytes bounds the request headers an event makes (its type
// and key are sent in headers, and a writer chooses them freely):
// 16 KiB, Node's default limit for a request's headers; Go's server takes
// 1 MB, most proxies 8 to 32 KiB. Larger events are dead-lettered.
const MaxEventHeaderBytes = 16 << 10

// headerBytes is the size of h as sent: each line's name, ": ", value
// and CRLF.
func headerBytes(h http.Header) int {
	n := 0
	for name, values := range h {
		for _, v := range values {
			n += len(name) + len(v) + 4
		}
	}
	return n
}

// checkHeaders returns an error naming the first header the transport
// would refuse to send.
func checkHeaders(h http.Header) error {
	for name, values := range h {
		if !validHeaderName(name) {
			return fmt.Errorf("header name %q is not a valid HTTP header name", name)
		}
		for _, v := range values {
			if !validHeaderValue(v) {
				return fmt.Errorf("header %s value %q holds a control character", name, v)
			}
		}
	}
	return nil
}

// readBody keeps the start of the body for error messages and drains a
// bounded amount more, so that the connection can be reused.
func readBody(b io.ReadCloser) ([]byte, error) {
	defer b.Close()
	head, err := io.ReadAll(io.LimitReader(b, maxReasonBody))
	if err != nil {
		return head, err
	}
	_, err = io.Copy(io.Discard, io.LimitReader(b, maxDrainBody))
	return head, err
}

func bodySuffix(body []byte) string {
	body = bytes.TrimSpace(body)
	if len(body) == 0 {
		return ""
	}
	return ": " + strconv.QuoteToASCII(string(body))
}

func statusClass(code int) string {
	switch code / 100 {
	case 1, 2:
		return "2xx"
	case 3:
		return "3xx"
	case 4:
		return "4xx"
	default:
		return "5xx"
	}
}

// jitter spreads d by ±20%, so that relays waiting for the same endpoint
// do not knock in step.
func jitter(d time.Duration) time.Duration {
	return time.Duration(float64(d) * (0.8 + 0.4*rand.Float64()))
}
