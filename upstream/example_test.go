package upstream_test

import (
	"fmt"
	"os"

	"github.com/omcp/arap/upstream"
)

// An upstreams file: one streamable HTTP server with the gateway's own
// token, one stdio server limited to two tools, one of them task-required.
func ExampleParse() {
	os.Setenv("BILLING_MCP_TOKEN", "example-token")
	cfg, err := upstream.Parse("upstreams.yaml", []byte(`
upstreams:
  - name: billing
    http:
      url: https://billing.internal.example/mcp
    credentials: {env: BILLING_MCP_TOKEN}   # sent as "Authorization: Bearer ..."
    prefix: billing.
    timeouts: {connect: 5s, call: 2m}
  - name: files
    stdio:
      command: mcp-server-filesystem
      args: [/srv/share]
    tools:
      include: [read_text_file, write_file]
      task_required: [write_file]
`))
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, u := range cfg.Upstreams {
		fmt.Println(u.Name, u.Prefix, u.Call, u.Credentials)
	}
	_, err = upstream.Parse("upstreams.yaml", []byte("upstreams:\n  - name: files\n    stdio: {command: x}\n    prefix: \"fs/\"\n"))
	fmt.Println(err)
	// Output:
	// billing billing. 2m0s credentials from env BILLING_MCP_TOKEN (redacted)
	// files  1m0s <nil>
	// upstreams upstreams.yaml: 1 problem(s)
	//   upstreams.yaml:4: upstream "files": prefix "fs/" has characters not allowed in MCP tool names ('/'); allowed: A-Z a-z 0-9 _ - .
}
