package bench

import (
	"context"
	"fmt"
	"io"
	"regexp"
	"strings"
)

// DBProfile is PostgreSQL's work during one measurement, per successful
// call: what the call did and what it left for background work (River's
// fetches, the notification dispatch) during the same seconds. It needs
// Options.Statements (pg_stat_statements).
type DBProfile struct {
	// Transactions counts read-only ones too (pg_stat_database's
	// xact_commit), and is approximate: a backend reports its counts up to a
	// second late.
	Transactions float64     `json:"transactions_per_op"`
	Statements   float64     `json:"statements_per_op"`
	Ms           float64     `json:"statement_ms_per_op"` // execution time of every statement
	WALBytes     float64     `json:"wal_bytes_per_op"`
	Top          []Statement `json:"top"`
}

// Statement is one normalized statement's share of a call.
type Statement struct {
	Query string  `json:"query"`
	Calls float64 `json:"calls_per_op"`
	Ms    float64 `json:"ms_per_op"`
}

// dbMark is where a measurement started.
type dbMark struct {
	commits int64
	lsn     string
}

// markDB resets pg_stat_statements and notes the commit count and the WAL
// position.
func (s *System) markDB(ctx context.Context) (dbMark, error) {
	var m dbMark
	if _, err := s.DB.Exec(ctx, `SELECT pg_stat_statements_reset()`); err != nil {
		return m, err
	}
	err := s.DB.QueryRow(ctx, `SELECT (SELECT sum(xact_commit)::bigint FROM pg_stat_database), pg_current_wal_lsn()::text`).Scan(&m.commits, &m.lsn)
	return m, err
}

// profileDB reads what happened since m, per call of n, with the top
// statements by time.
func (s *System) profileDB(ctx context.Context, m dbMark, n, top int) (*DBProfile, error) {
	if n == 0 {
		return nil, nil
	}
	var commits int64
	var wal float64
	if err := s.DB.QueryRow(ctx, `SELECT (SELECT sum(xact_commit)::bigint FROM pg_stat_database), pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)`, m.lsn).
		Scan(&commits, &wal); err != nil {
		return nil, err
	}
	// The profile's own statements are left out.
	rows, err := s.DB.Query(ctx, `SELECT query, calls, total_exec_time FROM pg_stat_statements
		WHERE query NOT LIKE '%pg_stat_statements%' AND query NOT LIKE '%pg_stat_database%' ORDER BY total_exec_time DESC`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	p := &DBProfile{Transactions: float64(commits-m.commits) / float64(n), WALBytes: wal / float64(n)}
	for rows.Next() {
		var q string
		var calls int64
		var ms float64
		if err := rows.Scan(&q, &calls, &ms); err != nil {
			return nil, err
		}
		p.Statements += float64(calls) / float64(n)
		p.Ms += ms / float64(n)
		if len(p.Top) < top && ms/float64(n) >= 0.0005 {
			p.Top = append(p.Top, Statement{Query: oneLine(q, 110), Calls: float64(calls) / float64(n), Ms: ms / float64(n)})
		}
	}
	return p, rows.Err()
}

var spaces = regexp.MustCompile(`\s+`)

// oneLine collapses q's white space (River's queries start with a "-- name:"
// comment, which names them best) and cuts it at n bytes.
func oneLine(q string, n int) string {
	q = strings.TrimSpace(spaces.ReplaceAllString(q, " "))
	if len(q) > n {
		q = q[:n] + "…"
	}
	return q
}

func (p *DBProfile) print(w io.Writer, name string) {
	if len(p.Top) == 0 {
		return // no statement of its own (the HTTP baseline)
	}
	fmt.Fprintf(w, "\nPostgreSQL per call of %s: %.1f transactions, %.1f statements, %.3f ms of statement time, %.1f KB of WAL\n",
		name, p.Transactions, p.Statements, p.Ms, p.WALBytes/1024)
	fmt.Fprintf(w, "  %8s %8s  %s\n", "ms/call", "per call", "statement")
	for _, st := range p.Top {
		fmt.Fprintf(w, "  %8.3f %8.2f  %s\n", st.Ms, st.Calls, st.Query)
	}
}
