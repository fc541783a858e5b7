package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/omcp/arap/callbacks"
	"github.com/omcp/arap/clients"
	"github.com/omcp/arap/migrations"
)

func clientsCreate(fs *flag.FlagSet) action {
	name := fs.String("name", "", "client name")
	scopes := fs.String("scope", "", "comma-separated scopes: "+strings.Join(clients.AllScopes, ", "))
	kind := fs.String("kind", clients.KindAutomation, "resolver kind: "+strings.Join(clients.AllKinds, ", "))
	var actors, prefixes, networks multi
	fs.Var(&actors, "actor", "actor id pattern the client may assert (repeatable), e.g. 'agent:*'")
	fs.Var(&prefixes, "callback-prefix", "URL prefix the client may register callbacks under (repeatable)")
	fs.Var(&networks, "callback-network", "internal network its callbacks may reach: loopback, private, link-local (repeatable)")
	return withDatabase(fs, func(ctx context.Context, db *pgxpool.Pool, s streams, _ []string) error {
		var sc []string
		for _, s := range strings.Split(*scopes, ",") {
			if s = strings.TrimSpace(s); s != "" {
				sc = append(sc, s)
			}
		}
		c, token, err := clients.NewStore(db).Create(ctx, clients.New{Name: *name, Scopes: sc, Kind: *kind, Actors: actors,
			CallbackPrefixes: prefixes, CallbackNetworks: networks}, operator())
		if err != nil {
			return err
		}
		fmt.Fprintf(s.out, "created client %s (%s)\ntoken: %s\nThe token is shown once; store it now.\n", c.Name, c.ID, token)
		if len(prefixes) > 0 {
			fmt.Fprintln(s.out, "Create its webhook secret with: arapctl clients secret rotate "+c.Name)
		}
		return nil
	})
}

func clientsList(fs *flag.FlagSet) action {
	asJSON := fs.Bool("json", false, "print JSON")
	return withDatabase(fs, func(ctx context.Context, db *pgxpool.Pool, s streams, _ []string) error {
		list, err := clients.NewStore(db).List(ctx)
		if err != nil {
			return err
		}
		if *asJSON {
			return json.NewEncoder(s.out).Encode(list)
		}
		tw := tabwriter.NewWriter(s.out, 0, 2, 2, ' ', 0)
		fmt.Fprintln(tw, "NAME\tID\tSCOPES\tKIND\tACTORS\tCREATED\tSTATUS")
		for _, c := range list {
			status := "active"
			if c.RevokedAt != nil {
				status = "revoked " + c.RevokedAt.Format(time.RFC3339)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", c.Name, c.ID, strings.Join(c.Scopes, ","), c.Kind,
				strings.Join(c.Actors, ","), c.CreatedAt.Format(time.RFC3339), status)
		}
		return tw.Flush()
	})
}

func clientsRevoke(fs *flag.FlagSet) action {
	return withDatabase(fs, func(ctx context.Context, db *pgxpool.Pool, s streams, pos []string) error {
		c, err := clients.NewStore(db).Revoke(ctx, pos[0], operator())
		if err != nil {
			return err
		}
		fmt.Fprintf(s.out, "revoked client %s (%s); replicas refuse its token within 5 seconds\n", c.Name, c.ID)
		return nil
	})
}

func clientsSecretRotate(fs *flag.FlagSet) action {
	d := databaseFlag(fs)
	overlap := fs.Duration("overlap", 24*time.Hour, "how long the previous secrets keep signing")
	keyFile := masterKeyFlag(fs)
	return func(s streams, pos []string) error {
		master, err := readMasterKey(keyFile)
		if err != nil {
			return err
		}
		ctx, db, err := d.open(s)
		if err != nil {
			return err
		}
		defer db.Close()
		c, err := clients.NewStore(db).Get(ctx, pos[0])
		if err != nil {
			return err
		}
		jobs, err := river.NewClient(riverpgxv5.New(db), &river.Config{Schema: migrations.RiverSchema})
		if err != nil {
			return err
		}
		cbs, err := callbacks.NewService(callbacks.Config{DB: db, Jobs: jobs, MasterKey: master, StatusEndpoint: func(string) string { return "" }})
		if err != nil {
			return err
		}
		secret, err := cbs.RotateSecret(ctx, c.ID, *overlap, "", operator())
		if err != nil {
			return err
		}
		fmt.Fprintf(s.out, "webhook secret for %s: %s\nShown once. Earlier secrets keep signing for %s.\n", c.Name, secret, *overlap)
		return nil
	}
}
