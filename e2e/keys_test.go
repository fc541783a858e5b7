package e2e

import (
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"net/http"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/omcp/arap/callbacks"
	"github.com/omcp/arap/internal/seal"
	"github.com/omcp/arap/mcp/tasks"
	"github.com/omcp/arap/pep"
	"github.com/omcp/arap/signing"
)

const rotationPolicy = `version: 1
rules:
  - name: transfers
    match: {resource_id: wire_transfer}
    effect: request
    approval: {kinds: [itsm]}
`

// TestMasterKeyRotationUnderLoad rotates both master keys the way an
// operator would: the services restart with the new key as current and
// the old one as previous; tool calls that create and read sealed values
// (stored arguments, submission bodies, signing keys, webhook secrets) run
// while arapctl keys reseal runs; --check passes; the services restart with
// the new keys only, and every task still runs its tool with its stored
// arguments once approved (callbacks signed with the webhook secret, the
// approval signed with the signing key). A value put back under the old
// key is then found by --check.
func TestMasterKeyRotationUnderLoad(t *testing.T) {
	t.Parallel()
	s := newStack(t, stackOptions{policy: rotationPolicy})
	ctx := context.Background()
	alice := s.client(s.alice)
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	require.NoError(t, os.WriteFile(policy, []byte(rotationPolicy), 0o600))
	oldKey, oldPep := mustKey(t, masterKey), mustKey(t, pepMasterKey)
	newKey, newPep := randomKey(t), randomKey(t)
	b64 := base64.StdEncoding.EncodeToString

	call := func(i int) (string, error) {
		r, err := alice.CallTool(ctx, "wire_transfer", map[string]any{"to": fmt.Sprintf("acct-%d", i), "amount": 1000 + i}, nil)
		if err != nil {
			return "", err
		}
		if r.Task == nil {
			return "", fmt.Errorf("call %d: no task: %+v", i, r)
		}
		return r.Task.TaskID, nil
	}
	// Under the old keys: tasks waiting for approval.
	var before []string
	for i := range 3 {
		id, err := call(i)
		require.NoError(t, err)
		s.requestOf(id) // bound: its submission body is sealed and stored
		before = append(before, id)
	}
	// Values of deployments older than key ids (nonce || ciphertext) still
	// open: the signing key and one task's arguments are rewritten so.
	toLegacy(t, s, oldKey, signing.Sealed[0], "")
	toLegacy(t, s, oldPep, pep.Sealed[0], before[0])

	// Restart both with current = new, previous = old.
	restartBackend := func(env ...string) {
		s.backend.signal(syscall.SIGTERM)
		s.backend.wait(60 * time.Second)
		s.backend = startArapd(t, append(append([]string{}, s.env...), env...), "serve", "--addr", s.backend.addr, "--policy", policy, "--public-url", s.api)
	}
	restartMCP := func(env ...string) {
		s.mcp.signal(syscall.SIGTERM)
		s.mcp.wait(60 * time.Second)
		s.mcp = s.startMCP(env...)
	}
	restartBackend("ARAP_MASTER_KEY="+b64(newKey), "ARAP_MASTER_KEY_PREVIOUS="+b64(oldKey))
	restartMCP("ARAP_PEP_MASTER_KEY="+b64(newPep), "ARAP_PEP_MASTER_KEY_PREVIOUS="+b64(oldPep))
	// The rotated services open what the old key sealed: the legacy
	// arguments of the first task run once it is approved.
	require.Equal(t, 200, s.decide(s.requestOf(before[0]), "approve"))
	requireExecuted(t, s, alice, before[0])
	before = before[1:]

	// Load: callers open tasks and approve every other one (which signs an
	// approval, sends a signed callback, and runs the tool with its stored
	// arguments) while the re-seal runs. The calls are paced to stay within
	// alice's limits (30 new requests a minute, 20 waiting) however long
	// the re-seal takes on a busy machine: a refused call would end the load.
	permits := time.NewTicker(2500 * time.Millisecond)
	defer permits.Stop()
	var (
		mu       sync.Mutex
		approved []string
		waiting  []string
		made     atomic.Int64
		stop     = make(chan struct{})
		wg       sync.WaitGroup
		loadErr  = make(chan error, 3)
	)
	for w := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				case <-permits.C:
				}
				id, err := call(100*(w+1) + i)
				if err != nil {
					loadErr <- err
					return
				}
				made.Add(1)
				mu.Lock()
				wait := i%2 == 1 && len(waiting) < 8
				if wait {
					waiting = append(waiting, id)
				}
				mu.Unlock()
				if wait {
					continue
				}
				req, err := boundRequest(ctx, s, id)
				if err == nil {
					if code := s.decideCode(req); code != 200 {
						err = fmt.Errorf("approve %s: %d", req, code)
					}
				}
				if err != nil {
					loadErr <- err
					return
				}
				mu.Lock()
				approved = append(approved, id)
				mu.Unlock()
			}
		}()
	}
	require.Eventually(t, func() bool { return made.Load() >= 4 }, 60*time.Second, 20*time.Millisecond, "the load runs")
	rotEnv := append(append([]string{}, s.env...), "ARAP_MASTER_KEY="+b64(newKey), "ARAP_MASTER_KEY_PREVIOUS="+b64(oldKey),
		"ARAP_PEP_MASTER_KEY="+b64(newPep), "ARAP_PEP_MASTER_KEY_PREVIOUS="+b64(oldPep))
	out := arapctl(t, rotEnv, "keys", "reseal")
	t.Log(out)
	require.Contains(t, out, "arap.signing_keys.private_key")
	out = arapctl(t, rotEnv, "keys", "reseal", "--pep")
	t.Log(out)
	require.Contains(t, out, "pep.approval_tasks.args_sealed")
	at := made.Load()
	require.Eventually(t, func() bool { return made.Load() >= at+4 }, 60*time.Second, 20*time.Millisecond, "the load goes on after the re-seal")
	close(stop)
	wg.Wait()
	close(loadErr)
	for err := range loadErr {
		require.NoError(t, err)
	}

	// The approved ones ran, during the rotation.
	for _, id := range approved {
		requireExecuted(t, s, alice, id)
	}

	// Only the new keys from here on: --check needs no previous key.
	newEnv := append(append([]string{}, s.env...), "ARAP_MASTER_KEY="+b64(newKey), "ARAP_PEP_MASTER_KEY="+b64(newPep))
	require.Contains(t, arapctl(t, newEnv, "keys", "reseal", "--check"), "can be retired")
	require.Contains(t, arapctl(t, newEnv, "keys", "reseal", "--pep", "--check"), "can be retired")
	onlyNew, err := seal.New(newKey)
	require.NoError(t, err)
	onlyNewPep, err := seal.New(newPep)
	require.NoError(t, err)
	n := opensAll(t, s, onlyNew, append(append([]seal.Column{}, signing.Sealed...), callbacks.Sealed...))
	require.Positive(t, n)
	n = opensAll(t, s, onlyNewPep, pep.Sealed)
	require.GreaterOrEqual(t, n, 2*len(before))

	restartBackend("ARAP_MASTER_KEY=" + b64(newKey))
	restartMCP("ARAP_PEP_MASTER_KEY=" + b64(newPep))
	// Each process names the key it seals under (by its id).
	require.Equal(t, seal.KeyID(newKey), s.backend.waitLog("backend started", 10*time.Second)["master_key_id"])
	require.Equal(t, seal.KeyID(newPep), s.mcp.waitLog("mcp front-end started", 10*time.Second)["master_key_id"])
	last := append(append([]string{}, before...), waiting...)
	for _, id := range last {
		require.Equal(t, 200, s.decide(s.requestOf(id), "approve"))
	}
	for _, id := range last {
		requireExecuted(t, s, alice, id)
		// Its callback was delivered: signed with a webhook secret the
		// backend opened under the new key, verified by the front-end.
		s.callbacksSettled(id)
		var delivered int
		require.NoError(t, s.pool.QueryRow(ctx, `SELECT count(*) FROM arap.deliveries WHERE request_id = $1 AND status = 'delivered'`,
			s.requestOf(id)).Scan(&delivered))
		require.Equal(t, 1, delivered, "task %s", id)
	}

	// A value left under the old key fails --check, naming its column.
	old, err := seal.New(oldPep)
	require.NoError(t, err)
	var key string
	var v []byte
	// (A task's arguments: every intent here is bound, and a bound intent
	// keeps no body.)
	require.NoError(t, s.pool.QueryRow(ctx, `SELECT task_id, args_sealed FROM pep.approval_tasks LIMIT 1`).Scan(&key, &v))
	plain, err := onlyNewPep.Open(v, key)
	require.NoError(t, err)
	_, err = s.pool.Exec(ctx, `UPDATE pep.approval_tasks SET args_sealed = $1 WHERE task_id = $2`, old.Seal(plain, key), key)
	require.NoError(t, err)
	cmd := osexec.Command(filepath.Join(binDir, "arapctl"), "keys", "reseal", "--pep", "--check")
	cmd.Env = append(os.Environ(), newEnv...)
	b, err := cmd.CombinedOutput()
	require.Error(t, err, "%s", b)
	require.Contains(t, string(b), "pep.approval_tasks.args_sealed")
	require.Contains(t, string(b), "1 not under key "+onlyNewPep.CurrentID())
}

