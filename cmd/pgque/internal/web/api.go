package web

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgque/pgque"
	"github.com/pgque/pgque/cmd/pgque/internal/keyview"
	"github.com/pgque/pgque/cmd/pgque/internal/view"
)

// sample is one reading of every queue, plain consumer and slot.
type sample struct {
	Time      time.Time
	Queues    []view.QueueInfo
	Consumers []view.ConsumerInfo
	Slots     []view.SlotRow
	// Blockers is what holds back rotations and flips; nil when the role
	// may not read it.
	Blockers []view.Blocker
}

func (s *Server) sample(ctx context.Context) (sample, error) {
	smp := sample{Time: time.Now()}
	qs, err := s.cfg.Client.Queues(ctx, "")
	if err != nil {
		return smp, err
	}
	for _, q := range qs {
		smp.Queues = append(smp.Queues, view.QueueInfoOf(q))
	}
	cons, err := s.cfg.Client.Consumers(ctx, "")
	if err != nil {
		return smp, err
	}
	for _, c := range cons {
		if !strings.Contains(c.Consumer, "#") { // slots are reported with their group
			smp.Consumers = append(smp.Consumers, view.ConsumerInfoOf(c))
		}
	}
	slots, err := s.cfg.Client.Slots(ctx, "", "")
	if err != nil {
		return smp, err
	}
	smp.Slots = view.SlotRowsOf(slots)
	bs, canSee, err := view.Blockers(ctx, s.cfg.Client)
	if err != nil {
		return smp, err
	}
	if canSee {
		smp.Blockers = nonNil(bs)
	}
	// Keys held while their lane runs (key lanes), counted on their slots;
	// not for a login that may not read blocked keys (a producer's).
	for _, q := range qs {
		bks, err := s.cfg.Client.BlockedKeys(ctx, q.Name, "")
		if errors.Is(err, pgque.ErrPermissionDenied) {
			break
		}
		if err != nil {
			return smp, err
		}
		for _, b := range bks {
			if b.State == pgque.BlockStateHeld {
				view.AddHold(smp.Slots, b.Queue, b.Consumer, b.Slot, b.Since, b.Deferred, smp.Time)
			}
		}
	}
	return smp, nil
}

// queueRow is a queue on the overview: its info and backlog (the pending
// events of its slowest consumer, held ones included) beside the keys
// blocked under pause on all its consumers.
type queueRow struct {
	view.QueueInfo
	Backlog     int64 `json:"backlog"`
	BlockedKeys int   `json:"blocked_keys"`
	// RotationPeriodSeconds is the queue's rotation_period, in seconds.
	RotationPeriodSeconds float64 `json:"rotation_period_seconds"`
}

// group is a partitioned consumer on the overview.
type group struct {
	Queue    string  `json:"queue"`
	Consumer string  `json:"consumer"`
	NSlots   int     `json:"nslots"`
	Owned    int     `json:"owned"`
	Workers  int     `json:"workers"`
	Lag      int64   `json:"lag"`
	HeadAge  float64 `json:"head_age_seconds"`
	// BlockedKeys counts the keys blocked under pause on all its slots;
	// their held events are in Lag and HeadAge.
	BlockedKeys int    `json:"blocked_keys"`
	Policy      string `json:"policy"`
}

// point is one sample as the charts draw it.
type point struct {
	// T is milliseconds since the epoch.
	T int64 `json:"t"`
	// Rate, Backlog and TickerLag by queue; Lag and HeadAge by
	// "queue/consumer".
	Rate      map[string]float64 `json:"rate"`
	Backlog   map[string]int64   `json:"backlog"`
	TickerLag map[string]float64 `json:"ticker_lag"`
	Lag       map[string]int64   `json:"lag"`
	HeadAge   map[string]float64 `json:"head_age"`
}

// overview is the document /api/overview returns.
type overview struct {
	Time           time.Time           `json:"time"`
	ActionsEnabled bool                `json:"actions_enabled"`
	Queues         []queueRow          `json:"queues"`
	Consumers      []view.ConsumerInfo `json:"consumers"`
	Groups         []group             `json:"groups"`
	Slots          []view.SlotRow      `json:"slots"`
	// Blockers is null when the console's role may not read them.
	Blockers []view.Blocker `json:"rotation_blockers"`
	History  []point        `json:"history"`
}

