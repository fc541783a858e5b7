package sep2848

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"unicode"
)

// This file holds the judgements the checks make about what they read:
// what a body says, whether an envelope is right, whether a response leaks
// something. Each is a pure function, shown a violation in checks_test.go.

var (
	saysRan     = regexp.MustCompile(`(?i)\b(ran|executed|has run|was run)\b`)
	saysNotRan  = regexp.MustCompile(`(?i)(did not|didn't|was not|wasn't|has not|hasn't|not been) (run|execute|executed)|\bnot executed\b`)
	saysMayRun  = regexp.MustCompile(`(?i)\bmay have\b|\bmight have\b|\bunknown\b|\bcould not be confirmed\b`)
	saysExpired = regexp.MustCompile(`(?i)\bexpir|\bdeadline\b|\btimed out\b|\bin time\b`)
	saysDone    = regexp.MustCompile(`(?i)\b(completed|succeeded|done|finished|executed|transferred|deleted|ran|has run)\b`)
	// Words that, earlier in the same sentence, make a completion word not
	// a claim that the action happened ("has not run", "once approved it
	// will be completed", "waiting until it is done").
	notAClaim = regexp.MustCompile(`(?i)\b(not|never|no|nothing|none|neither|nor|without|yet|until|unless|once|when|after|before|if|pending|waiting|awaiting|will|would|can|could|may|might)\b|n't\b`)
	jwtLike   = regexp.MustCompile(`eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.`)
	// Next-step guidance in a degraded result: what the agent can do.
	saysNeedsApproval = regexp.MustCompile(`(?i)\b(approv\w*|access|permission|authori[sz]\w*)\b`)
	saysNextStep      = regexp.MustCompile(`(?i)\b(retry|try again|request|ask|declare|use a client|contact|obtain)\b`)
)

// presentsDone returns the sentence of s that presents an action as done
// (a completion word with no negation or condition before it in its
// sentence), or "".
func presentsDone(s string) string {
	for _, sentence := range regexp.MustCompile(`[.;!?]+\s*`).Split(s, -1) {
		for _, loc := range saysDone.FindAllStringIndex(sentence, -1) {
			if !notAClaim.MatchString(sentence[:loc[0]]) {
				return sentence
			}
		}
	}
	return ""
}

// bodyAgrees reports what is wrong with a completed result's body given its
// disposition, or "".
func bodyAgrees(disposition, body string) string {
	ran, notRan, may := saysRan.MatchString(body), saysNotRan.MatchString(body), saysMayRun.MatchString(body)
	switch disposition {
	case ApprovedExecuted:
		if !ran || notRan {
			return "disposition approved-executed, but the body does not say the tool ran"
		}
	case DeniedNotExecuted:
		if !notRan {
			return "disposition denied-not-executed, but the body does not say the tool did not run"
		}
	case ExecutionError:
		if !(ran || may) || notRan {
			return "disposition execution-error, but the body does not say the tool ran (or may have)"
		}
	case OutcomeUnknown:
		if !may || notRan {
			return "disposition outcome-unknown, but the body does not say the tool may have run"
		}
	}
	return ""
}

// guidance reports what a degraded result's body lacks, or "".
func guidance(body string) string {
	switch {
	case !saysNotRan.MatchString(body):
		return "it does not say the tool did not run"
	case !saysNeedsApproval.MatchString(body):
		return "it does not say an approval (access) is needed"
	case !saysNextStep.MatchString(body):
		return "it gives no next step (retry with tasks, request access, ...)"
	}
	return ""
}

// guessable reports why task ids look guessable, or "": each must be at
// least 16 characters, and every two must differ in at least 16 positions,
// which a counter (tsk_0000000000000001, ...2) or a clock does not.
func guessable(ids []string) string {
	for i, a := range ids {
		if len(a) < 16 {
			return fmt.Sprintf("task id %q is shorter than 16 characters", a)
		}
		for _, b := range ids[i+1:] {
			diff := max(len(a), len(b)) - min(len(a), len(b))
			for k := range min(len(a), len(b)) {
				if a[k] != b[k] {
					diff++
				}
			}
			if diff < 16 {
				return fmt.Sprintf("task ids %q and %q differ in only %d positions", a, b, diff)
			}
		}
	}
	return ""
}

// untrusted reports model-facing text that carries client-supplied argument
// values or control characters.
func untrusted(texts []string, call Call) string {
	for _, s := range texts {
		for _, v := range call.Arguments {
			if a, ok := v.(string); ok && len(a) >= 6 && strings.Contains(s, a) {
				return fmt.Sprintf("model-facing text %q repeats the client-supplied argument %q", s, a)
			}
		}
		if strings.IndexFunc(s, func(r rune) bool { return unicode.IsControl(r) && r != '\n' }) >= 0 {
			return fmt.Sprintf("model-facing text %q carries control characters", s)
		}
	}
	return ""
}

