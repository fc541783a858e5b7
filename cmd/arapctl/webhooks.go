package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/omcp/arap/callbacks"
)

func webhooksCreate(fs *flag.FlagSet) action {
	client := fs.String("client", "", "API client whose callback allow-list the URL must pass and whose webhook secrets sign")
	url := fs.String("url", "", "where events are POSTed")
	return withDatabase(fs, func(ctx context.Context, db *pgxpool.Pool, s streams, pos []string) error {
		t, err := callbacks.NewTargetStore(db).Create(ctx, pos[0], *client, *url, operator())
		if err != nil {
			return err
		}
		fmt.Fprintf(s.out, "created webhook target %s: %s, signed with the webhook secrets of client %s\nRules name it in notify.webhooks.\n", t.Name, t.URL, t.Client)
		return nil
	})
}

func webhooksList(fs *flag.FlagSet) action {
	asJSON := fs.Bool("json", false, "print JSON")
	return withDatabase(fs, func(ctx context.Context, db *pgxpool.Pool, s streams, _ []string) error {
		list, err := callbacks.NewTargetStore(db).List(ctx)
		if err != nil {
			return err
		}
		if *asJSON {
			if list == nil {
				list = []callbacks.Target{}
			}
			return json.NewEncoder(s.out).Encode(list)
		}
		tw := tabwriter.NewWriter(s.out, 0, 2, 2, ' ', 0)
		fmt.Fprintln(tw, "NAME\tCLIENT\tURL\tCREATED")
		for _, t := range list {
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", t.Name, t.Client, t.URL, t.CreatedAt.Format(time.RFC3339))
		}
		return tw.Flush()
	})
}

func webhooksDelete(fs *flag.FlagSet) action {
	return withDatabase(fs, func(ctx context.Context, db *pgxpool.Pool, s streams, pos []string) error {
		if err := callbacks.NewTargetStore(db).Delete(ctx, pos[0], operator()); err != nil {
			return err
		}
		fmt.Fprintf(s.out, "deleted webhook target %s\n", pos[0])
		return nil
	})
}
