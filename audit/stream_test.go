package audit_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/audit"
	"github.com/omcp/arap/internal/dbtest"
)

// TestStreamOrderIsNumeric: the stream is ordered by transaction id as a
// number: 9 before 10 (as text, "10" sorts first).
func TestStreamOrderIsNumeric(t *testing.T) {
	ctx := context.Background()
	db := dbtest.New(t)
	appendEvents(t, db, "arq_a", 2)
	_, err := db.Exec(ctx, `UPDATE arap.audit_events SET txid = CASE seq WHEN 1 THEN '9'::xid8 ELSE '10'::xid8 END WHERE chain = 'arq_a'`)
	require.NoError(t, err)
	p, err := audit.Read(ctx, db, audit.Start(time.Time{}), 1)
	require.NoError(t, err)
	require.Len(t, p.Events, 1)
	require.EqualValues(t, 1, p.Events[0].Seq)
	c, err := audit.ParseCursor(p.Next)
	require.NoError(t, err)
	p, err = audit.Read(ctx, db, c, 10)
	require.NoError(t, err)
	require.Len(t, p.Events, 1)
	require.EqualValues(t, 2, p.Events[0].Seq)
	require.True(t, audit.VerifyRecords(p.Events).OK(), "a chain read from its middle verifies from there")
}

func TestCursors(t *testing.T) {
	since := time.Date(2026, 11, 1, 0, 0, 0, 123000, time.UTC)
	c, err := audit.ParseCursor(audit.Start(since).String())
	require.NoError(t, err)
	require.Equal(t, audit.Start(since), c)
	for _, bad := range []string{"", "a1.", "a1.!!", "b1.MC4wLg", "a1.MC4wLng", "a1.LTEuMC4", "a1.MC4tMS4", "a1.eC4wLg"} {
		_, err := audit.ParseCursor(bad)
		require.ErrorIs(t, err, audit.ErrBadCursor, "%q", bad)
	}
}
