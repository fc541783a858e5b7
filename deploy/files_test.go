package deploy

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/omcp/arap/evaluation"
	"github.com/omcp/arap/upstream"
)

// compose is the part of the Compose specification deploy/compose.yaml
// uses; decoding with KnownFields refuses anything else, so a misspelt key
// fails here rather than being ignored by the engine.
type compose struct {
	Name     string `yaml:"name"`
	XArap    any    `yaml:"x-arap"`
	Services map[string]struct {
		Image       string            `yaml:"image"`
		User        string            `yaml:"user"`
		ReadOnly    bool              `yaml:"read_only"`
		CapDrop     []string          `yaml:"cap_drop"`
		SecurityOpt []string          `yaml:"security_opt"`
		Restart     string            `yaml:"restart"`
		Command     []string          `yaml:"command"`
		Entrypoint  []string          `yaml:"entrypoint"`
		Profiles    []string          `yaml:"profiles"`
		Environment map[string]string `yaml:"environment"`
		Volumes     []string          `yaml:"volumes"`
		Secrets     []string          `yaml:"secrets"`
		Ports       []string          `yaml:"ports"`
		Healthcheck *struct {
			Test     []string `yaml:"test"`
			Interval string   `yaml:"interval"`
			Timeout  string   `yaml:"timeout"`
			Retries  int      `yaml:"retries"`
		} `yaml:"healthcheck"`
		DependsOn map[string]struct {
			Condition string `yaml:"condition"`
		} `yaml:"depends_on"`
	} `yaml:"services"`
	Secrets map[string]struct {
		File string `yaml:"file"`
	} `yaml:"secrets"`
	Volumes map[string]any `yaml:"volumes"`
}

// TestCompose: PostgreSQL with a healthcheck; the migration runs once it
// is healthy; serve and mcp start after the migration succeeded; every
// arap container runs the one image as uid 65532, read-only, without
// capabilities; master keys are Compose secrets (files), never values;
// the policy file it mounts exists and loads.
// TestComposeAvoidsWhatOldEnginesMisread holds compose.yaml to what
// podman-compose 1.0.3 (Debian 12) reads as Docker Compose does, and to a
// start that converges where it ignores depends_on conditions and
// profiles: no ${VAR:-} (it passes an empty default on literally); every
// arap service restarts after a failed start (the migration only after a
// failure); a service behind a profile does something harmless when
// started anyway; the header says which versions are supported and that
// the commands run from deploy/ (it resolves secret files from the working
// directory).
func TestComposeAvoidsWhatOldEnginesMisread(t *testing.T) {
	b, err := os.ReadFile("compose.yaml")
	require.NoError(t, err)
	require.NotRegexp(t, `\$\{[A-Za-z_]+:-\}`, string(b), "an empty default: podman-compose 1.0.3 substitutes it literally")
	require.Contains(t, string(b), "Supported: Docker Compose v2, and podman-compose from 1.0.3")
	require.Contains(t, string(b), "from\n# the deploy/ directory")
	var c compose
	require.NoError(t, yaml.Unmarshal(b, &c))
	for name, s := range c.Services {
		switch {
		case len(s.Profiles) > 0:
			require.Equal(t, []string{"version"}, s.Command, "%s: started by an engine that ignores profiles, it must do no harm", name)
		case name == "migrate":
			require.Equal(t, "on-failure", s.Restart)
		default:
			require.Equal(t, "unless-stopped", s.Restart, "%s: restarted until what it needs is up", name)
		}
	}
}

