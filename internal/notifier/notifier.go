// Package notifier runs LISTEN on one dedicated connection and fans the
// notifications out to in-process subscribers.
//
// One Notifier serves every consumer of a Client: the connection is opened
// when the first subscriber arrives and closed when the last one leaves, so a
// stopped consumer leaves no goroutine and no session behind. A lost
// connection is re-opened with jittered exponential backoff; every subscriber
// is woken after a reconnect because notifications sent while the session was
// down are lost. Subscribers must always poll as well: LISTEN is a latency
// optimisation, never the only way to learn about work.
package notifier

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/pgque/pgque/internal/backoff"
	"github.com/pgque/pgque/internal/dbq"
)

// ConnectFunc opens the dedicated session.
type ConnectFunc func(ctx context.Context) (*pgx.Conn, error)

// NotifyFunc sends a notification on another connection than the session
// (the application's pool), committed when it returns nil.
type NotifyFunc func(ctx context.Context, channel, payload string) error

// ProbeChannel carries each session's test of itself: once it listens, a
// token is sent on this channel through the pool (NotifyFunc), and a
// session that does not get it back within ProbeWait of its commit logs a
// warning. A transaction pooler (PgBouncer in transaction mode) makes
// that happen: the LISTEN holds for the server connection of one
// transaction, and notifications that arrive while no client is linked to
// it are dropped, so every wake-up is lost and consumers wait for their
// polls. The probe goes through another connection because such a pooler
// hands a connection's own NOTIFY back to it (the server sends it before
// the transaction's end).
const ProbeChannel = "pgque_probe"

// ProbeWait is how long a probe's notification may take to arrive.
const ProbeWait = 3 * time.Second

// Subscription delivers the payloads of one channel that match its filter.
type Subscription struct {
	n       *Notifier
	channel string
	match   func(payload string) bool
	c       chan string
}

// C delivers payloads. It is buffered and lossy: when the buffer is full a
// payload is dropped, which is fine for wake-ups and periodic announcements.
// An empty payload means "the connection was re-established: re-check".
func (s *Subscription) C() <-chan string { return s.c }

// Unlisten removes the subscription; the last one stops the session and waits
// for its goroutine to exit.
func (s *Subscription) Unlisten() { s.n.remove(s) }

// Notifier owns the LISTEN session.
type Notifier struct {
	connect   ConnectFunc
	channels  []string
	notify    NotifyFunc
	probeWait time.Duration
	logger    *slog.Logger
	retry     backoff.Policy

	// sessions counts the sessions that reached LISTEN (see Sessions).
	sessions atomic.Int64
	// probesFailed counts the probes that did not come back (see ProbeChannel).
	probesFailed atomic.Int64
	// probesOK counts those that did.
	probesOK atomic.Int64

	// pid is the backend pid of the current session once its probe came
	// back (0 otherwise): see SessionPID.
	pid atomic.Int32

	mu     sync.Mutex
	subs   map[*Subscription]struct{}
	watch  map[*func(pid int32, up bool)]struct{}
	cancel context.CancelFunc
	done   chan struct{}
}

// SessionPID is the backend pid of the LISTEN session, once a notification
// sent through the pool came back on it (the probe: the session is then a
// server session of its own, not one a transaction pooler lends), and 0
// when there is no such session (none yet, it was lost, or no NotifyFunc
// to probe with). A slot lease bound to it ends early when the session
// does (claim_slot's session), so only a session this process keeps for
// its whole life is named.
func (n *Notifier) SessionPID() int32 { return n.pid.Load() }

// OnSession registers f, called with a session's pid and up = true when
// SessionPID starts naming it, and up = false when that session ends (it
// broke, or the last subscriber left). It returns the function that
// unregisters f. f must not block.
func (n *Notifier) OnSession(f func(pid int32, up bool)) (remove func()) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.watch == nil {
		n.watch = make(map[*func(int32, bool)]struct{})
	}
	n.watch[&f] = struct{}{}
	return func() {
		n.mu.Lock()
		defer n.mu.Unlock()
		delete(n.watch, &f)
	}
}

// confirmed makes pid the session SessionPID names.
func (n *Notifier) confirmed(pid int32) {
	n.pid.Store(pid)
	n.tell(pid, true)
}

// ended clears SessionPID when pid was the session it named, and says so.
func (n *Notifier) ended(pid int32) {
	if pid != 0 && n.pid.CompareAndSwap(pid, 0) {
		n.tell(pid, false)
	}
}

func (n *Notifier) tell(pid int32, up bool) {
	n.mu.Lock()
	fs := make([]func(int32, bool), 0, len(n.watch))
	for f := range n.watch {
		fs = append(fs, *f)
	}
	n.mu.Unlock()
	for _, f := range fs {
		f(pid, up)
	}
}

// New returns a Notifier that will LISTEN on channels once subscribed to.
// With notify, each session probes itself (see ProbeChannel).
func New(connect ConnectFunc, channels []string, notify NotifyFunc, logger *slog.Logger) *Notifier {
	return &Notifier{
		connect:   connect,
		channels:  channels,
		notify:    notify,
		probeWait: ProbeWait,
		logger:    logger,
		retry:     backoff.Policy{Base: 100 * time.Millisecond, Max: 10 * time.Second, Jitter: 0.3},
		subs:      make(map[*Subscription]struct{}),
	}
}

