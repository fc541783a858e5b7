package pep

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"

	"github.com/jackc/pgx/v5/pgxpool"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// Tool is a tool this server offers, as its source (ToolSource) defines
// it. Its side effects are the Run function's; the gate decides whether and
// when Run is called, and calls it at most once per task.
type Tool struct {
	// Name is the name clients call it by (exposed; unique across sources).
	Name        string
	Title       string
	Description string
	InputSchema map[string]any
	// OutputSchema and Annotations are shown in tools/list as the source
	// gives them; the annotations' hints also go to the PDP.
	OutputSchema map[string]any
	Annotations  *sdk.ToolAnnotations
	// Upstream names the source ("demo" for the demo tools) and
	// UpstreamTool the tool's name there (default: Name); the PDP sees
	// both.
	Upstream     string
	UpstreamTool string
	// Digest identifies the definition (ToolDigest; computed when empty).
	// An approval is bound to it: a tool whose digest changed while its
	// call waited for approval does not run.
	Digest string
	// TaskRequired makes a call that can only proceed through approval fail
	// with -32021 for a client without the tasks extension, instead of the
	// degraded isError result.
	TaskRequired bool
	// Run runs the tool. An error that is an *UpstreamError says whether
	// the tool may have run; any other error means it ran and failed.
	Run func(ctx context.Context, x Invocation) (Output, error)
}

// Invocation is one execution of a tool.
type Invocation struct {
	DB        *pgxpool.Pool
	TaskID    string // "" when the call ran directly, without a task
	Principal Principal
	Args      map[string]any
	// The rest is set for a call that runs directly only: an approved
	// task's run has no caller's stream to report to (the tasks extension
	// supports neither progress nor logging for tasks) and no caller to ask.

	// Progress and Log put an upstream's progress notifications and log
	// messages about this run on the caller's stream.
	Progress func(*sdk.ProgressNotificationParams)
	Log      func(*sdk.LoggingMessageParams)
	// Meta is the caller's _meta (an upstream gets its declared
	// capabilities and log level from it).
	Meta sdk.Meta
	// RequestState and InputResponses continue an MRTR round the upstream
	// started (Output.Input): its own requestState and the caller's answers.
	RequestState   string
	InputResponses sdk.InputResponseMap
}

// Output is what a tool returns: text for the model, optional further
// content (an upstream's result, as it came) and structured content.
// IsError says the tool ran and reported an error (an upstream's
// isError result): it is returned as a tool error.
type Output struct {
	Text       string
	Content    []sdk.Content
	Structured any
	IsError    bool
	// Input, when set, is an upstream's MRTR input_required answer: the
	// tool has not finished and asks its caller for input (the rest of
	// Output is empty).
	Input *UpstreamInput
	// Rejected, when set, is the JSON-RPC error an upstream answered the
	// call with (Text says so too): an allowed call answers its caller
	// with exactly that error; a task's run records the tool error.
	Rejected *jsonrpc.Error
}

// UpstreamInput is what an upstream asks its caller before its tool can go
// on (SEP-2322): its input requests, and its requestState, which it wants
// back with the answers.
type UpstreamInput struct {
	Requests sdk.InputRequestMap
	State    string
}

// result is out as a CallToolResult, its text after lead (a sentence of
// the gate's own, or ""): the text first, then the further content.
func (out Output) result(lead string) *sdk.CallToolResult {
	text := out.Text
	if lead != "" {
		text = strings.TrimSpace(lead + " " + text)
	}
	content := []sdk.Content{}
	if text != "" || len(out.Content) == 0 {
		content = append(content, &sdk.TextContent{Text: text})
	}
	res := &sdk.CallToolResult{Content: append(content, out.Content...), IsError: out.IsError}
	if out.Structured != nil {
		res.StructuredContent = out.Structured
	}
	return res
}

