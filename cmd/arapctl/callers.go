package main

import (
	"crypto/rand"
	"encoding/base64"
	"flag"
	"fmt"

	"github.com/omcp/arap/pep"
)

// The callers commands manage the MCP front-end's caller tokens (schema pep).

func callersCreate(fs *flag.FlagSet) action {
	d := databaseFlag(fs)
	subject := fs.String("subject", "", "the subject id the caller acts for, e.g. alice")
	subjectType := fs.String("subject-type", "user", "the subject type")
	actor := fs.String("actor", "", "the actor (agent) id acting for the subject, e.g. agent:demo")
	return func(s streams, pos []string) error {
		ctx, db, err := d.open(s)
		if err != nil {
			return err
		}
		defer db.Close()
		b := make([]byte, 32)
		_, _ = rand.Read(b)
		token := "mcp_" + base64.RawURLEncoding.EncodeToString(b)
		c := &pep.Callers{DB: db}
		if err := c.Create(ctx, pos[0], token, pep.Principal{SubjectType: *subjectType, SubjectID: *subject, ActorID: *actor}); err != nil {
			return err
		}
		fmt.Fprintf(s.out, "created caller %s (acts for %s:%s through %q)\ntoken: %s\nThe token is shown once; store it now.\n", pos[0], *subjectType, *subject, *actor, token)
		return nil
	}
}

func callersRevoke(fs *flag.FlagSet) action {
	d := databaseFlag(fs)
	return func(s streams, pos []string) error {
		ctx, db, err := d.open(s)
		if err != nil {
			return err
		}
		defer db.Close()
		if err := (&pep.Callers{DB: db}).Revoke(ctx, pos[0]); err != nil {
			return err
		}
		fmt.Fprintf(s.out, "revoked caller %s\n", pos[0])
		return nil
	}
}
