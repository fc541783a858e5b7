// The client under test of the official MCP conformance suite's client
// scenarios (npm @modelcontextprotocol/conformance, `client --command`):
// it maps the scenario to `arapctl mcp` commands and nothing else, so every
// request the scenario's server sees comes from arapctl. The suite appends
// the server URL as the last argument and names the scenario in
// MCP_CONFORMANCE_SCENARIO (tool arguments, when it gives any, in
// MCP_CONFORMANCE_CONTEXT). ARAPCTL is the arapctl binary. Run by
// e2e/official_client_conformance_test.go.
import { spawnSync } from "node:child_process";
import { tmpdir } from "node:os";
import { join } from "node:path";

const url = process.argv[process.argv.length - 1];
const scenario = process.env.MCP_CONFORMANCE_SCENARIO ?? "";
const context = JSON.parse(process.env.MCP_CONFORMANCE_CONTEXT ?? "{}");
const arapctl = process.env.ARAPCTL;
if (!arapctl) {
  console.error("ARAPCTL (the arapctl binary) is not set");
  process.exit(2);
}

// mcp runs one arapctl mcp command against the scenario's server; the
// token is a placeholder, these servers ask for none. With oauth, no token:
// arapctl signs in as the MCP authorization specification says (the auth
// scenarios), as a pre-registered client when the scenario gives one.
function mcp(args, { mayFail = false, oauth = false } = {}) {
  const env = { ...process.env, ARAP_MCP_TOKEN: "conformance" };
  if (oauth) {
    delete env.ARAP_MCP_TOKEN;
    if (context.client_secret) env.ARAP_MCP_CLIENT_SECRET = context.client_secret;
    args = [...args, "--oauth-store", oauthStore, "--redirect-url", "http://localhost:3000/callback",
      "--client-metadata-url", "https://conformance-test.local/client-metadata.json"];
    if (context.client_id) args.push("--client-id", context.client_id);
  }
  const r = spawnSync(arapctl, ["mcp", ...args, "--url", url], {
    env,
    encoding: "utf8",
    timeout: 20000,
  });
  process.stdout.write(r.stdout ?? "");
  process.stderr.write(r.stderr ?? "");
  if (r.status !== 0 && !mayFail) {
    console.error(`arapctl mcp ${args.join(" ")}: exit ${r.status}`);
    process.exit(1);
  }
  return r;
}

const state = join(tmpdir(), `arapctl-conformance-${process.pid}.json`);
const oauthStore = join(tmpdir(), `arapctl-conformance-oauth-${process.pid}.json`);
const call = (tool, args, opts) =>
  mcp(["call", tool, "--args", JSON.stringify(args ?? {}), "--state", state, ...(opts?.input ?? [])], opts);

switch (scenario) {
  case "tools_call":
    call("add_numbers", { a: 2, b: 3 });
    break;
  case "request-metadata":
    // the server refuses the first request with -32022; arapctl retries
    call("any_tool", {});
    break;
  case "sep-2322-client-request-state":
    call("test_mrtr_echo_state", {}, { input: ["--input", "confirmed=true"] });
    call("test_mrtr_unrelated", {});
    call("test_mrtr_no_state", {}, { input: ["--input", "confirmed=true"] });
    call("test_mrtr_no_result_type", {});
    break;
  case "http-standard-headers":
    call("test_headers", {});
    call("my-hyphenated-tool", {});
    break;
  case "http-custom-headers":
    for (const c of context.toolCalls ?? []) call(c.name, c.arguments);
    break;
  case "http-invalid-tool-headers": {
    call("valid_tool", { region: "us-west1" });
    // arapctl must refuse each of these without calling it
    for (const t of [
      "invalid_empty_header", "invalid_object_header", "invalid_array_header", "invalid_null_header",
      "invalid_number_header", "invalid_duplicate_same_case", "invalid_duplicate_diff_case",
      "invalid_space_in_name", "invalid_colon_in_name", "invalid_non_ascii_name", "invalid_control_char_name",
    ]) {
      const r = call(t, {}, { mayFail: true });
      if (r.status === 0) {
        console.error(`arapctl called ${t}, whose x-mcp-header is invalid`);
        process.exit(1);
      }
    }
    break;
  }
  case "json-schema-ref-no-deref":
    mcp(["tools"]);
    break;
  case "json-schema-2020-12-preservation": {
    const tools = JSON.parse(mcp(["tools", "--json"]).stdout);
    const focal = tools.find((t) => t.name === "json_schema_2020_12_tool");
    call("json_schema_echo", { schema: focal.inputSchema });
    break;
  }
  default:
    if (scenario.startsWith("auth/")) {
      // As an MCP client signs in: list the tools, then call one, each an
      // arapctl run of its own (the second starts from the stored tokens).
      mcp(["tools"], { oauth: true });
      call("test-tool", {}, { oauth: true });
      break;
    }
    // the others: one plain call, which shows what arapctl does
    call("test_tool", {}, { mayFail: true });
    process.exit(1);
}
