package main

import (
	"fmt"
	"path/filepath"
	"sync"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestTaskFileKeepsConcurrentUpdates: clients writing the task file at once
// keep every id (the file is locked around each read-change-write).
func TestTaskFileKeepsConcurrentUpdates(t *testing.T) {
	f := &taskFile{path: filepath.Join(t.TempDir(), "state", "tasks.json")}
	var wg sync.WaitGroup
	for i := range 40 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			require.NoError(t, f.remember(fmt.Sprintf("tsk_%02d", i), "http://mcp", "tool"))
		}()
	}
	wg.Wait()
	ids, err := f.pending("http://mcp")
	require.NoError(t, err)
	require.Len(t, ids, 40)
	for i := 0; i < 40; i += 2 {
		require.NoError(t, f.forget(fmt.Sprintf("tsk_%02d", i)))
	}
	ids, err = f.pending("http://mcp")
	require.NoError(t, err)
	require.Len(t, ids, 20)
	none, err := f.pending("http://other")
	require.NoError(t, err)
	require.Empty(t, none, "tasks are per server")
}
