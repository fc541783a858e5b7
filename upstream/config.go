package upstream

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/jsonrpc"
	"go.yaml.in/yaml/v3"

	"github.com/omcp/arap/internal/yamlfile"
)

// Defaults for the per-upstream timeouts and the re-list schedule.
const (
	DefaultConnectTimeout = 10 * time.Second
	DefaultCallTimeout    = 60 * time.Second
	DefaultRelist         = 5 * time.Minute
	maxCallTimeout        = 24 * time.Hour
	maxToolName           = 128 // MCP tool-name rule (2025-11-25 "Tool names")
)

// Config is a parsed upstreams file: the MCP servers the gateway fronts.
type Config struct {
	Source    string // the file it was read from, for messages
	Upstreams []Upstream
}

// Upstream is one MCP server behind the gateway.
type Upstream struct {
	Name        string
	HTTP        *HTTP  // exactly one of HTTP and Stdio
	Stdio       *Stdio //
	Credentials *Credentials
	// Prefix is prepended to the upstream's tool names to form the names the
	// gateway exposes; "" exposes them as they are.
	Prefix       string
	Include      []string // path.Match globs over the upstream's tool names; empty means all
	Exclude      []string // applied after Include
	TaskRequired []string // tools whose calls are task-required (-32021 without the tasks extension)
	Connect      time.Duration
	Call         time.Duration
	Relist       time.Duration // re-list period, the fallback for upstreams that send no list_changed
	Line         int           // where the entry starts, for messages
	relDir       string        // the file's directory, for relative paths
	redactor     []string      // strings never to show (URL, header values, secret)
}

// HTTP is a streamable HTTP upstream.
type HTTP struct {
	URL     string
	Headers map[string]string
}

// Stdio is an upstream run as a child process speaking MCP on stdin/stdout.
// The child does not inherit the gateway's environment (which holds its
// database URL and keys): it gets PATH, HOME and LANG, plus Env.
type Stdio struct {
	Command string
	Args    []string
	Env     map[string]string
	Dir     string
}

// Problem is one error at one line of an upstreams file.
type Problem = yamlfile.Problem

// ConfigError lists every problem found in an upstreams file. Its message
// names the file and line of each ("FILE:LINE: reason") and never includes a
// credential.
type ConfigError = yamlfile.Error

// The file's shape. Durations are strings ("10s") parsed after decoding so a
// bad one is reported with its line.
type fileSpec struct {
	Upstreams []upstreamSpec `yaml:"upstreams"`
}

type upstreamSpec struct {
	Name        string     `yaml:"name"`
	HTTP        *httpSpec  `yaml:"http"`
	Stdio       *stdioSpec `yaml:"stdio"`
	Credentials *credSpec  `yaml:"credentials"`
	Prefix      string     `yaml:"prefix"`
	Tools       toolsSpec  `yaml:"tools"`
	Timeouts    struct {
		Connect string `yaml:"connect"`
		Call    string `yaml:"call"`
	} `yaml:"timeouts"`
	Relist string `yaml:"relist"`
}

type httpSpec struct {
	URL     string            `yaml:"url"`
	Headers map[string]string `yaml:"headers"`
}

type stdioSpec struct {
	Command string            `yaml:"command"`
	Args    []string          `yaml:"args"`
	Env     map[string]string `yaml:"env"`
	Dir     string            `yaml:"dir"`
}

type credSpec struct {
	Header *string `yaml:"header"`
	Scheme *string `yaml:"scheme"`
	AsEnv  string  `yaml:"as_env"`
	File   string  `yaml:"file"`
	Env    string  `yaml:"env"`
}

type toolsSpec struct {
	Include      []string `yaml:"include"`
	Exclude      []string `yaml:"exclude"`
	TaskRequired []string `yaml:"task_required"`
}