// summarize derives the queue backlogs, the consumer groups and the chart
// point of one sample.
func summarize(smp sample) ([]queueRow, []group, point) {
	p := point{T: smp.Time.UnixMilli(), Rate: map[string]float64{}, Backlog: map[string]int64{},
		TickerLag: map[string]float64{}, Lag: map[string]int64{}, HeadAge: map[string]float64{}}
	var groups []group
	index := map[string]int{}
	for _, sl := range smp.Slots {
		k := sl.Queue + "/" + sl.Consumer
		i, ok := index[k]
		if !ok {
			i = len(groups)
			index[k] = i
			groups = append(groups, group{Queue: sl.Queue, Consumer: sl.Consumer, NSlots: sl.NSlots, Policy: sl.Policy})
		}
		g := &groups[i]
		g.Lag += sl.Lag
		g.HeadAge = max(g.HeadAge, sl.OldestPendingSeconds)
		g.BlockedKeys += sl.BlockedKeys
		if sl.Owner != nil {
			g.Owned++
		}
	}
	for i := range groups {
		owners := map[string]bool{}
		for _, sl := range smp.Slots {
			if sl.Queue == groups[i].Queue && sl.Consumer == groups[i].Consumer && sl.Owner != nil {
				owners[*sl.Owner] = true
			}
		}
		groups[i].Workers = len(owners)
		k := groups[i].Queue + "/" + groups[i].Consumer
		p.Lag[k], p.HeadAge[k] = groups[i].Lag, groups[i].HeadAge
	}
	for _, c := range smp.Consumers {
		k := c.Queue + "/" + c.Consumer
		p.Lag[k], p.HeadAge[k] = c.Pending, c.LagSeconds
	}
	queues := make([]queueRow, len(smp.Queues))
	for i, q := range smp.Queues {
		queues[i] = queueRow{QueueInfo: q, RotationPeriodSeconds: q.Config.RotationSeconds}
		for _, c := range smp.Consumers {
			if c.Queue == q.Name {
				queues[i].Backlog = max(queues[i].Backlog, c.Pending)
			}
		}
		for _, g := range groups {
			if g.Queue == q.Name {
				queues[i].Backlog = max(queues[i].Backlog, g.Lag)
				queues[i].BlockedKeys += g.BlockedKeys
			}
		}
		if q.EvPerSec != nil {
			p.Rate[q.Name] = *q.EvPerSec
		}
		p.Backlog[q.Name], p.TickerLag[q.Name] = queues[i].Backlog, q.TickerLagSeconds
	}
	return queues, groups, p
}

// apiOverview returns the latest sample (taking one when none exists yet)
// with the charts' history. Every browser reads the same sample, so the
// database cost does not grow with the number of open pages.
func (s *Server) apiOverview(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	hist := append([]sample(nil), s.history...)
	s.mu.Unlock()
	if len(hist) == 0 {
		smp, err := s.sample(r.Context())
		if err != nil {
			writeDBError(w, err)
			return
		}
		hist = []sample{smp}
	}
	last := hist[len(hist)-1]
	queues, groups, _ := summarize(last)
	ov := overview{Time: last.Time, ActionsEnabled: s.cfg.AllowActions, Queues: nonNil(queues),
		Consumers: nonNil(last.Consumers), Groups: nonNil(groups), Slots: nonNil(last.Slots), Blockers: last.Blockers,
		History: []point{}}
	for _, smp := range hist {
		_, _, p := summarize(smp)
		ov.History = append(ov.History, p)
	}
	writeJSON(w, http.StatusOK, ov)
}

// blocked is a blocked key as the keys page shows it.
type blocked struct {
	Slot     int       `json:"slot"`
	Key      *string   `json:"key"`
	State    string    `json:"state"`
	HeadID   int64     `json:"head_ev_id"`
	Since    time.Time `json:"since"`
	Failures int       `json:"failures"`
	Reason   string    `json:"reason"`
	Deferred int64     `json:"deferred"`
}

// apiKeys returns the key report and blocked keys of ?queue= &consumer=.
func (s *Server) apiKeys(w http.ResponseWriter, r *http.Request) {
	queue, consumer := r.URL.Query().Get("queue"), r.URL.Query().Get("consumer")
	if queue == "" || consumer == "" {
		writeError(w, http.StatusBadRequest, "name a queue and a partitioned consumer (?queue=&consumer=)")
		return
	}
	rep, err := keyview.Collect(r.Context(), s.cfg.Client, queue, consumer, keyview.Options{KeyQuery: pgque.KeyQuery{Scan: ConsoleKeyScan}})
	if err != nil {
		writeDBError(w, err)
		return
	}
	bks, err := s.cfg.Client.BlockedKeys(r.Context(), queue, consumer)
	if err != nil {
		writeDBError(w, err)
		return
	}
	out := struct {
		*keyview.Report
		Blocked        []blocked `json:"blocked"`
		ActionsEnabled bool      `json:"actions_enabled"`
	}{Report: rep, Blocked: []blocked{}, ActionsEnabled: s.cfg.AllowActions}
	for _, b := range bks {
		out.Blocked = append(out.Blocked, blocked{Slot: b.Slot, Key: keyview.KeyPtr(b.Key), State: string(b.State), HeadID: b.HeadID,
			Since: b.Since, Failures: b.Failures, Reason: b.Reason, Deferred: b.Deferred})
	}
	writeJSON(w, http.StatusOK, out)
}