// leaks returns the first of secrets found in bodies (a secret of four or
// more characters, as a whole word), or "".
func leaks(bodies [][]byte, secrets []string) string {
	for _, s := range secrets {
		if len(s) < 4 {
			continue
		}
		re := regexp.MustCompile(`(^|\W)` + regexp.QuoteMeta(s) + `($|\W)`)
		for _, b := range bodies {
			if re.Match(b) {
				return fmt.Sprintf("%q reached the client: %.300s", s, b)
			}
		}
	}
	return ""
}

func envelopeOf(meta map[string]any) (map[string]any, bool) {
	e, ok := meta[MetaAuthorization].(map[string]any)
	return e, ok
}

// envelopeIs reports what is wrong with meta's envelope, or "".
func envelopeIs(meta map[string]any, remediation string, taskHint bool) string {
	e, ok := envelopeOf(meta)
	if !ok {
		return "no " + MetaAuthorization + " in _meta"
	}
	if e["reason"] != ReasonInsufficientAuthorization || e["remediation"] != remediation {
		return fmt.Sprintf("envelope is %v, want reason %s remediation %s", e, ReasonInsufficientAuthorization, remediation)
	}
	if taskHint {
		hints, _ := e["remediationHints"].([]any)
		if !slices.ContainsFunc(hints, func(h any) bool { m, _ := h.(map[string]any); return m["type"] == "task" }) {
			return fmt.Sprintf("envelope %v has no remediationHints entry of type task", e)
		}
	}
	return ""
}

// notRequestable reports what makes a tools/call answer other than a
// denial that is not requestable (isError, no task, no envelope inviting a
// request), or "".
func notRequestable(resp *response) string {
	if resp.err != nil {
		return fmt.Sprintf("a JSON-RPC error (%v), not a denial result", resp.err)
	}
	if _, isTask := resp.result["taskId"]; isTask || resp.result["resultType"] == ResultTask {
		return "a task was opened"
	}
	if resp.result["resultType"] == ResultInputRequired {
		return "input was asked for, as if a request could follow"
	}
	if resp.result["isError"] != true {
		return "the result is not isError"
	}
	meta, _ := resp.result["_meta"].(map[string]any)
	if e, ok := envelopeOf(meta); ok && e["remediation"] == RemediationAvailable {
		return "its envelope invites a request (remediation available)"
	}
	return ""
}

func disposition(res *toolResult) string { s, _ := res.Meta[MetaDisposition].(string); return s }

// namesTasks reports whether e is the missing-capability error naming the
// tasks extension.
func namesTasks(e *rpcError) bool {
	return e != nil && slices.Contains(codesMissingCapability, e.Code) &&
		(strings.Contains(string(e.Data), ExtTasks) || strings.Contains(e.Message, ExtTasks))
}

// jsonMessages reads a response body as one JSON value or, failing that, as
// an event stream: each event's data lines joined (an event's JSON may span
// several).
func jsonMessages(b []byte) []any {
	var v any
	if json.Unmarshal(b, &v) == nil {
		return []any{v}
	}
	var out []any
	var data []string
	flush := func() {
		if len(data) > 0 && json.Unmarshal([]byte(strings.Join(data, "\n")), &v) == nil {
			out = append(out, v)
		}
		data = data[:0]
	}
	for _, line := range strings.Split(strings.ReplaceAll(string(b), "\r\n", "\n"), "\n") {
		switch {
		case line == "":
			flush()
		case strings.HasPrefix(line, "data:"):
			data = append(data, strings.TrimPrefix(strings.TrimPrefix(line, "data:"), " "))
		}
	}
	flush()
	return out
}

func findArtifact(v any, path, backendURL string) string {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			if slices.Contains(backendArtifacts, k) {
				return fmt.Sprintf("%s.%s: a backend artifact member", path, k)
			}
			if w := findArtifact(e, path+"."+k, backendURL); w != "" {
				return w
			}
		}
	case []any:
		for i, e := range x {
			if w := findArtifact(e, fmt.Sprintf("%s[%d]", path, i), backendURL); w != "" {
				return w
			}
		}
	case string:
		if jwtLike.MatchString(x) {
			return path + ": a JWT"
		}
		if backendURL != "" && strings.Contains(x, strings.TrimRight(backendURL, "/")) {
			return path + ": the backend's URL"
		}
	}
	return ""
}

