package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/omcp/arap/attributes"
	"github.com/omcp/arap/migrations"
	"github.com/omcp/arap/requests"
)

func attributesList(fs *flag.FlagSet) action {
	return withDatabase(fs, func(ctx context.Context, db *pgxpool.Pool, s streams, _ []string) error {
		snap, err := attributes.NewStore(db).Snapshot(ctx)
		if err != nil {
			return err
		}
		return json.NewEncoder(s.out).Encode(snap)
	})
}

func attributesSet(fs *flag.FlagSet) action {
	return attributeChange(fs, func(pos []string) any {
		// JSON if it parses (true, 3, {"a":1}), otherwise a string.
		var value any
		if err := json.Unmarshal([]byte(pos[1]), &value); err != nil {
			value = pos[1]
		}
		return value
	}, "set")
}

func attributesUnset(fs *flag.FlagSet) action {
	return attributeChange(fs, func([]string) any { return nil }, "removed")
}

// attributeChange sets (or, with a nil value, removes) the attribute
// pos[0] and, in the same transaction, re-runs the automated resolvers of
// pending requests, whose inputs just changed.
func attributeChange(fs *flag.FlagSet, value func(pos []string) any, done string) action {
	return withDatabase(fs, func(ctx context.Context, db *pgxpool.Pool, s streams, pos []string) error {
		jobs, err := river.NewClient(riverpgxv5.New(db), &river.Config{Schema: migrations.RiverSchema})
		if err != nil {
			return err
		}
		if err := attributes.NewStore(db).Set(ctx, pos[0], value(pos), operator(), func(ctx context.Context, tx pgx.Tx) error {
			return requests.RecheckPendingTx(ctx, tx, jobs)
		}); err != nil {
			return err
		}
		fmt.Fprintf(s.out, "attribute %s %s; automated resolvers of pending requests will run again\n", pos[0], done)
		return nil
	})
}