// SetProbeWait changes ProbeWait for this Notifier; call it before the
// first Listen.
func (n *Notifier) SetProbeWait(d time.Duration) { n.probeWait = d }

// Probes returns how many sessions' probes came back and how many did not.
func (n *Notifier) Probes() (ok, failed int64) { return n.probesOK.Load(), n.probesFailed.Load() }

// Sessions returns how many sessions have reached LISTEN on every channel
// so far. A notification sent after it grew is delivered; tests use it to
// know that a (re)connected session listens, where they would otherwise
// have to guess how long connecting takes.
func (n *Notifier) Sessions() int64 { return n.sessions.Load() }

// Listen subscribes to channel (one of those given to New); match filters
// payloads (nil accepts all).
func (n *Notifier) Listen(channel string, match func(payload string) bool) *Subscription {
	s := &Subscription{n: n, channel: channel, match: match, c: make(chan string, 256)}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.subs[s] = struct{}{}
	if n.cancel == nil {
		ctx, cancel := context.WithCancel(context.Background())
		n.cancel = cancel
		n.done = make(chan struct{})
		go n.run(ctx, n.done)
	}
	return s
}

func (n *Notifier) remove(s *Subscription) {
	n.mu.Lock()
	if _, ok := n.subs[s]; !ok {
		n.mu.Unlock()
		return
	}
	delete(n.subs, s)
	var done chan struct{}
	if len(n.subs) == 0 && n.cancel != nil {
		n.cancel()
		done = n.done
		n.cancel, n.done = nil, nil
	}
	n.mu.Unlock()
	if done != nil {
		<-done
	}
}

// dispatch hands a payload to the matching subscribers without blocking.
func (n *Notifier) dispatch(channel, payload string, all bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for s := range n.subs {
		if !all && (s.channel != channel || (s.match != nil && !s.match(payload))) {
			continue
		}
		select {
		case s.c <- payload:
		default:
		}
	}
}

// run keeps one session listening until ctx ends.
func (n *Notifier) run(ctx context.Context, done chan struct{}) {
	defer close(done)
	for attempt := 0; ctx.Err() == nil; attempt++ {
		if attempt > 0 {
			if !backoff.Sleep(ctx.Done(), n.retry.Delay(attempt-1)) {
				return
			}
		}
		listening, err := n.session(ctx)
		if ctx.Err() != nil {
			return
		}
		if listening {
			attempt = 0
		}
		n.logger.WarnContext(ctx, "pgque: notifier session lost, reconnecting", slog.Any("error", err))
	}
}

// session opens the connection, listens, and delivers notifications until
// the connection fails or ctx ends. It reports whether LISTEN succeeded.
func (n *Notifier) session(ctx context.Context) (bool, error) {
	conn, err := n.connect(ctx)
	if err != nil {
		return false, err
	}
	defer func() {
		closeCtx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = conn.Close(closeCtx)
	}()
	q := dbq.New(conn)
	channels := n.channels
	var pid int32
	if n.notify != nil {
		channels = append(channels[:len(channels):len(channels)], ProbeChannel)
		// The server's pid, not the one the connection reports: a pooler
		// reports its own. Asked before LISTEN, so that the session's last
		// statement names what it is.
		if err := conn.QueryRow(ctx, "select pg_catalog.pg_backend_pid()").Scan(&pid); err != nil {
			return false, err
		}
		defer n.ended(pid)
	}
	for _, ch := range channels {
		if err := q.Listen(ctx, ch); err != nil {
			return false, err
		}
	}
	n.sessions.Add(1)
	// Anything sent while we were not listening is lost: wake everyone.
	n.dispatch("", "", true)
	// The probe's wait ends with the session: a session lost before its
	// token came back is not a pooler's doing.
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	token, back := n.probe(pctx)
	for {
		note, err := conn.WaitForNotification(ctx)
		if err != nil {
			return true, err
		}
		if note.Channel == ProbeChannel {
			if token != "" && note.Payload == token {
				token = ""
				close(back)
				n.confirmed(pid)
			}
			continue
		}
		n.dispatch(note.Channel, note.Payload, false)
	}
}

// probe sends a session's probe (see ProbeChannel) and returns its token
// and the channel session closes when the token arrives; "" without a
// NotifyFunc. A probe that cannot be sent (the pool's own calls report
// that) warns of nothing.
func (n *Notifier) probe(ctx context.Context) (string, chan struct{}) {
	if n.notify == nil {
		return "", nil
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	token := hex.EncodeToString(b[:])
	back := make(chan struct{})
	go func() {
		if err := n.notify(ctx, ProbeChannel, token); err != nil {
			return
		}
		t := time.NewTimer(n.probeWait)
		defer t.Stop()
		select {
		case <-back:
			n.probesOK.Add(1)
		case <-ctx.Done():
		case <-t.C:
			// Warned before counted: whoever sees the count (Probes) finds
			// the warning written.
			n.logger.WarnContext(ctx, "pgque: the LISTEN session did not receive a notification sent through the pool: "+
				"wake-ups do not arrive, so consumers wait for their polls (behind a transaction pooler such as "+
				"PgBouncer in transaction mode, set Config.PollOnly)", slog.Duration("waited", n.probeWait))
			n.probesFailed.Add(1)
		}
	}()
	return token, back
}
