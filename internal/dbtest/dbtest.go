// Package dbtest gives each test a fresh, fully migrated database.
//
// One PostgreSQL cluster serves a whole test binary (started on first use by
// pgembed); a migrated template database is cloned per test, which takes a few
// milliseconds. TEST_DATABASE_URL points the tests at an existing server
// instead (the role needs CREATEDB).
//
// Packages that use it call Main from TestMain so the cluster is stopped when
// the binary finishes:
//
//	func TestMain(m *testing.M) { dbtest.Main(m) }
package dbtest

import (
	"context"
	"fmt"
	"net/url"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/omcp/arap/internal/pgembed"
	"github.com/omcp/arap/migrations"
)

var (
	mu       sync.Mutex
	cluster  *pgembed.Cluster
	adminURL string // a URL to the maintenance database
	template string
	setupErr error
	counter  atomic.Int64
)

// Main runs the tests and then stops the cluster.
func Main(m *testing.M) {
	code := m.Run()
	Stop()
	os.Exit(code)
}

// Stop stops the cluster (and drops the template database on a server of
// TEST_DATABASE_URL). Main calls it; a TestMain that must stop something
// using the database first (a backend its examples share) calls m.Run, then
// that, then Stop.
func Stop() {
	mu.Lock()
	if template != "" && cluster == nil && adminURL != "" {
		dropDatabase(context.Background(), template)
	}
	if cluster != nil {
		_ = cluster.Stop(context.Background())
	}
	mu.Unlock()
}

func setup(ctx context.Context) error {
	if adminURL != "" || setupErr != nil {
		return setupErr
	}
	if u := os.Getenv("TEST_DATABASE_URL"); u != "" {
		adminURL = u
	} else {
		c, err := pgembed.Start(ctx, pgembed.Options{Ephemeral: true})
		if err != nil {
			setupErr = err
			return err
		}
		cluster = c
		adminURL = c.ConnString("postgres")
	}
	template = fmt.Sprintf("arap_tmpl_%d_%d", os.Getpid(), time.Now().UnixNano()%1e6)
	if err := exec(ctx, "CREATE DATABASE "+template); err != nil {
		setupErr = err
		return err
	}
	pool, err := pgxpool.New(ctx, urlFor(template))
	if err != nil {
		setupErr = err
		return err
	}
	defer pool.Close()
	if err := migrations.Up(ctx, pool, nil); err != nil {
		setupErr = err
		return err
	}
	return nil
}

// URL returns the connection URL of a fresh, migrated database that is dropped
// when the test ends (when it lives on a shared server).
func URL(tb testing.TB) string {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	mu.Lock()
	err := setup(ctx)
	if err != nil {
		mu.Unlock()
		tb.Fatalf("dbtest: %v", err)
	}
	name := fmt.Sprintf("%s_t%d", template, counter.Add(1))
	// Cloning needs the template to have no other sessions, so clones are
	// serialized by mu.
	err = exec(ctx, fmt.Sprintf("CREATE DATABASE %s TEMPLATE %s", name, template))
	mu.Unlock()
	if err != nil {
		tb.Fatalf("dbtest: clone template: %v", err)
	}
	if cluster == nil {
		tb.Cleanup(func() { dropDatabase(context.Background(), name) })
	}
	return urlFor(name)
}

// New returns a pool on a fresh, migrated database, closed when the test ends.
func New(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	pool, err := pgxpool.New(context.Background(), URL(tb))
	if err != nil {
		tb.Fatalf("dbtest: connect: %v", err)
	}
	tb.Cleanup(pool.Close)
	return pool
}

func urlFor(db string) string {
	u, err := url.Parse(adminURL)
	if err != nil {
		panic(err)
	}
	u.Path = "/" + db
	return u.String()
}

func exec(ctx context.Context, sql string) error {
	conn, err := pgx.Connect(ctx, adminURL)
	if err != nil {
		return fmt.Errorf("connect %s: %w", redact(adminURL), err)
	}
	defer conn.Close(ctx)
	_, err = conn.Exec(ctx, sql)
	return err
}

func dropDatabase(ctx context.Context, name string) {
	_ = exec(ctx, "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
}

func redact(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return "(unparseable URL)"
	}
	return p.Redacted()
}

// Private is a PostgreSQL cluster of one test's own, which the test may stop
// and start again (the same data and address), with one migrated database:
// for tests of what the processes do while the database is down.
type Private struct {
	// URL connects to the migrated database (over TCP on 127.0.0.1, so it
	// stays valid across restarts).
	URL  string
	opts pgembed.Options
	c    *pgembed.Cluster
}

// NewPrivate starts a private cluster, stopped when the test ends.
func NewPrivate(tb testing.TB) *Private {
	tb.Helper()
	// Not tb.TempDir: it is closed to others, and the server may run as
	// another account (pgembed, when the tests run as root).
	dir, err := os.MkdirTemp("", "arap-private-")
	if err != nil {
		tb.Fatalf("dbtest: %v", err)
	}
	tb.Cleanup(func() { _ = os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		tb.Fatalf("dbtest: %v", err)
	}
	// Not Ephemeral: its synchronous_commit=off loses the last commits in
	// a crash (StopImmediate), which a real server does not.
	p := &Private{opts: pgembed.Options{DataDir: dir + "/data", Port: -1}}
	p.Start(tb)
	p.opts.Port = p.c.Port()
	tb.Cleanup(func() { _ = p.c.Stop(context.Background()) })
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	admin := p.c.ConnString("postgres")
	conn, err := pgx.Connect(ctx, admin)
	if err != nil {
		tb.Fatalf("dbtest: %v", err)
	}
	_, err = conn.Exec(ctx, "CREATE DATABASE arap")
	_ = conn.Close(ctx)
	if err != nil {
		tb.Fatalf("dbtest: %v", err)
	}
	p.URL = p.c.ConnString("arap")
	pool, err := pgxpool.New(ctx, p.URL)
	if err != nil {
		tb.Fatalf("dbtest: %v", err)
	}
	defer pool.Close()
	if err := migrations.Up(ctx, pool, nil); err != nil {
		tb.Fatalf("dbtest: migrate: %v", err)
	}
	return p
}

// Stop stops the server: "fast" (sessions disconnected with 57P01), or,
// with immediate, as a crash would (no checkpoint, sessions cut).
func (p *Private) Stop(tb testing.TB, immediate bool) {
	tb.Helper()
	stop := p.c.Stop
	if immediate {
		stop = p.c.StopImmediate
	}
	if err := stop(context.Background()); err != nil {
		tb.Fatalf("dbtest: stop: %v", err)
	}
}

// Start starts the server again on the same data and port; it returns once
// the server accepts connections.
func (p *Private) Start(tb testing.TB) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := pgembed.Start(ctx, p.opts)
	if err != nil {
		tb.Fatalf("dbtest: start: %v", err)
	}
	p.c = c
}
