package authzen_test

import (
	"encoding/json"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/authzen"
)

// TestBindingHashVectors runs every known-answer vector of the ARAP draft
// (PR #611, copied from ../shared/spec/arap-test-vectors).
func TestBindingHashVectors(t *testing.T) {
	raw, err := os.ReadFile("testdata/binding-hash.json")
	require.NoError(t, err)
	var file struct {
		Vectors []struct {
			ID                    string   `json:"id"`
			Kind                  string   `json:"kind"`
			BindingContextMembers []string `json:"binding_context_members"`
			Request               struct {
				Subject  authzen.Object     `json:"subject"`
				Resource authzen.Object     `json:"resource"`
				Action   authzen.Object     `json:"action"`
				Items    []authzen.BulkItem `json:"items"`
				Context  authzen.Object     `json:"context"`
			} `json:"request"`
			JCS         string `json:"jcs"`
			BindingHash string `json:"binding_hash"`
		} `json:"vectors"`
	}
	require.NoError(t, json.Unmarshal(raw, &file))
	require.Len(t, file.Vectors, 7, "every vector in the file is run")
	for _, v := range file.Vectors {
		t.Run(v.ID, func(t *testing.T) {
			r := v.Request
			var input any
			var got string
			var err error
			switch v.Kind {
			case "single":
				input = authzen.BindingInput(r.Subject, r.Resource, r.Action, r.Context, v.BindingContextMembers)
				got, err = authzen.BindingHash(r.Subject, r.Resource, r.Action, r.Context, v.BindingContextMembers)
			case "bulk":
				input = map[string]any{"subject": authzen.BoundSubject(r.Subject), "items": r.Items, "context": authzen.RelevantContext(r.Context, v.BindingContextMembers)}
				got, err = authzen.BulkBindingHash(r.Subject, r.Items, r.Context, v.BindingContextMembers)
			default:
				t.Fatalf("unknown kind %q", v.Kind)
			}
			require.NoError(t, err)
			canon, err := authzen.Canonical(input)
			require.NoError(t, err)
			require.Equal(t, v.JCS, string(canon))
			require.Equal(t, v.BindingHash, got)
		})
	}
}

func TestBoundSubjectLeavesInputAlone(t *testing.T) {
	s := authzen.Object{"type": "user", "id": "alice", "properties": map[string]any{"act": map[string]any{"sub": "agent:demo"}, "dept": "x"}}
	b := authzen.BoundSubject(s)
	require.NotContains(t, b.Obj("properties"), "act")
	require.Contains(t, s.Obj("properties"), "act")
}

func TestEqualDistinguishesNullFromAbsent(t *testing.T) {
	require.True(t, authzen.Equal(map[string]any{"a": 1.0}, map[string]any{"a": 1}))
	require.False(t, authzen.Equal(map[string]any{"a": nil}, map[string]any{}))
	require.False(t, authzen.Equal([]any{1, 2}, []any{2, 1}))
}