// record writes the side effect to the ledger: the demo tools' stand-in for
// moving money or deleting a repository, which tests count.
func (x Invocation) record(ctx context.Context, tool string, effect map[string]any) (int64, error) {
	var id int64
	err := x.DB.QueryRow(ctx, `INSERT INTO pep.ledger (task_id, tool, principal, effect, at) VALUES (nullif($1, ''), $2, $3, $4, $5) RETURNING id`,
		x.TaskID, tool, x.Principal.Key(), effect, time.Now()).Scan(&id)
	if err != nil {
		return 0, fmt.Errorf("%s: record: %w", tool, err)
	}
	return id, nil
}

func str(m map[string]any, k string) string { s, _ := m[k].(string); return s }

func object(props map[string]any, required ...string) map[string]any {
	o := map[string]any{"type": "object", "properties": props, "additionalProperties": false}
	if len(required) > 0 {
		o["required"] = required
	}
	return o
}

// DemoTools are the tools of dev mode (DESIGN.md): get_balance (always
// allowed), wire_transfer, delete_repository, deploy_service and
// read_customer_record, each gated by the policy. They are the built-in
// upstream "demo" (DemoSource).
func DemoTools() []Tool {
	tools := demoTools()
	for i := range tools {
		tools[i].Upstream, tools[i].UpstreamTool = DemoUpstream, tools[i].Name
		tools[i].Digest, _ = ToolDigest(tools[i]) // plain JSON values: it cannot fail
	}
	return tools
}

// DemoSource is the demo tools as a source.
func DemoSource() ToolSource { return StaticTools(DemoTools()) }

func demoTools() []Tool {
	return []Tool{
		{
			Name:        "get_balance",
			Description: "Return the account balance.",
			InputSchema: object(map[string]any{}),
			Run: func(ctx context.Context, x Invocation) (Output, error) {
				// Subtracted in numeric, so that cents stay cents: the
				// balance is the decimal it reads.
				var bal float64
				err := x.DB.QueryRow(ctx, `SELECT 1000000 - coalesce(sum((effect->>'amount')::numeric), 0) FROM pep.ledger WHERE tool = 'wire_transfer' AND principal = $1`,
					x.Principal.Key()).Scan(&bal)
				if err != nil {
					return Output{}, err
				}
				return Output{Text: fmt.Sprintf("Balance: $%s.", money(bal)), Structured: map[string]any{"balance": bal, "currency": "USD"}}, nil
			},
		},
		{
			Name:        "wire_transfer",
			Description: "Transfer money to an account. Transfers over $25,000 need treasury approval; accounts named closed-... are refused by the bank.",
			InputSchema: object(map[string]any{
				"to":     map[string]any{"type": "string", "minLength": 1, "maxLength": 64, "description": "Beneficiary account"},
				"amount": amountSchema(),
			}, "to", "amount"),
			Run: func(ctx context.Context, x Invocation) (Output, error) {
				amount, _ := x.Args["amount"].(float64)
				if to := str(x.Args, "to"); strings.HasPrefix(to, "closed-") {
					// A failing run after approval (execution-error) needs a
					// tool that can fail: the bank refuses closed accounts.
					return Output{}, fmt.Errorf("the beneficiary account %s is closed; nothing was transferred", to)
				}
				id, err := x.record(ctx, "wire_transfer", map[string]any{"to": str(x.Args, "to"), "amount": amount})
				if err != nil {
					return Output{}, err
				}
				return Output{Text: fmt.Sprintf("Transfer of $%s to %s completed (transfer %d).", money(amount), str(x.Args, "to"), id),
					Structured: map[string]any{"transfer_id": id, "to": str(x.Args, "to"), "amount": amount}}, nil
			},
		},
		{
			Name:         "delete_repository",
			Description:  "Delete a source repository. Needs two platform approvals.",
			InputSchema:  object(map[string]any{"repo": map[string]any{"type": "string", "minLength": 1, "maxLength": 100}}, "repo"),
			TaskRequired: true,
			Run: func(ctx context.Context, x Invocation) (Output, error) {
				if _, err := x.record(ctx, "delete_repository", map[string]any{"repo": str(x.Args, "repo")}); err != nil {
					return Output{}, err
				}
				return Output{Text: fmt.Sprintf("Repository %s deleted.", str(x.Args, "repo"))}, nil
			},
		},
		{
			Name:        "deploy_service",
			Description: "Deploy a service version. Approved automatically inside the change window.",
			InputSchema: object(map[string]any{
				"service": map[string]any{"type": "string", "minLength": 1, "maxLength": 64},
				"version": map[string]any{"type": "string", "minLength": 1, "maxLength": 32},
			}, "service", "version"),
			Run: func(ctx context.Context, x Invocation) (Output, error) {
				if _, err := x.record(ctx, "deploy_service", map[string]any{"service": str(x.Args, "service"), "version": str(x.Args, "version")}); err != nil {
					return Output{}, err
				}
				return Output{Text: fmt.Sprintf("Deployed %s version %s.", str(x.Args, "service"), str(x.Args, "version"))}, nil
			},
		},
		{
			Name:        "read_customer_record",
			Description: "Read a customer record. Needs a business justification and an approval.",
			InputSchema: object(map[string]any{"customer_id": map[string]any{"type": "string", "minLength": 1, "maxLength": 64}}, "customer_id"),
			Run: func(ctx context.Context, x Invocation) (Output, error) {
				id := str(x.Args, "customer_id")
				if _, err := x.record(ctx, "read_customer_record", map[string]any{"customer_id": id}); err != nil {
					return Output{}, err
				}
				rec := map[string]any{"customer_id": id, "name": "Customer " + strings.ToUpper(id), "tier": "gold", "since": "2019-04-01"}
				return Output{Text: fmt.Sprintf("Customer %s: tier gold, customer since 2019-04-01.", id), Structured: rec}, nil
			},
		},
	}
}

