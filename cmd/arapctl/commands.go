package main

import (
	"bytes"
	"flag"
	"fmt"
	"strings"
)

// A command is one "group subcommand" of arapctl. commands lists every one,
// so the overview, each command's help, its usage line and the dispatch
// cannot disagree.
type command struct {
	name  string // "requests approve"
	args  string // what follows the name in the usage line
	brief string // one line for the overview and the help
	nargs int    // how many positional arguments it takes; -1: it checks
	// flags defines the command's own flags on fs and returns what runs
	// once they are parsed.
	flags func(fs *flag.FlagSet) action
}

// action runs a command with its positional arguments.
type action func(s streams, pos []string) error

var commands = []*command{
	{"clients create", "--name NAME --scope S[,S] [--kind KIND] [--actor PATTERN]... [--callback-prefix URL]... [--callback-network loopback|private|link-local]...",
		"create an API client; its token is printed once", 0, clientsCreate},
	{"clients list", "[--json]", "list API clients (never their tokens)", 0, clientsList},
	{"clients revoke", "NAME|ID", "revoke an API client; replicas refuse its token within 5 seconds", 1, clientsRevoke},
	{"clients secret rotate", "NAME|ID [--overlap 24h] [--master-key-file FILE]",
		"new webhook secret, printed once; the earlier ones keep signing for --overlap", 1, clientsSecretRotate},
	{"webhooks create", "NAME --client NAME|ID --url URL",
		"a named webhook target (ITSM) that rules name in notify.webhooks; the URL must pass the client's callback allow-list", 1, webhooksCreate},
	{"webhooks list", "[--json]", "list webhook targets", 0, webhooksList},
	{"webhooks delete", "NAME", "delete a webhook target; its pending deliveries fail until one of that name exists again", 1, webhooksDelete},
	{"keys rotate", "[--verify-window 192h] [--master-key-file FILE] [--master-key-previous-file FILE]", "new signing key; the old one keeps verifying for --verify-window", 0, keysRotate},
	{"keys list", "", "signing keys and their state", 0, keysList},
	{"keys reseal", "[--pep] [--check] [--master-key-file FILE] [--master-key-previous-file FILE] [--pep-master-key-file FILE] [--pep-master-key-previous-file FILE]", "re-seal every stored secret under the current master key (ARAP_MASTER_KEY; the old ones in ARAP_MASTER_KEY_PREVIOUS) while the services run; --check fails while any value is not under it", 0, keysReseal},
	{"passkeys list", "[--user NAME]", "approvers' registered passkeys: credential ids and public key fingerprints, to pin", 0, passkeysList},
	{"passkeys remove", "CREDENTIAL-ID --user NAME", "remove a person's passkey, even their last one (a lost key); recorded in the audit trail", 1, passkeysRemove},
	{"audit verify", "[--pep]", "check every hash chain of the audit trail, and every passkey-signed decision against its registered key", 0, auditVerify},
	{"audit export", "[--pep] [--out FILE] | [--since RFC3339 | --after CURSOR] [--follow [--interval 2s]] [--cursor-file FILE] [--out FILE]",
		"write the audit trail as JSON lines: from the database, chain by chain; or, with --since, --after, --follow or --cursor-file, through the API (ARAP_URL, ARAP_TOKEN with the audit scope) in stream order, --follow polling for new events", 0, auditExport},
	{"users create", "--name NAME [--display-name N] [--email E] [--password-stdin]", "create an approver or requester", 0, usersCreate},
	{"users list", "", "list users with their groups", 0, usersList},
	{"users disable", "NAME", "disable a user (they can no longer sign in or decide)", 1, usersDisable},
	{"users passwd", "NAME", "set a user's web UI password, read from standard input", 1, usersPasswd},
	{"groups create", "GROUP", "create a group", 1, groupsCreate},
	{"groups add", "GROUP USER", "add a user to a group", 2, groupsAdd},
	{"groups remove", "GROUP USER", "remove a user from a group", 2, groupsRemove},
	{"groups list", "", "list groups with their members", 0, groupsList},
	{"attributes set", "KEY VALUE", "set a fact the policy reads (VALUE is JSON if it parses, else a string); re-runs automated resolvers", 2, attributesSet},
	{"attributes unset", "KEY", "remove an attribute; re-runs automated resolvers", 1, attributesUnset},
	{"attributes list", "", "print every attribute as one JSON object", 0, attributesList},
	{"callers create", "NAME --subject ID [--subject-type user] [--actor ID]", "create an MCP caller token of the front-end, printed once", 1, callersCreate},
	{"callers revoke", "NAME", "revoke an MCP caller token", 1, callersRevoke},

	{"policy check", "FILE [--upstreams FILE] [--directory FILE]",
		"check a policy offline: it loads, and every property path its conditions read exists (tool arguments typed by the tools' input schemas), groups and users named exist", 1, policyCheck},
	{"policy test", "FILE CASES", "decide each case of CASES under the policy FILE, offline, and compare with what it expects", 2, policyTest},
	{"policy reload", "", "have the backend reload its policy file on every replica (scope admin); a file with errors is refused and the running policy stays", 0, policyReload},

	{"requests list", "[--status pending] [--rule R] [--limit N] [--json]", "requests you are named a decider of", 0, requestsList},
	{"requests show", "ID [--json]", "what a request asks, its votes and progress", 1, requestsShow},
	{"requests approve", "ID [--reason R] [--until RFC3339] [--on-behalf-of USER]", "approve a request", 1, requestsApprove},
	{"requests deny", "ID [--reason R] [--on-behalf-of USER]", "deny a request", 1, requestsDeny},
	{"approvals revoke", "ID [--reason R]", "revoke an approval before it is used", 1, approvalsRevoke},
	{"deliveries list", "REQUEST [--json]", "callback deliveries of a request and every attempt", 1, deliveriesList},
	{"deliveries redeliver", "REQUEST DELIVERY", "send a callback delivery again", 2, deliveriesRedeliver},

	{"mcp tools", "[--json]", "list the tools the server offers, with their hints (tools with invalid x-mcp-header annotations are left out, with a warning)", 0, mcpTools},
	{"mcp call", "TOOL [--arg NAME=VALUE]... [--args JSON] [--input FIELD=VALUE]... [--no-wait]",
		"call a tool; a task is printed and waited for", 1, mcpCall},
	{"mcp get", "TASK [--json]", "show a task", 1, mcpGet},
	{"mcp cancel", "TASK", "cancel a task", 1, mcpCancel},
	{"mcp wait", "[TASK]... [--input FIELD=VALUE]...", "wait for tasks; without TASK, every unfinished task this client started", -1, mcpWait},
}

