package notify

import (
	"bytes"
	"html/template"
	"strings"
	texttemplate "text/template"

	"github.com/omcp/arap/internal/summary"
	"github.com/omcp/arap/requests"
)

// content is what a message says: the request's summary (what its page
// shows first, built by the page's own function), a line about the event,
// and the link. Nothing else of the request goes in: no binding token,
// approval state, evaluation id or secret.
type content struct {
	Summary summary.Summary
	// Lead says what happened, in words, from names only.
	Lead  string
	Link  string
	Notes summary.Notes
}

func (s *Service) message(e *event, r *requests.Request, role string) Message {
	sum := summary.Of(r, s.cfg.Now())
	c := content{Summary: sum, Link: s.cfg.PageURL(r.ID)}
	sum.Note(&c.Notes)
	heading := summary.Plain(sum.Heading())
	var subject string
	switch e.Kind {
	case requests.EventCreated:
		subject = "Approval needed: " + heading
		c.Lead = "A request waits for your decision."
	case requests.EventDecided:
		verb := "approved"
		if e.Decision != "approve" {
			verb = "denied"
		}
		subject = summary.Plain(e.Voter) + " " + verb + ": " + heading
		c.Lead = summary.Plain(e.Voter) + " " + verb + " this request; it still waits for more decisions."
	case requests.EventReminder:
		subject = "Reminder: approval needed: " + heading
		c.Lead = "A request still waits for your decision."
	case requests.EventEscalated:
		subject = "Escalated to you: approval needed: " + heading
		c.Lead = "This request was not decided within " + r.ApprovalPolicy.EscalateAfter.String() + " and was escalated to your group " +
			summary.Plain(r.ApprovalPolicy.EscalateTo) + ": you may now decide it."
	default:
		subject = "Request " + e.Status + ": " + heading
		c.Lead = "This request ended: " + e.Status + "."
		if role == RoleRequester {
			c.Lead = "Your request ended: " + e.Status + "."
		}
	}
	var text, html bytes.Buffer
	if err := textMessage.Execute(&text, c); err != nil {
		panic(err) // the templates are fixed and their data is plain
	}
	if err := htmlMessage.Execute(&html, c); err != nil {
		panic(err)
	}
	return Message{Subject: subject, Text: text.String(), HTML: html.String(),
		Kind: e.Kind, Lead: c.Lead, Link: c.Link, Summary: sum, Notes: c.Notes, Request: r,
		AskDecision: role == RoleDecider && r.Status == requests.Pending}
}

// indent renders a value for plain text, markers in place; a multi-line
// value goes on its own lines.
func indent(f summary.Field) string {
	if !f.Multiline {
		return summary.Plain(f.Value)
	}
	return "\n      " + strings.ReplaceAll(summary.PlainBlock(f.Value), "\n", "\n      ")
}

var textMessage = texttemplate.Must(texttemplate.New("text").Funcs(texttemplate.FuncMap{
	"plain": summary.Plain, "value": indent,
}).Parse(`{{plain .Summary.Heading}}

{{.Lead}}
{{with .Notes.List}}
WARNING: this request contains hidden or look-alike characters. Each is shown
as its code point in angle brackets, such as <U+202E>, in its place; what runs
is the text with the character. Read the marked values carefully.
{{range .}}  - {{.Finding.Code}} {{.Finding.Name}} ({{.Finding.Why}}) in {{plain .Where}}{{if gt .Count 1}}, {{.Count}} times{{end}}
{{end}}{{end}}{{with .Summary}}
{{plain .Subject}}{{if .Actor}}, through {{plain .Actor}},{{end}} asks to run {{plain .Tool}}.
{{if .TimeLeft}}Time left: {{.TimeLeft}} (expires {{.ExpiresAt.UTC.Format "2006-01-02 15:04:05 MST"}})
{{end}}
What it will do (stated by the requester):
{{range .Arguments}}  {{plain .Name}}: {{value .}}
{{else}}  No arguments.
{{end}}
Why approval is needed (from policy):
{{if .Why}}  {{plain .Why}}
{{end}}  Rule {{plain .Rule}}
{{end}}
Open the request (sign-in required): {{.Link}}
`))

var htmlMessage = template.Must(template.New("html").Funcs(template.FuncMap{
	"show": summary.Show, "showField": summary.ShowField, "marker": summary.Marker, "plain": summary.Plain,
}).Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{{plain .Summary.Heading}}</title>
<style>mark.hidden-char{background:#ffd500;color:#000;font-weight:bold;border:1px solid #000;padding:0 2px}</style></head>
<body>
<h1>{{show .Summary.Heading}}</h1>
<p>{{.Lead}}</p>
{{with .Notes.List}}<section class="hidden-warning">
<h2>This request contains hidden or look-alike characters</h2>
<p>Each is shown as a highlighted marker, its code point such as U+202E, in its place; what runs is the text with the character, not what it looks like without. Read the marked values carefully.</p>
<ul>{{range .}}<li>{{marker .Finding}} {{.Finding.Name}} ({{.Finding.Why}}) in {{show .Where}}{{if gt .Count 1}}, {{.Count}} times{{end}}</li>{{end}}</ul>
</section>{{end}}
{{with .Summary}}<p class="summary"><strong>{{show .Subject}}</strong>{{if .Actor}}, through <strong>{{show .Actor}}</strong>,{{end}} asks to run <code class="tool">{{show .Tool}}</code>.</p>
{{if .TimeLeft}}<p>{{.TimeLeft}} left (expires {{.ExpiresAt.UTC.Format "2006-01-02 15:04:05 MST"}})</p>{{end}}
<h2>What it will do</h2>
<p>Stated by the requester: the call exactly as it would run.</p>
{{if .Arguments}}<dl>{{range .Arguments}}<dt>{{show .Name}}</dt><dd>{{showField .}}</dd>{{end}}</dl>{{else}}<p>No arguments.</p>{{end}}
<h2>Why approval is needed</h2>
<p>From policy, not from the requester.</p>
{{if .Why}}<p>{{show .Why}}</p>{{end}}
<p>Rule <code>{{show .Rule}}</code></p>{{end}}
<p><a href="{{.Link}}">Open the request</a> (sign-in required).</p>
</body></html>
`))