// findMember returns the path of the first member named name in v, or "".
func findMember(v any, path, name string) string {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			if k == name {
				return path + "." + k
			}
			if w := findMember(e, path+"."+k, name); w != "" {
				return w
			}
		}
	case []any:
		for i, e := range x {
			if w := findMember(e, fmt.Sprintf("%s[%d]", path, i), name); w != "" {
				return w
			}
		}
	}
	return ""
}

// dispositions calls f with every CallToolResult in v that carries a
// disposition: its disposition, its text and its _meta.
func dispositions(v any, f func(disposition, text string, meta map[string]any)) {
	switch x := v.(type) {
	case map[string]any:
		meta, _ := x["_meta"].(map[string]any)
		if d, ok := meta[MetaDisposition].(string); ok {
			if content, ok := x["content"].([]any); ok {
				var b strings.Builder
				for _, c := range content {
					if m, _ := c.(map[string]any); m["type"] == "text" {
						s, _ := m["text"].(string)
						b.WriteString(s + "\n")
					}
				}
				f(d, b.String(), meta)
			}
		}
		for _, e := range x {
			dispositions(e, f)
		}
	case []any:
		for _, e := range x {
			dispositions(e, f)
		}
	}
}

// requestableGuidance reports what a degraded result's body lacks to carry
// requestable guidance (that an approval is needed, and a next step), or
// "".
func requestableGuidance(body string) string {
	switch {
	case !saysNeedsApproval.MatchString(body):
		return "it does not say an approval (access) is needed"
	case !saysNextStep.MatchString(body):
		return "it gives no next step (retry with tasks, request access, ...)"
	}
	return ""
}

// envelopeAgrees reports what is wrong with a completed result's SEP-2643
// envelope given its disposition, or "": a denial carries one with
// remediation unavailable (when the server emits envelopes at all, aware),
// any other disposition none, since an envelope asserts the operation was
// not performed.
func envelopeAgrees(disposition string, meta map[string]any, aware bool) string {
	e, ok := envelopeOf(meta)
	switch {
	case disposition == DeniedNotExecuted && aware:
		if msg := envelopeIs(meta, RemediationUnavailable, false); msg != "" {
			return "disposition denied-not-executed, but " + msg
		}
	case disposition != DeniedNotExecuted && ok:
		return fmt.Sprintf("disposition %s, but the result carries the denial envelope %v", disposition, e)
	}
	return ""
}

// completedResults calls f with every completed task in v (an object with a
// taskId and status completed): its id and its result, nil if it has none.
func completedResults(v any, f func(taskID string, result map[string]any)) {
	switch x := v.(type) {
	case map[string]any:
		if id, ok := x["taskId"].(string); ok && x["status"] == StatusCompleted {
			res, _ := x["result"].(map[string]any)
			f(id, res)
		}
		for _, e := range x {
			completedResults(e, f)
		}
	case []any:
		for _, e := range x {
			completedResults(e, f)
		}
	}
}

// missingDisposition reports a completed task whose CallToolResult carries
// no string disposition in its _meta, or "".
func missingDisposition(taskID string, result map[string]any) string {
	if result == nil {
		return fmt.Sprintf("completed task %s carries no result", taskID)
	}
	meta, _ := result["_meta"].(map[string]any)
	if _, ok := meta[MetaDisposition].(string); !ok {
		return fmt.Sprintf("completed task %s: its result's _meta has no string %s (%v)", taskID, MetaDisposition, meta[MetaDisposition])
	}
	return ""
}

// modelTexts calls f with the model-facing text of every task in v (an
// object with a taskId): its statusMessage and model-immediate-response.
func modelTexts(v any, f func(taskID string, texts []string)) {
	switch x := v.(type) {
	case map[string]any:
		if id, ok := x["taskId"].(string); ok {
			var texts []string
			if s, ok := x["statusMessage"].(string); ok {
				texts = append(texts, s)
			}
			meta, _ := x["_meta"].(map[string]any)
			if s, ok := meta[MetaImmediate].(string); ok {
				texts = append(texts, s)
			}
			f(id, texts)
		}
		for _, e := range x {
			modelTexts(e, f)
		}
	case []any:
		for _, e := range x {
			modelTexts(e, f)
		}
	}
}

// serverRequest reports a JSON-RPC request (a method and an id) among the
// messages of a response body: a request from the server to the client,
// such as a standalone elicitation/create; or "".
func serverRequest(body []byte) string {
	for _, m := range jsonMessages(body) {
		x, _ := m.(map[string]any)
		if method, ok := x["method"].(string); ok && x["id"] != nil {
			return fmt.Sprintf("the server sent the client a %s request: %.200s", method, body)
		}
	}
	return ""
}
