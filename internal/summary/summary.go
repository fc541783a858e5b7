// Package summary is what a person is shown first about an access request:
// who asks, through which agent, to run which tool with which arguments,
// under which rule, and how long is left. The approver's request page
// (webui) and the notifications (notify) both build it here, so an e-mail
// cannot say something other than the page it links to.
//
// Every string that came from a request is rendered through Show (HTML) or
// Plain (text), which never write a character a person could not see or
// could mistake (package visible): a labelled marker such as U+202E stands
// in its place.
package summary

import (
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/omcp/arap/requests"
)

// Field is one rendered name and value.
type Field struct {
	Name, Value string
	Multiline   bool
}

// Summary is the top of a request's page.
type Summary struct {
	ID string
	// From policy.
	Rule  string
	Title string
	Why   string
	// Stated by the requester.
	Tool        string
	Arguments   []Field
	Subject     string
	Actor       string
	SubmittedBy string
	// Upstream and UpstreamTool: for a gateway tool, the server it runs on
	// and its name there.
	Upstream, UpstreamTool string

	ExpiresAt time.Time
	// TimeLeft is set while the request is pending and not yet due.
	TimeLeft string

	args map[string]any
}

// Of summarises r as of now.
func Of(r *requests.Request, now time.Time) Summary {
	s := Summary{ID: r.ID, Rule: r.Rule, Tool: r.Resource.Str("id"), Subject: r.Subject.Str("type") + " " + r.Subject.Str("id"),
		SubmittedBy: r.ClientID, ExpiresAt: r.ExpiresAt}
	if t, ok := r.Display["title"].(string); ok {
		s.Title = t
	}
	if d, ok := r.Display["description"].(string); ok {
		s.Why = d
	}
	if r.Resource.Str("type") != "mcp_tool" {
		s.Tool = r.Resource.Str("type") + ":" + r.Resource.Str("id") + " (" + r.Action.Str("name") + ")"
	}
	if up, ok := r.Resource.Obj("properties")["upstream"].(string); ok {
		s.Upstream = up
		s.UpstreamTool, _ = r.Resource.Obj("properties")["upstream_tool"].(string)
	}
	args, _ := r.Resource.Obj("properties")["arguments"].(map[string]any)
	if len(args) == 0 {
		args = r.Resource.Obj("properties")
	}
	s.args = args
	s.Arguments = Fields(args)
	if involved := r.Involved(); len(involved) > 1 {
		s.Actor = strings.Join(involved[1:], " → ")
	}
	if left := r.ExpiresAt.Sub(now); r.Status == requests.Pending && left > 0 {
		s.TimeLeft = Humanize(left)
	}
	return s
}

// Heading is the page's heading: the rule's title, or what is asked.
func (s Summary) Heading() string {
	if s.Title != "" {
		return s.Title
	}
	return "Request for " + s.Tool
}

// Note adds the hidden characters of the summary to n, each where the page
// shows it.
func (s Summary) Note(n *Notes) {
	n.Text("the title (from policy)", s.Title)
	n.Text("the description (from policy)", s.Why)
	n.Text("the tool", s.Tool)
	n.Text("the upstream", s.Upstream)
	n.Text("the tool's name upstream", s.UpstreamTool)
	n.Text("the subject", s.Subject)
	n.Text("the agent", s.Actor)
	n.Value("argument", s.args)
}

// Fields renders a JSON object readably: numbers with separators, strings
// as they are, anything nested as indented JSON.
func Fields(m map[string]any) []Field {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([]Field, 0, len(keys))
	for _, k := range keys {
		f := Field{Name: k}
		switch v := m[k].(type) {
		case string:
			f.Value = v
		case float64:
			f.Value = Number(v)
		case bool:
			f.Value = fmt.Sprint(v)
		case nil:
			f.Value = "null"
		default:
			var b strings.Builder
			enc := json.NewEncoder(&b)
			enc.SetEscapeHTML(false) // the page escapes; \u003c would only obscure
			enc.SetIndent("", "  ")
			_ = enc.Encode(v)
			f.Value, f.Multiline = strings.TrimSuffix(b.String(), "\n"), true
		}
		out = append(out, f)
	}
	return out
}

// Number writes v exactly as the call carries it (the shortest decimal
// that is v), with thousands separators in its integer part: never rounded,
// so what an approver reads is what runs. Where RFC 8785 writes a number
// with an exponent (below 1e-6 or from 1e21 on), so does Number: its
// canonical JSON text, as the binding hash sees it, not 300 zeros.
func Number(v float64) string {
	if a := math.Abs(v); a != 0 && (a < 1e-6 || a >= 1e21) {
		// Go pads the exponent to two digits (1e-07); RFC 8785 does not.
		return strings.NewReplacer("e-0", "e-", "e+0", "e+").Replace(strconv.FormatFloat(v, 'g', -1, 64))
	}
	s := strconv.FormatFloat(v, 'f', -1, 64)
	sign := ""
	if strings.HasPrefix(s, "-") {
		sign, s = "-", s[1:]
	}
	whole, frac, fractional := strings.Cut(s, ".")
	var b strings.Builder
	b.WriteString(sign)
	for i, c := range whole {
		if i > 0 && (len(whole)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if fractional {
		b.WriteString("." + frac)
	}
	return b.String()
}

// Humanize says a duration in words.
func Humanize(d time.Duration) string {
	switch {
	case d >= 48*time.Hour:
		return fmt.Sprintf("%d days", int(d.Hours()/24))
	case d >= time.Hour:
		return fmt.Sprintf("%dh %02dm", int(d.Hours()), int(d.Minutes())%60)
	case d >= time.Minute:
		return fmt.Sprintf("%d min", int(d.Minutes()))
	default:
		return "less than a minute"
	}
}
