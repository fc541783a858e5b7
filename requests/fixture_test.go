package requests_test

import (
	"context"
	"encoding/json"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/attributes"
	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/clients"
	"github.com/omcp/arap/evaluation"
	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/migrations"
	"github.com/omcp/arap/requests"
	"github.com/omcp/arap/signing"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

const (
	issuer      = "https://arap.test"
	requestsURL = "https://arap.test/access/v1/requests"
)

// clock is real time plus an offset the test can move forward, so tokens,
// the service and River agree on "now" while tests can jump past deadlines.
type clock struct {
	mu  sync.Mutex
	off time.Duration
}

func (c *clock) Now() time.Time          { c.mu.Lock(); defer c.mu.Unlock(); return time.Now().Add(c.off) }
func (c *clock) Advance(d time.Duration) { c.mu.Lock(); c.off += d; c.mu.Unlock() }

type fixture struct {
	t      testing.TB
	db     *pgxpool.Pool
	keys   *signing.Keys
	engine *evaluation.Engine
	svc    *requests.Service
	jobs   *river.Client[pgx.Tx]
	clock  *clock
	attrs  *attributes.Store
	// approvals is the PDP's approval store (hooks: requests.SetUseHooks).
	approvals *requests.ApprovalStore
	pep       requests.Caller
	other     requests.Caller
	pepID     string
}

func setup(t testing.TB) *fixture { return setupWith(t, "testdata/policy.yaml") }

func setupWith(t testing.TB, policy string) *fixture {
	t.Helper()
	ctx := context.Background()
	f := &fixture{t: t, db: dbtest.New(t), clock: &clock{}}
	var err error
	f.keys, err = signing.Open(ctx, f.db, signing.Options{MasterKey: make([]byte, 32), Now: f.clock.Now})
	require.NoError(t, err)
	f.attrs = attributes.NewStore(f.db)
	f.approvals = &requests.ApprovalStore{DB: f.db, Now: f.clock.Now}
	f.engine, err = evaluation.New(evaluation.Options{PolicyFile: policy, Keys: f.keys, Issuer: issuer,
		RequestsURL: requestsURL, Now: f.clock.Now, SchemaURL: func(s string) string { return issuer + "/s/" + s },
		Attributes: f.attrs, Approvals: f.approvals})
	require.NoError(t, err)
	f.jobs, err = river.NewClient(riverpgxv5.New(f.db), &river.Config{Schema: migrations.RiverSchema})
	require.NoError(t, err)
	f.svc, err = requests.NewService(requests.Config{DB: f.db, Jobs: f.jobs, Keys: f.keys, Policy: f.engine,
		Issuer: issuer, RequestsURL: requestsURL, Now: f.clock.Now})
	require.NoError(t, err)
	store := clients.NewStore(f.db)
	f.pep = f.caller(store, "pep", []string{"agent:*"})
	f.pepID = f.pep.ID
	f.other = f.caller(store, "other-pep", []string{"agent:*"})
	return f
}

func (f *fixture) caller(store *clients.Store, name string, actors []string) requests.Caller {
	c, _, err := store.Create(context.Background(), clients.New{Name: name, Scopes: []string{"evaluate", "request"}, Kind: "automation", Actors: actors}, "test")
	require.NoError(f.t, err)
	return requests.Caller{ID: c.ID, Name: c.Name, MayAssertActor: c.MayAssertActor}
}

func toolCall(tool string, args map[string]any) authzen.EvaluationRequest {
	return authzen.EvaluationRequest{
		Subject:  authzen.Object{"type": "user", "id": "alice", "properties": map[string]any{"act": map[string]any{"sub": "agent:demo"}}},
		Action:   authzen.Object{"name": "tools/call"},
		Resource: authzen.Object{"type": "mcp_tool", "id": tool, "properties": map[string]any{"arguments": args}},
		Context:  authzen.Object{"tenant": "acme"},
	}
}

// deny evaluates req for caller and returns the requestable denial's hint.
func (f *fixture) deny(caller requests.Caller, req authzen.EvaluationRequest) (authzen.Decision, authzen.AccessRequestHint) {
	out, err := f.engine.Evaluate(context.Background(), caller.ID, req)
	require.NoError(f.t, err)
	hint, ok := out.Decision.Context[authzen.CtxAccessRequest].(authzen.AccessRequestHint)
	require.True(f.t, ok, "expected a requestable denial, got %+v", out.Decision)
	return out.Decision, hint
}

// submission builds the ARAP body a PEP would send for a denial.
func submission(req authzen.EvaluationRequest, d authzen.Decision, hint authzen.AccessRequestHint) map[string]any {
	body := map[string]any{
		"subject":  req.Subject,
		"resource": req.Resource,
		"action":   req.Action,
		"context":  req.Context,
		"denial": map[string]any{
			"evaluation_id": d.Context[authzen.CtxEvaluationID],
			"expires_at":    hint.ExpiresAt.Format(time.RFC3339),
			"binding_token": hint.BindingToken,
			"reason":        d.Context[authzen.CtxReason],
			"template":      hint.Template,
		},
	}
	return body
}

func mustJSON(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return b
}

// fresh returns a new submission body for a new denial of tool.
func (f *fixture) fresh(tool string, args map[string]any) []byte {
	req := toolCall(tool, args)
	d, hint := f.deny(f.pep, req)
	return mustJSON(f.t, submission(req, d, hint))
}

func jsonRoundTrip(in, out any) error {
	b, err := json.Marshal(in)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, out)
}
