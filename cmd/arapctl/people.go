package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/omcp/arap/attributes"
	"github.com/omcp/arap/directory"
	"github.com/omcp/arap/migrations"
	"github.com/omcp/arap/requests"
)

// stdin is where passwords are read from (replaced in tests).
var stdin io.Reader = os.Stdin

func readSecret() (string, error) {
	line, err := bufio.NewReader(stdin).ReadString('\n')
	if err != nil && err != io.EOF {
		return "", err
	}
	return strings.TrimRight(line, "\r\n"), nil
}

func users(sub string, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("users "+sub, flag.ContinueOnError)
	name := fs.String("name", "", "user name (lower case)")
	display := fs.String("display-name", "", "display name")
	email := fs.String("email", "", "e-mail address (also matched against request subjects)")
	pwStdin := fs.Bool("password-stdin", false, "read a web UI password from standard input")
	ctx, db, pos, err := dbCommand(fs, args, -1, "")
	if err != nil {
		return err
	}
	defer db.Close()
	dir := directory.NewStore(db)
	switch sub {
	case "create":
		pw := ""
		if *pwStdin {
			if pw, err = readSecret(); err != nil {
				return err
			}
		}
		if err := dir.CreateUser(ctx, directory.User{Name: *name, DisplayName: *display, Email: *email}, pw, operator()); err != nil {
			return err
		}
		fmt.Fprintf(out, "created user %s\n", *name)
	case "list":
		list, err := dir.Users(ctx)
		if err != nil {
			return err
		}
		tw := tabwriter.NewWriter(out, 0, 2, 2, ' ', 0)
		fmt.Fprintln(tw, "NAME\tDISPLAY NAME\tEMAIL\tGROUPS\tSTATUS")
		for _, u := range list {
			status := "active"
			if u.DisabledAt != nil {
				status = "disabled"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", u.Name, u.DisplayName, u.Email, strings.Join(u.Groups, ","), status)
		}
		return tw.Flush()
	case "disable":
		if len(pos) != 1 {
			return usageError{"users disable takes a user name"}
		}
		if err := dir.DisableUser(ctx, pos[0], operator()); err != nil {
			return err
		}
		fmt.Fprintf(out, "disabled user %s\n", pos[0])
	case "passwd":
		if len(pos) != 1 {
			return usageError{"users passwd takes a user name; the password is read from standard input"}
		}
		pw, err := readSecret()
		if err != nil {
			return err
		}
		if err := dir.SetPassword(ctx, pos[0], pw, operator()); err != nil {
			return err
		}
		fmt.Fprintf(out, "password set for %s\n", pos[0])
	}
	return nil
}

func groups(sub string, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("groups "+sub, flag.ContinueOnError)
	want := map[string]int{"create": 1, "add": 2, "remove": 2, "list": 0}[sub]
	ctx, db, pos, err := dbCommand(fs, args, want, fmt.Sprintf("groups %s takes %d argument(s)", sub, want))
	if err != nil {
		return err
	}
	defer db.Close()
	dir := directory.NewStore(db)
	switch sub {
	case "create":
		err = dir.CreateGroup(ctx, pos[0], operator())
	case "add":
		err = dir.AddMember(ctx, pos[0], pos[1], operator())
	case "remove":
		err = dir.RemoveMember(ctx, pos[0], pos[1], operator())
	case "list":
		gs, err := dir.Groups(ctx)
		if err != nil {
			return err
		}
		names := make([]string, 0, len(gs))
		for g := range gs {
			names = append(names, g)
		}
		sort.Strings(names)
		for _, g := range names {
			fmt.Fprintf(out, "%s: %s\n", g, strings.Join(gs[g], ", "))
		}
		return nil
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "groups %s: done\n", sub)
	return nil
}

// attrs sets attributes and, in the same transaction, re-runs the automated
// resolvers of pending requests, whose inputs just changed.
func attrs(sub string, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("attributes "+sub, flag.ContinueOnError)
	ctx, db, pos, err := dbCommand(fs, args, -1, "")
	if err != nil {
		return err
	}
	defer db.Close()
	store := attributes.NewStore(db)
	if sub == "list" {
		snap, err := store.Snapshot(ctx)
		if err != nil {
			return err
		}
		return json.NewEncoder(out).Encode(snap)
	}
	var key string
	var value any
	switch {
	case sub == "set" && len(pos) == 2:
		key = pos[0]
		// JSON if it parses (true, 3, {"a":1}), otherwise a string.
		if err := json.Unmarshal([]byte(pos[1]), &value); err != nil {
			value = pos[1]
		}
	case sub == "unset" && len(pos) == 1:
		key = pos[0]
	default:
		return usageError{"attributes set KEY VALUE | attributes unset KEY"}
	}
	jobs, err := river.NewClient(riverpgxv5.New(db), &river.Config{Schema: migrations.RiverSchema})
	if err != nil {
		return err
	}
	if err := store.Set(ctx, key, value, operator(), func(ctx context.Context, tx pgx.Tx) error {
		return requests.RecheckPendingTx(ctx, tx, jobs)
	}); err != nil {
		return err
	}
	fmt.Fprintf(out, "attribute %s %s; automated resolvers of pending requests will run again\n", key, map[string]string{"set": "set", "unset": "removed"}[sub])
	return nil
}