var (
	nameRE    = regexp.MustCompile(`^[a-z0-9_-]{1,64}$`)
	envNameRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	// Headers the transport owns; setting them from the file would break the
	// protocol or smuggle a second credential past the credentials block.
	reservedHeaders   = []string{"Accept", "Content-Type", "Content-Length", "Host", "Connection", "Transfer-Encoding", "Last-Event-Id"}
	credentialHeaders = []string{"Authorization", "Proxy-Authorization", "Cookie"}
)

// Load reads and validates an upstreams file. Relative paths in it (a stdio
// command with a '/', stdio dir, credential files) are relative to the
// file's directory.
func Load(file string) (*Config, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, &ConfigError{What: "upstreams", Source: file, Problems: []Problem{{Message: fmt.Sprintf("read: %v", err)}}}
	}
	return Parse(file, b)
}

// Parse validates an upstreams document; name is the file it came from.
// Every problem is reported at once, with its line; credentials are resolved
// (read from their file or environment variable) here, so a missing one
// refuses the file rather than failing a call later.
func Parse(name string, data []byte) (*Config, error) {
	cerr := &ConfigError{What: "upstreams", Source: name}
	add := cerr.Add
	var spec fileSpec
	if !yamlfile.Decode(data, &spec, cerr) {
		return nil, cerr
	}
	// A second pass over the node tree gives each entry and key its line.
	var root yaml.Node
	_ = yaml.Unmarshal(data, &root)
	entries := entryNodes(&root)

	cfg := &Config{Source: name}
	dir := filepath.Dir(name)
	seen := map[string]int{}
	for i, s := range spec.Upstreams {
		var n *yaml.Node
		if i < len(entries) {
			n = entries[i]
		}
		u, problems := compile(s, n, dir)
		cerr.Problems = append(cerr.Problems, problems...)
		if u == nil {
			continue
		}
		if first, dup := seen[u.Name]; dup {
			add(lineAt(n, "name"), "upstream %q is defined twice (first at line %d)", u.Name, first)
			continue
		}
		seen[u.Name] = u.Line
		cfg.Upstreams = append(cfg.Upstreams, *u)
	}
	if len(cerr.Problems) > 0 {
		return nil, cerr
	}
	return cfg, nil
}

