package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/omcp/arap/mcp/tasks"
)

// listen opens a subscriptions/listen stream on task id, the way a client
// waiting for its result learns of it, and returns once the stream is
// acknowledged. The returned wait reads the stream until it reports the
// task completed (an error for any other end); closing the stream without
// waiting is close's.
func (s *System) listen(ctx context.Context, token, id string) (wait func() error, close func(), err error) {
	body, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": 1, "method": tasks.MethodListen, "params": map[string]any{
		"notifications": map[string]any{"taskIds": []string{id}},
		"_meta": map[string]any{tasks.MetaProtocolVersion: tasks.ProtocolVersion,
			tasks.MetaClientCapabilities: map[string]any{"extensions": map[string]any{tasks.ExtensionID: map[string]any{}}}}}})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.MCPURL, bytes.NewReader(body))
	if err != nil {
		return nil, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json, text/event-stream")
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set(tasks.HeaderProtocolVersion, tasks.ProtocolVersion)
	req.Header.Set(tasks.HeaderMethod, tasks.MethodListen)
	resp, err := Client.Do(req)
	if err != nil {
		return nil, nil, err
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if strings.Contains(sc.Text(), tasks.NotificationAcknowledged) {
			return func() error {
				defer resp.Body.Close()
				for sc.Scan() {
					data, ok := strings.CutPrefix(sc.Text(), "data:")
					if !ok {
						continue
					}
					var m struct {
						Method string `json:"method"`
						Params struct {
							Status tasks.Status `json:"status"`
						} `json:"params"`
					}
					if json.Unmarshal([]byte(strings.TrimSpace(data)), &m) != nil || m.Method != tasks.NotificationTasks {
						continue
					}
					switch {
					case m.Params.Status == tasks.Completed:
						return nil
					case m.Params.Status.Terminal():
						return fmt.Errorf("task %s ended %s", id, m.Params.Status)
					}
				}
				return errors.Join(sc.Err(), fmt.Errorf("task %s: the listen stream ended before it completed", id))
			}, func() { resp.Body.Close() }, nil
		}
	}
	resp.Body.Close()
	return nil, nil, errors.Join(sc.Err(), fmt.Errorf("listen on %s: no acknowledgement (HTTP %d)", id, resp.StatusCode))
}
