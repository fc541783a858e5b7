package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/clients"
	"github.com/omcp/arap/internal/dbtest"
	"github.com/omcp/arap/signing"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

func ctl(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	err := run(args, &out)
	return out.String(), err
}

func TestClientsKeysAudit(t *testing.T) {
	url := dbtest.URL(t)
	t.Setenv("DATABASE_URL", url)
	master := make([]byte, 32)
	master[0] = 7
	t.Setenv("ARAP_MASTER_KEY", base64.StdEncoding.EncodeToString(master))
	ctx := context.Background()
	db, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	defer db.Close()

	out, err := ctl(t, "clients", "create", "--name", "pep-a", "--scope", "evaluate,request", "--kind", "automation", "--actor", "agent:*")
	require.NoError(t, err)
	token := regexp.MustCompile(`token: (\S+)`).FindStringSubmatch(out)[1]
	c, err := clients.NewStore(db).Authenticate(ctx, token)
	require.NoError(t, err)
	require.Equal(t, "pep-a", c.Name)

	_, err = ctl(t, "clients", "create", "--name", "bad", "--scope", "root")
	require.ErrorContains(t, err, `unknown scope "root"`)

	out, err = ctl(t, "clients", "list")
	require.NoError(t, err)
	require.Contains(t, out, "pep-a")
	require.Contains(t, out, "evaluate,request")
	require.NotContains(t, out, token, "tokens are never listed")

	_, err = ctl(t, "clients", "revoke", "pep-a")
	require.NoError(t, err)
	_, err = clients.NewStore(db).Authenticate(ctx, token)
	require.ErrorIs(t, err, clients.ErrUnauthenticated)
	_, err = ctl(t, "clients", "revoke", "nobody")
	require.ErrorIs(t, err, clients.ErrNotFound)

	_, err = signing.Open(ctx, db, signing.Options{MasterKey: master})
	require.NoError(t, err)
	out, err = ctl(t, "keys", "rotate")
	require.NoError(t, err)
	require.Contains(t, out, "new signing key")
	out, err = ctl(t, "keys", "list")
	require.NoError(t, err)
	require.Contains(t, out, "signing")
	require.Contains(t, out, "verify-only until")

	out, err = ctl(t, "audit", "verify")
	require.NoError(t, err)
	require.Contains(t, out, "all intact")
	out, err = ctl(t, "audit", "export")
	require.NoError(t, err)
	require.Len(t, strings.Split(strings.TrimSpace(out), "\n"), 3, "client created, client revoked, key rotated")

	_, err = db.Exec(ctx, `UPDATE arap.audit_events SET actor = 'operator:mallory' WHERE seq = 2`)
	require.NoError(t, err)
	out, err = ctl(t, "audit", "verify")
	require.Error(t, err)
	require.Contains(t, out, "BROKEN: chain system: event seq 2")
}

func TestUsage(t *testing.T) {
	_, err := ctl(t, "frobnicate", "now")
	var ue usageError
	require.ErrorAs(t, err, &ue)
	t.Setenv("DATABASE_URL", "")
	_, err = ctl(t, "clients", "list")
	require.ErrorContains(t, err, "DATABASE_URL")
}
