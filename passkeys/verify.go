package passkeys

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/go-webauthn/webauthn/protocol/webauthncose"

	"github.com/omcp/arap/audit"
)

// Audit event kinds VerifyAudit reads from request chains (package
// requests writes them).
const (
	eventSubmitted   = "request.submitted"
	eventVoteApprove = "vote.approve"
	eventVoteDeny    = "vote.deny"
)

// Failure is a signed decision that does not verify, or a decision on a
// rule requiring a signature that carries none.
type Failure struct {
	RequestID string `json:"request_id"`
	Seq       int64  `json:"seq"`
	Voter     string `json:"voter"`
	Problem   string `json:"problem"`
}

func (f Failure) String() string {
	return fmt.Sprintf("request %s vote by %s (seq %d): %s", f.RequestID, f.Voter, f.Seq, f.Problem)
}

// Report is VerifyAudit's outcome.
type Report struct {
	Signed   int       `json:"signed"`
	Failures []Failure `json:"failures"`
}

// OK reports whether every signed decision verified.
func (r Report) OK() bool { return len(r.Failures) == 0 }

// VerifyAudit checks every signed decision from the audit log alone (see
// VerifyRecords).
func VerifyAudit(ctx context.Context, q audit.Querier) (Report, error) {
	var records []audit.Record
	err := audit.Kinds(ctx, q, []string{EventRegistered, EventRemoved, eventSubmitted, eventVoteApprove, eventVoteDeny},
		func(r audit.Record) error { records = append(records, r); return nil })
	if err != nil {
		return Report{}, err
	}
	return VerifyRecords(records), nil
}

type key struct {
	user, rpID, origin string
	cose               []byte
	at                 time.Time
	removed            *time.Time
}

type requestFacts struct {
	bindingHash    string
	requirePasskey bool
}

// VerifyRecords checks the signed decisions among records (audit events of
// the system chain and the request chains, each chain in order): for each
// vote carrying an assertion, the credential's registration in force at the
// vote (its id's latest by then: a removed id can be registered again) is
// the voter's, and was not removed before the vote; the challenge is re-derived from the request's chain (the
// request id, the binding_hash of its request.submitted event, the vote's
// decision and approved_until); the client data is a webauthn.get for that
// challenge from the registered origin; the authenticator data is for the
// registered RP id with the user present and verified flags set; and the
// signature over authenticatorData || SHA-256(clientDataJSON) verifies with
// the registered COSE key. A person's vote without an assertion on a
// request whose rule requires one is a failure too.
func VerifyRecords(records []audit.Record) Report {
	rep := Report{Failures: []Failure{}}
	// Every registration of each credential id, in order: once removed, an
	// id can be registered again, by anyone (an authenticator picks it).
	keys := map[string][]*key{}
	for _, r := range records {
		if r.Chain != audit.SystemChain {
			continue
		}
		switch r.Kind {
		case EventRegistered:
			var reg registration
			if json.Unmarshal(r.Data, &reg) == nil {
				id := reg.CredentialID.String()
				keys[id] = append(keys[id], &key{user: reg.User, rpID: reg.RPID, origin: reg.Origin, cose: reg.PublicKey, at: r.At})
			}
		case EventRemoved:
			var rm struct {
				CredentialID string `json:"credential_id"`
			}
			if json.Unmarshal(r.Data, &rm) == nil {
				// A removal ends the id's latest registration.
				if ks := keys[rm.CredentialID]; len(ks) > 0 && ks[len(ks)-1].removed == nil {
					k := ks[len(ks)-1]
					at := r.At
					k.removed = &at
				}
			}
		}
	}
	facts := map[string]*requestFacts{}
	for _, r := range records {
		if r.Chain == audit.SystemChain {
			continue
		}
		switch r.Kind {
		case eventSubmitted:
			var s struct {
				BindingHash    string `json:"binding_hash"`
				RequirePasskey bool   `json:"require_passkey"`
			}
			_ = json.Unmarshal(r.Data, &s)
			facts[r.Chain] = &requestFacts{bindingHash: s.BindingHash, requirePasskey: s.RequirePasskey}
		case eventVoteApprove, eventVoteDeny:
			f := facts[r.Chain]
			var v struct {
				ApprovedUntil *time.Time `json:"approved_until"`
				Assertion     *Assertion `json:"assertion"`
			}
			if err := json.Unmarshal(r.Data, &v); err != nil {
				rep.fail(r, "the vote's data cannot be read: "+err.Error())
				continue
			}
			if v.Assertion == nil {
				switch {
				case f == nil && strings.HasPrefix(r.Actor, "user:"):
					// Without it nobody can tell whether the vote needed a
					// signature: a chain rewritten without its first event
					// must not hide an unsigned vote.
					rep.fail(r, "the request's chain has no request.submitted event, so whether this vote needed a signature cannot be told")
				case f != nil && f.requirePasskey && !strings.HasPrefix(r.Actor, "resolver:"):
					rep.fail(r, "the rule requires a decision signed with the approver's passkey, and this vote carries no signature")
				}
				continue
			}
			rep.Signed++
			if f == nil {
				rep.fail(r, "the request's chain has no request.submitted event, so there is no binding_hash to check the signature against")
				continue
			}
			decision := strings.TrimPrefix(r.Kind, "vote.")
			if problem := checkVote(keys, r, f, decision, v.ApprovedUntil, v.Assertion); problem != "" {
				rep.fail(r, problem)
			}
		}
	}
	return rep
}

