package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/arapclient"
	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/clients"
	"github.com/omcp/arap/directory"
	"github.com/omcp/arap/internal/backendtest"
	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/internal/dev"
	"github.com/omcp/arap/signing"
)

func TestMain(m *testing.M) {
	if os.Getenv(mainEnv) != "" { // a child of arapctlMain
		os.Args = append([]string{"arapctl"}, os.Args[1:]...)
		main()
		os.Exit(0)
	}
	dbtest.Main(m)
}

// ctl runs arapctl and returns what it wrote to standard output.
func ctl(t *testing.T, args ...string) (string, error) {
	t.Helper()
	out, _, err := ctlNotes(t, args...)
	return out, err
}

// ctlNotes runs arapctl and returns its standard output and its notes
// (standard error, less the error main prints).
func ctlNotes(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	var out, note bytes.Buffer
	err := run(args, streams{out: &out, note: &note})
	return out.String(), note.String(), err
}

func TestClientsKeysAudit(t *testing.T) {
	url := dbtest.URL(t)
	t.Setenv("DATABASE_URL", url)
	master := make([]byte, 32)
	master[0] = 7
	t.Setenv("ARAP_MASTER_KEY", base64.StdEncoding.EncodeToString(master))
	ctx := context.Background()
	db, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	defer db.Close()

	out, err := ctl(t, "clients", "create", "--name", "pep-a", "--scope", "evaluate,request", "--kind", "automation", "--actor", "agent:*")
	require.NoError(t, err)
	token := regexp.MustCompile(`token: (\S+)`).FindStringSubmatch(out)[1]
	c, err := clients.NewStore(db).Authenticate(ctx, token)
	require.NoError(t, err)
	require.Equal(t, "pep-a", c.Name)

	_, err = ctl(t, "clients", "create", "--name", "bad", "--scope", "root")
	require.ErrorContains(t, err, `unknown scope "root"`)

	out, err = ctl(t, "clients", "list")
	require.NoError(t, err)
	require.Contains(t, out, "pep-a")
	require.Contains(t, out, "evaluate,request")
	require.NotContains(t, out, token, "tokens are never listed")

	_, err = ctl(t, "clients", "revoke", "pep-a")
	require.NoError(t, err)
	_, err = clients.NewStore(db).Authenticate(ctx, token)
	require.ErrorIs(t, err, clients.ErrUnauthenticated)
	_, err = ctl(t, "clients", "revoke", "nobody")
	require.ErrorIs(t, err, clients.ErrNotFound)

	_, err = signing.Open(ctx, db, signing.Options{MasterKey: master})
	require.NoError(t, err)
	out, err = ctl(t, "keys", "rotate")
	require.NoError(t, err)
	require.Contains(t, out, "new signing key")
	out, err = ctl(t, "keys", "list")
	require.NoError(t, err)
	require.Contains(t, out, "signing")
	require.Contains(t, out, "verify-only until")

	out, err = ctl(t, "audit", "verify")
	require.NoError(t, err)
	require.Contains(t, out, "all intact")
	out, err = ctl(t, "audit", "export")
	require.NoError(t, err)
	require.Len(t, strings.Split(strings.TrimSpace(out), "\n"), 3, "client created, client revoked, key rotated")

	// The last event removed breaks no link; the chain's head tells.
	_, err = db.Exec(ctx, `DELETE FROM arap.audit_events WHERE chain = 'system' AND seq = 3`)
	require.NoError(t, err)
	out, err = ctl(t, "audit", "verify")
	require.Error(t, err)
	require.Contains(t, out, "BROKEN: chain system: seq 3: missing: the chain ends at seq 2 but its head records seq 3")

	_, err = db.Exec(ctx, `UPDATE arap.audit_events SET actor = 'operator:mallory' WHERE seq = 2`)
	require.NoError(t, err)
	out, err = ctl(t, "audit", "verify")
	require.Error(t, err)
	require.Contains(t, out, "BROKEN: chain system: event seq 2")
}

