// Command arapctl is the operator and integration CLI of arap.
//
// Administrative commands (clients, keys, audit) work on the database
// directly (DATABASE_URL), like an operator's psql session, so the first API
// client can be created before any token exists.
package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/omcp/arap/audit"
	"github.com/omcp/arap/callbacks"
	"github.com/omcp/arap/clients"
	"github.com/omcp/arap/migrations"
	"github.com/omcp/arap/pep"
	"github.com/omcp/arap/signing"
)

const usage = `usage: arapctl <command> <subcommand> [flags]

  clients create --name NAME --scope S[,S] --kind KIND [--actor PATTERN]...
                 [--callback-prefix URL]... [--callback-network loopback|private|link-local]...
  clients secret rotate NAME [--overlap 24h]   new webhook secret (needs the master key)
  clients list [--json]
  clients revoke NAME|ID
  keys rotate [--verify-window 192h]
  keys list
  audit verify [--pep]                 --pep: the MCP front-end's trail (its DATABASE_URL)
  audit export [--pep] [--out FILE]
  users create --name NAME [--display-name N] [--email E] [--password-stdin]
  users list | users disable NAME | users passwd NAME (password on stdin)
  groups create NAME | groups add GROUP USER | groups remove GROUP USER | groups list
  attributes set KEY VALUE | attributes unset KEY | attributes list
  callers create NAME --subject ID [--subject-type user] [--actor ID]   MCP caller token
  callers revoke NAME

  requests list [--status pending] [--rule R] [--limit N] [--json]
  requests show ID
  requests approve ID [--reason R] [--until RFC3339]
  requests deny ID [--reason R]
  approvals revoke ID [--reason R]
  deliveries list REQUEST              callback deliveries and every attempt
  deliveries redeliver REQUEST DELIVERY

  mcp call TOOL [--arg NAME=VALUE]... [--args JSON] [--input FIELD=VALUE]... [--no-wait]
  mcp get TASK [--json]
  mcp cancel TASK
  mcp wait [TASK] [--input FIELD=VALUE]...   no TASK: every unfinished task this client started

Administrative commands use DATABASE_URL (or --database-url); keys rotate also
needs the master key (ARAP_MASTER_KEY or --master-key-file). The requests and
approvals commands call the decision API at ARAP_URL (--url, default
http://127.0.0.1:8480) with the token in ARAP_TOKEN (--token), which needs the
decide scope; deliveries need the token of the client that submitted.

The mcp commands are an MCP client that speaks only the tasks extension: at
ARAP_MCP_URL (--url, default http://127.0.0.1:8481/mcp) with the caller token
in ARAP_MCP_TOKEN (--token). call prints the task and waits for its result,
polling as often as the server asks; unfinished task ids are kept in
ARAP_MCP_STATE (--state, default ~/.local/state/arapctl/tasks.json) so that
wait resumes them after a restart. Exit status: 0 the tool ran, 1 an error
result or a failed or cancelled task, 3 input is needed, 4 interrupted.
`

func main() {
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "arapctl:", err)
		var ue usageError
		if errors.As(err, &ue) {
			fmt.Fprint(os.Stderr, "\n"+usage)
			os.Exit(2)
		}
		var ee exitError
		if errors.As(err, &ee) {
			os.Exit(ee.code)
		}
		os.Exit(1)
	}
}

type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func run(args []string, out io.Writer) error {
	if len(args) < 2 {
		if len(args) == 1 && (args[0] == "-h" || args[0] == "help" || args[0] == "--help") {
			fmt.Fprint(out, usage)
			return nil
		}
		return usageError{"missing command"}
	}
	cmd, sub, rest := args[0], args[1], args[2:]
	switch cmd + " " + sub {
	case "clients create":
		return clientsCreate(rest, out)
	case "clients list":
		return clientsList(rest, out)
	case "clients revoke":
		return clientsRevoke(rest, out)
	case "clients secret":
		return clientsSecret(rest, out)
	case "keys rotate":
		return keysRotate(rest, out)
	case "keys list":
		return keysList(rest, out)
	case "audit verify":
		return auditVerify(rest, out)
	case "audit export":
		return auditExport(rest, out)
	case "users create", "users list", "users disable", "users passwd":
		return users(sub, rest, out)
	case "groups create", "groups add", "groups remove", "groups list":
		return groups(sub, rest, out)
	case "attributes set", "attributes unset", "attributes list":
		return attrs(sub, rest, out)
	case "callers create", "callers revoke":
		return mcpCallers(sub, rest, out)
	case "mcp call", "mcp get", "mcp cancel", "mcp wait":
		return mcpCommand(sub, rest, out)
	case "requests list", "requests show", "requests approve", "requests deny", "approvals revoke",
		"deliveries list", "deliveries redeliver":
		return decisions(cmd+" "+sub, rest, out)
	}
	return usageError{fmt.Sprintf("unknown command %q", cmd+" "+sub)}
}

