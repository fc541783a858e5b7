// Package arap is the backend's HTTP surface: AuthZEN discovery and
// evaluation, the ARAP Access Request Service (submit, status, cancel), JWKS,
// request schemas, health and metrics. Handlers are thin: they authenticate,
// decode, call the evaluation and requests packages, and encode. Every route
// is listed in routes.go.
package arap

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/netip"
	"time"

	"github.com/omcp/arap/audit"
	"github.com/omcp/arap/callbacks"
	"github.com/omcp/arap/clients"
	"github.com/omcp/arap/directory"
	"github.com/omcp/arap/evaluation"
	"github.com/omcp/arap/internal/announce"
	"github.com/omcp/arap/internal/durability"
	"github.com/omcp/arap/internal/ratelimit"
	"github.com/omcp/arap/requests"
	"github.com/omcp/arap/signing"
)

// Limits bound what one caller can make the server do.
type Limits struct {
	// MaxBody bounds single-request bodies (submission, evaluation).
	MaxBody int64
	// MaxBatchBody bounds batch evaluation bodies.
	MaxBatchBody int64
	// MaxBatchItems bounds the number of evaluations in one batch.
	MaxBatchItems int
	// RequestsPerMinute is each API client's rate limit; UnauthenticatedPerMinute
	// limits callers (by IP address) whose token is missing or wrong. Both
	// are counted in Deps.Counters, so they hold for all replicas together.
	RequestsPerMinute        int
	UnauthenticatedPerMinute int
}

// DefaultLimits are used for zero fields.
var DefaultLimits = Limits{
	MaxBody:                  64 << 10,
	MaxBatchBody:             1 << 20,
	MaxBatchItems:            200,
	RequestsPerMinute:        6000,
	UnauthenticatedPerMinute: 120,
}

// Deps are what the handlers need.
type Deps struct {
	// PublicURL is the externally visible base URL (no trailing slash); it is
	// the PDP identifier and the base of every URL we hand out.
	PublicURL string
	Clients   *clients.Store
	Engine    *evaluation.Engine
	Requests  *requests.Service
	Keys      *signing.Keys
	Callbacks *callbacks.Service
	// Counters count the rate limits (arap.rate_counters).
	Counters *ratelimit.Counters
	Limits   Limits
	Log      *slog.Logger
	// TrustedProxies are the peers whose X-Forwarded-For is believed
	// (internal/clientip); none: every request's address is its peer.
	TrustedProxies []netip.Prefix
	// Ready reports whether the service can take traffic (database, workers),
	// with the database's durability when it answered (host.Probe).
	Ready func(ctx context.Context) (*durability.Report, error)
	// UI, when set, is the approvers' web interface, served under /ui/.
	UI http.Handler
	// Audit reads the audit trail for GET /v1/audit (404 without it).
	Audit audit.Querier
	// People is the directory, for decisions on a person's behalf; without
	// it on_behalf_of is refused.
	People People
	// DevMail, set by `arapd dev` only, lists the dev mail sink's messages
	// at /dev/mail and /dev/mail.json; elsewhere those paths are 404.
	DevMail http.Handler
	// Metrics serves GET /metrics; nil when they are served elsewhere
	// (--metrics-addr): /metrics is then not found here.
	Metrics http.Handler
	// Slack, when set, answers the Slack app's interactivity endpoint.
	Slack SlackApp
	// ReloadPolicy reloads the policy file on every replica (POST
	// /v1/admin/policy/reload); nil: not offered.
	ReloadPolicy func(ctx context.Context) (*evaluation.Policy, error)
	// Changes feeds the decision change stream (GET
	// /v1/decisions/changes); nil: not offered.
	Changes *announce.Hub
}

// SlackApp handles a Slack interactivity request (slackapp.App).
type SlackApp interface {
	Interact(ctx context.Context, header http.Header, body []byte) error
}

// People finds directory users by name.
type People interface {
	User(ctx context.Context, name string) (*directory.User, error)
}

// Server is the backend's http.Handler.
type Server struct {
	d         Deps
	perClient *ratelimit.Limiter // authenticated requests, by client
	perIP     *ratelimit.Limiter // refused authentications, by address
	handler   http.Handler
}

// New builds the handler.
func New(d Deps) (*Server, error) {
	if d.PublicURL == "" || d.Clients == nil || d.Engine == nil || d.Requests == nil || d.Keys == nil || d.Callbacks == nil || d.Counters == nil {
		return nil, errors.New("arap: PublicURL, Clients, Engine, Requests, Keys, Callbacks and Counters are required")
	}
	if d.Log == nil {
		d.Log = slog.New(slog.DiscardHandler)
	}
	if d.Ready == nil {
		d.Ready = func(context.Context) (*durability.Report, error) { return nil, nil }
	}
	l := &d.Limits
	if l.MaxBody == 0 {
		l.MaxBody = DefaultLimits.MaxBody
	}
	if l.MaxBatchBody == 0 {
		l.MaxBatchBody = DefaultLimits.MaxBatchBody
	}
	if l.MaxBatchItems == 0 {
		l.MaxBatchItems = DefaultLimits.MaxBatchItems
	}
	if l.RequestsPerMinute == 0 {
		l.RequestsPerMinute = DefaultLimits.RequestsPerMinute
	}
	if l.UnauthenticatedPerMinute == 0 {
		l.UnauthenticatedPerMinute = DefaultLimits.UnauthenticatedPerMinute
	}
	s := &Server{d: d}
	var err error
	if s.perClient, err = d.Counters.NewLimiter("client", l.RequestsPerMinute, time.Minute); err != nil {
		return nil, err
	}
	if s.perIP, err = d.Counters.NewLimiter("unauthenticated", l.UnauthenticatedPerMinute, time.Minute); err != nil {
		return nil, err
	}
	s.handler = s.routes()
	return s, nil
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.handler.ServeHTTP(w, r) }