// requireExecuted waits for an approved task to end having run its tool
// once.
func requireExecuted(t *testing.T, s *stack, c *tasks.Client, id string) {
	t.Helper()
	d := s.waitTask(c, id)
	require.Equal(t, tasks.Completed, d.Status, "task %s", id)
	disp, _ := disposition(t, d)
	require.Equal(t, "approved-executed", disp, "task %s", id)
	require.Equal(t, 1, s.ledger(id), "task %s", id)
}

func mustKey(t *testing.T, b64 string) []byte {
	k, err := base64.StdEncoding.DecodeString(b64)
	require.NoError(t, err)
	return k
}

func randomKey(t *testing.T) []byte {
	k := make([]byte, 32)
	_, err := rand.Read(k)
	require.NoError(t, err)
	return k
}

// boundRequest waits for the backend request bound to a task (requestOf
// for a goroutine other than the test's).
func boundRequest(ctx context.Context, s *stack, taskID string) (string, error) {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		var id *string
		err := s.pool.QueryRow(ctx, `SELECT backend_id FROM pep.approval_tasks WHERE task_id = $1`, taskID).Scan(&id)
		if err == nil && id != nil {
			return *id, nil
		}
		time.Sleep(20 * time.Millisecond) // polling
	}
	return "", fmt.Errorf("task %s: no backend request after 30s", taskID)
}

