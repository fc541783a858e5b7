package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf16"

	"github.com/omcp/arap/arapclient"
	"github.com/omcp/arap/internal/config"
	"github.com/omcp/arap/internal/visible"
)

// api is the decision API settings of a command: --url, and the token
// (ARAP_TOKEN or --token-file; never a flag, which the process list shows).
type api struct {
	base  *string
	token *config.Secret
}

func apiFlags(fs *flag.FlagSet) api {
	c := settings(fs)
	return api{
		base:  c.String("url", "http://127.0.0.1:8480", "backend URL", "ARAP_URL"),
		token: c.Secret("token", "the API token", "ARAP_TOKEN"),
	}
}

func (a api) client() (*arapclient.Client, error) {
	if !a.token.IsSet() {
		return nil, usageError{msg: "a token is required: " + a.token.Describe()}
	}
	return &arapclient.Client{BaseURL: strings.TrimRight(*a.base, "/"), Token: a.token.Value()}, nil
}

func requestsList(fs *flag.FlagSet) action {
	a := apiFlags(fs)
	status := fs.String("status", "pending", "status filter (empty for all)")
	rule := fs.String("rule", "", "only requests of this policy rule")
	limit := fs.Int("limit", 50, "page size")
	asJSON := fs.Bool("json", false, "print JSON")
	return func(s streams, _ []string) error {
		c, err := a.client()
		if err != nil {
			return err
		}
		page, err := c.Requests(context.Background(), arapclient.ListOptions{Status: *status, Rule: *rule, Limit: *limit})
		if err != nil {
			return err
		}
		if *asJSON {
			return writeEscaped(s.out, page, false)
		}
		tw := tabwriter.NewWriter(s.out, 0, 2, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tSTATUS\tRULE\tSUBJECT\tRESOURCE\tPROGRESS\tEXPIRES\tYOU MAY DECIDE\tHIDDEN CHARACTERS")
		for _, v := range page.Requests {
			may := "yes"
			if !v.YouMayDecide {
				may = "no: " + v.Why
			}
			hidden := "-"
			if n := len(v.HiddenCharacters) + v.HiddenOmitted; n > 0 {
				hidden = fmt.Sprintf("%d (requests show %s)", n, v.ID)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s:%s\t%d/%d\t%s\t%s\t%s\n", v.ID, v.Status, v.Rule, mark(v.Subject.Str("id")),
				mark(v.Resource.Str("type")), mark(v.Resource.Str("id")), v.Progress.Approvals, v.Progress.Quorum, v.ExpiresAt.Format(time.RFC3339), mark(may), hidden)
		}
		return tw.Flush()
	}
}

func requestsShow(fs *flag.FlagSet) action {
	a := apiFlags(fs)
	asJSON := fs.Bool("json", false, "print the exact JSON (invisible characters escaped)")
	return func(s streams, pos []string) error {
		c, err := a.client()
		if err != nil {
			return err
		}
		v, err := c.Request(context.Background(), pos[0])
		if err != nil {
			return err
		}
		if *asJSON {
			return writeEscaped(s.out, v, true)
		}
		return showRequest(s.out, v)
	}
}

func requestsApprove(fs *flag.FlagSet) action {
	return decide(fs, "approve")
}

func requestsDeny(fs *flag.FlagSet) action {
	return decide(fs, "deny")
}

// decide records a decision on a request.
func decide(fs *flag.FlagSet, decision string) action {
	a := apiFlags(fs)
	reason := fs.String("reason", "", "why (recorded with the decision)")
	person := fs.String("on-behalf-of", "", "record the decision as this directory user (needs the decide_for_people scope); their eligibility applies")
	var until *string
	if decision == "approve" {
		until = fs.String("until", "", "approved_until (RFC 3339), within what the policy allows")
	}
	return func(s streams, pos []string) error {
		body := arapclient.Decision{Decision: decision, Reason: *reason}
		if *person != "" {
			body.OnBehalfOf = person
		}
		if until != nil && *until != "" {
			t, err := time.Parse(time.RFC3339, *until)
			if err != nil {
				return usageError{msg: fmt.Sprintf("--until %q is not an RFC 3339 time such as 2026-12-01T17:00:00Z", *until)}
			}
			body.ApprovedUntil = &t
		}
		c, err := a.client()
		if err != nil {
			return err
		}
		v, err := c.Decide(context.Background(), pos[0], body)
		if err != nil {
			return err
		}
		fmt.Fprintf(s.out, "%s: %s (approvals %d/%d)\n", v.ID, v.Status, v.Progress.Approvals, v.Progress.Quorum)
		return nil
	}
}

func approvalsRevoke(fs *flag.FlagSet) action {
	a := apiFlags(fs)
	reason := fs.String("reason", "", "why (recorded with the revocation)")
	return func(s streams, pos []string) error {
		c, err := a.client()
		if err != nil {
			return err
		}
		res, err := c.Revoke(context.Background(), pos[0], *reason)
		if err != nil {
			return err
		}
		fmt.Fprintf(s.out, "approval %s of request %s: %s\n", res.ID, res.RequestID, res.Status)
		return nil
	}
}

func deliveriesList(fs *flag.FlagSet) action {
	a := apiFlags(fs)
	asJSON := fs.Bool("json", false, "print JSON")
	return func(s streams, pos []string) error {
		c, err := a.client()
		if err != nil {
			return err
		}
		deliveries, err := c.Deliveries(context.Background(), pos[0])
		if err != nil {
			return err
		}
		if *asJSON {
			return json.NewEncoder(s.out).Encode(map[string]any{"deliveries": deliveries})
		}
		tw := tabwriter.NewWriter(s.out, 0, 2, 2, ' ', 0)
		fmt.Fprintln(tw, "DELIVERY\tEVENT\tSTATUS\tENDPOINT\tATTEMPT\tAT\tHTTP\tLATENCY\tERROR")
		for _, d := range deliveries {
			if len(d.Attempts) == 0 {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t-\t\t\t\t\n", d.ID, d.Event, d.Status, d.Endpoint)
			}
			for i, at := range d.Attempts {
				code := "-"
				if at.StatusCode != nil {
					code = fmt.Sprint(*at.StatusCode)
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%.1fms\t%s\n", d.ID, d.Event, d.Status, d.Endpoint, i+1,
					at.At.Format(time.RFC3339), code, at.LatencyMS, at.Error)
			}
		}
		return tw.Flush()
	}
}

func deliveriesRedeliver(fs *flag.FlagSet) action {
	a := apiFlags(fs)
	return func(s streams, pos []string) error {
		c, err := a.client()
		if err != nil {
			return err
		}
		if err := c.Redeliver(context.Background(), pos[0], pos[1]); err != nil {
			return err
		}
		fmt.Fprintf(s.out, "delivery %s: redelivering\n", pos[1])
		return nil
	}
}

// mark shows a string for a terminal: every character a person could not
// see or could mistake becomes a marker such as <U+202E>, so none can hide
// or reorder what is printed around it.
func mark(s string) string { return visible.Marked(s, false) }

// showRequest prints a request for a person: a warning listing the hidden
// and look-alike characters, then the request as indented JSON whose
// strings and member names carry markers in their place.
func showRequest(out io.Writer, v arapclient.RequestView) error {
	if len(v.HiddenCharacters) > 0 {
		fmt.Fprintln(out, "WARNING: this request contains hidden or look-alike characters, shown below as <U+XXXX> markers:")
		for _, h := range v.HiddenCharacters {
			where := h.Pointer
			if h.InName {
				where += " (in the member name)"
			}
			fmt.Fprintf(out, "  %s %s (%s) at %s\n", h.Code, h.Name, h.Why, mark(where))
		}
		if v.HiddenOmitted > 0 {
			fmt.Fprintf(out, "  and %d more\n", v.HiddenOmitted)
		}
		fmt.Fprintln(out)
	}
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	var doc any
	if err := json.Unmarshal(b, &doc); err != nil {
		return err
	}
	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(markAll(doc))
}

// markAll marks every string and member name of a decoded JSON value.
func markAll(v any) any {
	switch x := v.(type) {
	case string:
		return mark(x)
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, val := range x {
			out[mark(k)] = markAll(val)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, val := range x {
			out[i] = markAll(val)
		}
		return out
	}
	return v
}

// writeEscaped writes v as exact JSON for programs, with every invisible
// character written as a \uXXXX escape: the data is unchanged, and a
// terminal showing it cannot be made to hide or reorder anything.
func writeEscaped(out io.Writer, v any, indent bool) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	if indent {
		enc.SetIndent("", "  ")
	}
	if err := enc.Encode(v); err != nil {
		return err
	}
	// Outside strings JSON is ASCII, so every such rune is inside a string,
	// where an escape means the same character.
	var b strings.Builder
	for _, r := range buf.String() {
		if _, hidden := visible.Hidden(r); hidden && r != '\n' {
			for _, u := range utf16.Encode([]rune{r}) {
				fmt.Fprintf(&b, "\\u%04x", u)
			}
			continue
		}
		b.WriteRune(r)
	}
	_, err := io.WriteString(out, b.String())
	return err
}
