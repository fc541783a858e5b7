package main

import (
	"flag"
	"io"
	"sync"

	"github.com/omcp/arap/internal/config"
)

// The connection settings (--url, the tokens, the database URL, the master
// key) are configured as arapd's are (internal/config): a flag, an ARAP_*
// variable, or a key of the config file (--config FILE, ARAP_CONFIG), in
// that order; secrets only from a variable or a file. One config file
// serves every command, so each command skips the keys of the others.
var sharedKeys = []string{"url", "token-file", "mcp-url", "mcp-token-file", "mcp-state", "database-url-file", "master-key-file",
	"master-key-previous-file", "pep-master-key-file", "pep-master-key-previous-file"}

// settingsOf holds the settings of each command's flag set.
var settingsOf sync.Map // *flag.FlagSet -> *config.Set

// settings returns the connection settings defined on fs, adding --config
// the first time.
func settings(fs *flag.FlagSet) *config.Set {
	if c, ok := settingsOf.Load(fs); ok {
		return c.(*config.Set)
	}
	c := config.Wrap(fs, "arapctl "+fs.Name(), io.Discard)
	c.Ignore(sharedKeys...)
	settingsOf.Store(fs, c)
	return c
}

// resolve completes fs's settings from the environment and the config file
// once the command line is parsed; commands without any have nothing to do.
func resolve(fs *flag.FlagSet) error {
	c, ok := settingsOf.Load(fs)
	if !ok {
		return nil
	}
	settingsOf.Delete(fs)
	return c.(*config.Set).Resolve()
}

// sources names where a flag's value may come from besides the flag, for
// the help ("" for a flag that is not a setting).
func sources(fs *flag.FlagSet, name string) string {
	if c, ok := settingsOf.Load(fs); ok {
		return c.(*config.Set).Sources(name)
	}
	return ""
}