// decideCode is decide for a goroutine other than the test's.
func (s *stack) decideCode(id string) int {
	req, err := http.NewRequest("POST", s.api+"/v1/requests/"+id+"/decisions", strings.NewReader(`{"decision":"approve","reason":"e2e"}`))
	if err != nil {
		return 0
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+s.itsmToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}

// toLegacy rewrites a sealed value (the row whose key is key, or the first
// row) into the format of values sealed before key ids: nonce ||
// ciphertext under master.
func toLegacy(t *testing.T, s *stack, master []byte, c seal.Column, key string) {
	t.Helper()
	ctx := context.Background()
	box, err := seal.New(master)
	require.NoError(t, err)
	var k, ad string
	var v []byte
	q := fmt.Sprintf(`SELECT %s, %s, %s FROM %s.%s WHERE ($1 = '' OR %s = $1) AND %s IS NOT NULL ORDER BY 1 LIMIT 1`, c.Key, c.AD, c.Value, c.Schema, c.Table, c.Key, c.Value)
	require.NoError(t, s.pool.QueryRow(ctx, q, key).Scan(&k, &ad, &v))
	plain, err := box.Open(v, ad)
	require.NoError(t, err)
	block, err := aes.NewCipher(master)
	require.NoError(t, err)
	aead, err := cipher.NewGCM(block)
	require.NoError(t, err)
	nonce := make([]byte, aead.NonceSize())
	_, _ = rand.Read(nonce)
	_, err = s.pool.Exec(ctx, fmt.Sprintf(`UPDATE %s.%s SET %s = $1 WHERE %s = $2`, c.Schema, c.Table, c.Value, c.Key),
		aead.Seal(nonce, nonce, plain, []byte(ad)), k)
	require.NoError(t, err)
}

// opensAll opens every value of cols with box and returns how many there
// were (a NULL holds nothing sealed: a settled intent's dropped body).
func opensAll(t *testing.T, s *stack, box *seal.Box, cols []seal.Column) int {
	t.Helper()
	n := 0
	for _, c := range cols {
		rows, err := s.pool.Query(context.Background(), fmt.Sprintf(`SELECT %s, %s FROM %s.%s WHERE %s IS NOT NULL`, c.AD, c.Value, c.Schema, c.Table, c.Value))
		require.NoError(t, err)
		values, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) ([2][]byte, error) {
			var v [2][]byte
			return v, r.Scan(&v[0], &v[1])
		})
		require.NoError(t, err) // rows are closed before any check can stop the test
		for _, v := range values {
			_, err := box.Open(v[1], string(v[0]))
			require.NoError(t, err, "%s of %s opens under the new key alone", c, v[0])
			n++
		}
	}
	return n
}
