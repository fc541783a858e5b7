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

	"github.com/omcp/arap/internal/config"
	"github.com/omcp/arap/internal/seal"
)

// Where `arapd dev` records its database (internal/dev; a test keeps them
// equal without linking the dev server into arapctl).
const (
	devDataDir         = ".arap-dev"
	devDatabaseURLFile = "database-url"
)

// database is the database URL of a database command: ARAP_DATABASE_URL,
// DATABASE_URL or --database-url-file (it may hold a password, so never a
// flag), else the one arapd dev recorded.
type database struct{ url *config.Secret }

func databaseFlag(fs *flag.FlagSet) database {
	return database{settings(fs).Secret("database-url", "the PostgreSQL URL (default: the one arapd dev recorded in "+devDataDir+"/"+devDatabaseURLFile+")", "ARAP_DATABASE_URL", "DATABASE_URL")}
}

// withDatabase is an action on the database: it registers the database URL
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

// open connects to the database: ARAP_DATABASE_URL, DATABASE_URL or
// --database-url-file, else
// the database `arapd dev` records in ./.arap-dev/database-url, which it
// names on s.note. The caller closes the pool.
func (d database) open(s streams) (context.Context, *pgxpool.Pool, error) {
	ctx := context.Background()
	url, from := d.url.Value(), ""
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
	b, err := devFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("no database: set DATABASE_URL (or ARAP_DATABASE_URL, or --database-url-file) (with `arapd dev` running, run arapctl in the directory it runs in, or set DATABASE_URL=$(cat DATA-DIR/%s))", devDatabaseURLFile)
	}
	if err != nil {
		return "", fmt.Errorf("%w; set DATABASE_URL instead", err)
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

// masterKeyFlag is the master key of the commands that need it:
// ARAP_MASTER_KEY or --master-key-file.
func masterKeyFlag(fs *flag.FlagSet) *config.Secret {
	return settings(fs).Secret("master-key", "the base64 master key", "ARAP_MASTER_KEY")
}

// devMasterKeyFile is where arapd dev keeps the backend's master key.
const devMasterKeyFile = "master.key"

// readMasterKey decodes the base64 master key. Unset, with arapd dev's
// database in use (DATABASE_URL unset, as for open), it is arapd dev's
// own (./.arap-dev/master.key), under the same rules as its database URL.
func readMasterKey(key *config.Secret) ([]byte, error) {
	value := key.Value()
	if !key.IsSet() && os.Getenv("DATABASE_URL") == "" && os.Getenv("ARAP_DATABASE_URL") == "" {
		path := filepath.Join(devDataDir, devMasterKeyFile)
		if b, err := devFile(path); err == nil {
			value = strings.TrimSpace(string(b))
		} else if !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
	}
	master, err := base64.StdEncoding.DecodeString(value)
	if err != nil || len(master) != 32 {
		return nil, errors.New("the master key is needed: " + key.Describe() + " (base64 of 32 bytes; arapd dev's is " +
			filepath.Join(devDataDir, devMasterKeyFile) + ", used when arapctl runs in arapd dev's directory with DATABASE_URL unset)")
	}
	return master, nil
}

// devFile reads a file arapd dev wrote: it must be the user's own and
// private, as arapd dev writes it; one planted by someone else (or checked
// out of a repository) could point the operator's commands elsewhere.
func devFile(path string) ([]byte, error) {
	info, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	st, ok := info.Sys().(*syscall.Stat_t)
	if info.Mode().Perm()&0o077 != 0 || (ok && int(st.Uid) != os.Getuid()) || !info.Mode().IsRegular() {
		return nil, fmt.Errorf("not using %s: it must be a file of your own that only you can read (mode 0600), as arapd dev writes it", path)
	}
	return os.ReadFile(path)
}

// previousKeysFlag is the master keys a rotation replaced, which still open
// values sealed under them: envName (comma or newline separated) or the
// file named by --<name>-file.
func previousKeysFlag(fs *flag.FlagSet, name, envName string) *config.Secret {
	return settings(fs).Secret(name, "the previous base64 master keys, comma or newline separated", envName)
}

// readPreviousKeys decodes the previous master keys (none when unset).
func readPreviousKeys(keys *config.Secret) ([][]byte, error) {
	parsed, err := seal.ParseKeys(keys.Value())
	if err != nil {
		return nil, fmt.Errorf("%s: %w", keys.Describe(), err)
	}
	return parsed, nil
}