// commandGroups names the first word of every command, in the order listed.
var commandGroups, groupOrder = func() (map[string]bool, []string) {
	m := map[string]bool{}
	var order []string
	for _, c := range commands {
		g, _, _ := strings.Cut(c.name, " ")
		if !m[g] {
			m[g] = true
			order = append(order, g)
		}
	}
	return m, order
}()

// Notes on what the commands of each kind need, shown in the overview and
// in the help of each command and group.
const (
	noteDatabase = `The database commands use ARAP_DATABASE_URL or DATABASE_URL (or a file
named by --database-url-file). When none is set, they use the database that
` + "`arapd dev`" + ` records in ` + devDataDir + `/` + devDatabaseURLFile + ` of the current directory, and say
so. keys rotate, keys reseal and clients secret rotate also need the master
key (ARAP_MASTER_KEY or --master-key-file; the keys it replaced, if any, in
ARAP_MASTER_KEY_PREVIOUS or --master-key-previous-file).` + noteSettings
	noteAPI = `The requests, approvals and deliveries commands call the decision API at
ARAP_URL (--url, default http://127.0.0.1:8480) with the token in ARAP_TOKEN
(or a file named by --token-file), which needs the decide scope; deliveries
need the token of the client that submitted.` + noteSettings
	noteMCP = `The mcp commands are an MCP client that speaks only the tasks extension: at
ARAP_MCP_URL (--url, default http://127.0.0.1:8481/mcp) with the caller token
in ARAP_MCP_TOKEN (or a file named by --token-file); without a token they
sign in by OAuth as the server's protected resource metadata says
(--client-id and ARAP_MCP_CLIENT_SECRET for a registered client,
--client-metadata-url, --redirect-url), keeping the tokens in
ARAP_MCP_OAUTH_STORE (--oauth-store, mode 0600). call prints the task and
waits for its result, polling as often as the server asks; unfinished task
ids are kept in ARAP_MCP_STATE (--state, default
~/.local/state/arapctl/tasks.json) so that wait resumes them after a
restart. Exit status: 0 the tool ran, 1 an error result or a failed or
cancelled task, 2 a usage error, 3 input is needed, 4 interrupted.` + noteSettings
	notePolicy = `policy check and policy test need nothing but files: no database, no key, no
server (check connects to the upstreams of --upstreams to list their tools).
policy reload asks the backend at ARAP_URL (--url) with an admin token in
ARAP_TOKEN.`
	noteSettings = `

Each of these settings is a flag, an environment variable or a key of the
config file (--config FILE, ARAP_CONFIG; one "key value" a line: url,
token-file, mcp-url, mcp-token-file, mcp-state, database-url-file,
master-key-file); a flag wins over the variable, the variable over the file.
Tokens, keys and the database URL are never flags.`
)

// note is what the commands of group need.
func note(group string) string {
	switch group {
	case "requests", "approvals", "deliveries":
		return noteAPI
	case "mcp":
		return noteMCP
	}
	return noteDatabase
}

