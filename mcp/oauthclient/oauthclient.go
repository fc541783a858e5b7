// Package oauthclient is the MCP authorization specification's client side
// for a command-line MCP client (arapctl mcp): the go-sdk's
// auth.AuthorizationCodeHandler (protected resource metadata discovery,
// authorization server metadata, client registration by metadata document,
// pre-registration or dynamic registration, PKCE, scope step-up), with the
// parts a command needs around it: the browser step (a loopback redirect,
// or an authorization server that answers at once) and the tokens kept
// between runs, refreshed, in a file only its owner reads.
package oauthclient

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/auth"
	"github.com/modelcontextprotocol/go-sdk/oauthex"
	"golang.org/x/oauth2"
)

// Config configures New.
type Config struct {
	// Server is the MCP endpoint the tokens are for (their key in Store).
	Server string
	// Store is the file keeping tokens and registrations between runs
	// (mode 0600).
	Store string
	// ClientID and ClientSecret name a client registered beforehand
	// (ClientSecret may be empty: a public client).
	ClientID, ClientSecret string
	// ClientMetadataURL is a client ID metadata document's URL, used
	// where the authorization server takes them.
	ClientMetadataURL string
	// RedirectURL is where the authorization server sends the browser back
	// (default DefaultRedirect); on loopback, arapctl listens there.
	RedirectURL string
	// Prompt is where a person is told to open the authorization URL.
	Prompt io.Writer
	// Wait bounds the wait for the browser (default 5 minutes).
	Wait time.Duration
	HTTP *http.Client
}

// DefaultRedirect is the loopback redirect a dynamically registered
// client asks for.
const DefaultRedirect = "http://127.0.0.1:8747/callback"

// New returns the OAuth handler for cfg.Server, starting from the tokens
// Store keeps for it, if any.
func New(cfg Config) (auth.OAuthHandler, error) {
	if cfg.RedirectURL == "" {
		cfg.RedirectURL = DefaultRedirect
	}
	if cfg.Wait == 0 {
		cfg.Wait = 5 * time.Minute
	}
	if cfg.HTTP == nil {
		cfg.HTTP = &http.Client{Timeout: 30 * time.Second}
	}
	if cfg.Prompt == nil {
		cfg.Prompt = io.Discard
	}
	s := &store{path: cfg.Store, server: cfg.Server}
	hc := &auth.AuthorizationCodeHandlerConfig{
		RedirectURL:              cfg.RedirectURL,
		AuthorizationCodeFetcher: (&fetcher{cfg: cfg}).fetch,
		DynamicClientRegistrationConfig: &auth.DynamicClientRegistrationConfig{Metadata: &oauthex.ClientRegistrationMetadata{
			ClientName: "arapctl", RedirectURIs: []string{cfg.RedirectURL}, GrantTypes: []string{"authorization_code", "refresh_token"},
			ResponseTypes: []string{"code"}, TokenEndpointAuthMethod: "none"}},
		RequestRefreshToken: true,
		Client:              cfg.HTTP,
		NewTokenSource: func(ctx context.Context, oc *oauth2.Config, tok *oauth2.Token) (oauth2.TokenSource, error) {
			saved := saved{ClientID: oc.ClientID, ClientSecret: oc.ClientSecret, TokenURL: oc.Endpoint.TokenURL,
				AuthStyle: int(oc.Endpoint.AuthStyle), Scopes: oc.Scopes, Token: tok}
			if err := s.save(saved); err != nil {
				return nil, err
			}
			return &persisting{src: oc.TokenSource(ctx, tok), store: s, saved: saved}, nil
		},
	}
	if cfg.ClientMetadataURL != "" {
		hc.ClientIDMetadataDocumentConfig = &auth.ClientIDMetadataDocumentConfig{URL: cfg.ClientMetadataURL}
	}
	if cfg.ClientID != "" {
		hc.PreregisteredClient = &oauthex.ClientCredentials{ClientID: cfg.ClientID}
		if cfg.ClientSecret != "" {
			hc.PreregisteredClient.ClientSecretAuth = &oauthex.ClientSecretAuth{ClientSecret: cfg.ClientSecret}
		}
	}
	prev, err := s.load()
	if err != nil {
		return nil, err
	}
	if prev != nil {
		// A step-up asks for the scopes held before as well as the ones
		// challenged (SEP-2350), also in a later run than the one they
		// were granted in.
		held := prev.Scopes
		hc.ScopeFilter = func(discovered []string) []string {
			out := slices.Clone(discovered)
			for _, s := range held {
				if !slices.Contains(out, s) {
					out = append(out, s)
				}
			}
			return out
		}
	}
	if prev != nil && prev.Token != nil {
		oc := &oauth2.Config{ClientID: prev.ClientID, ClientSecret: prev.ClientSecret, Scopes: prev.Scopes,
			Endpoint: oauth2.Endpoint{TokenURL: prev.TokenURL, AuthStyle: oauth2.AuthStyle(prev.AuthStyle)}}
		ctx := context.WithValue(context.Background(), oauth2.HTTPClient, cfg.HTTP)
		hc.InitialTokenSource = &persisting{src: oc.TokenSource(ctx, prev.Token), store: s, saved: *prev}
	}
	return auth.NewAuthorizationCodeHandler(hc)
}

