package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/omcp/arap/directory"
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

func usersCreate(fs *flag.FlagSet) action {
	d := databaseFlag(fs)
	name := fs.String("name", "", "user name (lower case)")
	display := fs.String("display-name", "", "display name")
	email := fs.String("email", "", "e-mail address (also matched against request subjects)")
	pwStdin := fs.Bool("password-stdin", false, "read a web UI password from standard input")
	return func(s streams, _ []string) error {
		pw := ""
		if *pwStdin {
			var err error
			if pw, err = readSecret(); err != nil {
				return err
			}
		}
		ctx, db, err := d.open(s)
		if err != nil {
			return err
		}
		defer db.Close()
		if err := directory.NewStore(db).CreateUser(ctx, directory.User{Name: *name, DisplayName: *display, Email: *email}, pw, operator()); err != nil {
			return err
		}
		fmt.Fprintf(s.out, "created user %s\n", *name)
		return nil
	}
}

func usersList(fs *flag.FlagSet) action {
	return withDatabase(fs, func(ctx context.Context, db *pgxpool.Pool, s streams, _ []string) error {
		list, err := directory.NewStore(db).Users(ctx)
		if err != nil {
			return err
		}
		tw := tabwriter.NewWriter(s.out, 0, 2, 2, ' ', 0)
		fmt.Fprintln(tw, "NAME\tDISPLAY NAME\tEMAIL\tGROUPS\tSTATUS")
		for _, u := range list {
			status := "active"
			if u.DisabledAt != nil {
				status = "disabled"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", u.Name, u.DisplayName, u.Email, strings.Join(u.Groups, ","), status)
		}
		return tw.Flush()
	})
}

func usersDisable(fs *flag.FlagSet) action {
	return directoryChange(fs, func(dir *directory.Store, ctx context.Context, pos []string) (string, error) {
		return "disabled user " + pos[0], dir.DisableUser(ctx, pos[0], operator())
	})
}

func usersPasswd(fs *flag.FlagSet) action {
	return directoryChange(fs, func(dir *directory.Store, ctx context.Context, pos []string) (string, error) {
		pw, err := readSecret()
		if err != nil {
			return "", err
		}
		return "password set for " + pos[0], dir.SetPassword(ctx, pos[0], pw, operator())
	})
}

func groupsCreate(fs *flag.FlagSet) action {
	return directoryChange(fs, func(dir *directory.Store, ctx context.Context, pos []string) (string, error) {
		return "created group " + pos[0], dir.CreateGroup(ctx, pos[0], operator())
	})
}

func groupsAdd(fs *flag.FlagSet) action {
	return directoryChange(fs, func(dir *directory.Store, ctx context.Context, pos []string) (string, error) {
		return fmt.Sprintf("added %s to %s", pos[1], pos[0]), dir.AddMember(ctx, pos[0], pos[1], operator())
	})
}

func groupsRemove(fs *flag.FlagSet) action {
	return directoryChange(fs, func(dir *directory.Store, ctx context.Context, pos []string) (string, error) {
		return fmt.Sprintf("removed %s from %s", pos[1], pos[0]), dir.RemoveMember(ctx, pos[0], pos[1], operator())
	})
}

func groupsList(fs *flag.FlagSet) action {
	return withDatabase(fs, func(ctx context.Context, db *pgxpool.Pool, s streams, _ []string) error {
		gs, err := directory.NewStore(db).Groups(ctx)
		if err != nil {
			return err
		}
		names := make([]string, 0, len(gs))
		for g := range gs {
			names = append(names, g)
		}
		sort.Strings(names)
		for _, g := range names {
			fmt.Fprintf(s.out, "%s: %s\n", g, strings.Join(gs[g], ", "))
		}
		return nil
	})
}

// directoryChange is a command that makes one change in the directory and
// prints what it did.
func directoryChange(fs *flag.FlagSet, change func(dir *directory.Store, ctx context.Context, pos []string) (string, error)) action {
	return withDatabase(fs, func(ctx context.Context, db *pgxpool.Pool, s streams, pos []string) error {
		done, err := change(directory.NewStore(db), ctx, pos)
		if err != nil {
			return err
		}
		fmt.Fprintln(s.out, done)
		return nil
	})
}
