package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/omcp/arap/audit"
	"github.com/omcp/arap/passkeys"
	"github.com/omcp/arap/pep"
)

func auditVerify(fs *flag.FlagSet) action {
	frontEnd := fs.Bool("pep", false, "verify the MCP front-end's audit trail (schema pep) instead of the backend's")
	return withDatabase(fs, func(ctx context.Context, db *pgxpool.Pool, s streams, _ []string) error {
		if *frontEnd {
			rep, err := pep.VerifyAudit(ctx, db)
			if err != nil {
				return err
			}
			return report(s, "pep audit", rep.OK(), rep.Chains, rep.Events, rep.Breaks)
		}
		rep, err := audit.Verify(ctx, db)
		if err != nil {
			return err
		}
		chainsErr := report(s, "audit", rep.OK(), rep.Chains, rep.Events, rep.Breaks)
		// The signatures are checked even when a chain is broken: a broken
		// chain does not make a forged decision any less forged.
		signed, err := passkeys.VerifyAudit(ctx, db)
		if err != nil {
			return err
		}
		if signed.OK() {
			fmt.Fprintf(s.out, "signed decisions: %d, all verify\n", signed.Signed)
			return chainsErr
		}
		for _, f := range signed.Failures {
			fmt.Fprintln(s.out, "SIGNATURE:", f.String())
		}
		return errors.Join(chainsErr, fmt.Errorf("audit: %d signed decisions do not verify", len(signed.Failures)))
	})
}

// report prints a verification's outcome; a broken chain is an error.
func report[B fmt.Stringer](s streams, name string, ok bool, chains, events int, breaks []B) error {
	if ok {
		fmt.Fprintf(s.out, "%s: %d chains, %d events, all intact\n", name, chains, events)
		return nil
	}
	for _, b := range breaks {
		fmt.Fprintln(s.out, "BROKEN:", b.String())
	}
	return fmt.Errorf("%s: %d of %d chains broken", name, len(breaks), chains)
}

func auditExport(fs *flag.FlagSet) action {
	file := fs.String("out", "", "write to FILE instead of standard output")
	frontEnd := fs.Bool("pep", false, "export the MCP front-end's audit trail (schema pep) instead of the backend's")
	return withDatabase(fs, func(ctx context.Context, db *pgxpool.Pool, s streams, _ []string) error {
		w := s.out
		if *file != "" {
			f, err := os.OpenFile(*file, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
			if err != nil {
				return err
			}
			defer f.Close()
			w = f
		}
		if *frontEnd {
			return pep.ExportAudit(ctx, db, w)
		}
		return audit.Export(ctx, db, w)
	})
}
