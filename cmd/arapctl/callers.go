package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"flag"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/omcp/arap/pep"
)

// The callers commands manage the MCP front-end's caller tokens (schema pep).

func callersCreate(fs *flag.FlagSet) action {
	subject := fs.String("subject", "", "the subject id the caller acts for, e.g. alice")
	subjectType := fs.String("subject-type", "user", "the subject type")
	actor := fs.String("actor", "", "the actor (agent) id acting for the subject, e.g. agent:demo")
	return withDatabase(fs, func(ctx context.Context, db *pgxpool.Pool, s streams, pos []string) error {
		b := make([]byte, 32)
		_, _ = rand.Read(b)
		token := "mcp_" + base64.RawURLEncoding.EncodeToString(b)
		c := &pep.Callers{DB: db}
		if err := c.Create(ctx, pos[0], token, pep.Principal{SubjectType: *subjectType, SubjectID: *subject, ActorID: *actor}); err != nil {
			return err
		}
		fmt.Fprintf(s.out, "created caller %s (acts for %s:%s through %q)\ntoken: %s\nThe token is shown once; store it now.\n", pos[0], *subjectType, *subject, *actor, token)
		return nil
	})
}

func callersRevoke(fs *flag.FlagSet) action {
	return withDatabase(fs, func(ctx context.Context, db *pgxpool.Pool, s streams, pos []string) error {
		if err := (&pep.Callers{DB: db}).Revoke(ctx, pos[0]); err != nil {
			return err
		}
		fmt.Fprintf(s.out, "revoked caller %s\n", pos[0])
		return nil
	})
}
