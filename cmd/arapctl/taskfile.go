package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"syscall"
	"time"
)

// taskFile remembers the tasks this client started and has not seen end, so
// that wait resumes them after the client restarts.
type taskFile struct{ path string }

type rememberedTask struct {
	Server  string    `json:"server"`
	Tool    string    `json:"tool"`
	Created time.Time `json:"created"`
}

func defaultStateFile() string {
	if p := os.Getenv("ARAP_MCP_STATE"); p != "" {
		return p
	}
	dir := os.Getenv("XDG_STATE_HOME")
	if dir == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return ".arapctl-tasks.json"
		}
		dir = filepath.Join(home, ".local", "state")
	}
	return filepath.Join(dir, "arapctl", "tasks.json")
}

// defaultOAuthStore keeps the OAuth tokens of arapctl mcp beside its task
// state.
func defaultOAuthStore() string {
	return filepath.Join(filepath.Dir(defaultStateFile()), "oauth.json")
}

func (f *taskFile) load() (map[string]rememberedTask, error) {
	m := map[string]rememberedTask{}
	b, err := os.ReadFile(f.path)
	if errors.Is(err, os.ErrNotExist) {
		return m, nil
	}
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, fmt.Errorf("task file %s is damaged: %w", f.path, err)
	}
	return m, nil
}

// save writes atomically: a crash leaves the old file or the new one.
func (f *taskFile) save(m map[string]rememberedTask) error {
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(f.path), ".tasks-*.json")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(b); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), f.path)
}

// update changes the file under an exclusive lock, so that clients running
// at once (a call waiting in one terminal, another call in the next) do not
// lose each other's task ids.
func (f *taskFile) update(change func(m map[string]rememberedTask)) error {
	if err := os.MkdirAll(filepath.Dir(f.path), 0o700); err != nil {
		return err
	}
	lock, err := os.OpenFile(f.path+".lock", os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return err
	}
	defer lock.Close() // closing releases the lock
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return fmt.Errorf("lock %s: %w", lock.Name(), err)
	}
	m, err := f.load()
	if err != nil {
		return err
	}
	change(m)
	return f.save(m)
}

func (f *taskFile) remember(id, server, tool string) error {
	return f.update(func(m map[string]rememberedTask) {
		m[id] = rememberedTask{Server: server, Tool: tool, Created: time.Now().UTC()}
	})
}

func (f *taskFile) forget(id string) error {
	return f.update(func(m map[string]rememberedTask) { delete(m, id) })
}

// pending lists the remembered tasks of server, oldest first.
func (f *taskFile) pending(server string) ([]string, error) {
	m, err := f.load()
	if err != nil {
		return nil, err
	}
	var ids []string
	for id, t := range m {
		if t.Server == server {
			ids = append(ids, id)
		}
	}
	sort.Slice(ids, func(i, j int) bool { return m[ids[i]].Created.Before(m[ids[j]].Created) })
	return ids, nil
}