func commandNamed(name string) *command {
	for _, c := range commands {
		if c.name == name {
			return c
		}
	}
	return nil
}

// usageLine is "usage: arapctl NAME ARGS".
func (c *command) usageLine() string {
	return strings.TrimSpace("usage: arapctl " + c.name + " " + c.args)
}

// positional names the positional arguments of the usage line.
func (c *command) positional() []string {
	var names []string
	for _, w := range strings.Fields(c.args) {
		if strings.HasPrefix(w, "-") || strings.HasPrefix(w, "[") {
			break
		}
		names = append(names, w)
	}
	return names
}

// help is `arapctl NAME --help`: the usage line, what it does, its flags,
// and what commands of its kind need.
func (c *command) help(fs *flag.FlagSet) string {
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s\n\n%s.\n", c.usageLine(), upperFirst(c.brief))
	first := true
	fs.VisitAll(func(f *flag.Flag) {
		if first {
			b.WriteString("\nflags:\n")
			first = false
		}
		typ, usage := flag.UnquoteUsage(f)
		if f.DefValue != "" && f.DefValue != "false" {
			usage += " (default " + f.DefValue + ")"
		}
		if src := sources(fs, f.Name); src != "" {
			usage += "; " + src
		}
		fmt.Fprintf(&b, "  %s\n%s", strings.TrimSpace("--"+f.Name+" "+typ), wrap("      ", usage, 80))
	})
	g, _, _ := strings.Cut(c.name, " ")
	fmt.Fprintf(&b, "\n%s\n", note(g))
	return b.String()
}

func upperFirst(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

// groupUsage is the usage lines of the commands of group.
func groupUsage(group string) string {
	var lines []string
	for _, c := range commands {
		if strings.HasPrefix(c.name, group+" ") {
			line := c.usageLine()
			if len(lines) > 0 {
				line = "       " + strings.TrimPrefix(line, "usage: ")
			}
			lines = append(lines, line)
		}
	}
	return strings.Join(lines, "\n")
}

// groupHelp is `arapctl GROUP --help`.
func groupHelp(group string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "usage: arapctl %s <subcommand> [arguments] [flags]\n\n", group)
	for _, c := range commands {
		if strings.HasPrefix(c.name, group+" ") {
			fmt.Fprintf(&b, "  %s\n      %s\n", strings.TrimSpace(c.name+" "+c.args), c.brief)
		}
	}
	fmt.Fprintf(&b, "\n%s\n\nRun \"arapctl %s <subcommand> --help\" for the flags of one.\n", note(group), group)
	return b.String()
}

// commandList is the one line a usage error without a command shows.
func commandList() string {
	return "commands: " + strings.Join(groupOrder, ", ") + " (arapctl --help lists them all)"
}

// overview is `arapctl --help`.
func overview() string {
	var b strings.Builder
	b.WriteString("usage: arapctl <command> <subcommand> [arguments] [flags]\n")
	sections := []struct {
		note   string
		groups []string
	}{
		{noteDatabase, []string{"clients", "webhooks", "keys", "passkeys", "audit", "users", "groups", "attributes", "callers"}},
		{noteAPI, []string{"requests", "approvals", "deliveries"}},
		{noteMCP, []string{"mcp"}},
		{notePolicy, []string{"policy"}},
	}
	for _, sec := range sections {
		b.WriteString("\n")
		for _, g := range sec.groups {
			for _, c := range commands {
				if strings.HasPrefix(c.name, g+" ") {
					b.WriteString(wrap("  "+c.name+" ", c.args, 80))
				}
			}
		}
		b.WriteString("\n" + sec.note + "\n")
	}
	b.WriteString("\nRun \"arapctl <command> <subcommand> --help\" for what one does and its flags.\n")
	return b.String()
}

// wrap writes head followed by text, continuing long lines indented under
// the start of text; a bracketed group ("[--kind KIND]") is never split.
func wrap(head, text string, width int) string {
	var b strings.Builder
	line := head
	indent := strings.Repeat(" ", len(head))
	for _, w := range groupsOf(text) {
		if len(line)+len(w) > width && len(line) > len(indent) {
			b.WriteString(strings.TrimRight(line, " ") + "\n")
			line = indent
		}
		line += w + " "
	}
	b.WriteString(strings.TrimRight(line, " ") + "\n")
	return b.String()
}

// groupsOf splits a usage text into words, keeping bracketed groups whole.
func groupsOf(text string) []string {
	var out []string
	depth := 0
	for _, w := range strings.Fields(text) {
		if depth > 0 {
			out[len(out)-1] += " " + w
		} else {
			out = append(out, w)
		}
		depth += strings.Count(w, "[") - strings.Count(w, "]")
	}
	return out
}
