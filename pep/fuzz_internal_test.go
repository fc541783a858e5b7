package pep

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/clean"
	"github.com/omcp/arap/internal/seal"
	"github.com/omcp/arap/mcp/tasks"
)

func requireInvalidParams(t *testing.T, err error) {
	t.Helper()
	var re *jsonrpc.Error
	require.True(t, errors.As(err, &re), "refusal is a JSON-RPC error: %v", err)
	require.EqualValues(t, tasks.CodeInvalidParams, re.Code)
	require.NotEmpty(t, re.Message)
}

// FuzzGateArguments decodes tools/call arguments as the gate does (the SDK
// has already parsed the JSON-RPC message, so they are JSON): nothing
// panics; a refusal is invalid params; accepted arguments satisfy the
// tool's schema, hold nothing the PDP or PostgreSQL would refuse, and give
// the same binding digest after a round trip (so a retry matches its task).
func FuzzGateArguments(f *testing.F) {
	cat, err := newCatalog([]ToolSource{DemoSource()})
	require.NoError(f, err)
	g := &Gate{catalog: cat}
	for _, c := range [][2]string{
		{"wire_transfer", `{"to":"acct-991","amount":50000}`}, {"wire_transfer", `{"to":"acct\u0000","amount":1}`},
		{"wire_transfer", `{"to":"a","amount":"lots"}`}, {"wire_transfer", `[]`}, {"wire_transfer", `null`}, {"get_balance", `{}`},
		{"delete_repository", `{"repo":"acme/legacy"}`}, {"deploy_service", `{"service":"api","version":"1.2.3"}`},
		{"read_customer_record", `{"customer_id":"c-1"}`}, {"wire_transfer", `{"to":"a","amount":1e308,"extra":{"\u0000":1}}`},
		{"wire_transfer", `{"to":"\ud800","amount":-0}`},
	} {
		f.Add(c[0], []byte(c[1]))
	}
	f.Fuzz(func(t *testing.T, tool string, raw []byte) {
		def, err := g.catalog.lookup(tool)
		if err != nil || !json.Valid(raw) {
			return
		}
		req := &sdk.CallToolRequest{Params: &sdk.CallToolParamsRaw{Name: tool, Arguments: json.RawMessage(raw)}}
		args, err := g.arguments(req, def)
		if err != nil {
			requireInvalidParams(t, err)
			return
		}
		require.NotNil(t, args)
		require.NoError(t, def.schema.Validate(toJSONValue(args)))
		b, err := json.Marshal(args)
		require.NoError(t, err)
		require.NoError(t, clean.JSON(b))
		d1, err := digest(tool, args)
		require.NoError(t, err)
		again, err := g.arguments(&sdk.CallToolRequest{Params: &sdk.CallToolParamsRaw{Name: tool, Arguments: b}}, def)
		require.NoError(t, err)
		d2, err := digest(tool, again)
		require.NoError(t, err)
		require.Equal(t, d1, d2)
	})
}

// FuzzRequestState feeds arbitrary MRTR requestState strings to the gate:
// nothing panics, and anything it did not seal (or that has expired) is
// refused as invalid params; what it sealed reads back exactly.
func FuzzRequestState(f *testing.F) {
	box, err := seal.New(make([]byte, 32))
	require.NoError(f, err)
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	g := &Gate{box: box, cfg: Config{Now: func() time.Time { return now }}}
	st := mrtrState{Nonce: "n1", Principal: "user:alice|agent:demo", Tool: "read_customer_record", Digest: strings.Repeat("a", 64), Key: "k", Expires: now.Add(time.Minute)}
	live := g.sealState(st)
	expired := st
	expired.Expires = now.Add(-time.Second)
	for _, s := range []string{live, g.sealState(expired), "", "AAAA", "not base64!", live[:len(live)-2], strings.ToUpper(live), live + "A"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := g.openState(s)
		if err != nil {
			requireInvalidParams(t, err)
			return
		}
		require.Equal(t, st, got, "only what we sealed opens")
	})
}