func compile(s upstreamSpec, n *yaml.Node, dir string) (*Upstream, []Problem) {
	var ps []Problem
	at := func(key ...string) int { return lineAt(n, key...) }
	add := func(line int, format string, args ...any) {
		msg := fmt.Sprintf(format, args...)
		if s.Name != "" {
			msg = fmt.Sprintf("upstream %q: ", s.Name) + msg
		}
		ps = append(ps, Problem{Line: line, Message: msg})
	}
	u := &Upstream{Name: s.Name, Prefix: s.Prefix, relDir: dir, Line: at()}
	if !nameRE.MatchString(s.Name) {
		add(at("name"), "name %q must be 1-64 characters of a-z, 0-9, '_' and '-'", s.Name)
	}
	switch {
	case s.HTTP == nil && s.Stdio == nil:
		add(at(), "needs a transport: http or stdio")
	case s.HTTP != nil && s.Stdio != nil:
		add(at("stdio"), "has both http and stdio; choose one")
	case s.HTTP != nil:
		u.HTTP = &HTTP{URL: s.HTTP.URL, Headers: s.HTTP.Headers}
		pu, err := url.Parse(s.HTTP.URL)
		switch {
		case err != nil || s.HTTP.URL == "":
			// url.Parse's message quotes the URL, which may hold a secret.
			add(at("http", "url"), "http.url is not a valid URL")
		case pu.Scheme != "http" && pu.Scheme != "https":
			add(at("http", "url"), "http.url must be an http or https URL")
		case pu.Host == "":
			add(at("http", "url"), "http.url has no host")
		case pu.User != nil:
			add(at("http", "url"), "http.url must not carry credentials; use the credentials block")
		}
		for h := range s.HTTP.Headers {
			if !validHeaderName(h) {
				add(at("http", "headers", h), "header name %q is not a valid HTTP header name", h)
			} else if slices.Contains(reservedHeaders, http.CanonicalHeaderKey(h)) || strings.HasPrefix(http.CanonicalHeaderKey(h), "Mcp-") {
				add(at("http", "headers", h), "header %q is set by the MCP transport and cannot be configured", h)
			} else if slices.Contains(credentialHeaders, http.CanonicalHeaderKey(h)) {
				// A secret written into this file would bypass the redaction
				// and the file-or-environment rule of credentials.
				add(at("http", "headers", h), "header %q carries a credential: give it in credentials (file or env), not in http.headers", h)
			}
		}
	case s.Stdio != nil:
		u.Stdio = &Stdio{Command: s.Stdio.Command, Args: s.Stdio.Args, Env: s.Stdio.Env, Dir: s.Stdio.Dir}
		if s.Stdio.Command == "" {
			add(at("stdio"), "stdio.command is required")
		}
		for k := range s.Stdio.Env {
			if !envNameRE.MatchString(k) {
				add(at("stdio", "env", k), "stdio.env name %q is not a valid environment variable name", k)
			}
		}
		if u.Stdio.Dir != "" && !filepath.IsAbs(u.Stdio.Dir) {
			u.Stdio.Dir = filepath.Join(dir, u.Stdio.Dir)
		}
		if strings.Contains(u.Stdio.Command, "/") && !filepath.IsAbs(u.Stdio.Command) {
			// A path, not a name looked up on PATH: relative to the file too.
			u.Stdio.Command = filepath.Join(dir, u.Stdio.Command)
		}
	}
	if s.Credentials != nil {
		c, cps := credentials(*s.Credentials, u, n, dir)
		for _, p := range cps {
			add(p.Line, "%s", p.Message)
		}
		u.Credentials = c
	}
	if s.Prefix != "" {
		if len(s.Prefix) >= maxToolName {
			add(at("prefix"), "prefix is %d characters; exposed tool names are at most %d", len(s.Prefix), maxToolName)
		} else if bad := badToolNameChars(s.Prefix); bad != "" {
			add(at("prefix"), "prefix %q has characters not allowed in MCP tool names (%s); allowed: A-Z a-z 0-9 _ - .", s.Prefix, bad)
		}
	}
	for _, g := range []struct {
		key  string
		pats []string
	}{{"include", s.Tools.Include}, {"exclude", s.Tools.Exclude}, {"task_required", s.Tools.TaskRequired}} {
		for _, p := range g.pats {
			if _, err := path.Match(p, ""); err != nil {
				add(at("tools", g.key), "tools.%s pattern %q is not a valid glob: %v", g.key, p, err)
			}
		}
	}
	u.Include, u.Exclude, u.TaskRequired = s.Tools.Include, s.Tools.Exclude, s.Tools.TaskRequired
	dur := func(v string, def time.Duration, line int, what string) time.Duration {
		if v == "" {
			return def
		}
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 || d > maxCallTimeout {
			add(line, "%s %q is not a positive duration of at most 24h (e.g. 10s, 2m)", what, v)
			return def
		}
		return d
	}
	u.Connect = dur(s.Timeouts.Connect, DefaultConnectTimeout, at("timeouts", "connect"), "timeouts.connect")
	u.Call = dur(s.Timeouts.Call, DefaultCallTimeout, at("timeouts", "call"), "timeouts.call")
	u.Relist = dur(s.Relist, DefaultRelist, at("relist"), "relist")
	if len(ps) > 0 {
		return nil, ps
	}
	return u, nil
}

// badToolNameChars lists, quoted, the characters of s outside the MCP
// tool-name alphabet; "" when there are none.
func badToolNameChars(s string) string {
	var bad []string
	for _, r := range s {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-' || r == '.') {
			if q := fmt.Sprintf("%q", r); !slices.Contains(bad, q) {
				bad = append(bad, q)
			}
		}
	}
	return strings.Join(bad, ", ")
}

