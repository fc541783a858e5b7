package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/omcp/arap/arapclient"
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
	since := fs.String("since", "", "read the backend's audit stream through the API from this RFC 3339 time")
	follow := fs.Bool("follow", false, "read the audit stream through the API and keep waiting for new events (until interrupted)")
	after := fs.String("after", "", "read the audit stream through the API from this cursor (printed when export stops)")
	cursorFile := fs.String("cursor-file", "", "read the audit stream through the API, resuming from the cursor kept in FILE and keeping it there after every page")
	interval := fs.Duration("interval", 2*time.Second, "with --follow, how long to wait when nothing is new (100ms to 1m)")
	a := apiFlags(fs)
	d := databaseFlag(fs)
	return func(s streams, _ []string) error {
		w := s.out
		if *file != "" {
			f, err := os.OpenFile(*file, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
			if err != nil {
				return err
			}
			defer f.Close()
			w = f
		}
		if *since == "" && !*follow && *after == "" && *cursorFile == "" {
			// The whole trail, chain by chain, straight from the database.
			ctx, db, err := d.open(s)
			if err != nil {
				return err
			}
			defer db.Close()
			if *file != "" {
				if err := w.(*os.File).Truncate(0); err != nil {
					return err
				}
			}
			if *frontEnd {
				return pep.ExportAudit(ctx, db, w)
			}
			return audit.Export(ctx, db, w)
		}
		if *frontEnd {
			return usageError{msg: "--pep reads the database; --since, --follow, --after and --cursor-file read the backend's audit API"}
		}
		if *interval < 100*time.Millisecond || *interval > time.Minute {
			return usageError{msg: "--interval must be from 100ms to 1m"}
		}
		c, err := a.client()
		if err != nil {
			return err
		}
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		return streamAudit(ctx, c, s, w, streamOptions{since: *since, after: *after, cursorFile: *cursorFile, follow: *follow, interval: *interval})
	}
}

type streamOptions struct {
	since, after, cursorFile string
	follow                   bool
	interval                 time.Duration
}

// streamAudit prints the audit stream as JSON lines, a page at a time, and
// keeps the cursor (in o.cursorFile, if any) only once a page's lines are
// written, so that a restart repeats nothing and loses nothing. Following,
// it polls every o.interval while nothing is new, and rides out a backend
// that is briefly unreachable (retrying with backoff up to a minute); a
// refusal (bad token, missing scope, bad cursor) ends it.
func streamAudit(ctx context.Context, c *arapclient.Client, s streams, w io.Writer, o streamOptions) error {
	cursor := o.after
	if o.cursorFile != "" && cursor == "" {
		b, err := os.ReadFile(o.cursorFile)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		cursor = strings.TrimSpace(string(b))
	}
	if cursor != "" && o.since != "" {
		return usageError{msg: "--since starts a new stream; a cursor (--after, or one kept in --cursor-file) goes on with one: give one of them"}
	}
	bw := bufio.NewWriter(w)
	wait, failures := o.interval, 0
	defer func() {
		if cursor != "" {
			fmt.Fprintf(s.note, "arapctl: audit stream cursor: %s\n", cursor)
		}
	}()
	for {
		opts := arapclient.AuditOptions{After: cursor, Limit: 1000}
		if cursor == "" {
			opts.Since = o.since
		}
		page, err := c.Audit(ctx, opts)
		var pe *arapclient.ProblemError
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil && (!o.follow || errors.As(err, &pe) && pe.Status < 500 && pe.Status != http.StatusTooManyRequests):
			return err
		case err != nil:
			failures++
			wait = min(o.interval<<min(failures, 10), time.Minute)
			fmt.Fprintf(s.note, "arapctl: audit stream: %v; retrying in %s\n", err, wait)
		default:
			failures, wait = 0, o.interval
			for _, e := range page.Events {
				bw.Write(e)
				bw.WriteByte('\n')
			}
			if err := bw.Flush(); err != nil {
				return err
			}
			cursor = page.Next
			if o.cursorFile != "" {
				if err := writeCursor(o.cursorFile, cursor); err != nil {
					return err
				}
			}
			if len(page.Events) == opts.Limit {
				continue // more is waiting
			}
			if !o.follow {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

// writeCursor replaces the cursor file atomically (a crash leaves the old
// cursor or the new one, never half of one).
func writeCursor(path, cursor string) error {
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(cursor+"\n"), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