func TestUsage(t *testing.T) {
	_, err := ctl(t, "frobnicate", "now")
	var ue usageError
	require.ErrorAs(t, err, &ue)
	t.Setenv("DATABASE_URL", "")
	_, err = ctl(t, "clients", "list")
	require.ErrorContains(t, err, "DATABASE_URL")
}

func TestUsersGroupsAttributes(t *testing.T) {
	url := dbtest.URL(t)
	t.Setenv("DATABASE_URL", url)
	ctx := context.Background()
	db, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	defer db.Close()

	stdin = strings.NewReader("correct horse battery\n")
	_, err = ctl(t, "users", "create", "--name", "zoe", "--email", "Zoe@Example.com", "--password-stdin")
	require.NoError(t, err)
	_, err = ctl(t, "groups", "create", "treasury")
	require.NoError(t, err)
	_, err = ctl(t, "groups", "add", "treasury", "zoe")
	require.NoError(t, err)
	_, err = ctl(t, "groups", "add", "treasury", "nobody")
	require.ErrorContains(t, err, "nobody")
	out, err := ctl(t, "users", "list")
	require.NoError(t, err)
	require.Contains(t, out, "zoe@example.com")
	require.Contains(t, out, "treasury")
	u, err := directory.NewStore(db).CheckPassword(ctx, "zoe", "correct horse battery")
	require.NoError(t, err)
	require.Equal(t, []string{"treasury"}, u.Groups)
	out, err = ctl(t, "groups", "list")
	require.NoError(t, err)
	require.Equal(t, "treasury: zoe\n", out)
	_, err = ctl(t, "users", "disable", "zoe")
	require.NoError(t, err)
	_, err = directory.NewStore(db).CheckPassword(ctx, "zoe", "correct horse battery")
	require.ErrorIs(t, err, directory.ErrUserDisabled)

	_, err = ctl(t, "attributes", "set", "change_freeze", "true")
	require.NoError(t, err)
	_, err = ctl(t, "attributes", "set", "risk_level", "high")
	require.NoError(t, err)
	out, err = ctl(t, "attributes", "list")
	require.NoError(t, err)
	require.JSONEq(t, `{"change_freeze": true, "risk_level": "high"}`, out)
	_, err = ctl(t, "attributes", "unset", "risk_level")
	require.NoError(t, err)
	out, err = ctl(t, "attributes", "list")
	require.NoError(t, err)
	require.JSONEq(t, `{"change_freeze": true}`, out)
}