func TestCompose(t *testing.T) {
	b, err := os.ReadFile("compose.yaml")
	require.NoError(t, err)
	var c compose
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	require.NoError(t, dec.Decode(&c))

	pg, ok := c.Services["postgres"]
	require.True(t, ok)
	require.NotNil(t, pg.Healthcheck)
	require.Contains(t, pg.Healthcheck.Test, "pg_isready")

	for _, name := range []string{"migrate", "serve", "mcp", "arapctl"} {
		s, ok := c.Services[name]
		require.True(t, ok, name)
		require.Equal(t, "arap:dev", s.Image, name)
		require.Equal(t, "65532:65532", s.User, name)
		require.True(t, s.ReadOnly, name)
		require.Equal(t, []string{"ALL"}, s.CapDrop, name)
		require.Contains(t, s.SecurityOpt, "no-new-privileges:true", name)
		require.Equal(t, "service_healthy", s.DependsOn["postgres"].Condition, name)
		require.Contains(t, s.Environment["DATABASE_URL"], "@postgres:5432/", name)
		for k, v := range s.Environment {
			if secretEnv.MatchString(k) && k != "DATABASE_URL" {
				require.Regexp(t, `^\$\{[A-Z_]+\}$`, v, "%s: %s only from the environment (.env), never written here", name, k)
			}
		}
		for _, sec := range s.Secrets {
			require.NotEmpty(t, c.Secrets[sec].File, "%s: secret %s is not a file", name, sec)
		}
	}
	require.Equal(t, []string{"migrate"}, c.Services["migrate"].Command)
	require.Equal(t, "on-failure", c.Services["migrate"].Restart, "a finished migration is not restarted; one that found no database yet is")
	for _, name := range []string{"serve", "mcp"} {
		s := c.Services[name]
		require.Equal(t, []string{name}, s.Command)
		require.Equal(t, "service_completed_successfully", s.DependsOn["migrate"].Condition, name)
	}
	serve, mcp := c.Services["serve"], c.Services["mcp"]
	require.Equal(t, "0.0.0.0:8480", serve.Environment["ARAP_ADDR"])
	require.Equal(t, "0.0.0.0:8481", mcp.Environment["ARAP_MCP_ADDR"])
	require.Equal(t, "http://serve:8480", mcp.Environment["ARAP_BACKEND_URL"])
	require.Equal(t, "/run/secrets/master-key", serve.Environment["ARAP_MASTER_KEY_FILE"])
	require.Equal(t, []string{"master-key"}, serve.Secrets)
	require.Equal(t, "/run/secrets/pep-master-key", mcp.Environment["ARAP_PEP_MASTER_KEY_FILE"])
	require.Equal(t, []string{"pep-master-key"}, mcp.Secrets, "the front-end sees only its own key")
	require.Equal(t, []string{"/usr/local/bin/arapctl"}, c.Services["arapctl"].Entrypoint)

	// The policy serve mounts is a file of this repository that loads.
	var policy string
	for _, v := range serve.Volumes {
		if src, dst, _ := strings.Cut(v, ":"); strings.HasPrefix(dst, serve.Environment["ARAP_POLICY"]) {
			policy = src
		}
	}
	require.NotEmpty(t, policy, "ARAP_POLICY is not mounted")
	_, err = evaluation.LoadFile(policy)
	require.NoError(t, err)

	// mcp: the upstreams file it mounts loads; the demo tools only when
	// the operator asks for them in .env, off by default.
	var upstreams string
	for _, v := range mcp.Volumes {
		if src, dst, _ := strings.Cut(v, ":"); strings.HasPrefix(dst, mcp.Environment["ARAP_UPSTREAMS"]) {
			upstreams = src
		}
	}
	require.NotEmpty(t, upstreams, "ARAP_UPSTREAMS is not mounted")
	_, err = upstream.Load(upstreams)
	require.NoError(t, err)
	require.Equal(t, "${ARAP_DEMO_TOOLS:-false}", mcp.Environment["ARAP_DEMO_TOOLS"])

	// Published ports only on loopback: the compose file is for one host.
	for _, s := range c.Services {
		for _, p := range s.Ports {
			require.True(t, strings.HasPrefix(p, "127.0.0.1:"), p)
		}
	}
}

// units are the systemd units and the key file setting each must feed
// from a credential.
var units = map[string]string{
	"systemd/arapd-serve.service": "ARAP_MASTER_KEY_FILE",
	"systemd/arapd-mcp.service":   "ARAP_PEP_MASTER_KEY_FILE",
}

// hardening lists the directives every unit must set.
var hardening = []string{
	"DynamicUser=yes", "NoNewPrivileges=yes", "ProtectSystem=strict", "ProtectHome=yes", "PrivateTmp=yes",
	"PrivateDevices=yes", "CapabilityBoundingSet=", "RestrictSUIDSGID=yes", "SystemCallFilter=@system-service",
}

