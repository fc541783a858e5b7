package pep_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/summary"
	"github.com/omcp/arap/mcp/tasks"
	"github.com/omcp/arap/pep"
)

// callText sends tools/call as alice, declaring the tasks extension, with
// arguments exactly as the text given (so that a number no Go value holds,
// such as 1e400, reaches the server as written), and returns the JSON-RPC
// answer's result and error.
func callText(t *testing.T, url, tool, arguments string) (map[string]any, *tasks.RPCError) {
	t.Helper()
	body := `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"` + tool + `","arguments":` + arguments +
		`,"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{"extensions":{"io.modelcontextprotocol/tasks":{}}}}}}`
	req, err := http.NewRequest(http.MethodPost, url, bytes.NewReader([]byte(body)))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Mcp-Protocol-Version", "2026-07-28")
	req.Header.Set("Mcp-Method", "tools/call")
	req.Header.Set("Mcp-Name", tool)
	req.Header.Set("Authorization", "Bearer "+aliceToken)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var out struct {
		Result map[string]any  `json:"result"`
		Error  *tasks.RPCError `json:"error"`
	}
	require.NoError(t, json.Unmarshal(raw, &out), "%s", raw)
	require.True(t, (out.Result == nil) != (out.Error == nil), "%s", raw)
	return out.Result, out.Error
}

// text is a CallToolResult's first text.
func text(t *testing.T, res map[string]any) string {
	t.Helper()
	content, _ := res["content"].([]any)
	require.NotEmpty(t, content, "%v", res)
	first, _ := content[0].(map[string]any)
	s, _ := first["text"].(string)
	return s
}

// TestTransferAmountsAnApproverCanRead (issue 39): wire_transfer takes whole
// cents from 0.01 to 1,000,000,000 and nothing else. A number that would
// not read back as itself, or not as money, is refused with -32602 naming
// amount before the policy sees it, and nothing happens: no transfer, no
// access request. 1e-320 once passed the policy as a positive amount and
// read "Transfer of $0"; 0.001 read "$0"; 100.015 read "$100.02";
// 12345678901234567890 became 12345678901234567000 on its way to the
// policy.
func TestTransferAmountsAnApproverCanRead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := newPEP(t, pepOptions{})
	// effects counts what a call may leave behind: transfers, submission
	// intents, access requests.
	effects := func(t *testing.T) [3]int {
		t.Helper()
		var n [3]int
		require.NoError(t, p.db.QueryRow(ctx, `SELECT count(*) FROM pep.ledger`).Scan(&n[0]))
		require.NoError(t, p.db.QueryRow(ctx, `SELECT count(*) FROM pep.intents`).Scan(&n[1]))
		require.NoError(t, p.env.Pool.QueryRow(ctx, `SELECT count(*) FROM arap.requests`).Scan(&n[2]))
		return n
	}
	for amount, want := range map[string]string{
		"1e-320":                 "amount: must be at least 0.01",
		"0.001":                  "amount: must be at least 0.01",
		"0.009":                  "amount: must be at least 0.01",
		"0":                      "amount: must be at least 0.01",
		"-5":                     "amount: must be at least 0.01",
		"100.015":                "amount: must be a multiple of 0.01",
		"25000.001":              "amount: must be a multiple of 0.01",
		"12345678901234567890":   "amount: the number 12345678901234567890 cannot be kept exactly",
		"1000000000.01":          "amount: must be at most 1000000000",
		"1e300":                  "amount: must be at most 1000000000",
		"1.7976931348623157e308": "amount: must be at most 1000000000",
		`"50000"`:                "amount:",
		`null`:                   "amount:",
	} {
		t.Run(amount, func(t *testing.T) {
			before := effects(t)
			res, rpc := callText(t, p.url, "wire_transfer", `{"to":"acct-991","amount":`+amount+`}`)
			require.NotNil(t, rpc, "%v", res)
			require.Equal(t, tasks.CodeInvalidParams, rpc.Code, rpc.Message)
			require.True(t, strings.HasPrefix(rpc.Message, "invalid arguments for wire_transfer: "), rpc.Message)
			require.Contains(t, rpc.Message, want)
			require.Equal(t, before, effects(t), "ledger, intents, requests")
		})
	}
	// Past float64 the call is refused before the gate sees it (the SDK's
	// Mcp-Name check cannot read the params: -32020, not -32602 naming
	// amount; see the report of issue 39), and nothing happens either.
	t.Run("1e400", func(t *testing.T) {
		before := effects(t)
		res, rpc := callText(t, p.url, "wire_transfer", `{"to":"acct-991","amount":1e400}`)
		require.NotNil(t, rpc, "%v", res)
		require.Equal(t, before, effects(t), "ledger, intents, requests")
	})

	// Whole cents run, and the result reads the amount as the call
	// carries it, digit for digit.
	res, rpc := callText(t, p.url, "wire_transfer", `{"to":"acct-1","amount":1234.56}`)
	require.Nil(t, rpc)
	require.Equal(t, "Transfer of $1,234.56 to acct-1 completed (transfer 1).", text(t, res))
	require.Equal(t, 1234.56, res["structuredContent"].(map[string]any)["amount"])
	res, rpc = callText(t, p.url, "wire_transfer", `{"to":"acct-2","amount":0.01}`)
	require.Nil(t, rpc)
	require.Equal(t, "Transfer of $0.01 to acct-2 completed (transfer 2).", text(t, res))
}

