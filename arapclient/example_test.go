package arapclient_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/omcp/arap/arapclient"
	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/internal/dev"
)

// A PEP asks before it acts: an allow runs the action, a requestable denial
// offers an access request, any other denial stops it.
func ExampleClient_Evaluate() {
	c := &arapclient.Client{BaseURL: exampleBackend().URL, Token: dev.PEPToken}
	for _, amount := range []int{100, 50000, 2000000} {
		call := transfer(amount)
		d, err := c.Evaluate(context.Background(), call)
		if err != nil {
			panic(err)
		}
		ar, requestable := arapclient.Requestable(call, d)
		switch {
		case d.Decision:
			fmt.Println(amount, "allowed")
		case requestable:
			fmt.Println(amount, "can be requested:", ar.Display["title"])
		default:
			fmt.Println(amount, "denied:", d.Context[authzen.CtxReason])
		}
	}
	// Output:
	// 100 allowed
	// 50000 can be requested: Treasury approval
	// 2000000 denied: amount_over_hard_limit
}

// Submit sends the denied call, bound to its denial, and returns the task.
func ExampleClient_Submit() {
	c := &arapclient.Client{BaseURL: exampleBackend().URL, Token: dev.PEPToken}
	ctx := context.Background()
	call := transfer(50000)
	d, err := c.Evaluate(ctx, call)
	if err != nil {
		panic(err)
	}
	ar, ok := arapclient.Requestable(call, d)
	if !ok {
		panic("not requestable")
	}
	tr, err := c.Submit(ctx, ar, arapclient.SubmitOptions{})
	if err != nil {
		panic(err)
	}
	fmt.Println(tr.Task.Status)
	_, err = c.Cancel(ctx, tr.Task.Links["cancel"].(string), "example_done")
	fmt.Println(err)
	// Output:
	// pending
	// <nil>
}

// Wait returns once the task is final; an approved one carries the approval
// that Reevaluate presents. Here an ITSM system approves through the
// decision API.
func ExampleClient_Wait() {
	base := exampleBackend().URL
	pep := &arapclient.Client{BaseURL: base, Token: dev.PEPToken}
	itsm := &arapclient.Client{BaseURL: base, Token: dev.ITSMToken}
	ctx := context.Background()
	call := transfer(50000)
	d, _ := pep.Evaluate(ctx, call)
	ar, _ := arapclient.Requestable(call, d)
	tr, err := pep.Submit(ctx, ar, arapclient.SubmitOptions{})
	if err != nil {
		panic(err)
	}

	if _, err := itsm.Decide(ctx, tr.Task.ID, arapclient.Decision{Decision: arapclient.DecisionApprove, Reason: "CHG-42"}); err != nil {
		panic(err)
	}

	done, err := pep.Wait(ctx, tr.Task, arapclient.WaitOptions{})
	if err != nil {
		panic(err)
	}
	fmt.Println(done.Task.Status)
	allow, err := pep.Reevaluate(ctx, call, done)
	if err != nil {
		panic(err)
	}
	fmt.Println("allowed:", allow.Decision)
	// Output:
	// approved
	// allowed: true
}

// Callbacks is the handler of the callback endpoint registered for the
// client; Wait with it returns as soon as a verified callback names the
// task, instead of at the next poll.
func ExampleCallbacks() {
	cbs, err := arapclient.NewCallbacks(dev.PEPWebhookSecret) // the client's webhook secret
	if err != nil {
		panic(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /arap-callbacks", cbs)
	// Submit with SubmitOptions{Callback: &authzen.Callback{Endpoint:
	// "https://pep.example.com/arap-callbacks"}}, then Wait with
	// WaitOptions{Callbacks: cbs}.
	fmt.Println("ready")
	// Output: ready
}

// Refusals are *ProblemError: the problem type of RFC 9457 and its code.
func ExampleProblemError() {
	c := &arapclient.Client{BaseURL: exampleBackend().URL, Token: dev.PEPToken}
	_, _, err := c.Status(context.Background(), c.BaseURL+authzen.PathRequests+"/arq_01JAAAAAAAAAAAAAAAAAAAAAAA")
	var pe *arapclient.ProblemError
	if errors.As(err, &pe) {
		fmt.Println(pe.Status, pe.Problem.Type)
	}
	fmt.Println(arapclient.IsProblem(err, authzen.ProblemUnknownTask))
	// Output:
	// 404 urn:openid:authzen:access-request:error:unknown_task
	// true
}

// A resolver lists what it may decide and decides it.
func ExampleClient_Decide() {
	base := exampleBackend().URL
	pep := &arapclient.Client{BaseURL: base, Token: dev.PEPToken}
	itsm := &arapclient.Client{BaseURL: base, Token: dev.ITSMToken}
	ctx := context.Background()
	call := transfer(70000)
	d, _ := pep.Evaluate(ctx, call)
	ar, _ := arapclient.Requestable(call, d)
	tr, err := pep.Submit(ctx, ar, arapclient.SubmitOptions{})
	if err != nil {
		panic(err)
	}

	v, err := itsm.Request(ctx, tr.Task.ID)
	if err != nil {
		panic(err)
	}
	fmt.Println(v.Rule, v.Resource.Str("id"), v.YouMayDecide)
	v, err = itsm.Decide(ctx, v.ID, arapclient.Decision{Decision: arapclient.DecisionDeny, Reason: "not this quarter"})
	if err != nil {
		panic(err)
	}
	fmt.Println(v.Status, v.Votes[0].Decision)
	// Output:
	// wire_transfer_large wire_transfer true
	// denied deny
}