// apiDeadLetters lists the dead letters of ?queue= (and &consumer=).
func (s *Server) apiDeadLetters(w http.ResponseWriter, r *http.Request) {
	queue := r.URL.Query().Get("queue")
	if queue == "" {
		writeError(w, http.StatusBadRequest, "name a queue (?queue=)")
		return
	}
	consumer := r.URL.Query().Get("consumer")
	limit := 100
	if l := r.URL.Query().Get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 || n > 1000 {
			writeError(w, http.StatusBadRequest, "limit must be between 1 and 1000")
			return
		}
		limit = n
	}
	dls, err := s.cfg.Client.DeadLetters(r.Context(), queue, &pgque.DeadLetterFilter{Consumer: consumer, Limit: limit})
	if err != nil {
		writeDBError(w, err)
		return
	}
	out := view.DeadLettersOf(dls)
	for i := range out {
		cutPayload(&out[i])
	}
	writeJSON(w, http.StatusOK, map[string]any{"dead_letters": nonNil(out), "actions_enabled": s.cfg.AllowActions})
}

// ConsolePayloadMax bounds the payload of each dead letter the console's
// page receives. A writer chooses payloads: a hundred dead letters of
// 30 MB made one refresh of the page (every five seconds) a 185 MB
// response that the browser never finished rendering. The whole payload
// is for pgque dlq list or dlq_list.
const ConsolePayloadMax = 64 << 10

// cutPayload replaces a payload over ConsolePayloadMax by its start as
// text, saying how long it is.
func cutPayload(d *view.DeadLetter) {
	text := d.Payload
	if d.PayloadText != nil {
		text = json.RawMessage(*d.PayloadText)
	}
	if len(text) <= ConsolePayloadMax {
		return
	}
	cut := strings.ToValidUTF8(string(text[:ConsolePayloadMax]), "")
	note := fmt.Sprintf("%s… (cut by the console: %d bytes in all; pgque dlq list <queue> --json shows all of it)", cut, len(text))
	d.Payload, d.PayloadText = nil, &note
}

// maxOlderThan is the longest purge bound in seconds a time.Duration holds.
const maxOlderThan = float64(math.MaxInt64 / int64(time.Second))

// actionRequest is the body of every action.
type actionRequest struct {
	Queue    string  `json:"queue"`
	Consumer string  `json:"consumer"`
	Key      *string `json:"key"`
	ID       int64   `json:"id"`
	// OlderThan (seconds) bounds a purge, at most maxOlderThan.
	OlderThan float64 `json:"older_than_seconds"`
}

// apiAction runs one action: unblock, retry-now, replay or purge.
func (s *Server) apiAction(w http.ResponseWriter, r *http.Request) {
	if !s.checkAction(w, r) {
		return
	}
	var req actionRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<16))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "bad action body: "+err.Error())
		return
	}
	if req.Queue == "" {
		writeError(w, http.StatusBadRequest, "the action needs a queue")
		return
	}
	ctx := r.Context()
	key := pgque.NullKey
	if req.Key != nil {
		key = pgque.KeyOf(*req.Key)
	}
	var result any
	var warning string
	var err error
	switch action := r.PathValue("action"); action {
	case "unblock":
		result, err = s.cfg.Client.UnblockKey(ctx, req.Queue, req.Consumer, key)
	case "retry-now":
		result, err = s.cfg.Client.RetryKeyNow(ctx, req.Queue, req.Consumer, key)
	case "replay":
		var rep pgque.ReplayReport
		rep, err = s.cfg.Client.ReplayDeadLetterReport(ctx, req.Queue, req.ID)
		result, warning = rep.EventID, view.ReplayWarning(rep)
	case "purge":
		if req.OlderThan < 0 || req.OlderThan > maxOlderThan {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("older_than_seconds must be between 0 and %.0f (about 292 years)", maxOlderThan))
			return
		}
		result, err = s.cfg.Client.PurgeDeadLetters(ctx, req.Queue, &pgque.PurgeFilter{Consumer: req.Consumer,
			OlderThan: time.Duration(req.OlderThan * float64(time.Second))})
	default:
		writeError(w, http.StatusNotFound, "unknown action "+strconv.Quote(action))
		return
	}
	if err != nil {
		writeDBError(w, err)
		return
	}
	s.cfg.Logger.InfoContext(ctx, "pgque web: action", "action", r.PathValue("action"), "queue", req.Queue,
		"consumer", req.Consumer, "id", req.ID)
	body := map[string]any{"result": result}
	if warning != "" {
		// A replay that comes after later events of its key: done, but
		// the operator is told.
		body["warning"] = warning
	}
	writeJSON(w, http.StatusOK, body)
}

// writeDBError maps a database error to a status: a refused privilege is
// 403, a pgque error about the request 400 (404 for what does not exist),
// anything else 500.
func writeDBError(w http.ResponseWriter, err error) {
	var pgErr *pgconn.PgError
	var pqErr *pgque.Error
	code := ""
	switch {
	case errors.As(err, &pgErr):
		code = pgErr.Code
	case errors.As(err, &pqErr):
		code = pqErr.Code
	}
	switch {
	case code == "42501":
		writeError(w, http.StatusForbidden, err.Error())
	case code == "PQ001" || code == "PQ002" || code == "PQ034" || code == "PQ040":
		writeError(w, http.StatusNotFound, err.Error())
	case strings.HasPrefix(code, "PQ") || code == "22004":
		writeError(w, http.StatusBadRequest, err.Error())
	default:
		writeError(w, http.StatusInternalServerError, err.Error())
	}
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}