// maxAmount is the largest amount wire_transfer takes (its schema's
// maximum); the dev policy refuses far less (over 1,000,000), but that is
// policy, this is what a number may be.
const maxAmount = 1_000_000_000

// amountSchema is wire_transfer's amount: whole cents from 0.01 to
// maxAmount. Anything else is refused with -32602 before the policy sees
// it: a subnormal such as 1e-320 (a positive amount to the policy that read
// "$0"), fractions of a cent (0.001, 100.015, which the result once
// rounded), numbers past float64's exact digits (12345678901234567890,
// which the call carries as 12345678901234567000). Within these bounds the
// number has at most 12 significant digits, so the approver's page (the
// shortest decimal of the value, internal/summary.Number), the binding
// hash (its RFC 8785 text) and the result (money) read the same digits.
// The schema judges the value, not its spelling: 1e2 is 100 everywhere.
func amountSchema() map[string]any {
	return map[string]any{"type": "number", "minimum": 0.01, "maximum": maxAmount, "multipleOf": 0.01,
		"description": "Amount in USD: whole cents, from 0.01 to 1000000000 (at most two decimals)"}
}

// money writes v exactly, never rounded (the shortest decimal that is v,
// as the binding hash and the approver see it), with thousands separators:
// 50000 is 50,000 and 50000.25 is 50,000.25; cents are written with two
// digits (50,000.20).
func money(v float64) string {
	s := strconv.FormatFloat(v, 'f', -1, 64)
	sign := ""
	if strings.HasPrefix(s, "-") {
		sign, s = "-", s[1:]
	}
	whole, frac, fractional := strings.Cut(s, ".")
	var b strings.Builder
	b.WriteString(sign)
	for i, c := range whole {
		if i > 0 && (len(whole)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if fractional {
		if len(frac) == 1 {
			frac += "0"
		}
		b.WriteString("." + frac)
	}
	return b.String()
}
