package main

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/mcp/tasks"
	"github.com/omcp/arap/pep"
)

// TestAuditVerifyPEP: `arapctl audit verify --pep` checks the MCP
// front-end's own trail in its database (a task cancelled by its caller
// leaves one event), says it is intact, and names the chain and event once a
// field is changed; `audit export --pep` writes it as JSON lines.
func TestAuditVerifyPEP(t *testing.T) {
	ctx := context.Background()
	endpoint, token, db, url := mcpServer(t)
	alice := &tasks.Client{URL: endpoint, Token: token}
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
