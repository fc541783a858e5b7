package notify_test

import (
	"context"
	"html/template"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/clients"
	"github.com/omcp/arap/internal/backendtest"
	"github.com/omcp/arap/internal/mailsink"
	"github.com/omcp/arap/internal/summary"
	"github.com/omcp/arap/requests"
)

// markupPolicy puts <, &, " and ' in everything of a rule a message shows
// (its title and description) and names a client with them, whose vote
// puts them in a message's lead line.
const markupPolicy = `version: 1
rules:
  - name: markup
    match: {resource_type: mcp_tool}
    effect: request
    display:
      title: 'Title <h1>&"''t'
      description: 'Why <i>&"''w'
    approval:
      quorum: 2
      groups: [treasury]
      clients: ['<c>&"''q']
`

// markup is a request whose tool name, subject, agent, argument names and
// values (one line, a block, a name with a hidden character, which the
// warning names) all carry <, & and quotes.
func markup() map[string]any {
	return map[string]any{
		"subject": map[string]any{"type": "user", "id": `s<u>&"'s`, "properties": map[string]any{"act": map[string]any{"sub": `agent:<a>&"'a`}}},
		"action":  map[string]any{"name": "tools/call"},
		"resource": map[string]any{"type": "mcp_tool", "id": `tool<b>&"'x`, "properties": map[string]any{"arguments": map[string]any{
			`name<n>&"'n`:         `value<v>&"'v`,
			`block`:               map[string]any{"k": `nested<j>&'j`},
			"hid\u202eden<h>&\"'": "x",
		}}},
	}
}

// shown is each value of markup() and markupPolicy as a message shows it
// (the plain-text part writes it as it is): the e-mail's HTML part must
// hold each escaped and none raw.
var shown = []string{
	`Title <h1>&"'t`, `Why <i>&"'w`, `user s<u>&"'s`, `agent:<a>&"'a`, `tool<b>&"'x`,
	`name<n>&"'n`, `value<v>&"'v`, `"k": "nested<j>&'j"`,
}

// TestMarkupEscapedInHTML: <, &, " and ' in the tool name, the subject, the
// agent, every argument name and value, the policy's title and description,
// a hidden-character warning's place and the lead line come out escaped in
// the HTML part (each a literal text, never markup) and as they are in the
// plain-text part and the subject.
func TestMarkupEscapedInHTML(t *testing.T) {
	sink := startSink(t)
	env := backendtest.Start(t, backendtest.Options{Mail: mailTo(sink), Policy: []byte(markupPolicy)})
	ctx := context.Background()
	id := env.Submit(t, markup())

	check := func(m mailsink.Message, values ...string) {
		t.Helper()
		for _, v := range values {
			require.Contains(t, m.Text, v, "the plain-text part shows %q as it is", v)
			require.Contains(t, m.HTML, template.HTMLEscapeString(v), "the HTML part shows %q escaped", v)
			require.NotContains(t, m.HTML, v, "the HTML part carries %q raw", v)
		}
		for _, tag := range []string{"<h1>&", "<i>&", "<u>&", "<a>&", "<b>&", "<n>&", "<v>&", "<j>&", "<h>&", "<c>&"} {
			require.NotContains(t, m.HTML, tag, "raw markup in the HTML part")
		}
		require.Contains(t, m.HTML, `<title>Title &lt;h1&gt;&amp;&#34;&#39;t</title>`)
		// The name with a hidden character: its marker, then the rest
		// escaped, as the argument's name and in the warning's place.
		require.Contains(t, m.Text, "  hid<U+202E>den<h>&\"': x\n")
		require.Contains(t, m.Text, "in argument “hid<U+202E>den<h>&\"'” (in its name)\n")
		require.Equal(t, 2, strings.Count(m.HTML, `U+202E</mark>den&lt;h&gt;&amp;&#34;&#39;`), "the name and the warning's place")
	}
	for _, m := range waitFor(t, sink, 2, about(id)) {
		require.Equal(t, `Approval needed: Title <h1>&"'t`, m.Subject)
		check(m, shown...)
		require.Contains(t, m.Text, "\nA request waits for your decision.\n")
	}

	// A client's vote that does not end the request tells the deciders,
	// its name in the lead line.
	c, _, err := clients.NewStore(env.Pool).Create(ctx, clients.New{Name: `<c>&"'q`, Scopes: []string{"decide"}, Kind: "itsm"}, "test")
	require.NoError(t, err)
	_, err = env.Backend.Requests().Decide(ctx, requests.ClientVoter(c.ID, c.Name, c.Kind), id, requests.Decision{Approve: true})
	require.NoError(t, err)
	lead := `client:<c>&"'q approved this request; it still waits for more decisions.`
	for _, m := range waitFor(t, sink, 2, func(m mailsink.Message) bool {
		return about(id)(m) && strings.HasPrefix(m.Subject, `client:<c>&"'q approved: `)
	}) {
		check(m, append([]string{lead}, shown...)...)
		require.Contains(t, m.HTML, "<p>"+template.HTMLEscapeString(lead)+"</p>")
	}
}

// TestHiddenCharactersInToolName: a hidden character in the tool's name
// (a bidi override, a zero-width space) is marked in the subject, the
// heading, the "asks to run" line and the warning of both parts, as in an
// argument; the raw character is in no part.
func TestHiddenCharactersInToolName(t *testing.T) {
	sink := startSink(t)
	env := backendtest.Start(t, backendtest.Options{Mail: mailTo(sink), Policy: []byte(`version: 1
rules:
  - name: any_tool
    match: {resource_type: mcp_tool}
    effect: request
    approval: {groups: [treasury]}
`)})
	id := env.Submit(t, map[string]any{
		"subject":  map[string]any{"type": "user", "id": "alice"},
		"action":   map[string]any{"name": "tools/call"},
		"resource": map[string]any{"type": "mcp_tool", "id": "wire\u202e_trans\u200bfer", "properties": map[string]any{"arguments": map[string]any{"to": "acct-1"}}},
	})
	const marked = "wire<U+202E>_trans<U+200B>fer"
	for _, m := range waitFor(t, sink, 2, about(id)) {
		require.Equal(t, "Approval needed: Request for "+marked, m.Subject)
		require.True(t, strings.HasPrefix(m.Text, "Request for "+marked+"\n"), "the heading: %q", m.Text)
		require.Contains(t, m.Text, "user alice asks to run "+marked+".\n")
		require.Contains(t, m.Text, "WARNING: this request contains hidden or look-alike characters")
		require.Contains(t, m.Text, "U+202E RIGHT-TO-LEFT OVERRIDE (bidirectional formatting) in the tool\n")
		require.Contains(t, m.Text, "U+200B ZERO WIDTH SPACE")
		require.Contains(t, m.HTML, "<title>Request for wire&lt;U&#43;202E&gt;_trans&lt;U&#43;200B&gt;fer</title>")
		shownTool := string(summary.Show("wire\u202e_trans\u200bfer"))
		require.Contains(t, m.HTML, `<h1>`+string(summary.Show("Request for wire\u202e_trans\u200bfer"))+`</h1>`)
		require.Contains(t, m.HTML, `asks to run <code class="tool">`+shownTool+`</code>`)
		require.Contains(t, m.HTML, "in "+string(summary.Show("the tool"))+"</li>")
		for _, c := range []string{"\u202e", "\u200b"} {
			require.NotContains(t, m.Text+m.HTML+m.Subject, c)
		}
	}
}