// TestApprovedAmountReadsAsApproved: 50000.25 waits for a treasury
// approval; the approver's page shows the amount the backend stored
// (summary.Number of it), and the approved run's result reads that same
// amount, never rounded.
func TestApprovedAmountReadsAsApproved(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := newPEP(t, pepOptions{})
	res, rpc := callText(t, p.url, "wire_transfer", `{"to":"acct-991","amount":50000.25}`)
	require.Nil(t, rpc)
	require.Equal(t, tasks.ResultTypeTask, res["resultType"], "%v", res)
	id, _ := res["taskId"].(string)
	require.NotEmpty(t, id, "%v", res)

	request := p.request(t, id)
	var resource map[string]any
	require.NoError(t, p.env.Pool.QueryRow(ctx, `SELECT resource FROM arap.requests WHERE id = $1`, request).Scan(&resource))
	args := resource["properties"].(map[string]any)["arguments"].(map[string]any)
	require.Equal(t, 50000.25, args["amount"])
	shown := summary.Number(args["amount"].(float64))
	require.Equal(t, "50,000.25", shown, "what the approver reads")

	p.approveAndAdvance(t, id)
	d := p.get(t, id)
	require.Equal(t, tasks.Completed, d.Status, "%s", d.Result)
	var result map[string]any
	require.NoError(t, json.Unmarshal(d.Result, &result))
	require.Equal(t, "Approved; the tool ran once. Transfer of $"+shown+" to acct-991 completed (transfer 1).", text(t, result))
	require.Equal(t, 50000.25, result["structuredContent"].(map[string]any)["amount"])
}

// TestBalanceKeepsCents: the balance is subtracted as a decimal, so it reads
// whole cents: after 999,999.99 spent it is $0.01, not the float64
// difference 0.010000000055879354.
func TestBalanceKeepsCents(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p := newPEP(t, pepOptions{})
	alice := pep.Principal{SubjectType: "user", SubjectID: "alice", ActorID: "agent:demo"}
	_, err := p.db.Exec(ctx, `INSERT INTO pep.ledger (tool, principal, effect, at) VALUES ('wire_transfer', $1, '{"to":"acct-991","amount":999999.99}', now())`, alice.Key())
	require.NoError(t, err)
	res, rpc := callText(t, p.url, "get_balance", `{}`)
	require.Nil(t, rpc)
	require.Equal(t, "Balance: $0.01.", text(t, res))
	require.Equal(t, 0.01, res["structuredContent"].(map[string]any)["balance"])
}
