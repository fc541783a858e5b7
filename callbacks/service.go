package callbacks

import (
	"sync"

	"github.com/omcp/arap/internal/telemetry"
	"go.opentelemetry.io/otel/trace"

	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/riverqueue/river"

	"github.com/omcp/arap/audit"
	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/clients"
	"github.com/omcp/arap/internal/fault"
	"github.com/omcp/arap/internal/randid"
	"github.com/omcp/arap/internal/seal"
	"github.com/omcp/arap/requests"
	"github.com/omcp/arap/webhook"
)

// DefaultSchedule is the wait before each retry, after the immediate first
// attempt: Standard Webhooks' schedule, from seconds to about a day in all.
var DefaultSchedule = []time.Duration{5 * time.Second, 5 * time.Minute, 30 * time.Minute, 2 * time.Hour, 5 * time.Hour, 10 * time.Hour, 10 * time.Hour}

// Events are the terminal events a callback can subscribe to.
var Events = []string{authzen.StatusApproved, authzen.StatusDenied, authzen.StatusExpired, authzen.StatusCancelled, authzen.StatusFailed, authzen.StatusPartial}

// Delivery states.
const (
	Pending   = "pending"
	Delivered = "delivered"
	Failed    = "failed"
	Gone      = "gone" // the receiver answered 410: no more retries to that endpoint
)

var (
	deliveries = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "arap_callback_deliveries_total", Help: "Callback deliveries by final outcome (delivered, failed, gone).",
	}, []string{"outcome"})
	attempts = promauto.NewCounterVec(prometheus.CounterOpts{
		Name: "arap_callback_attempts_total", Help: "Callback delivery attempts by result (2xx, 4xx, 5xx, error).",
	}, []string{"result"})
	attemptLatency = promauto.NewHistogram(prometheus.HistogramOpts{
		Name: "arap_callback_attempt_duration_seconds", Help: "Callback delivery attempt latency.",
		Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
	})
)

// Config configures a Service.
type Config struct {
	DB        *pgxpool.Pool
	Jobs      requests.JobInserter
	MasterKey []byte
	// PreviousMasterKeys (32 bytes each) open values sealed before a master-key
	// rotation; they never seal.
	PreviousMasterKeys [][]byte
	// StatusEndpoint renders a request's status URL for the task handle.
	StatusEndpoint func(requestID string) string
	// Resolver resolves callback hosts; net.DefaultResolver when nil.
	Resolver Resolver
	// Schedule is the wait before each retry; DefaultSchedule when nil.
	Schedule []time.Duration
	// Timeout bounds one attempt (default 10s); MaxResponse the response
	// bytes read (default 64 KiB).
	Timeout     time.Duration
	MaxResponse int64
	Now         func() time.Time
	Log         *slog.Logger
	// TracerProvider traces each POST (a client span; the receiver gets
	// its traceparent); the global provider when nil.
	TracerProvider trace.TracerProvider
}

// Service registers, delivers and reports callbacks.
type Service struct {
	cfg     Config
	box     *seal.Box
	clients *clients.Store
	mu      sync.Mutex
	able    map[string]ableClient // by client id: clients seen able to receive callbacks
}

// ableClient is a client CheckCallback read, with a live webhook secret,
// remembered until exp: a PEP subscribes every request it submits, and the
// two reads were a fifth of the statements of a gated call's submission. A
// client changes only by its revocation, which a token authenticated just
// before may outlive as long (clients.CacheTTL); a client whose last secret
// expires may be accepted that long after, and its callbacks then fail to
// sign, as they would had it expired a moment later.
type ableClient struct {
	c   *clients.Client
	exp time.Time
}

