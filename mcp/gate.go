package mcp

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"
	"unicode"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	sdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/internal/clean"
	"github.com/omcp/arap/internal/schemamsg"
	"github.com/omcp/arap/internal/seal"
	"github.com/omcp/arap/mcp/tasks"
)

// JobInserter enqueues River jobs.
type JobInserter interface {
	Insert(ctx context.Context, args river.JobArgs, opts *river.InsertOpts) (*rivertype.JobInsertResult, error)
	InsertTx(ctx context.Context, tx pgx.Tx, args river.JobArgs, opts *river.InsertOpts) (*rivertype.JobInsertResult, error)
}

// Config configures a Gate.
type Config struct {
	DB      *pgxpool.Pool
	Backend *authzen.Client
	// MasterKey (32 bytes) seals tool arguments and submission bodies.
	MasterKey []byte
	// CallbackURL is where the backend is asked to call back (this server's
	// callback endpoint); empty means poll only.
	CallbackURL string
	Jobs        JobInserter
	Tools       []Tool
	// PollInterval is suggested to clients (pollIntervalMs); default 2s.
	PollInterval time.Duration
	// ResultRetention keeps a terminal task readable this long; default 24h.
	ResultRetention time.Duration
	// ExecTimeout bounds a tool run; a claimed task whose run has not been
	// recorded by then ends outcome-unknown. Default 30s.
	ExecTimeout time.Duration
	// MaxChained bounds the requests opened for one task; default 3.
	MaxChained int
	// MaxWindow bounds how long a task may wait for a decision, whatever
	// deadline the backend sets (SEP-2848: pending tasks must not
	// accumulate without limit); past it the task ends denied and the
	// request is cancelled. Default 7 days.
	MaxWindow time.Duration
	// MaxPending bounds a principal's live approval tasks; default 20.
	MaxPending int
	// SubmitsPerMinute bounds a principal's new approval requests; default 30.
	SubmitsPerMinute int
	// StateTTL bounds an MRTR requestState's life; default 10 minutes.
	StateTTL time.Duration
	Now      func() time.Time
	Log      *slog.Logger
}

// Gate is the enforcement point: it decides every tools/call through the PDP
// and runs approval tasks.
type Gate struct {
	cfg     Config
	box     *seal.Box
	tasks   *tasks.Store
	callers *Callers
	tools   map[string]Tool
	schemas map[string]*jsonschema.Schema
	advance chan struct{} // bounds concurrent Advance runs started by callbacks
}

// KindApproval is the task kind of approval tasks.
const KindApproval = "tool-approval"

