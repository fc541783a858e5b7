package e2e

import (
	"context"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/internal/dev"
)

// markerCheck is what the page reports about one marker.
type markerCheck struct {
	Text       string  `json:"text"`
	Title      string  `json:"title"`
	Width      float64 `json:"w"`
	Height     float64 `json:"h"`
	Display    string  `json:"display"`
	Visibility string  `json:"visibility"`
	Opacity    string  `json:"opacity"`
	Color      string  `json:"color"`
	Background string  `json:"bg"`
	FontSize   float64 `json:"fontSize"`
	Visible    bool    `json:"checkVisibility"`
	InValue    bool    `json:"inValue"`
	InText     bool    `json:"inText"`
}

// pageCheck is what the request page reports about its values.
type pageCheck struct {
	Markers []markerCheck `json:"markers"`
	// Isolation is the computed unicode-bidi of every value element.
	Isolation []string `json:"isolation"`
	Warning   string   `json:"warning"`
	Text      string   `json:"text"`
	DOM       string   `json:"dom"`
	Extra     struct {
		Open    bool   `json:"open"`
		Summary string `json:"summary"`
	} `json:"extra"`
}

const checkMarkers = `(() => {
  const text = document.body.innerText;
  const markers = Array.from(document.querySelectorAll('#arguments mark.hidden-char')).map(m => {
    const r = m.getBoundingClientRect(), cs = getComputedStyle(m);
    return {text: m.textContent, title: m.title, w: r.width, h: r.height, display: cs.display,
      visibility: cs.visibility, opacity: cs.opacity, color: cs.color, bg: cs.backgroundColor,
      fontSize: parseFloat(cs.fontSize), checkVisibility: m.checkVisibility({checkOpacity: true, checkVisibilityCSS: true}),
      inValue: !!m.closest('.val'), inText: m.innerText.length > 0 && text.includes(m.innerText)};
  });
  const extra = document.getElementById('extra-context');
  return {
    markers: markers,
    isolation: Array.from(document.querySelectorAll('main .val')).map(v => getComputedStyle(v).unicodeBidi),
    warning: document.getElementById('hidden-warning').innerText,
    text: text,
    dom: document.documentElement.outerHTML,
    extra: {open: extra.open, summary: extra.querySelector('summary').innerText},
  };
})()`

// TestBrowserShowsHiddenCharacters is issue 13's deception in a real
// browser: a request whose argument is "acct-<RLO>199<PDF>" (which renders
// as acct-991), with a zero-width space in an argument's name, a Cyrillic
// letter in a Latin word and (issue 39) an argument in fullwidth forms,
// "ｃ－１２３", beside ordinary Japanese and accented text. The approver's page must show each as a
// visible, labelled marker in the DOM text, warn at the top with the exact
// code points, isolate every value, never carry the raw override, and fold
// away the context nobody asked for. A screenshot is saved as an artifact.
func TestBrowserShowsHiddenCharacters(t *testing.T) {
	t.Parallel()
	ctx := newBrowser(t)
	d := startDev(t, dbtest.URL(t))
	base := d.p.url()

	// As the dev PEP would: evaluate, then submit. delete_repository is
	// requestable whatever its arguments hold (wire_transfer refuses them).
	call := toolCall("delete_repository", map[string]any{"repo": "acct-\u202e199\u202c", "n\u200bote": "p\u0430ypal",
		"tag": "\uff43\uff0d\uff11\uff12\uff13", "memo": "東京タワー、Zürich café"})
	call["context"] = map[string]any{"approved_by": "CFO"}
	status, dec := postJSON(t, d.api+"/access/v1/evaluation", dev.PEPToken, call)
	require.Equal(t, 200, status, "%v", dec)
	dctx := dec["context"].(map[string]any)
	hint := dctx["access_request"].(map[string]any)
	body := map[string]any{"denial": map[string]any{"evaluation_id": dctx["evaluation_id"], "expires_at": hint["expires_at"],
		"binding_token": hint["binding_token"], "reason": dctx["reason"], "template": hint["template"]}}
	for k, v := range call {
		body[k] = v
	}
	status, sub := postJSON(t, d.api+"/access/v1/requests", dev.PEPToken, body)
	require.Equal(t, 202, status, "%v", sub)
	id := sub["task"].(map[string]any)["id"].(string)

	signIn(t, ctx, base, "dave") // platform: an eligible approver
	do(t, ctx, "the queue flags the request",
		chromedp.WaitVisible(`//li[@data-request="`+id+`"]//span[contains(@class,"hidden-badge")]`))
	do(t, ctx, "open the request", chromedp.Navigate(base+"/ui/requests/"+id), chromedp.WaitVisible(chromedp.ID("hidden-warning")))
	got, err := chromedp.Run(ctx, chromedp.Evaluate[pageCheck](checkMarkers))
	require.NoError(t, err)

	for _, r := range []string{"\u202e", "\u202c", "\u200b", "\u0430", "\uff43", "\uff0d", "\uff11", "\uff12", "\uff13"} {
		require.NotContains(t, got.Text, r, "the rendered text holds no raw %U", []rune(r)[0])
		require.NotContains(t, got.DOM, r, "the DOM holds no raw %U", []rune(r)[0])
	}
	var texts []string
	for _, m := range got.Markers {
		texts = append(texts, m.Text)
		require.True(t, m.InValue, "%s: inside an isolated value", m.Text)
		require.True(t, m.InText, "%s: in the page's rendered text", m.Text)
		require.True(t, m.Width > 0 && m.Height > 0, "%s: has a box: %+v", m.Text, m)
		require.True(t, m.Visible, "%s: checkVisibility: %+v", m.Text, m)
		require.NotEqual(t, "none", m.Display)
		require.Equal(t, "visible", m.Visibility)
		require.Equal(t, "1", m.Opacity)
		require.GreaterOrEqual(t, m.FontSize, 8.0, "%s: readable", m.Text)
		require.NotEqual(t, m.Color, m.Background, "%s: text distinct from its background", m.Text)
		require.NotContains(t, []string{"rgba(0, 0, 0, 0)", "transparent"}, m.Color)
		require.NotContains(t, []string{"rgba(0, 0, 0, 0)", "transparent"}, m.Background, "%s: highlighted", m.Text)
		require.Contains(t, m.Title, m.Text+" ", "labelled with its name")
	}
	require.ElementsMatch(t, []string{"U+202E", "U+202C", "U+200B", "U+0430", "U+FF43", "U+FF0D", "U+FF11", "U+FF12", "U+FF13"}, texts)

	require.NotEmpty(t, got.Isolation)
	for _, b := range got.Isolation {
		require.Contains(t, []string{"isolate", "isolate-override", "plaintext"}, b, "every value is a bidi isolate")
	}
	for _, want := range []string{"This request contains hidden or look-alike characters",
		"U+202E RIGHT-TO-LEFT OVERRIDE", "U+202C POP DIRECTIONAL FORMATTING", "U+200B ZERO WIDTH SPACE", "U+0430 CYRILLIC SMALL LETTER A",
		"U+FF43 FULLWIDTH LATIN SMALL LETTER C (NFKC “c”) (compatibility character) in argument “tag”",
		"U+FF0D FULLWIDTH HYPHEN-MINUS", "U+FF11 FULLWIDTH DIGIT ONE", "U+FF12 FULLWIDTH DIGIT TWO", "U+FF13 FULLWIDTH DIGIT THREE"} {
		require.Contains(t, strings.Join(strings.Fields(got.Warning), " "), want)
	}
	require.Contains(t, got.Text, "acct-U+202E199U+202C", "the reader sees the characters' places")
	require.Contains(t, got.Text, "U+FF43U+FF0DU+FF11U+FF12U+FF13", "each fullwidth character is marked in its place")
	require.Contains(t, got.Text, "東京タワー、Zürich café", "ordinary Japanese and accented text is shown as it is")
	require.NotContains(t, got.Warning, "memo", "and is no finding")
	require.False(t, got.Extra.Open, "context nobody asked for is folded away")
	require.Equal(t, "Extra, not asked for, not checked (1)", got.Extra.Summary)
	require.Contains(t, got.Text, "Stated by the requester")
	require.Contains(t, got.Text, "From policy, not from the requester.")

	path := saveArtifact(t, ctx, "request-hidden-characters.png")
	t.Logf("screenshot: %s", path)
	checkPage(t, ctx, "request with hidden characters")
}