func (rep *Report) fail(r audit.Record, problem string) {
	rep.Failures = append(rep.Failures, Failure{RequestID: r.Chain, Seq: r.Seq, Voter: r.Actor, Problem: problem})
}

// checkVote returns what is wrong with one signed vote, or "".
func checkVote(keys map[string][]*key, r audit.Record, f *requestFacts, decision string, until *time.Time, a *Assertion) string {
	if !a.Complete() {
		return "the stored assertion is incomplete"
	}
	id := a.CredentialID.String()
	regs := keys[id]
	// The registration in force at the vote: the last one made by then.
	var k *key
	for _, reg := range regs {
		if !reg.at.After(r.At) {
			k = reg
		}
	}
	switch {
	case len(regs) == 0:
		return fmt.Sprintf("signed with passkey %s, which the audit log's system chain does not register", id)
	case k == nil:
		return fmt.Sprintf("signed with passkey %s, registered only after the vote (%s)", id, regs[0].at.UTC().Format(time.RFC3339))
	case "user:"+k.user != r.Actor:
		return fmt.Sprintf("signed with passkey %s, which is registered to user:%s, not to the voter", id, k.user)
	case k.removed != nil && k.removed.Before(r.At):
		return fmt.Sprintf("signed with passkey %s, removed before the vote (%s)", id, k.removed.UTC().Format(time.RFC3339))
	}
	if decision == "approve" && (until == nil || !until.Equal(until.Truncate(time.Second))) {
		return "the vote's approved_until is missing or not a whole second, so it cannot be what was signed"
	}
	challenge := Challenge(r.Chain, f.bindingHash, decision, until)
	var cd struct {
		Type      string `json:"type"`
		Challenge string `json:"challenge"`
		Origin    string `json:"origin"`
	}
	if err := json.Unmarshal(a.ClientDataJSON, &cd); err != nil {
		return "the client data is not JSON: " + err.Error()
	}
	switch {
	case cd.Type != "webauthn.get":
		return fmt.Sprintf("the client data's type is %q, not webauthn.get", cd.Type)
	case cd.Challenge != base64.RawURLEncoding.EncodeToString(challenge):
		return "the signed challenge is not the one derived from this request, its binding_hash, the decision and approved_until (the vote or the request was changed after signing)"
	case cd.Origin != k.origin:
		return fmt.Sprintf("signed at origin %q, not the registered %q", cd.Origin, k.origin)
	}
	ad := []byte(a.AuthenticatorData)
	rpHash := sha256.Sum256([]byte(k.rpID))
	switch {
	case len(ad) < 37:
		return "the authenticator data is too short"
	case !slices.Equal(ad[:32], rpHash[:]):
		return fmt.Sprintf("the authenticator data is not for relying party %s", k.rpID)
	case ad[32]&0x01 == 0:
		return "the authenticator data does not have the user-present flag"
	case ad[32]&0x04 == 0:
		return "the authenticator data does not have the user-verified flag"
	}
	pub, err := webauthncose.ParsePublicKey(k.cose)
	if err != nil {
		return "the registered public key cannot be read: " + err.Error()
	}
	cdHash := sha256.Sum256(a.ClientDataJSON)
	ok, err := webauthncose.VerifySignature(pub, slices.Concat(ad, cdHash[:]), a.Signature)
	if err != nil || !ok {
		return "signature does not verify"
	}
	return ""
}
