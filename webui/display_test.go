package webui

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/evaluation"
	"github.com/omcp/arap/internal/visible"
	"github.com/omcp/arap/requests"
)

// classes has one string per class visible reports (its test table).
var classes = []struct{ in, code string }{
	{"acct-\u202e199", "U+202E"}, {"acct-199\u202c", "U+202C"}, {"a\u2066b", "U+2066"}, {"a\u2069b", "U+2069"},
	{"a\u202ab", "U+202A"}, {"a\u200eb", "U+200E"}, {"a\u061cb", "U+061C"}, {"ac\u200bct", "U+200B"},
	{"a\u200db", "U+200D"}, {"a\u2060b", "U+2060"}, {"a\ufeffb", "U+FEFF"}, {"a\u00adb", "U+00AD"},
	{"a\u034fb", "U+034F"}, {"a\ufe0fb", "U+FE0F"}, {"a\U000e0041b", "U+E0041"}, {"a\u3164b", "U+3164"},
	{"a\x00b", "U+0000"}, {"a\tb", "U+0009"}, {"a\nb", "U+000A"}, {"a\x1bb", "U+001B"}, {"a\u0085b", "U+0085"},
	{"a\u2028b", "U+2028"}, {"a\u00a0b", "U+00A0"}, {"a\u3000b", "U+3000"}, {"a\ue000b", "U+E000"},
	{"a\U000f0000b", "U+F0000"}, {"a\U000e0080b", "U+E0080"}, {"a\U0003fffdb", "U+3FFFD"}, {"a\u0378b", "U+0378"},
	{"a\xffb", "0xFF"}, {"p\u0430ypal", "U+0430"}, {"\u0440aypal", "U+0440"},
	{"\uff43-123", "U+FF43"}, {"c\uff0d123", "U+FF0D"}, {"c-\uff11", "U+FF11"}, {"m\u00b2", "U+00B2"},
	{"\ufb01le", "U+FB01"}, {"\u2460", "U+2460"}, {"\uff41\u0301", "U+FF41"},
}

// raw reports the first character of page that a person could not see or
// could mistake, outside line breaks (the template's own layout).
func raw(page string) (string, bool) {
	for _, f := range visible.Scan(page, true) {
		return f.Label(), true
	}
	return "", false
}

func TestShowMarksEveryClass(t *testing.T) {
	for _, c := range classes {
		outs := []string{string(show(c.in))}
		if c.in != "a\nb" { // a block shows line breaks as they are
			outs = append(outs, string(showBlock(c.in)))
		}
		for _, out := range outs {
			require.Contains(t, out, `<mark class="hidden-char" title="`+c.code, "%q", c.in)
			require.Contains(t, out, ">"+c.code+"</mark>", "%q: the marker reads as the code point", c.in)
			bad, found := raw(strings.ReplaceAll(out, "\n", ""))
			require.False(t, found, "%q: %s written raw in %q", c.in, bad, out)
		}
		require.Contains(t, plain(c.in), "<"+c.code+">")
	}
	require.Equal(t, `<bdi class="val">acct-<mark class="hidden-char" title="U+202E RIGHT-TO-LEFT OVERRIDE: bidirectional formatting">U+202E</mark>199</bdi>`,
		string(show("acct-\u202e199")))
	require.Equal(t, `<bdi class="val">acct-991</bdi>`, string(show("acct-991")), "clean text is isolated too")
	require.Equal(t, "<pre class=\"val\" dir=\"auto\">{\n  &#34;a&#34;: 1\n}</pre>", string(showBlock("{\n  \"a\": 1\n}")), "line breaks of a block stay")
}

func TestShowEscapes(t *testing.T) {
	out := string(show(`<script>alert("x")</script> & <b>`))
	require.Equal(t, `<bdi class="val">&lt;script&gt;alert(&#34;x&#34;)&lt;/script&gt; &amp; &lt;b&gt;</bdi>`, out)
	out = string(show("\u202e<img src=x onerror=alert(1)>"))
	require.NotContains(t, out, "<img")
	require.Contains(t, out, "&lt;img")
}

// TestItemNotesEveryPlace: the warning names every place a hidden character
// is shown, requester's statements and policy text alike, and keeps the
// context the rule asked for apart from the rest.
func TestItemNotesEveryPlace(t *testing.T) {
	u := &UI{d: Deps{Now: time.Now}}
	r := &requests.Request{
		ID: "arq_x", Status: requests.Pending, Rule: "r",
		Subject:        authzen.Object{"type": "user", "id": "al\u202eice", "properties": map[string]any{"act": map[string]any{"sub": "agent:\u200bdemo"}}},
		Action:         authzen.Object{"name": "tools/call"},
		Resource:       authzen.Object{"type": "mcp_tool", "id": "wire\u2066", "properties": map[string]any{"arguments": map[string]any{"t\u200bo": "acct-\u202e199\u202c", "list": []any{"p\u0430y"}}}},
		Context:        authzen.Object{"ticket": "CHG\u00a01", "approved_by": "CF\u200bO"},
		Display:        map[string]any{"title": "Treasury\u200b", "description": "Why\ue000"},
		ApprovalPolicy: evaluation.ApprovalPolicy{Quorum: 1, DeclaredContext: []string{"ticket"}},
		ExpiresAt:      time.Now().Add(time.Hour),
	}
	votes := []requests.Vote{{Voter: "user:bob", Decision: "deny", Reason: "looks \u202eodd"}}
	it := u.item(r, votes, requests.UserVoter("carol", nil, nil))
	var got []string
	for _, n := range it.Hidden {
		got = append(got, n.Finding.Code+" in "+n.Where)
	}
	for _, want := range []string{
		"U+200B in the title (from policy)", "U+E000 in the description (from policy)", "U+2066 in the tool",
		"U+202E in the subject", "U+200B in the agent", "U+200B in argument “t\u200bo” (in its name)",
		"U+202E in argument “t\u200bo”", "U+202C in argument “t\u200bo”", "U+0430 in argument “list” › 0",
		"U+00A0 in answer “ticket”", "U+200B in extra context member “approved_by”", "U+202E in the reason of user:bob",
	} {
		require.Contains(t, got, want)
	}
	require.Equal(t, []Field{{Name: "ticket", Value: "CHG\u00a01"}}, it.Answers)
	require.Equal(t, []Field{{Name: "approved_by", Value: "CF\u200bO"}}, it.Extra)
}
