// Package config is the one way arapd's commands (and arapctl's connection
// settings) are configured. Every setting is a flag with an environment
// variable and a config-file key; the precedence is
//
//	flag > environment variable > config file (--config FILE, ARAP_CONFIG) > default
//
// Parsing is ff/v3's (github.com/peterbourgon/ff/v3): flags first, then the
// config file for what is still unset. The environment is read here, before
// ff reads the file, because ff derives one variable name per flag from a
// prefix, and arapd keeps the names operators already use (arapd mcp's
// --addr is ARAP_MCP_ADDR, the database URL is also DATABASE_URL).
//
// Secrets (master keys, tokens, passwords, the database URL) are never flag
// values, which any user can read in the process list: a secret X comes
// from the variable ARAP_X, or from a file named by --x-file (ARAP_X_FILE,
// config key x-file). Setting both is an error naming both.
//
// A value that does not parse is a start-up error naming where it came
// from: the flag, the variable, or the config file's line.
package config

import (
	"bufio"
	"encoding"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/peterbourgon/ff/v3"
)

// EnvPrefix starts the variable of every flag without an explicit one:
// --job-timeout is ARAP_JOB_TIMEOUT.
const EnvPrefix = "ARAP_"

// ConfigFlag names the config file; its variable is ARAP_CONFIG.
const ConfigFlag = "config"

// ErrHelp is returned by Parse for -h and --help, after the help is written.
var ErrHelp = flag.ErrHelp

// Set is one command's configuration.
type Set struct {
	cmd     string
	fs      *flag.FlagSet
	env     map[string][]string // flag name -> its variables, the first the one named in help
	order   []string            // flag names in definition order, for help
	secrets []*Secret
	config  *string
	out     io.Writer
	lookup  func(string) (string, bool)
	keys    map[string]string // config key -> flag name, where they differ
	keyOf   map[string]string // flag name -> config key, where they differ
	ignore  map[string]bool   // keys other commands read from the same file
}

// New starts the configuration of command (e.g. "arapd serve"), with
// --config. Help and errors go to out.
func New(command string, out io.Writer) *Set {
	fs := flag.NewFlagSet(command, flag.ContinueOnError)
	fs.SetOutput(io.Discard) // Parse words the errors; Usage writes help
	fs.Usage = func() {}
	return Wrap(fs, command, out)
}

// Wrap defines the settings on fs, which the caller parses itself (arapctl,
// whose flags and arguments interleave) before calling Resolve.
func Wrap(fs *flag.FlagSet, command string, out io.Writer) *Set {
	s := &Set{cmd: command, fs: fs, env: map[string][]string{}, out: out, lookup: os.LookupEnv,
		keys: map[string]string{}, keyOf: map[string]string{}, ignore: map[string]bool{}}
	s.config = s.String(ConfigFlag, "", "read settings from `FILE`: one a line, its key (the flag name), a space, its value; # starts a comment")
	return s
}

// Key makes key the config-file key of flag name (default: the name), for
// a flag whose name means different things in different commands sharing
// one file (arapctl's --url).
func (s *Set) Key(name, key string) {
	s.keys[key] = name
	s.keyOf[name] = key
}

// Ignore names keys of the config file that other commands read: they are
// not errors here.
func (s *Set) Ignore(keys ...string) {
	for _, k := range keys {
		s.ignore[k] = true
	}
}

func (s *Set) key(name string) string {
	if k, ok := s.keyOf[name]; ok {
		return k
	}
	return name
}

// WithLookup replaces the environment (tests).
func (s *Set) WithLookup(lookup func(string) (string, bool)) *Set {
	s.lookup = lookup
	return s
}

// EnvName is the default variable of a flag: ARAP_ and the name in upper
// snake case.
func EnvName(flagName string) string {
	return EnvPrefix + strings.ToUpper(strings.NewReplacer("-", "_", ".", "_").Replace(flagName))
}

func (s *Set) define(name string, env []string) {
	if len(env) == 0 {
		env = []string{EnvName(name)}
	}
	s.env[name] = env
	s.order = append(s.order, name)
}

// String defines a string setting. env, when given, are its variables in
// order of preference (default: EnvName(name)).
func (s *Set) String(name, def, usage string, env ...string) *string {
	s.define(name, env)
	return s.fs.String(name, def, usage)
}

// Bool defines a boolean setting.
func (s *Set) Bool(name string, def bool, usage string, env ...string) *bool {
	s.define(name, env)
	return s.fs.Bool(name, def, usage)
}

// Int defines an integer setting.
func (s *Set) Int(name string, def int, usage string, env ...string) *int {
	s.define(name, env)
	return s.fs.Int(name, def, usage)
}

// Duration defines a duration setting (300ms, 10s, 1h30m).
func (s *Set) Duration(name string, def time.Duration, usage string, env ...string) *time.Duration {
	s.define(name, env)
	return s.fs.Duration(name, def, usage)
}

