package webui_test

import (
	"context"
	"fmt"
	"net/url"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/internal/backendtest"
	"github.com/omcp/arap/internal/dev"
)

// TestSameApproverWrittenDifferently: bob cannot approve in the web UI a
// request made for him or through him under any spelling (case, type
// prefix, e-mail; and, in a stored request, whitespace, invisible and
// compatibility characters), wherever the chains name him (a later link of
// the subject's, the last link of one at the depth limit, client.actor's). He sees why, has no buttons, and a posted
// vote is refused and records nothing.
func TestSameApproverWrittenDifferently(t *testing.T) {
	env := backendtest.Start(t, backendtest.Options{})
	ctx := context.Background()
	bob := newBrowser(t, env.URL)
	require.Equal(t, 303, bob.signIn("bob", dev.Password).status)
	count := func(q, id string) int {
		var n int
		require.NoError(t, env.Pool.QueryRow(ctx, q, id).Scan(&n))
		return n
	}
	check := func(t *testing.T, id string) {
		p := bob.get("/ui/requests/" + id)
		require.Equal(t, 200, p.status)
		require.Contains(t, p.body, "made on their behalf or through them")
		require.NotContains(t, p.body, `id="approve"`)
		events := count(`SELECT count(*) FROM arap.audit_events WHERE chain = $1`, id)
		r := bob.post("/ui/requests/"+id+"/decide", url.Values{"decision": {"approve"}, "csrf": {csrf(t, p)}})
		require.Equal(t, 409, r.status)
		require.Zero(t, count(`SELECT count(*) FROM arap.votes WHERE request_id = $1`, id))
		require.Equal(t, events, count(`SELECT count(*) FROM arap.audit_events WHERE chain = $1`, id), "a refused vote writes nothing")
	}
	for _, s := range []string{"BOB", "Bob", "user:bob", "USER:Bob", "bob@example.com", "BOB@Example.com", "mailto:bob@example.com"} {
		t.Run("subject "+s, func(t *testing.T) { check(t, env.Submit(t, wireCall(s, 50000))) })
		t.Run("actor "+s, func(t *testing.T) {
			call := wireCall("alice", 50000)
			call["subject"].(map[string]any)["properties"] = map[string]any{"act": map[string]any{"sub": "agent:demo", "act": map[string]any{"sub": "agent:" + s}}}
			check(t, env.Submit(t, call))
		})
	}
	// Deep in the chains: the last link of a subject chain at the depth
	// limit, and a later link of client.actor's chain.
	t.Run("actor at the depth limit", func(t *testing.T) {
		var act map[string]any
		for i := authzen.MaxActorDepth - 1; i >= 0; i-- {
			link := map[string]any{"sub": fmt.Sprintf("agent:a%d", i)}
			if i == authzen.MaxActorDepth-1 {
				link["sub"] = "agent:bob"
			}
			if act != nil {
				link["act"] = act
			}
			act = link
		}
		call := wireCall("alice", 50000)
		call["subject"].(map[string]any)["properties"] = map[string]any{"act": act}
		check(t, env.Submit(t, call))
	})
	t.Run("client actor chain", func(t *testing.T) {
		call := wireCall("alice", 50000)
		call["client"] = map[string]any{"actor": map[string]any{"id": "agent:demo", "act": map[string]any{"sub": "agent:Bob"}}}
		check(t, env.Submit(t, call))
	})
	for _, s := range []string{" bob", "bob ", "b\u200bob", "\u202ebob", "bo\u00adb", "ｂｏｂ", "b\u00a0ob", "\u1d2e\u1d3c\u1d2e"} {
		t.Run("stored subject "+s, func(t *testing.T) {
			id := env.Submit(t, wireCall("alice", 50000))
			_, err := env.Pool.Exec(ctx, `UPDATE arap.requests SET subject = jsonb_set(subject, '{id}', to_jsonb($2::text)) WHERE id = $1`, id, s)
			require.NoError(t, err)
			check(t, id)
		})
	}
}
