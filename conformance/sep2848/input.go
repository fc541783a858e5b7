package sep2848

// Submission input: before the task (MRTR), and in the task (tasks/update).

import (
	"context"
	"fmt"
	"time"
)

// inTaskInput: an approval that expires, after which the new request needs
// input the task does not have, asked for in the task itself.
func inTaskInput(ctx context.Context, r *run) error {
	if r.p.Reinput == nil {
		r.skipScenario("the profile has no reinput call")
		return nil
	}
	call := r.p.Reinput.Fresh()
	t, err := r.open(ctx, r.c, call)
	if err != nil {
		return err
	}
	defer r.drop(context.WithoutCancel(ctx), r.c, t.TaskID)
	if err := r.cfg.Resolver.Resolve(ctx, t.TaskID, call, true, "approved by the conformance run"); err != nil {
		return err
	}
	wctx, stop := context.WithTimeout(ctx, time.Duration(r.p.Reinput.After)+r.cfg.Timeout)
	defer stop()
	g, err := r.c.wait(wctx, t.TaskID, func(g *task) bool { return terminal(g) || g.Status == StatusInputRequired })
	if err != nil {
		return err
	}
	if g.Status != StatusInputRequired {
		r.fail("sep-2848-input-required-envelope", "the task never asked for input in-task: it ended %s", g.Status)
		r.fail("sep-2848-update-checks-input-keys", "the task never asked for input in-task")
		return nil
	}
	msg := ""
	switch {
	case len(g.InputRequests) == 0:
		msg = "no inputRequests"
	case len(g.Result) > 0:
		msg = "it carries a result"
	case presentsDone(g.StatusMessage) != "":
		msg = fmt.Sprintf("its statusMessage presents it as done: %q", presentsDone(g.StatusMessage))
	case r.sep2643(t):
		msg = envelopeIs(g.Meta, RemediationAvailable, false)
	}
	r.expect("sep-2848-input-required-envelope", msg == "", "input_required task: %s", msg)

	// An answer to a key that was not asked for changes nothing.
	bogus := map[string]any{"sep2848-not-asked": map[string]any{"action": "accept", "content": map[string]any{}}}
	if _, err := r.c.call(ctx, MethodUpdate, t.TaskID, map[string]any{"taskId": t.TaskID, "inputResponses": bogus}); err != nil {
		return err
	}
	still, err := r.get(ctx, r.c, t.TaskID)
	if err != nil {
		return err
	}
	if still.Status != StatusInputRequired || !sameKeys(still.InputRequests, g.InputRequests) {
		r.fail("sep-2848-update-checks-input-keys", "an answer to a key that was not asked for moved the task to %s (input requests %v)", still.Status, keys(still.InputRequests))
		return nil
	}
	resp, err := r.c.call(ctx, MethodUpdate, t.TaskID, map[string]any{"taskId": t.TaskID, "inputResponses": r.answers(g.InputRequests)})
	if err != nil {
		return err
	}
	next, err := r.c.wait(wctx, t.TaskID, func(g *task) bool { return g.Status != StatusInputRequired })
	if err != nil {
		return err
	}
	r.expect("sep-2848-update-checks-input-keys", resp.err == nil && next.Status == StatusWorking,
		"answering the asked keys: error %v, the task is %s", resp.err, next.Status)
	return nil
}

func sameKeys(a, b map[string]any) bool {
	if len(a) != len(b) {
		return false
	}
	for k := range a {
		if _, ok := b[k]; !ok {
			return false
		}
	}
	return true
}

func keys(m map[string]any) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// answers fills every input request's form: required string fields with the
// profile's answer, numbers with 1, booleans with true.
func (r *run) answers(reqs map[string]any) map[string]any {
	out := map[string]any{}
	for key, v := range reqs {
		m, _ := v.(map[string]any)
		if p, ok := m["params"].(map[string]any); ok {
			m = p
		}
		schema, _ := m["requestedSchema"].(map[string]any)
		props, _ := schema["properties"].(map[string]any)
		content := map[string]any{}
		for name, pv := range props {
			ps, _ := pv.(map[string]any)
			switch ps["type"] {
			case "string":
				content[name] = r.p.Answer
			case "number", "integer":
				content[name] = 1
			case "boolean":
				content[name] = true
			}
		}
		out[key] = map[string]any{"action": "accept", "content": content}
	}
	return out
}

func input(ctx context.Context, r *run) error {
	if r.p.Input == nil {
		r.skipScenario("the profile has no call that needs submission input")
		return nil
	}
	call := r.p.Input.Fresh()
	resp, err := r.c.callTool(ctx, call, nil)
	if err != nil {
		return err
	}
	reqs, _ := resp.result["inputRequests"].(map[string]any)
	state, _ := resp.result["requestState"].(string)
	_, isTask := resp.result["taskId"]
	if !r.expect("sep-2848-input-before-submission", resp.err == nil && resp.result["resultType"] == ResultInputRequired && len(reqs) > 0 && state != "" && !isTask,
		"want resultType input_required with inputRequests and requestState, got %v %.300s", resp.err, resp.raw) {
		return fmt.Errorf("no input request")
	}
	// On the channel, not beside it: no request of the server's own (a
	// standalone elicitation/create) rides the response.
	if msg := serverRequest(resp.body); msg != "" {
		r.fail("sep-2848-input-before-submission", "%s", msg)
	}
	extra := map[string]any{"requestState": state, "inputResponses": r.answers(reqs)}
	// The retry must match the binding: changed arguments, or another
	// tool, with this requestState are refused.
	changed := []Call{r.p.Input.Fresh()}
	if r.p.ChangedTool != nil {
		changed = append(changed, r.p.ChangedTool.Fresh())
	}
	accepted := ""
	for _, c := range changed {
		bad, err := r.c.callTool(ctx, c, extra)
		if err != nil {
			return err
		}
		if bt, err := asTask(bad); err == nil && bt.TaskID != "" {
			defer r.drop(context.WithoutCancel(ctx), r.c, bt.TaskID)
		}
		if bad.err == nil {
			accepted = fmt.Sprintf("a retry as %s %v was accepted: %.300s", c.Name, c.Arguments, bad.raw)
		}
	}
	r.expect("sep-2848-mrtr-binding-enforced", accepted == "", "%s", accepted)
	if r.cfg.OtherToken == "" {
		r.skip("sep-2848-mrtr-caller-enforced", "no second principal (--other-token)")
	} else {
		other := r.c.with(r.cfg.OtherToken, tasksOnly)
		stolen, err := other.callTool(ctx, call, extra)
		if err != nil {
			return err
		}
		if st, err := asTask(stolen); err == nil && st.TaskID != "" {
			defer r.drop(context.WithoutCancel(ctx), other, st.TaskID)
		}
		r.expect("sep-2848-mrtr-caller-enforced", stolen.err != nil,
			"another principal's retry with this requestState was accepted: %.300s", stolen.raw)
	}
	good, err := r.c.callTool(ctx, call, extra)
	if err != nil {
		return err
	}
	t, terr := asTask(good)
	if terr == nil && t.TaskID != "" {
		defer r.drop(context.WithoutCancel(ctx), r.c, t.TaskID)
	}
	r.expect("sep-2848-input-retry-creates-task", terr == nil && t.ResultType == ResultTask && t.Status == StatusWorking,
		"the retry with answers returned %v %.300s", good.err, good.raw)
	return nil
}
