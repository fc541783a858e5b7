package pep_test

import (
	"context"
	"testing"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/migrations"
	"github.com/omcp/arap/pep"
)

// TestCallerIdentitiesAreCanonical: a caller whose subject or actor the
// backend would refuse as non-canonical is refused when it is made.
func TestCallerIdentitiesAreCanonical(t *testing.T) {
	db := dbtest.New(t)
	jobs, err := river.NewClient(riverpgxv5.New(db), &river.Config{Schema: migrations.PEPRiverSchema})
	require.NoError(t, err)
	g, err := pep.NewGate(pep.Config{DB: db, Backend: &authzen.Client{BaseURL: "http://127.0.0.1:1", Token: "unused"},
		MasterKey: make([]byte, 32), Jobs: jobs, Tools: pep.DemoTools()})
	require.NoError(t, err)
	ctx := context.Background()
	for _, p := range []pep.Principal{
		{SubjectID: "bob "}, {SubjectID: "b\u200bob"}, {SubjectID: "ｂｏｂ"}, {SubjectID: "bob", ActorID: "agent:demo\u202e"},
		{SubjectID: "bob", SubjectType: " user"},
	} {
		err := g.Callers().Create(ctx, "c", "token-0123456789", p)
		require.Error(t, err, "%+v", p)
	}
	require.NoError(t, g.Callers().Create(ctx, "c", "token-0123456789", pep.Principal{SubjectID: "bob", ActorID: "agent:demo"}))
}