// NewService checks cfg and returns a Service.
func NewService(cfg Config) (*Service, error) {
	if cfg.DB == nil || cfg.Jobs == nil || cfg.StatusEndpoint == nil {
		return nil, errors.New("callbacks: DB, Jobs and StatusEndpoint are required")
	}
	box, err := seal.New(cfg.MasterKey, cfg.PreviousMasterKeys...)
	if err != nil {
		return nil, fmt.Errorf("callbacks: %w", err)
	}
	if cfg.Resolver == nil {
		cfg.Resolver = net.DefaultResolver
	}
	if cfg.Schedule == nil {
		cfg.Schedule = DefaultSchedule
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = 10 * time.Second
	}
	if cfg.MaxResponse == 0 {
		cfg.MaxResponse = 64 << 10
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Service{cfg: cfg, box: box, clients: clients.NewStore(cfg.DB), able: map[string]ableClient{}}, nil
}

// DeliveryIDPrefix starts every delivery id.
const DeliveryIDPrefix = "msg_"

// CheckCallback validates a submission's callback for client clientID; it is
// requests.Config.CheckCallback.
func (s *Service) CheckCallback(ctx context.Context, clientID string, cb *authzen.Callback) error {
	refuse := func(format string, args ...any) error {
		return &requests.Error{Code: authzen.ProblemCallbackRefused, Detail: fmt.Sprintf(format, args...)}
	}
	if cb.Endpoint == "" {
		return refuse("callback.endpoint is required")
	}
	if len(cb.State) > 1024 {
		return refuse("callback.state is longer than 1024 characters")
	}
	for _, e := range cb.Events {
		if !slices.Contains(Events, e) {
			return refuse("callback.events: %q is not one of %s", e, strings.Join(Events, ", "))
		}
	}
	c, secret, err := s.callbackClient(ctx, clientID)
	if err != nil {
		return err
	}
	if err := CheckEndpoint(ctx, s.cfg.Resolver, c, cb.Endpoint); err != nil {
		return refuse("%v", err)
	}
	if !secret {
		return refuse("client %q has no webhook secret, and callbacks are never sent unsigned; an operator can create one (arapctl clients secret rotate)", c.Name)
	}
	return nil
}

// callbackClient reads client id and whether it has a live webhook secret,
// from memory when it was seen with one lately (ableClient).
func (s *Service) callbackClient(ctx context.Context, id string) (*clients.Client, bool, error) {
	now := s.cfg.Now()
	s.mu.Lock()
	a, ok := s.able[id]
	s.mu.Unlock()
	if ok && now.Before(a.exp) {
		return a.c, true, nil
	}
	c, err := s.clients.Get(ctx, id)
	if err != nil {
		return nil, false, err
	}
	var n int
	if err := s.cfg.DB.QueryRow(ctx, `SELECT count(*) FROM arap.webhook_secrets WHERE client_id = $1 AND (expires_at IS NULL OR expires_at > $2)`,
		id, now).Scan(&n); err != nil {
		return nil, false, err
	}
	if n > 0 {
		s.mu.Lock()
		if len(s.able) > 10000 {
			clear(s.able)
		}
		s.able[id] = ableClient{c: c, exp: now.Add(clients.CacheTTL)}
		s.mu.Unlock()
	}
	return c, n > 0, nil
}

// DeliverArgs is the job that delivers one callback.
type DeliverArgs struct {
	DeliveryID string `json:"delivery_id"`
}

// Kind implements river.JobArgs.
func (DeliverArgs) Kind() string { return "callbacks.deliver" }

// InsertOpts lets a delivery's job fail (a database outage, a worker
// killed mid-attempt) as often as it must: the delivery's own schedule
// (Attempt) decides when it is given up, never River's attempt count.
func (DeliverArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{MaxAttempts: maxJobAttempts}
}

// maxJobAttempts bounds a delivery job's failed runs: at retryCap apart,
// more than two weeks.
const maxJobAttempts = 50_000

// OnTerminal enqueues the callbacks of the ended requests that subscribed to
// their new state: the delivery rows in one INSERT, their jobs in one River
// insert (an expiry sweep ends hundreds at once). It runs inside the
// transaction that ends them (requests.Config.OnTerminal), so a delivery
// exists if and only if its state change does, and, with the unique
// (request_id, event), at most once.
func (s *Service) OnTerminal(ctx context.Context, tx pgx.Tx, ended []*requests.Request) error {
	var ids, requestIDs, clientIDs, endpoints, events, bodies []string
	var jobs []river.InsertManyParams
	for _, r := range ended {
		cb := r.Callback
		if cb == nil {
			continue
		}
		event := string(r.Status)
		if len(cb.Events) > 0 && !slices.Contains(cb.Events, event) {
			continue
		}
		body, err := json.Marshal(webhook.Body{State: cb.State, Task: r.Handle(s.cfg.StatusEndpoint(r.ID)).Task})
		if err != nil {
			return err
		}
		id := randid.New(DeliveryIDPrefix)
		ids, requestIDs, clientIDs = append(ids, id), append(requestIDs, r.ID), append(clientIDs, r.ClientID)
		endpoints, events, bodies = append(endpoints, cb.Endpoint), append(events, event), append(bodies, string(body))
		jobs = append(jobs, river.InsertManyParams{Args: DeliverArgs{DeliveryID: id}})
	}
	if len(ids) == 0 {
		return nil
	}
	if _, err := tx.Exec(ctx, `INSERT INTO arap.deliveries (id, request_id, client_id, endpoint, event, body, status, created_at, updated_at, next_attempt_at)
		SELECT id, request_id, client_id, endpoint, event, body, 'pending', $7, $7, $7
		FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[]) AS d(id, request_id, client_id, endpoint, event, body)`,
		ids, requestIDs, clientIDs, endpoints, events, bodies, s.cfg.Now()); err != nil {
		return fmt.Errorf("callbacks: record deliveries: %w", err)
	}
	if _, err := s.cfg.Jobs.InsertManyTx(ctx, tx, jobs); err != nil {
		return fmt.Errorf("callbacks: enqueue deliveries: %w", err)
	}
	return nil
}

// Worker delivers callbacks.
type Worker struct {
	river.WorkerDefaults[DeliverArgs]
	Service *Service
}

// Work makes one attempt; on failure it snoozes until the next retry.
func (w *Worker) Work(ctx context.Context, job *river.Job[DeliverArgs]) error {
	next, err := w.Service.Attempt(ctx, job.Args.DeliveryID)
	if err != nil {
		return err
	}
	if !next.IsZero() {
		return river.JobSnooze(max(time.Until(next), 0))
	}
	return nil
}

// NextRetry runs a delivery job that failed (not one that snoozed until
// its delivery's next attempt) again soon: after 1 s, doubling, at most
// retryCap, with jitter. River's default waits the failures' count to the
// fourth power in seconds, so a job that failed five times (a chaos run's
// database stops and kills) waited ten minutes while its delivery was due
// in seconds.
func (w *Worker) NextRetry(job *river.Job[DeliverArgs]) time.Time {
	return time.Now().Add(jobRetryAfter(len(job.Errors)))
}

// retryCap is the longest wait before a failed delivery job runs again.
const retryCap = 30 * time.Second

// jobRetryAfter is the wait after failures failed runs (1 or more).
func jobRetryAfter(failures int) time.Duration {
	d := retryCap
	if failures < 6 {
		d = min(time.Duration(1<<max(failures-1, 0))*time.Second, retryCap)
	}
	return d + time.Duration(mrand.Int64N(int64(d/5)+1))
}

// Timeout leaves room for the attempt's own timeout.
func (w *Worker) Timeout(*river.Job[DeliverArgs]) time.Duration {
	return w.Service.cfg.Timeout + 30*time.Second
}

// AddWorkers registers the delivery worker.
func (s *Service) AddWorkers(w *river.Workers) { river.AddWorker(w, &Worker{Service: s}) }

type delivery struct {
	id, requestID, clientID, endpoint, event, body, status string
	attempts                                               int
}

// Attempt sends delivery id once and records the outcome. It returns when
// to try again, or zero when the delivery is finished (delivered, gone,
// failed for good, or not pending).
func (s *Service) Attempt(ctx context.Context, id string) (time.Time, error) {
	var d delivery
	err := s.cfg.DB.QueryRow(ctx, `SELECT id, request_id, client_id, endpoint, event, body, status, attempts FROM arap.deliveries WHERE id = $1`, id).
		Scan(&d.id, &d.requestID, &d.clientID, &d.endpoint, &d.event, &d.body, &d.status, &d.attempts)
	if errors.Is(err, pgx.ErrNoRows) {
		return time.Time{}, nil
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("callbacks: load delivery %s: %w", id, err)
	}
	if d.status != Pending {
		return time.Time{}, nil
	}
	c, err := s.clients.Get(ctx, d.clientID)
	if err != nil {
		return time.Time{}, err
	}
	keys, err := s.secretKeys(ctx, d.clientID)
	if err != nil {
		return time.Time{}, err
	}

	start := time.Now()
	code, retryAfter, sendErr := s.send(ctx, c, keys, d)
	latency := time.Since(start)
	if sendErr == nil && code >= 200 && code < 300 {
		fault.Point("callbacks.after-send")
	}
	attemptLatency.Observe(latency.Seconds())
	attempts.WithLabelValues(resultLabel(code, sendErr)).Inc()

	d.attempts++
	status, next := Pending, time.Time{}
	switch {
	case sendErr == nil && code >= 200 && code < 300:
		status = Delivered
	case sendErr == nil && code == http.StatusGone:
		status = Gone
	case d.attempts > len(s.cfg.Schedule):
		status = Failed
	default:
		wait := s.cfg.Schedule[d.attempts-1]
		wait += time.Duration((mrand.Float64()*0.4 - 0.2) * float64(wait)) // ±20% jitter
		if retryAfter > wait {
			wait = min(retryAfter, 24*time.Hour)
		}
		next = s.cfg.Now().Add(wait)
	}
	errText := ""
	if sendErr != nil {
		errText = sendErr.Error()
	} else if status == Pending || status == Failed {
		errText = fmt.Sprintf("receiver answered %d", code)
	}
	err = pgx.BeginFunc(ctx, s.cfg.DB, func(tx pgx.Tx) error {
		now := s.cfg.Now()
		var codeArg *int
		if sendErr == nil {
			codeArg = &code
		}
		if _, err := tx.Exec(ctx, `INSERT INTO arap.delivery_attempts (delivery_id, at, status_code, latency_ms, error) VALUES ($1, $2, $3, $4, nullif($5, ''))`,
			d.id, now, codeArg, float64(latency.Microseconds())/1000, errText); err != nil {
			return err
		}
		var nextArg *time.Time
		if !next.IsZero() {
			nextArg = &next
		}
		if _, err := tx.Exec(ctx, `UPDATE arap.deliveries SET status = $2, attempts = $3, last_status = $4, last_error = nullif($5, ''),
			next_attempt_at = $6, updated_at = $7 WHERE id = $1`, d.id, status, d.attempts, codeArg, errText, nextArg, now); err != nil {
			return err
		}
		if status == Gone {
			// The receiver says the endpoint is gone: stop every pending
			// delivery to it, not only this one.
			if _, err := tx.Exec(ctx, `UPDATE arap.deliveries SET status = 'gone', next_attempt_at = NULL, updated_at = $3,
				last_error = 'endpoint answered 410 Gone to ' || $4
				WHERE client_id = $1 AND endpoint = $2 AND status = 'pending'`, d.clientID, d.endpoint, now, d.id); err != nil {
				return err
			}
		}
		if status != Pending {
			return audit.Append(ctx, tx, audit.Event{Chain: d.requestID, Kind: "callback." + status, Actor: "system", At: now,
				Data: map[string]any{"delivery_id": d.id, "event": d.event, "attempts": d.attempts, "status_code": codeArg}})
		}
		return nil
	})
	if err != nil {
		return time.Time{}, fmt.Errorf("callbacks: record attempt: %w", err)
	}
	if status != Pending {
		deliveries.WithLabelValues(status).Inc()
		s.cfg.Log.InfoContext(ctx, "callback finished", "delivery_id", d.id, "request_id", d.requestID, "outcome", status, "attempts", d.attempts)
	}
	return next, nil
}

func resultLabel(code int, err error) string {
	if err != nil {
		return "error"
	}
	return strconv.Itoa(code/100) + "xx"
}

// send POSTs the body once. Redirects are not followed: a redirect could
// lead outside the client's allowed destinations.
func (s *Service) send(ctx context.Context, c *clients.Client, keys [][]byte, d delivery) (int, time.Duration, error) {
	return s.post(ctx, c, keys, d.id, d.endpoint, []byte(d.body))
}

// post POSTs body to endpoint for client c, signed with keys under
// webhook-id id: the one signer and dialler of callbacks and webhook
// targets alike.
func (s *Service) post(ctx context.Context, c *clients.Client, keys [][]byte, id, endpoint string, body []byte) (int, time.Duration, error) {
	if len(keys) == 0 {
		return 0, 0, errors.New("no live webhook secret for this client; not sending unsigned")
	}
	dialer := &net.Dialer{Timeout: 5 * time.Second, Control: dialControl(c.CallbackNetworks)}
	client := &http.Client{
		Timeout: s.cfg.Timeout,
		Transport: telemetry.Transport(&http.Transport{DialContext: dialer.DialContext, TLSHandshakeTimeout: 5 * time.Second, DisableKeepAlives: true, ResponseHeaderTimeout: s.cfg.Timeout},
			s.cfg.TracerProvider),
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, bytes.NewReader(body))
	if err != nil {
		return 0, 0, err
	}
	ts := s.cfg.Now().Unix()
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "arap-callbacks/1")
	req.Header.Set(webhook.HeaderID, id)
	req.Header.Set(webhook.HeaderTimestamp, strconv.FormatInt(ts, 10))
	req.Header.Set(webhook.HeaderSignature, webhook.SignatureHeader(keys, id, ts, body))
	resp, err := client.Do(req)
	if err != nil {
		return 0, 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, s.cfg.MaxResponse))
	return resp.StatusCode, retryAfter(resp.Header.Get("Retry-After"), s.cfg.Now()), nil
}

// retryAfter parses Retry-After (seconds or an HTTP date).
func retryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	if n, err := strconv.Atoi(v); err == nil && n > 0 {
		return time.Duration(n) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}
