// Package backendtest starts a real backend (HTTP on loopback, River workers,
// a fresh database) for tests of the HTTP surface and of its clients.
package backendtest

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/trace"

	"github.com/omcp/arap/arap"
	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/backend"
	"github.com/omcp/arap/internal/contract"
	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/internal/dev"
	"github.com/omcp/arap/notify"
	"github.com/omcp/arap/slackapp"
	"github.com/omcp/arap/sso"
)

// Env is a running backend.
type Env struct {
	URL        string
	Backend    *backend.Backend
	Pool       *pgxpool.Pool
	PolicyFile string
	DBURL      string
}

// Options tune Start.
type Options struct {
	// Policy is the policy document; the dev seed policy when empty.
	Policy []byte
	// PolicyFile, when set, is used in place of Policy, so that files it
	// names relative to itself (a subject_attributes file) are found.
	PolicyFile string
	Limits     arap.Limits
	// RequestRetention overrides how long ended requests stay readable.
	RequestRetention time.Duration
	// CallbackSchedule overrides the callback retry schedule.
	CallbackSchedule []time.Duration
	// RateLimitClock is the rate limits' clock; by default a fixed time, so
	// that a test's requests all fall in one window.
	RateLimitClock func() time.Time
	// Join, when set, starts another replica on Join's database (already
	// seeded) instead of a fresh one.
	Join *Env
	// DatabaseURL, when set, is a migrated database of the test's own
	// (dbtest.Private, which the test may stop), seeded here.
	DatabaseURL string
	// ListenURL is backend.Config.ListenURL: a direct connection for
	// LISTEN and migrations, DatabaseURL going through a pooler.
	ListenURL string
	// Now is the web UI's clock (time.Now when nil).
	Now func() time.Time
	// Mail turns on e-mail notifications.
	Mail *notify.EmailConfig
	// Slack turns on the Slack app.
	Slack *slackapp.Config
	// OIDC turns on sign-in through an OpenID provider.
	OIDC *sso.Config
	// NoLocalPasswords turns password sign-in off.
	NoLocalPasswords bool
	// TrustedProxies are the peers whose X-Forwarded-For is believed.
	TrustedProxies []netip.Prefix
	// TracerProvider records the backend's spans (the global provider
	// when nil).
	TracerProvider trace.TracerProvider
	// MetricsAddr serves /metrics on a listener of its own.
	MetricsAddr string
	// Log is the backend's logger (discarded when nil).
	Log *slog.Logger
}

// fixedClock is ten seconds into a minute in 2030.
func fixedClock() time.Time { return time.Date(2030, 1, 1, 0, 0, 10, 0, time.UTC) }

// Start runs a backend for the test, seeded with the dev clients and tokens,
// and stops it when the test ends.
func Start(t testing.TB, o Options) *Env {
	t.Helper()
	ctx := context.Background()
	var dbURL string
	switch {
	case o.Join != nil:
		dbURL = o.Join.DBURL
	case o.DatabaseURL != "":
		dbURL = o.DatabaseURL
	default:
		dbURL = dbtest.URL(t)
	}
	policy := o.Policy
	if policy == nil {
		policy = dev.SeedPolicy()
	}
	file := o.PolicyFile
	if file == "" {
		file = filepath.Join(t.TempDir(), "policy.yaml")
		if err := os.WriteFile(file, policy, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	clock := o.RateLimitClock
	if clock == nil {
		clock = fixedClock
	}
	// Clients reach the backend through a proxy that checks every response
	// against openapi/arap.yaml; the proxy's URL is the public URL.
	front := httptest.NewUnstartedServer(nil)
	b, err := backend.New(ctx, backend.Config{
		Addr: "127.0.0.1:0", PublicURL: "http://" + front.Listener.Addr().String(), DatabaseURL: dbURL, ListenURL: o.ListenURL, PolicyFile: file, MasterKey: make([]byte, 32), Limits: o.Limits,
		RequestRetention: o.RequestRetention, CallbackSchedule: o.CallbackSchedule, RateLimitClock: clock, Now: o.Now, Mail: o.Mail, Slack: o.Slack,
		OIDC: o.OIDC, NoLocalPasswords: o.NoLocalPasswords, TrustedProxies: o.TrustedProxies, TracerProvider: o.TracerProvider, MetricsAddr: o.MetricsAddr,
		Log: o.Log,
	})
	if err != nil {
		t.Fatal(err)
	}
	if o.Join == nil {
		if err := dev.Seed(ctx, b.Clients(), b.Directory(), b.Callbacks()); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	contract.Proxy(t, "http://"+b.Addr(), front)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = b.Stop(ctx)
	})
	return &Env{URL: b.URL(), Backend: b, Pool: b.Pool(), PolicyFile: file, DBURL: dbURL}
}

// Submit evaluates call as the dev PEP and submits the access request its
// requestable denial offers (with call's client member, if any, which
// only a submission has), returning the request id.
func (e *Env) Submit(t testing.TB, call map[string]any) string {
	t.Helper()
	post := func(path string, body any) map[string]any {
		b, err := json.Marshal(body)
		if err != nil {
			t.Fatal(err)
		}
		req, _ := http.NewRequest("POST", e.URL+path, bytes.NewReader(b))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+dev.PEPToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out map[string]any
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode >= 300 {
			t.Fatalf("POST %s: %d %v %v", path, resp.StatusCode, out, err)
		}
		return out
	}
	// client is a submission's member, not an evaluation's.
	eval := map[string]any{}
	for k, v := range call {
		if k != "client" {
			eval[k] = v
		}
	}
	d := post(authzen.PathEvaluation, eval)
	ctx, _ := d["context"].(map[string]any)
	hint, _ := ctx["access_request"].(map[string]any)
	if hint == nil {
		t.Fatalf("evaluation offered no access request: %v", d)
	}
	body := map[string]any{"denial": map[string]any{
		"evaluation_id": ctx["evaluation_id"], "expires_at": hint["expires_at"], "binding_token": hint["binding_token"],
		"reason": ctx["reason"], "template": hint["template"],
	}}
	for k, v := range call {
		body[k] = v
	}
	task, _ := post(authzen.PathRequests, body)["task"].(map[string]any)
	id, _ := task["id"].(string)
	if id == "" {
		t.Fatal("submission returned no task id")
	}
	return id
}