// TextVar defines a setting parsed by p's UnmarshalText (a log level).
func (s *Set) TextVar(p encoding.TextUnmarshaler, name string, def encoding.TextMarshaler, usage string, env ...string) {
	s.define(name, env)
	s.fs.TextVar(p, name, def, usage)
}

// Var defines a setting of any flag.Value.
func (s *Set) Var(v flag.Value, name, usage string, env ...string) {
	s.define(name, env)
	s.fs.Var(v, name, usage)
}

// Secret is a secret setting: its value comes from a variable or a file,
// never a flag.
type Secret struct {
	name  string   // "master-key": the file flag is master-key-file
	env   []string // variables holding the value itself
	file  *string
	what  string
	value string
	set   bool
}

// Secret defines a secret named name (e.g. "master-key"): its value is in
// the first set of env (default ARAP_MASTER_KEY), or in the file named by
// --master-key-file, whose variable is env[0]+"_FILE".
func (s *Set) Secret(name, what string, env ...string) *Secret {
	if len(env) == 0 {
		env = []string{EnvName(name)}
	}
	sec := &Secret{name: name, env: env, what: what}
	sec.file = s.String(name+"-file", "", "file holding "+what+" (instead of "+strings.Join(env, " or ")+")", env[0]+"_FILE")
	s.secrets = append(s.secrets, sec)
	return sec
}

// Value is the secret ("" when unset), surrounding white space removed.
func (c *Secret) Value() string { return c.value }

// IsSet reports whether the secret was given, from a variable or a file.
func (c *Secret) IsSet() bool { return c.set }

// Describe names where the secret can come from, for messages.
func (c *Secret) Describe() string {
	return fmt.Sprintf("%s or --%s-file (%s_FILE)", strings.Join(c.env, " or "), c.name, c.env[0])
}

// Parse reads the command line, then the environment for settings the
// command line left unset, then the config file for those still unset,
// then the secrets. For -h it writes the help and returns ErrHelp.
func (s *Set) Parse(args []string) error {
	if err := s.fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			s.Help(s.out)
			return ErrHelp
		}
		return errors.New(s.flagProblem(err))
	}
	if s.fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", s.fs.Arg(0))
	}
	return s.Resolve()
}

// Resolve sets, after the command line was parsed, what it left unset: from
// the environment, then from the config file; then it reads the secrets.
func (s *Set) Resolve() error {
	given := map[string]bool{}
	s.fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	for _, name := range s.order {
		if given[name] {
			continue
		}
		for _, v := range s.env[name] {
			val, ok := s.lookup(v)
			if !ok || val == "" {
				continue
			}
			if err := s.fs.Set(name, val); err != nil {
				return fmt.Errorf("%s=%q: %s", v, val, s.valueProblem(name, err))
			}
			break
		}
	}
	// The command line is parsed already (no arguments here); ff reads the
	// config file, setting only flags neither the command line nor the
	// environment set.
	file := *s.config
	err := ff.Parse(s.fs, nil, ff.WithConfigFileFlag(ConfigFlag), ff.WithConfigFileParser(s.fileParser(file)))
	if err != nil {
		var pe *parseError
		if errors.As(err, &pe) {
			return pe
		}
		return fmt.Errorf("config file %s: %w", file, err)
	}
	for _, sec := range s.secrets {
		if err := s.readSecret(sec); err != nil {
			return err
		}
	}
	return nil
}

func (s *Set) readSecret(c *Secret) error {
	var fromEnv string
	for _, v := range c.env {
		if val, ok := s.lookup(v); ok && val != "" {
			if fromEnv != "" {
				continue // an alias: the first set wins
			}
			fromEnv, c.value = v, strings.TrimSpace(val)
		}
	}
	if *c.file != "" {
		if fromEnv != "" {
			return fmt.Errorf("%s is set both in %s and as a file (--%s-file, %s_FILE or the config file's %s); set one", c.what, fromEnv, c.name, c.env[0], s.key(c.name+"-file"))
		}
		b, err := os.ReadFile(*c.file)
		if err != nil {
			return fmt.Errorf("%s (--%s-file): %w", c.what, c.name, err)
		}
		c.value = strings.TrimSpace(string(b))
		if c.value == "" {
			return fmt.Errorf("%s (--%s-file): %s is empty", c.what, c.name, *c.file)
		}
	}
	c.set = c.value != ""
	return nil
}

// parseError is a config file line that cannot be used.
type parseError struct {
	file string
	line int
	err  error
}

func (e *parseError) Error() string { return fmt.Sprintf("%s:%d: %v", e.file, e.line, e.err) }
func (e *parseError) Unwrap() error { return e.err }

