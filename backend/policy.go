package backend

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/omcp/arap/evaluation"
	"github.com/omcp/arap/internal/announce"
	"github.com/omcp/arap/internal/pglisten"
)

// Reloading the policy: on SIGHUP, on an administrator's request (POST
// /v1/admin/policy/reload, `arapctl policy reload`) and when another
// replica announces one. A new policy is loaded and checked whole before it
// replaces the running one; one with errors is refused, the running one
// stays, and the log and arap_policy_reloads_total{result="rejected"} say
// so. A reload an administrator asked for that succeeds is announced on
// PolicyChannel, so every replica reloads its own file.

// PolicyChannel is the channel a reload is announced on.
const PolicyChannel = "arap_policy"

// policyListener is the application_name of the connection hearing them.
const policyListener = "arap-policy-listener"

var policyReloads = prometheus.NewCounterVec(prometheus.CounterOpts{
	Name: "arap_policy_reloads_total",
	Help: "Policy reloads by result: loaded, or rejected (the file has errors; the running policy stays).",
}, []string{"result"})

// Reload re-reads the policy file; on error the running policy stays. A
// policy loaded is announced to the front-ends' decision caches (package
// announce) once it is in force here, whichever way the reload came (a
// signal, an administrator, another replica's announcement): a front-end
// connected to any replica forgets what it decided by the old one.
func (b *Backend) Reload() error {
	if err := b.engine.Reload(); err != nil {
		policyReloads.WithLabelValues("rejected").Inc()
		b.cfg.Log.Error("policy reload rejected; keeping the current policy", "error", err.Error())
		return err
	}
	policyReloads.WithLabelValues("loaded").Inc()
	b.cfg.Log.Info("policy reloaded", "policy", b.cfg.PolicyFile, "rules", len(b.engine.Policy().Rules))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := announce.Now(ctx, b.host.Pool(), announce.Policy); err != nil {
		// The front-ends connected here lose their stream, and with it
		// their decisions; those connected elsewhere keep theirs up to
		// their max age.
		b.changes.Drop()
		b.cfg.Log.Error("policy reloaded, but the front-ends' decision caches could not be told; those connected to other replicas keep their decisions up to their max age", "error", err.Error())
	}
	return nil
}

// reloadEverywhere reloads the policy here and, if it loads, announces it
// to every replica.
func (b *Backend) reloadEverywhere(ctx context.Context) (*evaluation.Policy, error) {
	if err := b.Reload(); err != nil {
		return nil, err
	}
	if _, err := b.host.Pool().Exec(ctx, `SELECT pg_notify($1, '')`, PolicyChannel); err != nil {
		return b.engine.Policy(), errors.Join(errNotAnnounced, err)
	}
	return b.engine.Policy(), nil
}

var errNotAnnounced = errors.New("the policy reloaded here, but the other replicas could not be told; send them SIGHUP")

// policyHearer reloads the policy when another replica announces a reload.
type policyHearer struct {
	b    *Backend
	stop context.CancelFunc
	done chan struct{}
}

func (h *policyHearer) Start(context.Context) error {
	ctx, stop := context.WithCancel(context.Background())
	h.stop, h.done = stop, make(chan struct{})
	l := pglisten.Listener{DB: h.b.host.Pool(), Channel: PolicyChannel, Name: policyListener, What: "policy reloads of other replicas", Log: h.b.cfg.Log,
		Heard: func(string) { _ = h.b.Reload() }}
	go func() {
		defer close(h.done)
		l.Run(ctx, nil)
	}()
	return nil
}

func (h *policyHearer) Stop() {
	if h.stop != nil {
		h.stop()
		<-h.done
	}
}
