package durability

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
)

// Querier is a pool, a connection or a transaction.
type Querier interface {
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// Report is what a check found.
type Report struct {
	// InRecovery: the server is a standby (pg_is_in_recovery()).
	InRecovery bool `json:"in_recovery"`
	// ReadOnly: the server refuses writes (in recovery, or
	// transaction_read_only on for this connection).
	ReadOnly bool `json:"read_only"`
	// SynchronousCommit is synchronous_commit as this process's sessions
	// have it (the server's, its role's or database's, or the URL's).
	SynchronousCommit string `json:"synchronous_commit"`
	// SynchronousStandby: synchronous_standby_names is set. Its value,
	// the standbys' names, is not reported.
	SynchronousStandby bool `json:"synchronous_standby_configured"`
	// Replication: the server can have standbys (wal_level is not minimal
	// and max_wal_senders is above zero).
	Replication bool `json:"replication_possible"`
	// Standbys are those connected now (pg_stat_replication), or nil when
	// this role may not see them.
	Standbys *Standbys `json:"standbys"`
	// Warning says how a committed claim could be lost; empty when it
	// cannot (by the rule above).
	Warning string `json:"warning,omitempty"`
}

// Standbys counts the standbys streaming from the server, by
// sync_state: sync and quorum are Synchronous, potential ones wait their
// turn, async ones are never waited for. Base backups in progress are not
// counted.
type Standbys struct {
	Synchronous  int `json:"synchronous"`
	Potential    int `json:"potential"`
	Asynchronous int `json:"asynchronous"`
}

// Check reads the settings and the standbys. An error means the database
// did not answer the settings' query; pg_stat_replication that cannot be
// read leaves Standbys nil.
func Check(ctx context.Context, db Querier) (Report, error) {
	var r Report
	var readOnly, names, walLevel, senders string
	err := db.QueryRow(ctx, `SELECT pg_is_in_recovery(), current_setting('transaction_read_only'),
		current_setting('synchronous_commit'), current_setting('synchronous_standby_names'),
		current_setting('wal_level'), current_setting('max_wal_senders')`).
		Scan(&r.InRecovery, &readOnly, &r.SynchronousCommit, &names, &walLevel, &senders)
	if err != nil {
		return Report{}, fmt.Errorf("durability: settings: %w", err)
	}
	r.ReadOnly = r.InRecovery || readOnly == "on"
	r.SynchronousStandby = strings.TrimSpace(names) != ""
	n, _ := strconv.Atoi(senders)
	r.Replication = walLevel != "minimal" && n > 0
	r.Standbys = standbys(ctx, db)
	r.Warning = r.warning()
	return r, nil
}

// standbys counts pg_stat_replication's rows by sync_state; nil when the
// view cannot be read or hides its details (no pg_monitor).
func standbys(ctx context.Context, db Querier) *Standbys {
	rows, err := db.Query(ctx, `SELECT sync_state FROM pg_stat_replication WHERE state IS DISTINCT FROM 'backup'`)
	if err != nil {
		return nil
	}
	defer rows.Close()
	var s Standbys
	for rows.Next() {
		var state *string
		if rows.Scan(&state) != nil || state == nil {
			return nil // hidden: this role lacks pg_read_all_stats
		}
		switch *state {
		case "sync", "quorum":
			s.Synchronous++
		case "potential":
			s.Potential++
		default:
			s.Asynchronous++
		}
	}
	if rows.Err() != nil {
		return nil
	}
	return &s
}

// warning applies the rule; a standby's own settings say nothing until it
// is promoted (it is read-only, so not ready, meanwhile).
func (r Report) warning() string {
	switch {
	case r.InRecovery:
		return ""
	case r.SynchronousCommit == "off":
		return "synchronous_commit is off: a commit is acknowledged before it is on disk, so a crash or a failover can lose the last ones, execution claims included (a tool could run twice)"
	case !r.SynchronousStandby && (r.Replication || r.Standbys != nil && r.Standbys.Synchronous+r.Standbys.Potential+r.Standbys.Asynchronous > 0):
		return "no synchronous standby is configured (synchronous_standby_names is empty): a failover to a standby can lose the commits it had not received, execution claims included (a tool could run twice)"
	case r.SynchronousStandby && r.SynchronousCommit == "local":
		return "synchronous_commit is local: commits do not wait for the synchronous standby, so a failover can lose the last ones, execution claims included (a tool could run twice)"
	}
	return ""
}

// Summary is the report in one line, for a log or a person.
func (r Report) Summary() string {
	var b strings.Builder
	if r.InRecovery {
		b.WriteString("in recovery (a standby): read-only; ")
	} else if r.ReadOnly {
		b.WriteString("read-only (transaction_read_only is on); ")
	}
	fmt.Fprintf(&b, "synchronous_commit=%s; ", r.SynchronousCommit)
	if r.SynchronousStandby {
		b.WriteString("a synchronous standby is configured; ")
	} else {
		b.WriteString("no synchronous standby is configured; ")
	}
	switch s := r.Standbys; {
	case s == nil:
		b.WriteString("standbys unknown (pg_stat_replication needs pg_monitor)")
	default:
		fmt.Fprintf(&b, "standbys streaming: %d synchronous, %d potential, %d asynchronous", s.Synchronous, s.Potential, s.Asynchronous)
		if r.SynchronousStandby && s.Synchronous == 0 && r.SynchronousCommit != "off" && r.SynchronousCommit != "local" {
			b.WriteString(" (none synchronous: every commit waits until one connects)")
		}
	}
	return b.String()
}

// Log writes r once: at warn level with its warning when a committed
// claim could be lost, else at info.
func Log(ctx context.Context, log *slog.Logger, r Report) {
	attrs := []any{"synchronous_commit", r.SynchronousCommit, "synchronous_standby_configured", r.SynchronousStandby, "summary", r.Summary()}
	if r.Warning != "" {
		log.WarnContext(ctx, "database durability: a failover could lose an execution claim", append(attrs, "warning", r.Warning)...)
		return
	}
	log.InfoContext(ctx, "database durability", attrs...)
}
