package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/omcp/arap/callbacks"
	"github.com/omcp/arap/internal/seal"
	"github.com/omcp/arap/passkeys"
	"github.com/omcp/arap/pep"
	"github.com/omcp/arap/signing"
)

func keysRotate(fs *flag.FlagSet) action {
	d := databaseFlag(fs)
	window := fs.Duration("verify-window", signing.DefaultVerifyWindow, "how long the retired key keeps verifying (cover the longest approval)")
	keyFile := masterKeyFlag(fs)
	prevKeys := previousKeysFlag(fs, "master-key-previous", "ARAP_MASTER_KEY_PREVIOUS")
	return func(s streams, _ []string) error {
		master, err := readMasterKey(keyFile)
		if err != nil {
			return err
		}
		previous, err := readPreviousKeys(prevKeys)
		if err != nil {
			return err
		}
		ctx, db, err := d.open(s)
		if err != nil {
			return err
		}
		defer db.Close()
		keys, err := signing.Open(ctx, db, signing.Options{MasterKey: master, PreviousMasterKeys: previous})
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

// keysReseal re-seals every sealed column of the backend (or, with --pep,
// of the front-end) under the current master key, while the services run
// with the current key and the previous ones; --check only reports, and
// fails while any value is not under the current key.
func keysReseal(fs *flag.FlagSet) action {
	d := databaseFlag(fs)
	frontEnd := fs.Bool("pep", false, "the MCP front-end's sealed values (schema pep, keys ARAP_PEP_MASTER_KEY and ARAP_PEP_MASTER_KEY_PREVIOUS) instead of the backend's")
	check := fs.Bool("check", false, "change nothing; exit non-zero if any value is not sealed under the current key (run it before retiring a previous key)")
	// Both processes' keys are settings here; --pep picks the front-end's.
	key := masterKeyFlag(fs)
	prevKeys := previousKeysFlag(fs, "master-key-previous", "ARAP_MASTER_KEY_PREVIOUS")
	pepKey := settings(fs).Secret("pep-master-key", "the front-end's base64 master key (with --pep)", "ARAP_PEP_MASTER_KEY")
	pepPrevKeys := previousKeysFlag(fs, "pep-master-key-previous", "ARAP_PEP_MASTER_KEY_PREVIOUS")
	return func(s streams, _ []string) error {
		cols := append(append([]seal.Column{}, signing.Sealed...), callbacks.Sealed...)
		if *frontEnd {
			cols, key, prevKeys = pep.Sealed, pepKey, pepPrevKeys
		}
		current, err := readMasterKey(key)
		if err != nil {
			return err
		}
		var previous [][]byte
		if !*check {
			if previous, err = readPreviousKeys(prevKeys); err != nil {
				return err
			}
		}
		box, err := seal.New(current, previous...)
		if err != nil {
			return err
		}
		ctx, db, err := d.open(s)
		if err != nil {
			return err
		}
		defer db.Close()
		if !*check {
			counts, err := seal.Reseal(ctx, db, box, cols)
			for _, n := range counts {
				fmt.Fprintf(s.out, "%s: %d values, %d re-sealed, %d already under key %s", n.Column, n.Rows, n.Resealed, n.Current, box.CurrentID())
				if n.Stale > 0 {
					fmt.Fprintf(s.out, ", %d opened by none of the keys given", n.Stale)
				}
				fmt.Fprintln(s.out)
			}
			if err != nil {
				return err
			}
		}
		// Whatever the re-seal did, what counts is what is stored now: a
		// replica still sealing under an old key shows here.
		counts, err := seal.Check(ctx, db, box, cols)
		if err != nil {
			return err
		}
		stale := 0
		for _, n := range counts {
			stale += n.Stale
			if *check || n.Stale > 0 {
				fmt.Fprintf(s.out, "%s: %d values, %d not under key %s\n", n.Column, n.Rows, n.Stale, box.CurrentID())
			}
		}
		if stale > 0 {
			return fmt.Errorf("%d sealed values are not under the current key %s: do not retire the previous keys yet (run keys reseal again; check that every replica runs with the new key as current)", stale, box.CurrentID())
		}
		fmt.Fprintf(s.out, "every sealed value is under the current key %s; the previous keys can be retired\n", box.CurrentID())
		return nil
	}
}