// validToolName is the MCP tool-name rule: 1 to 128 characters of
// A-Z a-z 0-9 _ - . (specification 2025-11-25, server/tools, "Tool names").
func validToolName(s string) bool {
	return s != "" && len(s) <= maxToolName && badToolNameChars(s) == ""
}

func validHeaderName(h string) bool {
	if h == "" {
		return false
	}
	for _, r := range h {
		if r > 127 || !strings.ContainsRune("!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz", r) {
			return false
		}
	}
	return true
}

// entryNodes returns the mapping nodes of the upstreams list, in order.
func entryNodes(root *yaml.Node) []*yaml.Node {
	if root.Kind != yaml.DocumentNode || len(root.Content) == 0 {
		return nil
	}
	_, list := child(root.Content[0], "upstreams")
	if list == nil || list.Kind != yaml.SequenceNode {
		return nil
	}
	return list.Content
}

// child returns the key and value nodes of key in mapping m.
func child(m *yaml.Node, key string) (k, v *yaml.Node) {
	if m == nil || m.Kind != yaml.MappingNode {
		return nil, nil
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i], m.Content[i+1]
		}
	}
	return nil, nil
}

// lineAt is the line of the deepest key found along keys from n, else of its
// nearest ancestor, so a message always has a line.
func lineAt(n *yaml.Node, keys ...string) int {
	if n == nil {
		return 0
	}
	line := n.Line
	for _, key := range keys {
		k, v := child(n, key)
		if k == nil {
			break
		}
		line, n = k.Line, v
	}
	return line
}

// exposes reports whether the upstream offers its tool name, and under which
// name; ok is false for tools the file filters out.
func (u *Upstream) exposes(tool string) (name string, ok bool) {
	if len(u.Include) > 0 && !matchAny(u.Include, tool) {
		return "", false
	}
	if matchAny(u.Exclude, tool) {
		return "", false
	}
	return u.Prefix + tool, true
}

func (u *Upstream) taskRequired(tool string) bool { return matchAny(u.TaskRequired, tool) }

func matchAny(pats []string, s string) bool {
	for _, p := range pats {
		if ok, _ := path.Match(p, s); ok {
			return true
		}
	}
	return false
}

// redact removes from s everything the client must not see: the URL, its
// host, configured header values and the credential.
// redactError is we with what redact hides taken out of its message and
// data; data that is no longer JSON once redacted is dropped.
func (u *Upstream) redactError(we *jsonrpc.Error) *jsonrpc.Error {
	out := &jsonrpc.Error{Code: we.Code, Message: u.redact(we.Message)}
	if len(we.Data) > 0 {
		if d := u.redact(string(we.Data)); json.Valid([]byte(d)) {
			out.Data = json.RawMessage(d)
		}
	}
	return out
}

func (u *Upstream) redact(s string) string {
	var hide []string
	if u.HTTP != nil {
		hide = append(hide, u.HTTP.URL)
		if pu, err := url.Parse(u.HTTP.URL); err == nil && pu.Host != "" {
			hide = append(hide, pu.Host)
		}
		for _, v := range u.HTTP.Headers {
			hide = append(hide, v)
		}
	}
	if v := secretOf(u.Credentials); v != "" {
		hide = append(hide, v)
	}
	for _, h := range hide {
		if len(h) >= 3 {
			s = strings.ReplaceAll(s, h, "[redacted]")
		}
	}
	return s
}

// same reports whether two entries would connect the same way, so a reload
// keeps the live session of an unchanged upstream.
func (u *Upstream) same(o *Upstream) bool {
	// A rotated secret reconnects; the same secret from another file does not.
	cred := func(c *Credentials) [4]string {
		if c == nil {
			return [4]string{}
		}
		return [4]string{c.Header, c.Scheme, c.AsEnv, secretOf(c)}
	}
	return reflect.DeepEqual(u.HTTP, o.HTTP) && reflect.DeepEqual(u.Stdio, o.Stdio) &&
		cred(u.Credentials) == cred(o.Credentials) && u.Connect == o.Connect
}
