package e2e

import (
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	osexec "os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/dbtest"
)

// TestOperationsWalk follows docs/operations.md, "From the image to the
// first approved call", with the binaries the image holds instead of its
// containers (deploy.TestImage runs those): the environment compose.yaml
// gives each service, the files it mounts, and the steps' arapctl commands
// as written; then the agent's call, carol's approval through the web UI
// form, and the call's result.
func TestOperationsWalk(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../docs/operations.md")
	require.NoError(t, err)
	walk := string(doc)[strings.Index(string(doc), "## From the image to the first approved call"):]
	walk = walk[:strings.Index(walk, "\nThen: ")]

	dir := t.TempDir()
	for name, key := range map[string]string{"master-key": masterKey, "pep-master-key": pepMasterKey} {
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(key+"\n"), 0o400))
	}
	db := "DATABASE_URL=" + dbtest.URL(t)
	ctlEnv := []string{db, "ARAP_MASTER_KEY_FILE=" + filepath.Join(dir, "master-key")} // compose.yaml's arapctl service
	require.NoError(t, exec(t, []string{db}, "arapd", "migrate"))
	serve := startArapd(t, append(ctlEnv, "ARAP_ADDR=127.0.0.1:0", "ARAP_POLICY=../deploy/k8s/base/policy.yaml"), "serve")
	ctlEnv = append(ctlEnv, "ARAP_PUBLIC_URL="+serve.url())

	// Step 3, each `docker compose run --rm [-T] arapctl ...` line as written.
	var token, secret, agent string
	for _, line := range regexp.MustCompile(`(?m)^ *(?:echo '([^']*)' \| )?docker compose run --rm (?:-T )?arapctl ((?:.*\\\n)*.*)$`).FindAllStringSubmatch(walk, -1) {
		args := strings.Fields(strings.ReplaceAll(line[2], "\\\n", " "))
		for i, a := range args {
			args[i] = strings.Trim(a, "'")
			// Compose's network, translated to loopback: the front-end is
			// reached at 127.0.0.1, not at the service name mcp.
			switch args[i] {
			case "http://mcp:8481/":
				args[i] = "http://127.0.0.1:"
			case "private":
				args[i] = "loopback"
			}
		}
		if args[0] == "audit" {
			continue // after the call
		}
		cmd := osexec.Command(filepath.Join(binDir, "arapctl"), args...)
		cmd.Env = append(os.Environ(), ctlEnv...)
		cmd.Stdin = strings.NewReader(line[1] + "\n")
		out, err := cmd.CombinedOutput()
		require.NoError(t, err, "arapctl %v: %s", args, out)
		if m := regexp.MustCompile(`token: (\S+)`).FindStringSubmatch(string(out)); m != nil && args[0] == "clients" {
			token = m[1]
		} else if m != nil {
			agent = m[1]
		}
		if m := regexp.MustCompile(`(whsec_\S+)`).FindStringSubmatch(string(out)); m != nil {
			secret = m[1]
		}
	}
	require.NotEmpty(t, token, "step 3 creates the API client")
	require.NotEmpty(t, secret, "step 3 rotates its webhook secret")
	require.NotEmpty(t, agent, "step 3 creates the caller")
	require.Contains(t, walk, "ARAP_DEMO_TOOLS=true", "step 4 asks for the demo tools")

	// Step 5: the mcp service's environment, with step 4's .env.
	mcp := startArapd(t, []string{db, "ARAP_PEP_MASTER_KEY_FILE=" + filepath.Join(dir, "pep-master-key"),
		"ARAP_MCP_ADDR=127.0.0.1:0", "ARAP_BACKEND_URL=" + serve.url(), "ARAP_UPSTREAMS=../deploy/k8s/base/upstreams.yaml",
		"ARAP_BACKEND_TOKEN=" + token, "ARAP_WEBHOOK_SECRETS=" + secret, "ARAP_DEMO_TOOLS=true"}, "mcp")
	mcp.waitLog("mcp front-end started", 30e9)

	// Step 6: the agent's call, as written.
	m := regexp.MustCompile(`arapctl (mcp call .*)`).FindStringSubmatch(walk)
	require.NotNil(t, m)
	call := startArapctl(t, []string{"ARAP_MCP_TOKEN=" + agent, "ARAP_MCP_URL=" + mcp.url() + "/mcp",
		"ARAP_MCP_STATE=" + filepath.Join(dir, "tasks.json")}, strings.Fields(m[1])...)
	call.waitOutput(t, "working")

	// Step 7: carol signs in and approves the one request.
	jar, _ := cookiejar.New(nil)
	carol := &http.Client{Jar: jar}
	get := func(path string) string {
		resp, err := carol.Get(serve.url() + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		require.Equal(t, 200, resp.StatusCode, "%s: %s", path, b)
		return string(b)
	}
	post := func(path string, form url.Values) {
		resp, err := carol.PostForm(serve.url()+path, form)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, 200, resp.StatusCode, path)
	}
	csrf := regexp.MustCompile(`name="csrf" value="([^"]+)"`)
	password := regexp.MustCompile(`echo '([^']*)' \|`).FindStringSubmatch(walk)[1]
	post("/ui/login", url.Values{"csrf": {csrf.FindStringSubmatch(get("/ui/login"))[1]}, "username": {"carol"}, "password": {password}, "next": {"/ui/"}})
	id := regexp.MustCompile(`data-request="(arq_[A-Z0-9]+)"`).FindStringSubmatch(get("/ui/"))
	require.NotNil(t, id, "carol sees the request")
	page := get("/ui/requests/" + id[1])
	require.Contains(t, page, "wire_transfer")
	post("/ui/requests/"+id[1]+"/decide", url.Values{"csrf": {csrf.FindStringSubmatch(page)[1]}, "decision": {"approve"}})
	code, out := call.exit(t)
	require.Equal(t, 0, code, out)
	require.Contains(t, out, "completed")
	require.Contains(t, out, "Transfer of $50,000 to acct-991 completed")
}
