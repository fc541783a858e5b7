package chaos

import (
	"sync"
	"time"
)

// History is everything the checker judges: each client's own record of
// what it sent and received, the approvers' decisions, the faults, the
// upstream's side effects and snapshots of both schemas taken after the
// system settled.
type History struct {
	Calls      []*Call       `json:"calls"`
	Decisions  []Decision    `json:"decisions"`
	Faults     []Fault       `json:"faults"`
	Executions []Execution   `json:"executions"`
	Tasks      []TaskRow     `json:"tasks"`
	Intents    []IntentRow   `json:"intents"`
	Requests   []RequestRow  `json:"requests"`
	Ledger     []LedgerRow   `json:"ledger"`
	Audit      AuditOutcome  `json:"audit"`
	Settle     SettleOutcome `json:"settle"`
}

// Call is one logical call of a caller: the same request resent on every
// retry, as a real client does after a lost response.
type Call struct {
	ID        string    `json:"id"` // client-chosen call id (in the arguments)
	Caller    int       `json:"caller"`
	Tool      string    `json:"tool"`
	Kind      string    `json:"kind"` // allowed, gated, denied
	Attempts  []Attempt `json:"attempts"`
	TaskID    string    `json:"task_id,omitempty"`
	Cancelled bool      `json:"cancelled,omitempty"` // the client sent tasks/cancel (acknowledged)
	Final     string    `json:"final,omitempty"`     // last task status or result kind seen
	Disp      string    `json:"disposition,omitempty"`
	Start     time.Time `json:"start"`
	End       time.Time `json:"end"`
}

// Attempt is one request of a call and what came back.
type Attempt struct {
	At      time.Time `json:"at"`
	Method  string    `json:"method"`
	Outcome string    `json:"outcome"` // task, result, error, unavailable, internal, lost
	Detail  string    `json:"detail,omitempty"`
}

// Decision is one action of an approver on a backend request.
type Decision struct {
	At      time.Time `json:"at"`
	Request string    `json:"request"`
	Action  string    `json:"action"` // approve, deny, revoke, expire (left alone)
	Status  int       `json:"status"` // HTTP status (0: lost)
}

// Fault is one injected fault and when it was active.
type Fault struct {
	Kind   string    `json:"kind"`
	Target string    `json:"target"`
	Start  time.Time `json:"start"`
	End    time.Time `json:"end"`
}

// TaskRow is a front-end approval task after the run.
type TaskRow struct {
	ID          string     `json:"id"`
	Status      string     `json:"status"`
	Message     string     `json:"message,omitempty"` // status message
	Reason      string     `json:"reason,omitempty"`  // the result's text or the error's message
	Tool        string     `json:"tool"`
	Phase       string     `json:"phase"`
	Disposition string     `json:"disposition"`
	ClaimedAt   *time.Time `json:"claimed_at,omitempty"`
	BackendID   string     `json:"backend_id"`
	CreatedAt   time.Time  `json:"created_at"`
	TerminalAt  *time.Time `json:"terminal_at,omitempty"`
}

// IntentRow is a submission intent.
type IntentRow struct {
	Key       string `json:"key"`
	TaskID    string `json:"task_id"`
	State     string `json:"state"`
	BackendID string `json:"backend_id"`
}

// RequestRow is a backend request after the run, with what its audit chain
// says about approval and revocation order.
type RequestRow struct {
	ID           string     `json:"id"`
	Status       string     `json:"status"`
	CallID       string     `json:"call_id"` // the call_id (or wire_transfer "to") in its arguments
	HasCallback  bool       `json:"has_callback"`
	Delivery     string     `json:"delivery"`                // best status of its callback deliveries: delivered, gone (the receiver had it and answered 410), pending, failed, or ""
	DeliveryNote string     `json:"delivery_note,omitempty"` // attempts, next attempt, last error
	NextAttempt  *time.Time `json:"next_attempt,omitempty"`  // a pending delivery's next retry
	Received     bool       `json:"received"`                // the front-end's replay memory holds its callback's webhook-id
	RevokedSeq   int64      `json:"revoked_seq,omitempty"`
	AllowedSeq   int64      `json:"allowed_seq,omitempty"` // first re-evaluation that allowed
	CreatedAt    time.Time  `json:"created_at"`
	Audit        []string   `json:"audit"` // its audit chain: seq kind actor (decision, reason)
}

// LedgerRow is a demo tool's side effect.
type LedgerRow struct {
	TaskID string    `json:"task_id"`
	CallID string    `json:"call_id,omitempty"` // wire_transfer's "to", less "acct-"
	Tool   string    `json:"tool"`
	At     time.Time `json:"at"`
}

// AuditOutcome is the verification of both audit chains.
type AuditOutcome struct {
	BackendChains, BackendEvents int
	BackendBreaks                []string
	PEPChains, PEPEvents         int
	PEPBreaks                    []string
}

// SettleOutcome is how the system came to rest after the faults stopped.
type SettleOutcome struct {
	Bound      time.Duration `json:"bound"`
	Took       time.Duration `json:"took"`
	At         time.Time     `json:"at"`                  // when the tables were read
	Unsettled  []string      `json:"unsettled,omitempty"` // live tasks at the bound
	Incomplete []string      `json:"incomplete,omitempty"`
}

// eventLog collects faults and decisions as they happen.
type eventLog struct {
	mu        sync.Mutex
	faults    []Fault
	decisions []Decision
}

func (l *eventLog) fault(kind, target string, start, end time.Time) {
	l.mu.Lock()
	l.faults = append(l.faults, Fault{Kind: kind, Target: target, Start: start, End: end})
	l.mu.Unlock()
}

func (l *eventLog) decision(d Decision) {
	l.mu.Lock()
	l.decisions = append(l.decisions, d)
	l.mu.Unlock()
}