// fileParser reads the config file in ff's plain format (one "key value"
// per line), line by line, so that an error names its line. Only flags are
// keys: a secret's key is its file's (master-key-file), never the secret.
func (s *Set) fileParser(file string) ff.ConfigFileParser {
	return func(r io.Reader, set func(name, value string) error) error {
		sc := bufio.NewScanner(r)
		for n := 1; sc.Scan(); n++ {
			err := ff.PlainParser(strings.NewReader(sc.Text()), func(name, value string) error {
				key := strings.TrimLeft(name, "-")
				name = key
				if n, ok := s.keys[key]; ok {
					name = n
				} else if _, renamed := s.keyOf[key]; renamed {
					name = "" // the flag's key is another
				}
				if name == ConfigFlag {
					return errors.New("a config file cannot name another config file")
				}
				if name == "" || s.fs.Lookup(name) == nil {
					if s.ignore[key] {
						return nil
					}
					return fmt.Errorf("unknown key %q%s", key, s.secretHint(key))
				}
				if err := set(name, value); err != nil {
					return fmt.Errorf("%s %q: %s", key, value, s.valueProblem(name, errors.Unwrap(err)))
				}
				return nil
			})
			if err != nil {
				return &parseError{file: file, line: n, err: err}
			}
		}
		return sc.Err()
	}
}

func (s *Set) secretHint(name string) string {
	for _, c := range s.secrets {
		if c.name == name {
			return fmt.Sprintf(" (a secret is never in the config file: name a file holding it with %s-file)", name)
		}
	}
	return ""
}

// flagProblem words the flag package's errors.
func (s *Set) flagProblem(err error) string {
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
		return "no such flag: --" + name
	}
	if name, ok := strings.CutPrefix(msg, "flag needs an argument: -"); ok {
		return "--" + name + " needs a value"
	}
	if rest, ok := strings.CutPrefix(msg, "invalid value "); ok {
		// invalid value "x" for flag -job-timeout: parse error
		if v, f, ok := strings.Cut(rest, " for flag -"); ok {
			name, why, _ := strings.Cut(f, ": ")
			return fmt.Sprintf("--%s %s: %s", name, v, s.valueProblem(name, errors.New(why)))
		}
	}
	return msg
}

// valueProblem says what a value of flag name should look like: the flag
// package's own errors say only "parse error".
func (s *Set) valueProblem(name string, err error) string {
	f := s.fs.Lookup(name)
	if f == nil || err == nil {
		return fmt.Sprint(err)
	}
	if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
		return "want true or false"
	}
	switch typ, _ := flag.UnquoteUsage(f); typ {
	case "duration":
		return "want a duration such as 30s, 5m or 1h30m"
	case "int":
		return "want a whole number"
	default:
		return err.Error()
	}
}

// Sources names a flag's variable and config key ("env ARAP_URL; config
// key url"), or "" for a flag not defined here.
func (s *Set) Sources(name string) string {
	env, ok := s.env[name]
	if !ok {
		return ""
	}
	if name == ConfigFlag {
		return "env " + strings.Join(env, " or ")
	}
	return fmt.Sprintf("env %s; config key %s", strings.Join(env, " or "), s.key(name))
}

// Help writes the command's settings: each flag with its variable and
// config key, and the secrets.
func (s *Set) Help(w io.Writer) {
	var b strings.Builder
	fmt.Fprintf(&b, "usage: %s [flags]\n\n", s.cmd)
	b.WriteString("Each setting is a flag, an environment variable or a key in the config file\n(--config FILE); a flag wins over the variable, the variable over the file.\n\n")
	secretFile := map[string]*Secret{}
	for _, c := range s.secrets {
		secretFile[c.name+"-file"] = c
	}
	for _, name := range s.order {
		f := s.fs.Lookup(name)
		if secretFile[name] != nil {
			continue
		}
		typ, usage := flag.UnquoteUsage(f)
		fmt.Fprintf(&b, "  --%s", name)
		if typ != "" {
			fmt.Fprintf(&b, " %s", typ)
		}
		fmt.Fprintf(&b, "\n      %s", usage)
		if f.DefValue != "" && f.DefValue != "0" && f.DefValue != "false" && f.DefValue != "0s" {
			fmt.Fprintf(&b, " (default %s)", f.DefValue)
		}
		if name == ConfigFlag {
			fmt.Fprintf(&b, "\n      env %s\n", strings.Join(s.env[name], " or "))
			continue
		}
		fmt.Fprintf(&b, "\n      env %s; config key %s\n", strings.Join(s.env[name], " or "), s.key(name))
	}
	if len(s.secrets) > 0 {
		b.WriteString("\nSecrets are never flags (the process list shows flags): each is read from its\nvariable, or from a file named by its -file flag, variable or config key.\n\n")
		for _, c := range s.secrets {
			fmt.Fprintf(&b, "  %s\n      env %s, or a file: --%s-file, env %s_FILE, config key %s\n", c.what, strings.Join(c.env, " or "), c.name, c.env[0], s.key(c.name+"-file"))
		}
	}
	_, _ = io.WriteString(w, b.String())
}
