package main

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/internal/backendtest"
	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/internal/dev"
	"github.com/omcp/arap/mcp/tasks"
	"github.com/omcp/arap/migrations"
	"github.com/omcp/arap/pep"
)

// TestAuditVerifyPEP: `arapctl audit verify --pep` checks the MCP
// front-end's own trail in its database (a task cancelled by its caller
// leaves one event), says it is intact, and names the chain and event once a
// field is changed; `audit export --pep` writes it as JSON lines.
func TestAuditVerifyPEP(t *testing.T) {
	ctx := context.Background()
	env := backendtest.Start(t, backendtest.Options{})
	url := dbtest.URL(t)
	db, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	t.Cleanup(db.Close)
	jobs, err := river.NewClient(riverpgxv5.New(db), &river.Config{Schema: migrations.PEPRiverSchema})
	require.NoError(t, err)
	g, err := pep.NewGate(pep.Config{DB: db, Backend: &authzen.Client{BaseURL: env.URL, Token: dev.PEPToken}, MasterKey: make([]byte, 32), Jobs: jobs, Tools: pep.DemoTools()})
	require.NoError(t, err)
	require.NoError(t, g.Callers().Create(ctx, "alice-agent", "alice-token-0123", pep.Principal{SubjectType: "user", SubjectID: "alice", ActorID: "agent:demo"}))
	srv, err := pep.NewServer(g, pep.ServerOptions{Name: "test", Version: "0"})
	require.NoError(t, err)
	h := httptest.NewServer(srv)
	t.Cleanup(h.Close)
	alice := &tasks.Client{URL: h.URL + pep.PathMCP, Token: "alice-token-0123"}
	r, err := alice.CallTool(ctx, "wire_transfer", map[string]any{"to": "acct-ctl", "amount": 50000}, nil)
	require.NoError(t, err)
	require.Equal(t, tasks.ResultTypeTask, r.ResultType)
	require.NoError(t, alice.Cancel(ctx, r.Task.TaskID))

	t.Setenv("DATABASE_URL", url)
	out, err := ctl(t, "audit", "verify", "--pep")
	require.NoError(t, err)
	require.Equal(t, "pep audit: 1 chains, 1 events, all intact\n", out)
	out, err = ctl(t, "audit", "export", "--pep")
	require.NoError(t, err)
	var rec pep.AuditRecord
	require.NoError(t, json.Unmarshal([]byte(strings.TrimSpace(out)), &rec), out)
	require.Equal(t, r.Task.TaskID, rec.Chain)
	require.Equal(t, pep.AuditCancelled, rec.Kind)

	_, err = db.Exec(ctx, `UPDATE pep.audit_events SET data = jsonb_set(data, '{reason}', '"approved"')`)
	require.NoError(t, err)
	out, err = ctl(t, "audit", "verify", "--pep")
	require.ErrorContains(t, err, "1 of 1 chains broken")
	require.Contains(t, out, "BROKEN: chain "+r.Task.TaskID+": event seq 1: hash does not match")
}