func TestDecisionCommands(t *testing.T) {
	env := backendtest.Start(t, backendtest.Options{})
	t.Setenv("ARAP_URL", env.URL)
	t.Setenv("ARAP_TOKEN", dev.ITSMToken)
	id := submitWire(t, env.URL)

	out, err := ctl(t, "requests", "list")
	require.NoError(t, err)
	require.Contains(t, out, id)
	require.Contains(t, out, "wire_transfer_large")
	out, err = ctl(t, "requests", "show", id)
	require.NoError(t, err)
	require.Contains(t, out, `"amount": 50000`)
	out, err = ctl(t, "requests", "approve", id, "--reason", "CHG-1")
	require.NoError(t, err)
	require.Contains(t, out, id+": approved (approvals 1/1)")
	_, err = ctl(t, "requests", "deny", id)
	require.ErrorContains(t, err, "already approved")
	out, err = ctl(t, "approvals", "revoke", id, "--reason", "oops")
	require.NoError(t, err)
	require.Contains(t, out, "revoked")

	id2 := submitWire(t, env.URL)
	out, err = ctl(t, "requests", "deny", id2, "--reason", "no")
	require.NoError(t, err)
	require.Contains(t, out, "denied")
	t.Setenv("ARAP_TOKEN", dev.ResolverToken)
	_, err = ctl(t, "requests", "show", id2)
	require.ErrorContains(t, err, "unknown_task")

	// On a person's behalf: the dev ITSM client records carol's approval;
	// the resolver, without decide_for_people, cannot; nor can the
	// requester approve her own request through it.
	id3 := submitWire(t, env.URL)
	_, err = ctl(t, "requests", "approve", id3, "--on-behalf-of", "carol")
	require.ErrorContains(t, err, "insufficient_scope")
	t.Setenv("ARAP_TOKEN", dev.ITSMToken)
	_, err = ctl(t, "requests", "approve", id3, "--on-behalf-of", "alice")
	require.ErrorContains(t, err, "ineligible_approver")
	_, err = ctl(t, "requests", "deny", id3, "--on-behalf-of", "nobody")
	require.ErrorContains(t, err, "unknown_person")
	out, err = ctl(t, "requests", "approve", id3, "--on-behalf-of", "carol", "--reason", "CHG-2")
	require.NoError(t, err)
	require.Contains(t, out, id3+": approved (approvals 1/1)")
	out, err = ctl(t, "requests", "show", id3)
	require.NoError(t, err)
	require.Contains(t, out, `"voter": "user:carol"`)
	require.Contains(t, out, `"channel": "on_behalf"`)
	require.Contains(t, out, `"client": "dev-itsm"`)

	// An operator grants the scope to an ITSM client; it records bob's
	// denial of a fourth request.
	t.Setenv("DATABASE_URL", env.DBURL)
	out, err = ctl(t, "clients", "create", "--name", "servicenow", "--scope", "decide,decide_for_people", "--kind", "itsm")
	require.NoError(t, err)
	t.Setenv("ARAP_TOKEN", regexp.MustCompile(`token: (\S+)`).FindStringSubmatch(out)[1])
	id4 := submitWire(t, env.URL)
	out, err = ctl(t, "requests", "deny", id4, "--on-behalf-of", "bob")
	require.NoError(t, err)
	require.Contains(t, out, id4+": denied")

	t.Setenv("ARAP_TOKEN", dev.PEPToken)
	out, err = ctl(t, "deliveries", "list", id2)
	require.NoError(t, err)
	require.Contains(t, out, "DELIVERY", "no callback registered: an empty table")
	_, err = ctl(t, "deliveries", "redeliver", id2, "msg_nope")
	require.ErrorContains(t, err, "no such delivery")
}

// submitWire evaluates and submits a wire_transfer of 50000 as the dev PEP.
func submitWire(t *testing.T, base string) string {
	t.Helper()
	call := map[string]any{
		"subject":  map[string]any{"type": "user", "id": "alice"},
		"action":   map[string]any{"name": "tools/call"},
		"resource": map[string]any{"type": "mcp_tool", "id": "wire_transfer", "properties": map[string]any{"arguments": map[string]any{"to": "acct-991", "amount": 50000}}},
	}
	return submitCall(t, base, call)
}

// submitCall evaluates call as the dev PEP and submits the access request
// its requestable denial offers, through the client library.
func submitCall(t *testing.T, base string, call map[string]any) string {
	t.Helper()
	c := &arapclient.Client{BaseURL: base, Token: dev.PEPToken}
	ev := authzen.EvaluationRequest{Subject: call["subject"].(map[string]any), Action: call["action"].(map[string]any), Resource: call["resource"].(map[string]any)}
	d, err := c.Evaluate(context.Background(), ev)
	require.NoError(t, err)
	ar, ok := arapclient.Requestable(ev, d)
	require.True(t, ok, "requestable: %+v", d)
	resp, err := c.Submit(context.Background(), ar, arapclient.SubmitOptions{})
	require.NoError(t, err)
	return resp.Task.ID
}

