package main

import (
	"context"
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/omcp/arap/internal/seal"
)

// Where `arapd dev` records its database (internal/dev; a test keeps them
// equal without linking the dev server into arapctl).
const (
	devDataDir         = ".arap-dev"
	devDatabaseURLFile = "database-url"
)

// database is the --database-url flag of a database command.
type database struct{ url *string }

func databaseFlag(fs *flag.FlagSet) database {
	return database{fs.String("database-url", "", "PostgreSQL URL (default: DATABASE_URL, else the one arapd dev recorded in "+devDataDir+"/"+devDatabaseURLFile+")")}
}

// withDatabase is an action on the database: it registers --database-url
// on fs, and connects before run and closes after it.
func withDatabase(fs *flag.FlagSet, run func(ctx context.Context, db *pgxpool.Pool, s streams, args []string) error) action {
	d := databaseFlag(fs)
	return func(s streams, args []string) error {
		ctx, db, err := d.open(s)
		if err != nil {
			return err
		}
		defer db.Close()
		return run(ctx, db, s, args)
	}
}

// open connects to the database: --database-url, else DATABASE_URL, else
// the database `arapd dev` records in ./.arap-dev/database-url, which it
// names on s.note. The caller closes the pool.
func (d database) open(s streams) (context.Context, *pgxpool.Pool, error) {
	ctx := context.Background()
	url, from := *d.url, ""
	if url == "" {
		url = os.Getenv("DATABASE_URL")
	}
	if url == "" {
		var err error
		if url, err = devDatabaseURL(); err != nil {
			return nil, nil, err
		}
		from = filepath.Join(devDataDir, devDatabaseURLFile)
		fmt.Fprintf(s.note, "arapctl: DATABASE_URL is unset; using the database of arapd dev (%s)\n", from)
	}
	db, err := pgxpool.New(ctx, url)
	if err != nil {
		return nil, nil, fmt.Errorf("database URL: %w", err)
	}
	// Connect now, so that a database that is not there says so here and
	// not as the first query's error.
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := db.Ping(pctx); err != nil {
		db.Close()
		if from != "" {
			return nil, nil, fmt.Errorf("cannot reach the database of arapd dev (%s): %w; its private cluster is reachable only while `arapd dev` runs", from, err)
		}
		return nil, nil, fmt.Errorf("cannot reach the database: %w", err)
	}
	return ctx, db, nil
}

// devDatabaseURL reads the URL `arapd dev` recorded in the current
// directory's data dir. The file must be the user's own and private, as
// arapd dev writes it: one planted by someone else (or checked out of a
// repository) could point the operator's commands at another database.
func devDatabaseURL() (string, error) {
	path := filepath.Join(devDataDir, devDatabaseURLFile)
	info, err := os.Stat(path)
	if errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("no database: set DATABASE_URL or --database-url (with `arapd dev` running, run arapctl in the directory it runs in, or set DATABASE_URL=$(cat DATA-DIR/%s))", devDatabaseURLFile)
	}
	if err != nil {
		return "", err
	}
	st, ok := info.Sys().(*syscall.Stat_t)
	if info.Mode().Perm()&0o077 != 0 || (ok && int(st.Uid) != os.Getuid()) || !info.Mode().IsRegular() {
		return "", fmt.Errorf("not using %s: it must be a file of your own that only you can read (mode 0600), as arapd dev writes it; set DATABASE_URL instead", path)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	url := strings.TrimSpace(string(b))
	if url == "" {
		return "", fmt.Errorf("%s is empty; set DATABASE_URL instead", path)
	}
	return url, nil
}

// operator names the person running the command, for the audit trail.
func operator() string {
	name := os.Getenv("USER")
	if name == "" {
		name = "unknown"
	}
	return "operator:" + name
}

// masterKeyFlag is --master-key-file of the commands that need the master
// key.
func masterKeyFlag(fs *flag.FlagSet) *string {
	return fs.String("master-key-file", os.Getenv("ARAP_MASTER_KEY_FILE"), "file with the base64 master key (ARAP_MASTER_KEY_FILE; or the key itself in ARAP_MASTER_KEY)")
}

// readMasterKey reads the base64 master key from a file or ARAP_MASTER_KEY.
func readMasterKey(file string) ([]byte, error) { return readMasterKeyFrom("ARAP_MASTER_KEY", file) }

// readMasterKeyFrom reads a base64 master key from a file or the
// environment variable envName.
func readMasterKeyFrom(envName, file string) ([]byte, error) {
	raw := os.Getenv(envName)
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, err
		}
		raw = string(b)
	}
	master, err := base64.StdEncoding.DecodeString(strings.TrimSpace(raw))
	if err != nil || len(master) != 32 {
		return nil, fmt.Errorf("the master key is needed: %s or --master-key-file (base64 of 32 bytes)", envName)
	}
	return master, nil
}

// previousKeysFlag is --master-key-previous-file: the master keys a rotation
// replaced, which still open values sealed under them.
func previousKeysFlag(fs *flag.FlagSet, envName string) *string {
	return fs.String("master-key-previous-file", os.Getenv(envName+"_FILE"),
		"file with the previous master keys, base64, comma or newline separated ("+envName+"_FILE; or the keys themselves in "+envName+")")
}

// readPreviousKeys reads the previous master keys from a file or envName.
func readPreviousKeys(envName, file string) ([][]byte, error) {
	raw := os.Getenv(envName)
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, err
		}
		raw = string(b)
	}
	keys, err := seal.ParseKeys(raw)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", envName, err)
	}
	return keys, nil
}