// dbCommand parses the arguments of a command that works on the database
// directly (adding --database-url to fs) and connects. want is how many
// positional arguments it takes (-1: the caller checks), usage the message
// when the count is wrong. The caller closes the pool.
func dbCommand(fs *flag.FlagSet, args []string, want int, usage string) (context.Context, *pgxpool.Pool, []string, error) {
	u := fs.String("database-url", os.Getenv("DATABASE_URL"), "PostgreSQL URL (DATABASE_URL)")
	pos, err := parse(fs, args)
	if err != nil {
		return nil, nil, nil, err
	}
	if want >= 0 && len(pos) != want {
		if usage == "" && len(pos) > want {
			usage = "unexpected argument " + pos[want]
		}
		return nil, nil, nil, usageError{usage}
	}
	if *u == "" {
		return nil, nil, nil, errors.New("DATABASE_URL or --database-url is required")
	}
	ctx := context.Background()
	db, err := pgxpool.New(ctx, *u)
	if err != nil {
		return nil, nil, nil, err
	}
	return ctx, db, pos, nil
}

// operator names the person running the command, for the audit trail.
func operator() string {
	name := os.Getenv("USER")
	if name == "" {
		name = "unknown"
	}
	return "operator:" + name
}

type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(v string) error { *m = append(*m, v); return nil }

func clientsCreate(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("clients create", flag.ContinueOnError)
	name := fs.String("name", "", "client name")
	scopes := fs.String("scope", "", "comma-separated scopes: "+strings.Join(clients.AllScopes, ", "))
	kind := fs.String("kind", clients.KindAutomation, "resolver kind: "+strings.Join(clients.AllKinds, ", "))
	var actors, prefixes, networks multi
	fs.Var(&actors, "actor", "actor id pattern the client may assert (repeatable), e.g. 'agent:*'")
	fs.Var(&prefixes, "callback-prefix", "URL prefix the client may register callbacks under (repeatable)")
	fs.Var(&networks, "callback-network", "internal network its callbacks may reach: loopback, private, link-local (repeatable)")
	ctx, db, _, err := dbCommand(fs, args, 0, "")
	if err != nil {
		return err
	}
	defer db.Close()
	var sc []string
	for _, s := range strings.Split(*scopes, ",") {
		if s = strings.TrimSpace(s); s != "" {
			sc = append(sc, s)
		}
	}
	c, token, err := clients.NewStore(db).Create(ctx, clients.New{Name: *name, Scopes: sc, Kind: *kind, Actors: actors,
		CallbackPrefixes: prefixes, CallbackNetworks: networks}, operator())
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "created client %s (%s)\ntoken: %s\nThe token is shown once; store it now.\n", c.Name, c.ID, token)
	if len(prefixes) > 0 {
		fmt.Fprintln(out, "Create its webhook secret with: arapctl clients secret rotate "+c.Name)
	}
	return nil
}