// TestShowMarksHiddenCharacters: `requests show` never prints a character a
// person could not see: it warns and prints markers in their place; with
// --json the exact data comes out with such characters escaped.
func TestShowMarksHiddenCharacters(t *testing.T) {
	env := backendtest.Start(t, backendtest.Options{Policy: []byte(`version: 1
rules:
  - name: expense
    match: {resource_id: expense}
    effect: request
    approval: {kinds: [itsm]}
`)})
	t.Setenv("ARAP_URL", env.URL)
	t.Setenv("ARAP_TOKEN", dev.ITSMToken)
	call := map[string]any{
		"subject":  map[string]any{"type": "user", "id": "alice"},
		"action":   map[string]any{"name": "tools/call"},
		"resource": map[string]any{"type": "mcp_tool", "id": "expense", "properties": map[string]any{"arguments": map[string]any{"to": "acct-\u202e199\u202c", "n\u200bote": "p\u0430y"}}},
	}
	id := submitCall(t, env.URL, call)

	out, err := ctl(t, "requests", "show", id)
	require.NoError(t, err)
	require.True(t, strings.HasPrefix(out, "WARNING: this request contains hidden or look-alike characters"), out)
	for _, want := range []string{
		"U+202E RIGHT-TO-LEFT OVERRIDE (bidirectional formatting) at /resource/properties/arguments/to",
		"U+200B ZERO WIDTH SPACE (invisible character) at /resource/properties/arguments/n<U+200B>ote (in the member name)",
		"U+0430 CYRILLIC SMALL LETTER A",
		`"to": "acct-<U+202E>199<U+202C>"`,
		`"n<U+200B>ote": "p<U+0430>y"`,
	} {
		require.Contains(t, out, want)
	}
	for _, raw := range []string{"\u202e", "\u202c", "\u200b", "\u0430"} {
		require.NotContains(t, out, raw, "no raw %U in what a person reads", []rune(raw)[0])
	}

	out, err = ctl(t, "requests", "show", id, "--json")
	require.NoError(t, err)
	require.Contains(t, out, `"to": "acct-\u202e199\u202c"`, "escaped, not raw")
	for _, raw := range []string{"\u202e", "\u202c", "\u200b"} {
		require.NotContains(t, out, raw)
	}
	var v map[string]any
	require.NoError(t, json.Unmarshal([]byte(out), &v), "still exact JSON")
	require.Equal(t, "acct-\u202e199\u202c", v["resource"].(map[string]any)["properties"].(map[string]any)["arguments"].(map[string]any)["to"])

	out, err = ctl(t, "requests", "list")
	require.NoError(t, err)
	require.Contains(t, out, "HIDDEN CHARACTERS")
	require.Contains(t, out, "4 (requests show "+id+")")
}

// TestKeysResealCheck: --check fails, naming the column, while a value is
// sealed under a previous key; keys reseal moves it; --check then passes
// with the new key alone.
func TestKeysResealCheck(t *testing.T) {
	url := dbtest.URL(t)
	t.Setenv("DATABASE_URL", url)
	ctx := context.Background()
	db, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	defer db.Close()
	oldKey, newKey := bytes.Repeat([]byte{3}, 32), bytes.Repeat([]byte{4}, 32)
	_, err = signing.Open(ctx, db, signing.Options{MasterKey: oldKey}) // seals its signing key under oldKey
	require.NoError(t, err)

	t.Setenv("ARAP_MASTER_KEY", base64.StdEncoding.EncodeToString(newKey))
	t.Setenv("ARAP_MASTER_KEY_PREVIOUS", base64.StdEncoding.EncodeToString(oldKey))
	out, err := ctl(t, "keys", "reseal", "--check")
	require.ErrorContains(t, err, "do not retire the previous keys yet")
	require.Contains(t, out, "arap.signing_keys.private_key: 1 values, 1 not under key")

	out, err = ctl(t, "keys", "reseal")
	require.NoError(t, err)
	require.Contains(t, out, "arap.signing_keys.private_key: 1 values, 1 re-sealed")

	t.Setenv("ARAP_MASTER_KEY_PREVIOUS", "")
	out, err = ctl(t, "keys", "reseal", "--check")
	require.NoError(t, err)
	require.Contains(t, out, "the previous keys can be retired")
}
