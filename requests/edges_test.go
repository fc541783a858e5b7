package requests_test

import (
	"context"
	"encoding/base64"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/requests"
)

// Ids and free text reach the service from HTTP paths, JSON bodies and web
// forms. Malformed ids are unknown and bad text is refused, each as a typed
// refusal, before any query: PostgreSQL refuses NUL and invalid UTF-8 in
// text, which would otherwise surface as an internal error.
func TestMalformedIDsAndTextAreRefusedBeforeSQL(t *testing.T) {
	f := setupWith(t, "testdata/resolution.yaml")
	ctx := context.Background()
	r := f.submitFor("alice", "wire_transfer", map[string]any{"amount": 50000})

	for _, id := range []string{"", "\x00", "arq_\x00", "arq_" + "AAAAAAAAAAAAAAAAAAAAAAAAA\x00", "arq_\xff\xfe", "arq_aaaaaaaaaaaaaaaaaaaaaaaaaa", "apr_\x00", r.ID + "\x00"} {
		_, err := f.svc.Get(ctx, f.pep, id)
		require.Equal(t, authzen.ProblemUnknownTask, requests.ErrorCode(err), "Get(%q): %v", id, err)
		_, err = f.svc.Load(ctx, id)
		require.Equal(t, authzen.ProblemUnknownTask, requests.ErrorCode(err), "Load(%q): %v", id, err)
		_, err = f.svc.Cancel(ctx, f.pep, id, "", "")
		require.Equal(t, authzen.ProblemUnknownTask, requests.ErrorCode(err), "Cancel(%q): %v", id, err)
		_, err = f.svc.Decide(ctx, bob, id, requests.Decision{Approve: true})
		require.Equal(t, authzen.ProblemUnknownTask, requests.ErrorCode(err), "Decide(%q): %v", id, err)
		_, err = f.svc.Revoke(ctx, carol, id, "")
		require.Equal(t, authzen.ProblemNotFound, requests.ErrorCode(err), "Revoke(%q): %v", id, err)
		a, err := (&requests.ApprovalStore{DB: f.db, Now: time.Now}).Approval(ctx, id)
		require.NoError(t, err, "Approval(%q)", id)
		require.Nil(t, a)

		cursor := base64.RawURLEncoding.EncodeToString([]byte(time.Now().UTC().Format(time.RFC3339Nano) + "|" + id))
		_, _, err = f.svc.List(ctx, nil, requests.ListOptions{Cursor: cursor})
		require.Equal(t, authzen.ProblemInvalidRequest, requests.ErrorCode(err), "cursor with %q: %v", id, err)
	}

	for _, text := range []string{"\x00", "fine\x00", "\xff", "a\xc0\xafb"} {
		_, err := f.svc.Decide(ctx, bob, r.ID, requests.Decision{Approve: true, Reason: text})
		require.Equal(t, authzen.ProblemInvalidRequest, requests.ErrorCode(err), "reason %q: %v", text, err)
		_, err = f.svc.Cancel(ctx, f.pep, r.ID, "", text)
		require.Equal(t, authzen.ProblemInvalidRequest, requests.ErrorCode(err), "comment %q: %v", text, err)
		_, err = f.svc.Revoke(ctx, carol, r.ID, text)
		require.Equal(t, authzen.ProblemInvalidRequest, requests.ErrorCode(err), "revocation reason %q: %v", text, err)
	}
	got, err := f.svc.Load(ctx, r.ID)
	require.NoError(t, err)
	require.Equal(t, requests.Pending, got.Status, "nothing changed")
	votes, err := f.svc.Votes(ctx, r.ID)
	require.NoError(t, err)
	require.Empty(t, votes)
}