func clientsList(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("clients list", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print JSON")
	ctx, db, _, err := dbCommand(fs, args, 0, "")
	if err != nil {
		return err
	}
	defer db.Close()
	list, err := clients.NewStore(db).List(ctx)
	if err != nil {
		return err
	}
	if *asJSON {
		return json.NewEncoder(out).Encode(list)
	}
	tw := tabwriter.NewWriter(out, 0, 2, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tID\tSCOPES\tKIND\tACTORS\tCREATED\tSTATUS")
	for _, c := range list {
		status := "active"
		if c.RevokedAt != nil {
			status = "revoked " + c.RevokedAt.Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", c.Name, c.ID, strings.Join(c.Scopes, ","), c.Kind,
			strings.Join(c.Actors, ","), c.CreatedAt.Format(time.RFC3339), status)
	}
	return tw.Flush()
}

func clientsRevoke(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("clients revoke", flag.ContinueOnError)
	ctx, db, pos, err := dbCommand(fs, args, 1, "clients revoke takes one client name or id")
	if err != nil {
		return err
	}
	defer db.Close()
	c, err := clients.NewStore(db).Revoke(ctx, pos[0], operator())
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "revoked client %s (%s); replicas refuse its token within 5 seconds\n", c.Name, c.ID)
	return nil
}

func keysRotate(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("keys rotate", flag.ContinueOnError)
	window := fs.Duration("verify-window", signing.DefaultVerifyWindow, "how long the retired key keeps verifying (cover the longest approval)")
	keyFile := fs.String("master-key-file", os.Getenv("ARAP_MASTER_KEY_FILE"), "file with the base64 master key (or ARAP_MASTER_KEY)")
	ctx, db, _, err := dbCommand(fs, args, 0, "")
	if err != nil {
		return err
	}
	defer db.Close()
	master, err := readMasterKey(*keyFile)
	if err != nil {
		return err
	}
	keys, err := signing.Open(ctx, db, signing.Options{MasterKey: master})
	if err != nil {
		return err
	}
	old := keys.ActiveKid()
	kid, err := keys.Rotate(ctx, *window, operator())
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "new signing key %s; %s retired, verifying until %s\n", kid, old, time.Now().Add(*window).UTC().Format(time.RFC3339))
	return nil
}