// TestSystemdUnits: each unit runs its arapd command hardened, takes its
// master key through LoadCredential (a file only this service can read,
// never an environment value) and passes systemd-analyze verify where
// systemd is installed.
func TestSystemdUnits(t *testing.T) {
	for file, keyEnv := range units {
		t.Run(filepath.Base(file), func(t *testing.T) {
			b, err := os.ReadFile(file)
			require.NoError(t, err)
			text := string(b)
			lines := strings.Split(text, "\n")
			for _, h := range hardening {
				require.True(t, slices.Contains(lines, h), "missing %s", h)
			}
			cred := regexp.MustCompile(`(?m)^LoadCredential=([a-z-]+):/etc/arap/[a-z-]+$`).FindStringSubmatch(text)
			require.NotNil(t, cred, "no LoadCredential for the master key")
			require.Contains(t, lines, "Environment="+keyEnv+"=%d/"+cred[1])
			require.NotRegexp(t, `(?m)^Environment=.*ARAP_(PEP_)?MASTER_KEY=`, text, "a key in the environment")
			proc := map[string]string{"ARAP_MASTER_KEY_FILE": "serve", "ARAP_PEP_MASTER_KEY_FILE": "mcp"}[keyEnv]
			require.Contains(t, lines, "ExecStart=/usr/local/bin/arapd "+proc)

			analyze, err := exec.LookPath("systemd-analyze")
			if err != nil {
				t.Log("systemd-analyze not installed: syntax not verified")
				return
			}
			// verify wants ExecStart's binary to exist: point it at one.
			self, err := os.Executable()
			require.NoError(t, err)
			dir := t.TempDir()
			unit := filepath.Join(dir, filepath.Base(file))
			require.NoError(t, os.WriteFile(unit, []byte(strings.ReplaceAll(text, "/usr/local/bin/arapd", self)), 0o644))
			out, err := exec.Command(analyze, "verify", unit).CombinedOutput()
			require.NoError(t, err, "%s", out)
			// verify prints warnings (unknown directives, bad values) and
			// still exits 0 for many of them.
			for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
				if l != "" && !slices.ContainsFunc([]string{"Failed to connect", "bus", "not running"}, func(s string) bool { return strings.Contains(l, s) }) {
					require.Failf(t, "systemd-analyze verify", "%s", out)
				}
			}
		})
	}
}

// TestSecretsAreIgnored (issue 38): the files the Compose steps make,
// master keys in deploy/secrets/ and the token in deploy/.env, are never
// committed by accident.
func TestSecretsAreIgnored(t *testing.T) {
	if _, err := exec.LookPath("git"); err != nil {
		t.Skip("git is not installed")
	}
	for _, f := range []string{"secrets/master-key", "secrets/pep-master-key", ".env"} {
		out, err := exec.Command("git", "check-ignore", "-q", f).CombinedOutput()
		require.NoError(t, err, "deploy/%s is not git-ignored: %s", f, out)
	}
}

// TestStartingPolicyCases: the starting policy the manifests and Compose
// mount decides as its cases file says (arapctl policy test).
func TestStartingPolicyCases(t *testing.T) {
	p, err := evaluation.LoadFile("k8s/base/policy.yaml")
	require.NoError(t, err)
	raw, err := os.ReadFile("k8s/base/policy-cases.yaml")
	require.NoError(t, err)
	cases, err := evaluation.ParseCases("policy-cases.yaml", raw)
	require.NoError(t, err)
	require.NotEmpty(t, cases)
	outcomes, err := evaluation.RunCases(context.Background(), p, cases)
	require.NoError(t, err)
	for _, o := range outcomes {
		require.Empty(t, o.Diffs, "case %q (line %d)", o.Case.Name, o.Case.Line)
	}
	for _, f := range evaluation.Check(p, evaluation.CheckEnv{}) {
		require.True(t, f.Note, "policy.yaml:%d: %s", f.Line, f.Message)
	}
}