// TestMCPRefusesHiddenCharactersInTransfers: through the MCP front-end, a
// wire_transfer whose beneficiary holds a right-to-left override (or a
// zero-width space, a Cyrillic look-alike, or fullwidth forms) is refused
// outright by the dev policy: a plain denial, no task, no request for
// anyone to approve, and nothing runs.
func TestMCPRefusesHiddenCharactersInTransfers(t *testing.T) {
	t.Parallel()
	s := newStack(t, stackOptions{})
	alice := s.client(s.alice)
	ctx := context.Background()
	for _, to := range []string{"acct-\u202e199\u202c", "acct\u200b-991", "p\u0430ypal", "\uff43\uff0d\uff11\uff12\uff13"} {
		for _, amount := range []float64{100, 50000} {
			r, err := alice.CallTool(ctx, "wire_transfer", map[string]any{"to": to, "amount": amount}, nil)
			require.NoError(t, err)
			require.True(t, r.IsError, "%q %v: %s", to, amount, r.Raw)
			require.Nil(t, r.Task, "no task: nothing to approve")
			require.Contains(t, string(r.Raw), "not allowed by policy")

			status, d := postJSON(t, s.api+"/access/v1/evaluation", s.pepToken, toolCall("wire_transfer", map[string]any{"to": to, "amount": amount}))
			require.Equal(t, 200, status)
			require.Equal(t, false, d["decision"])
			require.Equal(t, "hidden_characters", d["context"].(map[string]any)["reason"])
			require.NotContains(t, d["context"], "access_request", "not requestable")
		}
	}
	var ran, intents, reqs int
	require.NoError(t, s.pool.QueryRow(ctx, `SELECT count(*) FROM pep.ledger WHERE tool = 'wire_transfer'`).Scan(&ran))
	require.NoError(t, s.pool.QueryRow(ctx, `SELECT count(*) FROM pep.intents`).Scan(&intents))
	require.NoError(t, s.pool.QueryRow(ctx, `SELECT count(*) FROM arap.requests`).Scan(&reqs))
	require.Zero(t, ran, "nothing ran")
	require.Zero(t, intents, "nothing was submitted")
	require.Zero(t, reqs, "no request exists")

	// The same transfer without the hidden characters goes to approval.
	r, err := alice.CallTool(ctx, "wire_transfer", map[string]any{"to": "acct-991", "amount": 50000}, nil)
	require.NoError(t, err)
	require.Equal(t, "task", r.ResultType, "%s", r.Raw)
}
