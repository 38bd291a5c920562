package cli

import (
	"errors"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/pgque/pgque"
	"github.com/pgque/pgque/cmd/pgque/internal/relay"
	"github.com/pgque/pgque/internal/backoff"
	"github.com/pgque/pgque/pgqueprom"
)

// Environment variables of the relay: every flag --name can also be set as
// PGQUE_RELAY_NAME (dashes become underscores); a flag on the command line
// wins. The auth header value is only read from the environment, never
// from a flag, so that it does not show in process listings.
const (
	envRelayPrefix  = "PGQUE_RELAY_"
	EnvRelayAuthDef = "PGQUE_RELAY_AUTH"
)

func (a *app) relayCommand() *cobra.Command {
	var (
		ccfg          pgque.PartitionedConsumerConfig
		rcfg          relay.Config
		policy        string
		retryMin      time.Duration
		retryMax      time.Duration
		authEnv       string
		withTicker    bool
		listen        string
		shutdown      time.Duration
		verbose       bool
		concurrency   int
		tickInterval  time.Duration
		retryInterval time.Duration
	)
	cmd := &cobra.Command{
		Use:   "relay --queue Q --consumer C --slots N --to URL",
		Short: "Deliver each key's events in order to an HTTP endpoint (CloudEvents over HTTP)",
		Long: `Relay runs a partitioned consumer (a worker pool over N slots, shared with any
other relay or worker of the same consumer) and POSTs every event to --to in
the CloudEvents HTTP binding, binary mode: the payload is the JSON body, the
attributes are ce-* headers, and pgque-* headers carry the partition key
(percent-encoded), slot, epoch (fencing token), retry count and ev_id. Within
a key the next event is posted only after the previous one was answered;
different keys, of one slot or of several, are posted at once, up to
--concurrency requests per process.

Answers: 2xx acknowledges. 422, or any non-2xx with "pgque-dead-letter: 1",
dead-letters at once. 5xx, 408, 429, other 4xx, timeouts and connections
broken after sending are retried with the backoff (Retry-After honoured,
clamped). An endpoint that cannot be reached or is misconfigured
(connection, DNS or TLS errors, 3xx — redirects are not followed —, 401, 403,
404, 405, 407, 421) charges no event a retry: the request is repeated with a
capped backoff until it answers. See docs/relay.md.

Every flag can also be set from the environment as PGQUE_RELAY_<FLAG>
(e.g. PGQUE_RELAY_TO); the database comes from --dsn, PGQUE_DSN or
DATABASE_URL. Subscribe the consumer when you install, before the producers
start ('pgque slots subscribe'): a relay whose first start creates the
subscription receives only what is sent from then on, and warns when the
queue already had events. SIGINT or SIGTERM stops gracefully: requests in flight finish,
their chunks are acknowledged and the slot leases released.`,
		Args: exactArgs(),
		PreRunE: func(cmd *cobra.Command, _ []string) error {
			return flagsFromEnv(cmd.Flags())
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch {
			case ccfg.Queue == "":
				return usagef("--queue is required")
			case ccfg.Consumer == "":
				return usagef("--consumer is required")
			case ccfg.Slots < 1:
				return usagef("--slots must be at least 1 (got %d)", ccfg.Slots)
			case concurrency < 0:
				return usagef("--concurrency must not be negative (got %d)", concurrency)
			case retryMin <= 0 || retryMax < retryMin:
				return usagef("--retry-min must be positive and at most --retry-max (got %v, %v)", retryMin, retryMax)
			}
			switch policy {
			case "":
			case "skip":
				ccfg.FailurePolicy = pgque.FailurePolicySkip
			case "pause":
				ccfg.FailurePolicy = pgque.FailurePolicyPause
			default:
				return usagef("--policy must be skip or pause (got %q)", policy)
			}
			// The per-process limit of requests at once, over the key
			// lanes of every owned slot (0: the relay's default, its
			// --max-in-flight).
			ccfg.MaxWorkers = concurrency
			ccfg.RetryDelay = backoff.Policy{Base: retryMin, Max: retryMax, Jitter: 0.1}.Delay
			rcfg.Queue, rcfg.Consumer = ccfg.Queue, ccfg.Consumer
			if authEnv != "" {
				rcfg.AuthValue = os.Getenv(authEnv)
			}
			// Check the delivery settings before connecting, so that a bad
			// URL is a usage error; Run builds the relay again with the
			// real logger (and warns about skipped verification once).
			check := rcfg
			check.Logger = slog.New(slog.DiscardHandler)
			probe, err := relay.New(&check)
			if err != nil {
				return usagef("%v", strings.TrimPrefix(err.Error(), relay.ErrInvalidConfig.Error()+": "))
			}
			probe.Close()
			level := slog.LevelInfo
			if verbose {
				level = slog.LevelDebug
			}
			log := a.logger(level)
			reg := prometheus.NewRegistry()
			rcfg.Metrics = relay.NewMetrics(reg)
			obs, err := pgqueprom.New(reg)
			if err != nil {
				return err
			}
			s, err := a.connectWith(cmd.Context(), &pgque.Config{Logger: log, Observer: obs})
			if err != nil {
				return err
			}
			defer s.Close()
			if ccfg.WorkerID == "" {
				ccfg.WorkerID = defaultWorkerID()
			}
			rc := &relay.RunConfig{
				Client: s.Client, Consumer: ccfg, Relay: rcfg, Listen: listen, MetricsHandler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}),
				ShutdownTimeout: shutdown, Logger: log,
			}
			if withTicker {
				rc.Ticker = &pgque.TickerConfig{WorkerID: ccfg.WorkerID, TickInterval: tickInterval, RetryInterval: retryInterval}
			}
			err = relay.Run(cmd.Context(), rc)
			if errors.Is(err, relay.ErrInvalidConfig) || errors.Is(err, pgque.ErrInvalidArgument) {
				return usagef("%v", err)
			}
			return err
		},
	}
	f := cmd.Flags()
	f.StringVar(&ccfg.Queue, "queue", "", "queue to consume (required)")
	f.StringVar(&ccfg.Consumer, "consumer", "", "consumer name, shared by every relay and worker of the pool (required)")
	f.IntVar(&ccfg.Slots, "slots", 0, "number of slots N of the consumer; every process must use the same (required)")
	f.StringVar(&rcfg.URL, "to", "", "endpoint URL every event is POSTed to, http:// or https:// (required)")
	f.IntVar(&concurrency, "concurrency", 0, "per-process limit of events handled at once, across the keys of every owned slot, one per key (default: --max-in-flight)")
	f.StringVar(&policy, "policy", "", "failure policy, skip or pause (default: the persisted one, skip for a new consumer)")
	f.BoolVar(&ccfg.StartFromOldest, "from-oldest", false, "when the relay creates the consumer's subscription, start it at the oldest event the queue keeps for its other subscriptions (subscribing before the producers start needs no flag)")
	f.DurationVar(&ccfg.LeaseTTL, "lease-ttl", pgque.LeaseTTLDefault, "slot lease lifetime: a crashed relay's slots are taken over after it")
	f.StringVar(&ccfg.WorkerID, "worker", "", "id of this process in slot leases (default hostname-pid-random)")
	f.IntVar(&ccfg.BatchSize, "batch-size", 0, "maximum events per chunk (default the library's)")
	f.DurationVar(&ccfg.PollInterval, "poll-interval", 0, "how often an idle slot polls without a notification (default the library's)")
	f.DurationVar(&ccfg.ClaimInterval, "claim-interval", 0, "period of the slot claim loop (default the library's)")
	f.DurationVar(&retryMin, "retry-min", time.Second, "backoff before the first redelivery of a failed event (doubled per retry)")
	f.DurationVar(&retryMax, "retry-max", 10*time.Minute, "longest backoff before a redelivery")
	f.DurationVar(&rcfg.Timeout, "timeout", relay.TimeoutDefault, "per-request timeout (connect, send, answer)")
	f.IntVar(&rcfg.MaxInFlight, "max-in-flight", relay.MaxInFlightDefault, "cap on requests in flight from this process (and on kept-alive connections)")
	f.DurationVar(&rcfg.RetryAfterMax, "retry-after-max", relay.RetryAfterMaxDefault, "clamp on a response's Retry-After")
	f.DurationVar(&rcfg.UnreachableBackoffMin, "unreachable-backoff-min", relay.UnreachableBackoffMinDefault, "first wait before repeating a request to an unreachable endpoint")
	f.DurationVar(&rcfg.UnreachableBackoffMax, "unreachable-backoff-max", relay.UnreachableBackoffMaxDefault, "longest wait before repeating a request to an unreachable endpoint")
	f.StringVar(&rcfg.CAFile, "ca-file", "", "PEM file of CA certificates to trust for an https endpoint (default the system's)")
	f.BoolVar(&rcfg.InsecureSkipVerify, "insecure-skip-verify", false, "do not verify the endpoint's TLS certificate (tests only; logged as a warning)")
	f.StringVar(&rcfg.AuthHeader, "auth-header", relay.AuthHeaderDefault, "header that carries the auth value")
	f.StringVar(&authEnv, "auth-env", EnvRelayAuthDef, "environment variable holding the auth header value (never printed; unset: no header)")
	f.BoolVar(&withTicker, "ticker", false, "also run a ticker in this process (leader-elected with any other ticker)")
	f.DurationVar(&tickInterval, "tick-interval", pgque.TickIntervalDefault, "with --ticker: how often the leader ticks")
	f.DurationVar(&retryInterval, "retry-interval", pgque.RetryIntervalDefault, "with --ticker: how often due retries are re-inserted")
	f.StringVar(&listen, "metrics-listen", "", "serve /metrics, /healthz and /readyz on this address, e.g. :9188")
	f.DurationVar(&shutdown, "shutdown-timeout", relay.ShutdownTimeoutDefault, "bound on the graceful stop after SIGTERM")
	f.BoolVarP(&verbose, "verbose", "v", false, "log at debug level")
	f.VisitAll(func(fl *pflag.Flag) { fl.Usage += " [$" + relayEnvName(fl.Name) + "]" })
	return cmd
}

// relayEnvName is the environment variable of a relay flag.
func relayEnvName(flag string) string {
	return envRelayPrefix + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

// flagsFromEnv sets every flag not given on the command line from its
// environment variable, when that is set and not empty (an empty variable
// counts as unset, as deployment files often leave them).
func flagsFromEnv(fs *pflag.FlagSet) error {
	var errs []error
	fs.VisitAll(func(fl *pflag.Flag) {
		if fl.Changed {
			return
		}
		name := relayEnvName(fl.Name)
		v := os.Getenv(name)
		if v == "" {
			return
		}
		if err := fs.Set(fl.Name, v); err != nil {
			errs = append(errs, usagef("$%s: %v", name, err))
		}
	})
	return errors.Join(errs...)
}
