package callbacks

import (
	"github.com/omcp/arap/internal/telemetry"

	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/omcp/arap/audit"
	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/internal/randid"
	"github.com/omcp/arap/requests"
)

// Delivery is a callback delivery with its attempts.
type Delivery struct {
	ID            string     `json:"id"`
	RequestID     string     `json:"request_id"`
	Endpoint      string     `json:"endpoint"`
	Event         string     `json:"event"`
	Status        string     `json:"status"`
	Attempts      []Attempt  `json:"attempts"`
	NextAttemptAt *time.Time `json:"next_attempt_at,omitempty"`
	CreatedAt     time.Time  `json:"created_at"`
}

// Attempt is one try.
type Attempt struct {
	At         time.Time `json:"at"`
	StatusCode *int      `json:"status_code,omitempty"`
	LatencyMS  float64   `json:"latency_ms"`
	Error      string    `json:"error,omitempty"`
}

// Deliveries lists request id's deliveries, oldest first, with every attempt.
func (s *Service) Deliveries(ctx context.Context, requestID string) ([]Delivery, error) {
	rows, err := s.cfg.DB.Query(ctx, `SELECT id, request_id, endpoint, event, status, next_attempt_at, created_at
		FROM arap.deliveries WHERE request_id = $1 ORDER BY created_at, id`, requestID)
	if err != nil {
		return nil, fmt.Errorf("callbacks: deliveries: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Delivery, error) {
		var d Delivery
		err := r.Scan(&d.ID, &d.RequestID, &d.Endpoint, &d.Event, &d.Status, &d.NextAttemptAt, &d.CreatedAt)
		d.Attempts = []Attempt{}
		return d, err
	})
	if err != nil {
		return nil, err
	}
	for i := range out {
		rows, err := s.cfg.DB.Query(ctx, `SELECT at, status_code, latency_ms, coalesce(error, '') FROM arap.delivery_attempts WHERE delivery_id = $1 ORDER BY at, id`, out[i].ID)
		if err != nil {
			return nil, err
		}
		out[i].Attempts, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (Attempt, error) {
			var a Attempt
			err := r.Scan(&a.At, &a.StatusCode, &a.LatencyMS, &a.Error)
			return a, err
		})
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// Redeliver sends delivery id again now, whatever its state, with a fresh
// retry schedule and the same webhook-id.
func (s *Service) Redeliver(ctx context.Context, requestID, id, by string) error {
	if !randid.Valid(DeliveryIDPrefix, id) {
		return &requests.Error{Code: authzen.ProblemNotFound, Detail: "no such delivery for this request"}
	}
	return pgx.BeginFunc(ctx, s.cfg.DB, func(tx pgx.Tx) error {
		now := s.cfg.Now()
		tag, err := tx.Exec(ctx, `UPDATE arap.deliveries SET status = 'pending', attempts = 0, next_attempt_at = $3, updated_at = $3
			WHERE id = $1 AND request_id = $2`, id, requestID, now)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			return &requests.Error{Code: authzen.ProblemNotFound, Detail: "no such delivery for this request"}
		}
		if _, err := s.cfg.Jobs.InsertTx(ctx, tx, DeliverArgs{DeliveryID: id}, nil); err != nil {
			return err
		}
		return audit.Append(ctx, tx, audit.Event{Chain: requestID, Kind: "callback.redeliver", Actor: by, At: now, Data: map[string]any{"delivery_id": id}})
	})
}

// QueueDepth is a gauge of deliveries still pending, database-wide: only
// the replica for which leader is true reports it, so that summing over
// replicas counts it once.
func (s *Service) QueueDepth(leader func(context.Context) bool) prometheus.Collector {
	return telemetry.LeaderGauge(prometheus.GaugeOpts{
		Name: "arap_callback_queue_depth", Help: "Callback deliveries waiting for a (re)try, in the whole database (reported by the River leader replica only).",
	}, leader, func(ctx context.Context) (n int, err error) {
		err = s.cfg.DB.QueryRow(ctx, `SELECT count(*) FROM arap.deliveries WHERE status = 'pending'`).Scan(&n)
		return n, err
	})
}