func keysList(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("keys list", flag.ContinueOnError)
	ctx, db, _, err := dbCommand(fs, args, 0, "")
	if err != nil {
		return err
	}
	defer db.Close()
	list, err := signing.List(ctx, db)
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(out, 0, 2, 2, ' ', 0)
	fmt.Fprintln(tw, "KID\tALG\tCREATED\tSTATE")
	for _, k := range list {
		state := "signing"
		switch {
		case k.RetiredAt == nil:
		case k.ExpiresAt == nil:
			state = "retired"
		case time.Now().After(*k.ExpiresAt):
			state = "expired"
		default:
			state = "verify-only until " + k.ExpiresAt.Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", k.Kid, k.Alg, k.CreatedAt.Format(time.RFC3339), state)
	}
	return tw.Flush()
}

func auditVerify(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("audit verify", flag.ContinueOnError)
	pep := fs.Bool("pep", false, "verify the MCP front-end's audit trail (schema pep) instead of the backend's")
	ctx, db, _, err := dbCommand(fs, args, 0, "")
	if err != nil {
		return err
	}
	defer db.Close()
	if *pep {
		return pepAuditVerify(ctx, db, out)
	}
	rep, err := audit.Verify(ctx, db)
	if err != nil {
		return err
	}
	if rep.OK() {
		fmt.Fprintf(out, "audit: %d chains, %d events, all intact\n", rep.Chains, rep.Events)
		return nil
	}
	for _, b := range rep.Breaks {
		fmt.Fprintln(out, "BROKEN:", b.String())
	}
	return fmt.Errorf("audit: %d of %d chains broken", len(rep.Breaks), rep.Chains)
}

// pepAuditVerify verifies the MCP front-end's trail: one chain per approval
// task, each against its recorded head.
func pepAuditVerify(ctx context.Context, db *pgxpool.Pool, out io.Writer) error {
	rep, err := pep.VerifyAudit(ctx, db)
	if err != nil {
		return err
	}
	if rep.OK() {
		fmt.Fprintf(out, "pep audit: %d chains, %d events, all intact\n", rep.Chains, rep.Events)
		return nil
	}
	for _, b := range rep.Breaks {
		fmt.Fprintln(out, "BROKEN:", b.String())
	}
	return fmt.Errorf("pep audit: %d of %d chains broken", len(rep.Breaks), rep.Chains)
}

func auditExport(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("audit export", flag.ContinueOnError)
	file := fs.String("out", "", "write to FILE instead of standard output")
	frontEnd := fs.Bool("pep", false, "export the MCP front-end's audit trail (schema pep) instead of the backend's")
	ctx, db, _, err := dbCommand(fs, args, 0, "")
	if err != nil {
		return err
	}
	defer db.Close()
	w := out
	if *file != "" {
		f, err := os.OpenFile(*file, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
		if err != nil {
			return err
		}
		defer f.Close()
		w = f
	}
	if *frontEnd {
		return pep.ExportAudit(ctx, db, w)
	}
	return audit.Export(ctx, db, w)
}

// parse parses flags that may come before or after positional arguments
// ("requests approve ID --reason R") and returns the positional ones.
func parse(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, usageError{err.Error()}
		}
		if fs.NArg() == 0 {
			return pos, nil
		}
		pos = append(pos, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

func clientsSecret(args []string, out io.Writer) error {
	if len(args) == 0 || args[0] != "rotate" {
		return usageError{"clients secret rotate NAME [--overlap 24h]"}
	}
	fs := flag.NewFlagSet("clients secret rotate", flag.ContinueOnError)
	overlap := fs.Duration("overlap", 24*time.Hour, "how long the previous secrets keep signing")
	keyFile := fs.String("master-key-file", os.Getenv("ARAP_MASTER_KEY_FILE"), "file with the base64 master key (or ARAP_MASTER_KEY)")
	ctx, db, pos, err := dbCommand(fs, args[1:], 1, "clients secret rotate takes one client name or id")
	if err != nil {
		return err
	}
	defer db.Close()
	master, err := readMasterKey(*keyFile)
	if err != nil {
		return err
	}
	c, err := clients.NewStore(db).Get(ctx, pos[0])
	if err != nil {
		return err
	}
	jobs, err := river.NewClient(riverpgxv5.New(db), &river.Config{Schema: migrations.RiverSchema})
	if err != nil {
		return err
	}
	cbs, err := callbacks.NewService(callbacks.Config{DB: db, Jobs: jobs, MasterKey: master, StatusEndpoint: func(string) string { return "" }})
	if err != nil {
		return err
	}
	secret, err := cbs.RotateSecret(ctx, c.ID, *overlap, "", operator())
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "webhook secret for %s: %s\nShown once. Earlier secrets keep signing for %s.\n", c.Name, secret, *overlap)
	return nil
}

// readMasterKey reads the base64 master key from a file or ARAP_MASTER_KEY.
func readMasterKey(file string) ([]byte, error) {
	raw := os.Getenv("ARAP_MASTER_KEY")
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, err
		}
		raw = string(b)
	}
	master, err := base64.StdEncoding.DecodeString(strings.TrimSpace(raw))
	if err != nil || len(master) != 32 {
		return nil, errors.New("the master key is needed: ARAP_MASTER_KEY or --master-key-file (base64 of 32 bytes)")
	}
	return master, nil
}

// mcpCallers manages the MCP front-end's caller tokens (schema pep).
func mcpCallers(sub string, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("callers "+sub, flag.ContinueOnError)
	subject := fs.String("subject", "", "the subject id the caller acts for, e.g. alice")
	subjectType := fs.String("subject-type", "user", "the subject type")
	actor := fs.String("actor", "", "the actor (agent) id acting for the subject, e.g. agent:demo")
	ctx, db, pos, err := dbCommand(fs, args, 1, "callers "+sub+" takes one caller name")
	if err != nil {
		return err
	}
	defer db.Close()
	c := &pep.Callers{DB: db}
	if sub == "revoke" {
		if err := c.Revoke(ctx, pos[0]); err != nil {
			return err
		}
		fmt.Fprintf(out, "revoked caller %s\n", pos[0])
		return nil
	}
	b := make([]byte, 32)
	_, _ = rand.Read(b)
	token := "mcp_" + base64.RawURLEncoding.EncodeToString(b)
	if err := c.Create(ctx, pos[0], token, pep.Principal{SubjectType: *subjectType, SubjectID: *subject, ActorID: *actor}); err != nil {
		return err
	}
	fmt.Fprintf(out, "created caller %s (acts for %s:%s through %q)\ntoken: %s\nThe token is shown once; store it now.\n", pos[0], *subjectType, *subject, *actor, token)
	return nil
}
