// Package backendtest starts a real backend (HTTP on loopback, River workers,
// a fresh database) for tests of the HTTP surface and of its clients.
package backendtest

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/omcp/arap/arap"
	"github.com/omcp/arap/backend"
	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/internal/dev"
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
	Limits arap.Limits
	// RequestRetention overrides how long ended requests stay readable.
	RequestRetention time.Duration
	// CallbackSchedule overrides the callback retry schedule.
	CallbackSchedule []time.Duration
}

// Start runs a backend for the test, seeded with the dev clients and tokens,
// and stops it when the test ends.
func Start(t testing.TB, o Options) *Env {
	t.Helper()
	ctx := context.Background()
	dbURL := dbtest.URL(t)
	policy := o.Policy
	if policy == nil {
		policy = dev.SeedPolicy()
	}
	file := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(file, policy, 0o600); err != nil {
		t.Fatal(err)
	}
	b, err := backend.New(ctx, backend.Config{
		Addr: "127.0.0.1:0", DatabaseURL: dbURL, PolicyFile: file, MasterKey: make([]byte, 32), Limits: o.Limits,
		RequestRetention: o.RequestRetention, CallbackSchedule: o.CallbackSchedule,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := dev.Seed(ctx, b.Clients(), b.Directory(), b.Callbacks()); err != nil {
		t.Fatal(err)
	}
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = b.Stop(ctx)
	})
	return &Env{URL: b.URL(), Backend: b, Pool: b.Pool(), PolicyFile: file, DBURL: dbURL}
}
