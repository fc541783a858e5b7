// Command pep is a whole policy enforcement point in one page: before alice's
// transfer runs it asks arap, asks for approval when the policy allows
// asking, waits for the decision, and runs only on the final allow.
package main

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/omcp/arap/arapclient"
	"github.com/omcp/arap/authzen"
)

func main() {
	ctx := context.Background()
	c := &arapclient.Client{BaseURL: os.Getenv("ARAP_URL"), Token: os.Getenv("ARAP_TOKEN")}
	call := authzen.EvaluationRequest{
		Subject: authzen.Object{"type": "user", "id": "alice"},
		Action:  authzen.Object{"name": "tools/call"},
		Resource: authzen.Object{"type": "mcp_tool", "id": "wire_transfer",
			"properties": map[string]any{"arguments": map[string]any{"to": "acct-991", "amount": 50000}}},
	}
	d, err := c.Evaluate(ctx, call)
	if err != nil {
		log.Fatal(err)
	}
	if ar, ok := arapclient.Requestable(call, d); ok {
		tr, err := c.Submit(ctx, ar, arapclient.SubmitOptions{})
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println("waiting for approval of", tr.Task.ID)
		done, err := c.Wait(ctx, tr.Task, arapclient.WaitOptions{}) // polls as Retry-After asks
		if err != nil {
			log.Fatal(err)
		}
		if done.Task.Status != authzen.StatusApproved {
			log.Fatalf("request %s ended %s", tr.Task.ID, done.Task.Status)
		}
		// Only a new decision with the approval lets the transfer run.
		if d, err = c.Reevaluate(ctx, call, done); err != nil {
			log.Fatal(err)
		}
	}
	if !d.Decision {
		log.Fatalf("not allowed (%v)", d.Context[authzen.CtxReason])
	}
	fmt.Println("allowed: the transfer runs now")
}