// NewGate checks cfg and builds a Gate.
func NewGate(cfg Config) (*Gate, error) {
	if cfg.DB == nil || cfg.Backend == nil || cfg.Jobs == nil {
		return nil, errors.New("mcp: DB, Backend and Jobs are required")
	}
	box, err := seal.New(cfg.MasterKey)
	if err != nil {
		return nil, fmt.Errorf("mcp: %w", err)
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&cfg.PollInterval, 2*time.Second)
	def(&cfg.ResultRetention, 24*time.Hour)
	def(&cfg.ExecTimeout, 30*time.Second)
	def(&cfg.StateTTL, 10*time.Minute)
	def(&cfg.MaxWindow, 7*24*time.Hour)
	if brokenBuild && broken(violateNoRetention) { // keeps a result a minute
		cfg.ResultRetention = time.Minute
	}
	if cfg.MaxChained == 0 {
		cfg.MaxChained = 3
	}
	if cfg.MaxPending == 0 {
		cfg.MaxPending = 20
	}
	if cfg.SubmitsPerMinute == 0 {
		cfg.SubmitsPerMinute = 30
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	g := &Gate{cfg: cfg, box: box, tasks: &tasks.Store{DB: cfg.DB, Now: cfg.Now}, callers: &Callers{DB: cfg.DB}, advance: make(chan struct{}, 16)}
	if g.tools, g.schemas, err = compileTools(cfg.Tools); err != nil {
		return nil, err
	}
	return g, nil
}

// compileTools indexes tools by name with their compiled input schemas.
func compileTools(list []Tool) (map[string]Tool, map[string]*jsonschema.Schema, error) {
	tools, schemas := map[string]Tool{}, map[string]*jsonschema.Schema{}
	for _, t := range list {
		c := jsonschema.NewCompiler()
		url := "urn:arap:tool:" + t.Name
		if err := c.AddResource(url, toJSONValue(t.InputSchema)); err != nil {
			return nil, nil, fmt.Errorf("mcp: tool %s schema: %w", t.Name, err)
		}
		sch, err := c.Compile(url)
		if err != nil {
			return nil, nil, fmt.Errorf("mcp: tool %s schema: %w", t.Name, err)
		}
		tools[t.Name], schemas[t.Name] = t, sch
	}
	return tools, schemas, nil
}

func toJSONValue(v any) any {
	b, _ := json.Marshal(v)
	var out any
	_ = json.Unmarshal(b, &out)
	return out
}

func (g *Gate) now() time.Time { return g.cfg.Now().UTC().Truncate(time.Microsecond) }

// Tasks is the gate's task store.
func (g *Gate) Tasks() *tasks.Store { return g.tasks }

// Callers is the gate's caller store.
func (g *Gate) Callers() *Callers { return g.callers }

// binding is the immutable call binding of an approval task.
type binding struct {
	Tool      string         `json:"tool"`
	Args      map[string]any `json:"args"`
	Principal Principal      `json:"principal"`
}

// digest is the JCS SHA-256 of tool and arguments (hex).
func digest(tool string, args map[string]any) (string, error) {
	c, err := authzen.Canonical(map[string]any{"tool": tool, "arguments": args})
	if err != nil {
		return "", err
	}
	s := sha256.Sum256(c)
	return hex.EncodeToString(s[:]), nil
}

// dedupKey identifies (principal, tool, arguments): a repeated call with all
// three equal returns the live task instead of opening a second approval.
func dedupKey(p Principal, tool, argsDigest string) string {
	if brokenBuild && broken(violateDedupOff) {
		return newKey()
	}
	if brokenBuild && broken(violateDedupAcrossPrincipals) {
		p = Principal{}
	}
	s := sha256.Sum256([]byte(p.Key() + "\x00" + tool + "\x00" + argsDigest))
	return hex.EncodeToString(s[:])
}

// evaluation is the AuthZEN request for a call (COAZ-style mapping):
// subject = the principal with its actor, action tools/call, resource the
// tool with its arguments.
func evaluation(p Principal, tool string, args map[string]any) authzen.EvaluationRequest {
	return authzen.EvaluationRequest{
		Subject:  p.Subject(),
		Action:   authzen.Object{"name": "tools/call"},
		Resource: authzen.Object{"type": "mcp_tool", "id": tool, "properties": map[string]any{"arguments": args}},
	}
}

// rpcError is a JSON-RPC error result.
func rpcError(code int64, msg string) *jsonrpc.Error { return &jsonrpc.Error{Code: code, Message: msg} }

// Call handles tools/call for principal p. It returns a CallToolResult, a
// CreateTaskResult, an input_required result, or a JSON-RPC error.
func (g *Gate) Call(ctx context.Context, p Principal, req *sdk.CallToolRequest) (sdk.Result, error) {
	tool, ok := g.tools[req.Params.Name]
	if !ok {
		return nil, rpcError(tasks.CodeInvalidParams, fmt.Sprintf("unknown tool %q", req.Params.Name))
	}
	args, err := g.arguments(req)
	if err != nil {
		return nil, err
	}
	hasTasks := tasks.HasExtension(req.Params.GetMeta())
	if brokenBuild && broken(violatePlainClientsGetTasks) {
		hasTasks = true
	}
	if brokenBuild && broken(violateNeedsToolApproval) {
		caps, _ := req.Params.GetMeta()[tasks.MetaClientCapabilities].(map[string]any)
		ext, _ := caps["extensions"].(map[string]any)
		_, hasTasks = ext[ExtensionToolApproval]
	}

	var answers *inputAnswers
	if req.Params.RequestState != "" {
		// An MRTR retry: it must match the binding the first call captured.
		if answers, err = g.resume(ctx, p, tool.Name, args, req); err != nil {
			return nil, err
		}
	}

	var decision authzen.Decision
	err = retryTransient(ctx, func() (err error) {
		decision, err = g.cfg.Backend.Evaluate(ctx, evaluation(p, tool.Name, args))
		return err
	})
	if err != nil {
		g.cfg.Log.Error("evaluation failed", "tool", tool.Name, "error", err)
		return nil, rpcError(tasks.CodeInternalError, "the authorization service is unavailable; try again later")
	}
	if decision.Decision {
		return g.runDirect(ctx, p, tool, args)
	}
	hint, requestable := decision.AccessRequest()
	if !requestable {
		if brokenBuild && broken(violatePlainDenialAsError) {
			return nil, rpcError(tasks.CodeInvalidParams, "not allowed")
		}
		return denied("This call is not allowed by policy; the tool did not run.", RemediationUnavailable), nil
	}
	if !hasTasks {
		if tool.TaskRequired {
			return nil, tasks.MissingCapability()
		}
		return degraded(hint), nil
	}
	if brokenBuild && broken(violateExecuteOnRequestableDenial) {
		_, _ = g.runDirect(ctx, p, tool, args)
	}
	// Deduplication comes before the limits: a repeat of a call whose task
	// is live asks for nothing new, so it gets that task even at the cap.
	d, err := digest(tool.Name, args)
	if err != nil {
		return nil, err
	}
	dedup := dedupKey(p, tool.Name, d)
	if t, err := g.existing(ctx, dedup); t != nil || err != nil {
		return created(t), err
	}
	// A first look at the limits, so a caller at the cap is not asked for
	// input it could not use; the binding check is taken again in open,
	// atomically with the insert.
	if msg, err := g.limited(ctx, g.cfg.DB, p); err != nil || msg != "" {
		if err != nil {
			g.cfg.Log.Error("limit check failed", "error", err)
			msg = msgBusy
		}
		return denied(msg, RemediationUnavailable), nil
	}

	// Input the backend needs before it will accept the request is collected
	// first, synchronously (MRTR), so the task is submitted complete.
	extra, ask, err := g.collectInput(ctx, p, tool.Name, args, hint, answers)
	if err != nil {
		return nil, err
	}
	if ask != nil {
		return ask, nil
	}
	t, err := g.open(ctx, p, tool.Name, args, decision, hint, extra)
	var le *limitError
	if errors.As(err, &le) {
		return denied(le.msg, RemediationUnavailable), nil
	}
	if err != nil {
		return nil, err
	}
	if brokenBuild && broken(violateArtifactLeak) {
		res := created(t).(*tasks.CreateResult)
		res.Meta["binding_token"] = hint.BindingToken
		return res, nil
	}
	return created(t), nil
}

// created is the CreateTaskResult for an approval task.
func created(t *tasks.Task) sdk.Result {
	if t == nil {
		return nil
	}
	immediate := "This action is waiting for an out-of-band approval and has not run. Continue with other work and check the task later."
	if brokenBuild && broken(violatePendingShownDone) {
		immediate = "Transfer completed."
	}
	return tasks.NewCreateResult(t, map[string]any{MetaImmediate: immediate})
}

// arguments decodes and validates the call's arguments against the tool's
// input schema.
func (g *Gate) arguments(req *sdk.CallToolRequest) (map[string]any, error) {
	var args map[string]any
	raw, err := json.Marshal(req.Params.Arguments)
	if err != nil {
		return nil, rpcError(tasks.CodeInvalidParams, "arguments must be a JSON object")
	}
	if len(raw) == 0 || string(raw) == "null" {
		raw = []byte("{}")
	}
	if err := json.Unmarshal(raw, &args); err != nil {
		return nil, rpcError(tasks.CodeInvalidParams, "arguments must be a JSON object")
	}
	if err := clean.JSON(raw); err != nil {
		// Neither the PDP nor a tool's storage could take them.
		return nil, rpcError(tasks.CodeInvalidParams, "arguments must be valid UTF-8 without NUL characters")
	}
	if err := g.schemas[req.Params.Name].Validate(toJSONValue(args)); err != nil {
		return nil, rpcError(tasks.CodeInvalidParams, "invalid arguments for "+req.Params.Name+": "+schemamsg.Join(schemamsg.Messages(err)))
	}
	return args, nil
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

// runDirect runs an allowed call at once: no task, no approval.
func (g *Gate) runDirect(ctx context.Context, p Principal, tool Tool, args map[string]any) (sdk.Result, error) {
	out, err := tool.Run(ctx, Invocation{DB: g.cfg.DB, Principal: p, Args: args})
	if err != nil {
		// Not the error's text: a tool's message may quote its arguments.
		g.cfg.Log.Warn("tool failed", "tool", tool.Name)
		return &sdk.CallToolResult{IsError: true, Content: []sdk.Content{&sdk.TextContent{Text: "The tool failed: " + sanitize(err.Error(), 200)}}}, nil
	}
	res := &sdk.CallToolResult{Content: []sdk.Content{&sdk.TextContent{Text: out.Text}}}
	if out.Structured != nil {
		res.StructuredContent = out.Structured
	}
	return res, nil
}

// denied is a plain denial: the tool did not run, with the SEP-2643 envelope.
func denied(text, remediation string) *sdk.CallToolResult {
	return &sdk.CallToolResult{
		IsError: true,
		Content: []sdk.Content{&sdk.TextContent{Text: text}},
		Meta:    sdk.Meta{MetaAuthorization: envelope(remediation, false)},
	}
}

// degraded answers a requestable denial for a client without the tasks
// extension: an error with next steps, and no submission (it could not be
// resumed anyway).
func degraded(hint *authzen.AccessRequestHint) *sdk.CallToolResult {
	why := describe(hint)
	text := "This call needs an approval (" + why + ") and did not run. " +
		"Your client did not declare the tasks extension (io.modelcontextprotocol/tasks), so it cannot wait for an out-of-band decision here. " +
		"Retry from a client that supports tasks, or ask a person to request the access."
	return denied(text, RemediationUndisclosed)
}

// describe is model-safe text about what the approval is for, taken from the
// backend's display hints and sanitized.
func describe(hint *authzen.AccessRequestHint) string {
	if hint == nil {
		return "approval required"
	}
	for _, k := range []string{"description", "title"} {
		if s, ok := hint.Display[k].(string); ok && s != "" {
			return sanitize(s, 160)
		}
	}
	return "approval required"
}

// sanitize keeps text safe to show a model: letters, digits, spaces and
// plain punctuation only, no markup or control characters, bounded length.
func sanitize(s string, max int) string {
	var b strings.Builder
	for _, r := range s {
		switch {
		case unicode.IsLetter(r) || unicode.IsDigit(r) || r == ' ':
			b.WriteRune(r)
		case strings.ContainsRune(".,:;$%()'-/?!_", r): // _: field names such as business_justification
			b.WriteRune(r)
		case unicode.IsSpace(r):
			b.WriteRune(' ')
		}
	}
	out := strings.Join(strings.Fields(b.String()), " ")
	if len(out) > max {
		out = strings.TrimSpace(out[:max]) + "..."
	}
	return out
}

// Limit denials: non-requestable, so the agent does not loop.
const (
	msgBusy        = "The approval service is busy; the tool did not run. Try again later."
	msgRate        = "Too many approval requests in the last minute; the tool did not run and no request was made. Wait before asking again."
	msgOutstanding = "Too many approval requests are already waiting for a decision; the tool did not run and no request was made. Wait for them or cancel some."
)

// limitError is a call refused by the per-caller limits.
type limitError struct{ msg string }

func (e *limitError) Error() string { return e.msg }

// limited says why p may not open another approval request now, or "".
// Approval fatigue is a known bypass, so requests per caller are bounded in
// rate and in number outstanding. Only a count taken under p's limit lock
// (lockLimits, in open) binds: two counts read outside it may both see room
// for one more.
func (g *Gate) limited(ctx context.Context, q tasks.Querier, p Principal) (string, error) {
	var recent, pending int
	// Two counts, each served by its own index (migrations/pep/0002).
	err := q.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM pep.approval_tasks WHERE principal = $1 AND created_at > $2),
		(SELECT count(*) FROM pep.approval_tasks WHERE principal = $1 AND phase <> 'done')`, p.Key(), g.now().Add(-time.Minute)).Scan(&recent, &pending)
	switch {
	case err != nil:
		return "", err
	case brokenBuild && broken(violateLimitsOff):
		return "", nil
	case recent >= g.cfg.SubmitsPerMinute:
		return msgRate, nil
	case pending >= g.cfg.MaxPending:
		return msgOutstanding, nil
	}
	return "", nil
}

// newKey is a fresh, high-entropy idempotency key for one submission.
func newKey() string {
	b := make([]byte, 24)
	_, _ = rand.Read(b)
	return "pep_" + base64.RawURLEncoding.EncodeToString(b)
}
