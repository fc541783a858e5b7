package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/arapclient"
	"github.com/omcp/arap/audit"
	"github.com/omcp/arap/clients"
	"github.com/omcp/arap/internal/backendtest"
	"github.com/omcp/arap/internal/dev"
)

// records parses JSON lines of audit events.
func records(t *testing.T, out string) []audit.Record {
	t.Helper()
	var rs []audit.Record
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		var r audit.Record
		require.NoError(t, json.Unmarshal(sc.Bytes(), &r), "line %q", sc.Text())
		rs = append(rs, r)
	}
	return rs
}

// lockedBuffer is written by the streaming goroutine and read by the test.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func TestAuditExportThroughTheAPI(t *testing.T) {
	env := backendtest.Start(t, backendtest.Options{})
	ctx := context.Background()
	_, token, err := env.Backend.Clients().Create(ctx, clients.New{Name: "siem", Scopes: []string{clients.ScopeAudit}, Kind: clients.KindAutomation}, "test")
	require.NoError(t, err)
	t.Setenv("ARAP_URL", env.URL)
	t.Setenv("ARAP_TOKEN", token)
	appendEvent := func(kind string) {
		require.NoError(t, pgx.BeginFunc(ctx, env.Pool, func(tx pgx.Tx) error {
			return audit.Append(ctx, tx, audit.Event{Chain: audit.SystemChain, Kind: kind, Actor: "test"})
		}))
	}
	var total int
	require.NoError(t, env.Pool.QueryRow(ctx, `SELECT count(*) FROM arap.audit_events`).Scan(&total))
	require.Positive(t, total)

	// Without --follow it stops at the end; the chains verify from the
	// lines alone.
	out, err := ctl(t, "audit", "export", "--since", "2000-01-01T00:00:00Z")
	require.NoError(t, err)
	rs := records(t, out)
	require.Len(t, rs, total)
	rep := audit.VerifyRecords(rs)
	require.True(t, rep.OK(), "%v", rep.Breaks)

	// --cursor-file resumes where the last run stopped.
	cursorFile := filepath.Join(t.TempDir(), "cursor")
	out, err = ctl(t, "audit", "export", "--cursor-file", cursorFile)
	require.NoError(t, err)
	require.Len(t, records(t, out), total)
	appendEvent("test.resumed")
	out, err = ctl(t, "audit", "export", "--cursor-file", cursorFile)
	require.NoError(t, err)
	rs = records(t, out)
	require.Len(t, rs, 1)
	require.Equal(t, "test.resumed", rs[0].Kind)

	// --follow sees an event appended while it runs.
	c := &arapclient.Client{BaseURL: env.URL, Token: token}
	fctx, cancel := context.WithCancel(ctx)
	var buf, notes lockedBuffer
	done := make(chan error, 1)
	go func() {
		done <- streamAudit(fctx, c, streams{out: &buf, note: &notes}, &buf, streamOptions{follow: true, interval: 100 * time.Millisecond})
	}()
	require.Eventually(t, func() bool { return strings.Count(buf.String(), "\n") == total+1 }, 30*time.Second, 20*time.Millisecond)
	appendEvent("test.followed")
	require.Eventually(t, func() bool { return strings.Contains(buf.String(), `"kind":"test.followed"`) }, 30*time.Second, 20*time.Millisecond)
	cancel()
	require.NoError(t, <-done)
	rs = records(t, buf.String())
	require.Len(t, rs, total+2)
	rep = audit.VerifyRecords(rs)
	require.True(t, rep.OK(), "%v", rep.Breaks)
	require.Contains(t, notes.String(), "audit stream cursor: a1.", "where to resume is printed on the way out")

	// Refusals are errors, even following: a bad time, a token without the
	// audit scope.
	_, err = ctl(t, "audit", "export", "--since", "yesterday")
	require.ErrorContains(t, err, "RFC 3339")
	t.Setenv("ARAP_TOKEN", dev.ITSMToken)
	_, err = ctl(t, "audit", "export", "--follow")
	require.ErrorContains(t, err, "audit scope")
	_, err = ctl(t, "audit", "export", "--follow", "--pep")
	require.ErrorContains(t, err, "--pep reads the database")
}