// saved is what Store keeps for one server: the client it registered or
// was given, where to refresh, and the last token.
type saved struct {
	ClientID     string        `json:"client_id"`
	ClientSecret string        `json:"client_secret,omitempty"`
	TokenURL     string        `json:"token_url"`
	AuthStyle    int           `json:"auth_style"`
	Scopes       []string      `json:"scopes,omitempty"`
	Token        *oauth2.Token `json:"token"`
}

// store is the token file: a JSON object of saved by server, written
// whole, mode 0600, through a rename.
type store struct {
	path, server string
	mu           sync.Mutex
}

func (s *store) all() (map[string]saved, error) {
	m := map[string]saved{}
	b, err := os.ReadFile(s.path)
	if errors.Is(err, os.ErrNotExist) {
		return m, nil
	}
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("oauthclient: %s is not a token file: %w", s.path, err)
	}
	return m, nil
}

func (s *store) load() (*saved, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m, err := s.all()
	if err != nil {
		return nil, err
	}
	if v, ok := m[s.server]; ok {
		return &v, nil
	}
	return nil, nil
}

func (s *store) save(v saved) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	m, err := s.all()
	if err != nil {
		return err
	}
	m[s.server] = v
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(s.path), 0o700); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(s.path), ".oauth-*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := tmp.Chmod(0o600); err != nil {
		tmp.Close()
		return err
	}
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), s.path)
}

// persisting keeps a refreshed token in the store.
type persisting struct {
	src   oauth2.TokenSource
	store *store
	mu    sync.Mutex
	saved saved
}

func (p *persisting) Token() (*oauth2.Token, error) {
	tok, err := p.src.Token()
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.saved.Token == nil || tok.AccessToken != p.saved.Token.AccessToken {
		p.saved.Token = tok
		if err := p.store.save(p.saved); err != nil {
			return nil, err
		}
	}
	return tok, nil
}

// fetcher is the browser step: an authorization server that sends the
// browser straight back (no person to ask: a test server, an existing
// session) is answered at once; otherwise a person is asked to open the
// URL, and the loopback redirect is awaited.
type fetcher struct{ cfg Config }

func (f *fetcher) fetch(ctx context.Context, args *auth.AuthorizationArgs) (*auth.AuthorizationResult, error) {
	var ln net.Listener
	redirect, err := url.Parse(f.cfg.RedirectURL)
	if err != nil {
		return nil, err
	}
	if host := redirect.Hostname(); host == "127.0.0.1" || host == "::1" || host == "localhost" {
		// Listen before anyone can be sent back.
		if ln, err = net.Listen("tcp", redirect.Host); err == nil {
			defer ln.Close()
		}
	}
	if res, ok, err := f.direct(ctx, args.URL); err != nil || ok {
		return res, err
	}
	if ln == nil {
		return nil, fmt.Errorf("oauthclient: the authorization server wants a person, and %s is not a loopback address this command can listen on", f.cfg.RedirectURL)
	}
	fmt.Fprintf(f.cfg.Prompt, "To authorize arapctl, open this URL in a browser:\n\n  %s\n\nWaiting for the authorization server to send the browser back to %s ...\n", args.URL, f.cfg.RedirectURL)
	got := make(chan *auth.AuthorizationResult, 1)
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != redirect.Path {
			http.NotFound(w, r)
			return
		}
		q := r.URL.Query()
		if e := q.Get("error"); e != "" {
			fmt.Fprintf(w, "Authorization failed: %s. You may close this window.\n", e)
		} else {
			fmt.Fprintln(w, "arapctl is authorized. You may close this window.")
		}
		select {
		case got <- &auth.AuthorizationResult{Code: q.Get("code"), State: q.Get("state"), Iss: q.Get("iss")}:
		default:
		}
	})}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Close()
	wait, cancel := context.WithTimeout(ctx, f.cfg.Wait)
	defer cancel()
	select {
	case r := <-got:
		if r.Code == "" {
			return nil, errors.New("oauthclient: the authorization server sent no code back")
		}
		return r, nil
	case <-wait.Done():
		return nil, fmt.Errorf("oauthclient: no authorization came back within %s", f.cfg.Wait)
	}
}

// direct asks for the authorization URL without following redirects: ok
// when the server sends the browser straight back to the redirect URL.
func (f *fetcher) direct(ctx context.Context, authURL string) (*auth.AuthorizationResult, bool, error) {
	c := &http.Client{Timeout: 30 * time.Second, Transport: f.cfg.HTTP.Transport,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, authURL, nil)
	if err != nil {
		return nil, false, err
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, false, nil // a person's browser may reach what this cannot
	}
	resp.Body.Close()
	loc := resp.Header.Get("Location")
	if resp.StatusCode < 300 || resp.StatusCode > 399 || !strings.HasPrefix(loc, f.cfg.RedirectURL) {
		return nil, false, nil
	}
	u, err := url.Parse(loc)
	if err != nil {
		return nil, false, err
	}
	q := u.Query()
	if e := q.Get("error"); e != "" {
		return nil, false, fmt.Errorf("oauthclient: the authorization server refused: %s %s", e, q.Get("error_description"))
	}
	return &auth.AuthorizationResult{Code: q.Get("code"), State: q.Get("state"), Iss: q.Get("iss")}, true, nil
}
