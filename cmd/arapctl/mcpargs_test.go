package main

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"path/filepath"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/arapclient"
	"github.com/omcp/arap/internal/backendtest"
	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/internal/dev"
	"github.com/omcp/arap/pep"
)

// TestArgValue: a --arg value takes the type the tool's schema gives its
// property; without one, JSON when it parses, else text.
func TestArgValue(t *testing.T) {
	types := func(ts ...string) map[string]bool {
		m := map[string]bool{}
		for _, t := range ts {
			m[t] = true
		}
		return m
	}
	for _, tc := range []struct {
		text  string
		types map[string]bool
		want  any
	}{
		{"991", types("string"), "991"},
		{"true", types("string"), "true"},
		{"acct-991", types("string"), "acct-991"},
		{`"991"`, types("string"), "991"},
		{"50000", types("number"), json.Number("50000")},
		{"12.5", types("number"), json.Number("12.5")},
		{"3", types("integer"), json.Number("3")},
		{"true", types("boolean"), true},
		{"null", types("string", "null"), nil},
		{"none", types("string", "null"), "none"},
		{`{"a":1}`, types("object"), map[string]any{"a": json.Number("1")}},
		{`["a"]`, types("array"), []any{"a"}},
		{"991", nil, json.Number("991")},
		{"acct-991", nil, "acct-991"},
		{`"991"`, nil, "991"},
	} {
		got, err := argValue("tool", "field", tc.text, tc.types)
		require.NoError(t, err, "%q %v", tc.text, tc.types)
		require.Equal(t, tc.want, got, "%q %v", tc.text, tc.types)
	}
	for _, tc := range []struct {
		text  string
		types map[string]bool
		want  string
	}{
		{"lots", types("number"), "--arg amount=lots: amount of wire_transfer takes a number; write it as JSON, such as --arg amount=12.5"},
		{"1.5", types("integer"), "--arg amount=1.5: amount of wire_transfer takes an integer; write it as JSON, such as --arg amount=3"},
		{"yes", types("boolean", "null"), "--arg amount=yes: amount of wire_transfer takes true or false or null; write it as JSON, such as --arg amount=true"},
		{"[1]", types("object"), `--arg amount=[1]: amount of wire_transfer takes a JSON object; write it as JSON, such as --arg amount='{"key":"value"}'`},
	} {
		_, err := argValue("wire_transfer", "amount", tc.text, tc.types)
		var ue usageError
		require.ErrorAs(t, err, &ue, tc.text)
		require.Equal(t, tc.want, ue.msg)
	}
}

// mcpServer starts the MCP front-end on a test backend with the demo tools
// and a caller acting for alice, and returns its endpoint, its caller token
// and its database.
func mcpServer(t *testing.T) (string, string, *pgxpool.Pool, string) {
	t.Helper()
	ctx := context.Background()
	env := backendtest.Start(t, backendtest.Options{})
	url := dbtest.URL(t)
	db, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	t.Cleanup(db.Close)
	g, err := pep.NewGate(pep.Config{DB: db, Backend: &arapclient.Client{BaseURL: env.URL, Token: dev.PEPToken}, MasterKey: make([]byte, 32), Tools: pep.DemoTools()})
	require.NoError(t, err)
	const token = "alice-token-0123"
	require.NoError(t, g.Callers().Create(ctx, "alice-agent", token, pep.Principal{SubjectType: "user", SubjectID: "alice", ActorID: "agent:demo"}))
	srv, err := pep.NewServer(g, pep.ServerOptions{Name: "test", Version: "0"})
	require.NoError(t, err)
	h := httptest.NewServer(srv)
	t.Cleanup(h.Close)
	return h.URL + pep.PathMCP, token, db, url
}

// TestMCPCallTypesArgsBySchema: `--arg to=991` sends the string "991",
// since wire_transfer's input schema says `to` is a string, and the number
// 100 for amount; a value the schema's type cannot take is refused before
// anything is sent, saying how to write it.
func TestMCPCallTypesArgsBySchema(t *testing.T) {
	endpoint, token, _, _ := mcpServer(t)
	state := filepath.Join(t.TempDir(), "tasks.json")
	t.Setenv("ARAP_MCP_TOKEN", token)
	out, err := ctl(t, "mcp", "call", "wire_transfer", "--arg", "to=991", "--arg", "amount=100", "--url", endpoint, "--state", state)
	require.NoError(t, err, out)
	require.Contains(t, out, "Transfer of $100 to 991 completed")
	require.Contains(t, out, `"to": "991"`)

	_, err = ctl(t, "mcp", "call", "wire_transfer", "--arg", "to=991", "--arg", "amount=lots", "--url", endpoint, "--state", state)
	require.EqualError(t, err, "mcp call: --arg amount=lots: amount of wire_transfer takes a number; write it as JSON, such as --arg amount=12.5")
}
