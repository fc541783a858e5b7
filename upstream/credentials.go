package upstream

import (
	"errors"
	"fmt"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Credentials is the gateway's own credential for an upstream, resolved when
// the file is loaded. The MCP client's token is never passed through: it
// was issued for the gateway (its audience), and forwarding it would let any
// upstream replay the caller's identity against the gateway and every other
// upstream (the confused deputy the MCP authorization spec forbids).
type Credentials struct {
	Header string // HTTP: the header carrying it (default Authorization)
	Scheme string // HTTP: prefix before the secret (default "Bearer" for Authorization)
	AsEnv  string // stdio: the child's environment variable carrying it
	From   string // "file PATH" or "env NAME", for messages
	secret *sealed
}

// sealed holds a secret behind a pointer, so that fmt's %v and %+v of any
// enclosing struct print an address, never the value.
type sealed struct{ v string }

// String never shows the secret (a value receiver, so that a copy of
// Credentials formats the same way).
func (c Credentials) String() string { return "credentials from " + c.From + " (redacted)" }

// GoString keeps %#v from printing the secret's holder.
func (c Credentials) GoString() string { return c.String() }

// headerValue is the value of the credential header.
func (c *Credentials) headerValue() string {
	if c.Scheme == "" {
		return c.secret.v
	}
	return c.Scheme + " " + c.secret.v
}

// credentials resolves an upstream's credentials entry: where the secret
// comes from, and how it is sent.
func credentials(s credSpec, u *Upstream, n *yaml.Node, dir string) (*Credentials, []Problem) {
	var ps []Problem
	add := func(line int, format string, args ...any) {
		ps = append(ps, Problem{Line: line, Message: fmt.Sprintf(format, args...)})
	}
	at := func(key ...string) int { return lineAt(n, append([]string{"credentials"}, key...)...) }
	c := &Credentials{}
	switch {
	case u.HTTP != nil:
		if s.AsEnv != "" {
			add(at("as_env"), "credentials.as_env is for stdio upstreams; http ones use header and scheme")
		}
		c.Header = "Authorization"
		if s.Header != nil {
			c.Header = *s.Header
		}
		if !validHeaderName(c.Header) {
			add(at("header"), "credentials.header %q is not a valid HTTP header name", c.Header)
		}
		if slices.ContainsFunc(slices.Collect(maps.Keys(u.HTTP.Headers)), func(h string) bool { return http.CanonicalHeaderKey(h) == http.CanonicalHeaderKey(c.Header) }) {
			add(lineAt(n, "http", "headers"), "header %q is set both in http.headers and by credentials", c.Header)
		}
		if http.CanonicalHeaderKey(c.Header) == "Authorization" {
			c.Scheme = "Bearer"
		}
		if s.Scheme != nil {
			c.Scheme = *s.Scheme
		}
	case u.Stdio != nil:
		if s.Header != nil || s.Scheme != nil {
			add(at(), "credentials.header and scheme are for http upstreams; stdio ones use as_env")
		}
		c.AsEnv = s.AsEnv
		if !envNameRE.MatchString(s.AsEnv) {
			add(at(), "credentials.as_env must name the child's environment variable that carries the credential")
		}
	}
	switch {
	case (s.File == "") == (s.Env == ""):
		add(at(), "credentials need exactly one of file and env")
	case s.File != "":
		p := s.File
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		c.From = "file " + s.File
		b, err := os.ReadFile(p)
		if err != nil {
			add(at("file"), "credentials file %q cannot be read: %v", s.File, unwrapPathError(err))
			break
		}
		v := strings.TrimSpace(string(b))
		if v == "" {
			add(at("file"), "credentials file %q is empty", s.File)
			break
		}
		c.secret = &sealed{v}
	default:
		c.From = "env " + s.Env
		v, ok := os.LookupEnv(s.Env)
		v = strings.TrimSpace(v)
		if !ok || v == "" {
			add(at("env"), "credentials environment variable %s is not set or empty", s.Env)
			break
		}
		c.secret = &sealed{v}
	}
	if strings.ContainsAny(secretOf(c), "\r\n") {
		add(at(), "credential from %s contains a line break", c.From)
	}
	return c, ps
}

func secretOf(c *Credentials) string {
	if c == nil || c.secret == nil {
		return ""
	}
	return c.secret.v
}

func unwrapPathError(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
