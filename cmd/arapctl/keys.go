package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/omcp/arap/passkeys"
	"github.com/omcp/arap/signing"
)

func keysRotate(fs *flag.FlagSet) action {
	d := databaseFlag(fs)
	window := fs.Duration("verify-window", signing.DefaultVerifyWindow, "how long the retired key keeps verifying (cover the longest approval)")
	keyFile := masterKeyFlag(fs)
	return func(s streams, _ []string) error {
		master, err := readMasterKey(keyFile)
		if err != nil {
			return err
		}
		ctx, db, err := d.open(s)
		if err != nil {
			return err
		}
		defer db.Close()
		keys, err := signing.Open(ctx, db, signing.Options{MasterKey: master})
		if err != nil {
			return err
		}
		old := keys.ActiveKid()
		kid, err := keys.Rotate(ctx, *window, operator())
		if err != nil {
			return err
		}
		fmt.Fprintf(s.out, "new signing key %s; %s retired, verifying until %s\n", kid, old, time.Now().Add(*window).UTC().Format(time.RFC3339))
		return nil
	}
}

func keysList(fs *flag.FlagSet) action {
	return withDatabase(fs, func(ctx context.Context, db *pgxpool.Pool, s streams, _ []string) error {
		list, err := signing.List(ctx, db)
		if err != nil {
			return err
		}
		tw := tabwriter.NewWriter(s.out, 0, 2, 2, ' ', 0)
		fmt.Fprintln(tw, "KID\tALG\tCREATED\tSTATE")
		for _, k := range list {
			state := "signing"
			switch {
			case k.RetiredAt == nil:
			case k.ExpiresAt == nil:
				state = "retired"
			case time.Now().After(*k.ExpiresAt):
				state = "expired"
			default:
				state = "verify-only until " + k.ExpiresAt.Format(time.RFC3339)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", k.Kid, k.Alg, k.CreatedAt.Format(time.RFC3339), state)
		}
		return tw.Flush()
	})
}

// passkeysList prints the registered passkeys with their key fingerprints:
// kept somewhere the database's writers cannot reach, they show whether a
// registration in the audit log was replaced.
func passkeysList(fs *flag.FlagSet) action {
	user := fs.String("user", "", "only this user's")
	return withDatabase(fs, func(ctx context.Context, db *pgxpool.Pool, s streams, _ []string) error {
		list, err := passkeys.List(ctx, db, *user)
		if err != nil {
			return err
		}
		tw := tabwriter.NewWriter(s.out, 0, 2, 2, ' ', 0)
		fmt.Fprintln(tw, "USER\tNAME\tCREATED\tCREDENTIAL ID\tKEY FINGERPRINT (SHA-256)")
		for _, p := range list {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", p.User, p.Name, p.CreatedAt.UTC().Format(time.RFC3339), p.ID(), p.Fingerprint())
		}
		return tw.Flush()
	})
}

// passkeysRemove removes a person's passkey, even their last one (a lost
// key); people remove their others in the web UI.
func passkeysRemove(fs *flag.FlagSet) action {
	user := fs.String("user", "", "whose passkey (required)")
	return withDatabase(fs, func(ctx context.Context, db *pgxpool.Pool, s streams, args []string) error {
		if *user == "" {
			return errors.New("--user is required")
		}
		if err := passkeys.RemoveByOperator(ctx, db, *user, args[0], operator()); err != nil {
			return err
		}
		fmt.Fprintf(s.out, "removed passkey %s of %s\n", args[0], *user)
		return nil
	})
}
