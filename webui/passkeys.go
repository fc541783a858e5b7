package webui

// Passkeys in the web UI: the page where approvers register and remove
// them, and the signing of decisions on rules that require it
// (approval.require_passkey). The browser side is assets/passkeys.js; the
// ceremonies and the checks are package passkeys', and requests.Decide
// verifies the signature when it records the vote.

import (
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/omcp/arap/passkeys"
	"github.com/omcp/arap/requests"
)

// sessionHash is what ties a ceremony to the browser session that began
// it: the hash of the session cookie, as arap.ui_sessions keys it.
func sessionHash(r *http.Request) []byte {
	c, err := r.Cookie(cookieName)
	if err != nil {
		return nil
	}
	return hashID(c.Value)
}

// passkeyState is what a page says about the person's passkeys.
type passkeyState struct {
	Required    bool   // the request's rule requires a signed decision
	Have        bool   // the person has registered at least one
	Unavailable string // why passkeys cannot be used on this server, if so
}

func (u *UI) passkeyState(r *http.Request, user string) (passkeyState, error) {
	st := passkeyState{Unavailable: u.d.PasskeysUnavailable}
	if u.d.Passkeys == nil {
		if st.Unavailable == "" {
			st.Unavailable = "passkeys are not configured on this server"
		}
		return st, nil
	}
	list, err := u.d.Passkeys.List(r.Context(), user)
	st.Have = len(list) > 0
	return st, err
}

type passkeysData struct {
	Passkeys    []passkeys.Passkey
	Unavailable string
	RPID        string
}

// passkeysPage lists the person's passkeys, with the form to register one.
func (u *UI) passkeysPage(w http.ResponseWriter, r *http.Request) {
	s := sessionFrom(r)
	d := passkeysData{Unavailable: u.d.PasskeysUnavailable}
	if u.d.Passkeys != nil {
		var err error
		if d.Passkeys, err = u.d.Passkeys.List(r.Context(), s.user.Name); err != nil {
			u.fail(w, r, err)
			return
		}
		d.RPID = u.d.Passkeys.RPID()
	} else if d.Unavailable == "" {
		d.Unavailable = "passkeys are not configured on this server"
	}
	var flash string
	switch r.URL.Query().Get("done") {
	case "registered":
		flash = "Your passkey was registered."
	case "removed":
		flash = "The passkey was removed."
	}
	u.render(w, r, "passkeys", http.StatusOK, page{Title: "Passkeys", User: s.user, CSRF: s.csrf, Data: d, Flash: flash})
}

// jsonError answers a script's call with a message for the person.
func jsonError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"error": msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// passkeyCall checks what every passkey call needs: the CSRF token and a
// relying party.
func (u *UI) passkeyCall(w http.ResponseWriter, r *http.Request) (*session, bool) {
	s := sessionFrom(r)
	if !u.checkCSRF(r, s.csrf) {
		jsonError(w, http.StatusForbidden, "missing or wrong CSRF token: reload the page and try again")
		return nil, false
	}
	if u.d.Passkeys == nil {
		jsonError(w, http.StatusConflict, "Passkeys are unavailable on this server: "+u.d.PasskeysUnavailable)
		return nil, false
	}
	return s, true
}

// beginRegistration answers with the options for navigator.credentials.create.
func (u *UI) beginRegistration(w http.ResponseWriter, r *http.Request) {
	s, ok := u.passkeyCall(w, r)
	if !ok {
		return
	}
	id, create, stepUp, err := u.d.Passkeys.BeginRegistration(r.Context(), sessionHash(r), s.user.Name)
	if err != nil {
		u.fail(w, r, err)
		return
	}
	if stepUp == nil && u.now().Sub(s.signedInAt) > FirstPasskeyWithin {
		// No passkey of theirs can approve this one, so the sign-in must:
		// a session cookie stolen later cannot enrol the thief's key.
		jsonError(w, http.StatusForbidden, "To register your first passkey, sign out and sign in again: the sign-in must be less than "+
			wait(FirstPasskeyWithin)+" old.")
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"ceremony": id, "options": create, "step_up": stepUp})
}

// FirstPasskeyWithin is how recent a sign-in must be to register a
// person's first passkey (later ones are approved by an earlier one).
const FirstPasskeyWithin = 10 * time.Minute

// finishRegistration stores the passkey the browser created.
func (u *UI) finishRegistration(w http.ResponseWriter, r *http.Request) {
	s, ok := u.passkeyCall(w, r)
	if !ok {
		return
	}
	var stepUp *passkeys.Assertion
	if raw := r.PostFormValue("step_up"); raw != "" {
		stepUp = new(passkeys.Assertion)
		if len(raw) > maxAssertion || json.Unmarshal([]byte(raw), stepUp) != nil {
			jsonError(w, http.StatusBadRequest, "The passkey was not registered: the approval by your existing passkey cannot be read.")
			return
		}
	}
	_, err := u.d.Passkeys.FinishRegistration(r.Context(), sessionHash(r), s.user.Name, r.PostFormValue("ceremony"),
		r.PostFormValue("name"), []byte(r.PostFormValue("credential")), stepUp)
	switch {
	case errors.Is(err, passkeys.ErrInvalid), errors.Is(err, passkeys.ErrCeremony):
		jsonError(w, http.StatusBadRequest, "The passkey was not registered: "+err.Error())
	case err != nil:
		u.fail(w, r, err)
	default:
		writeJSON(w, http.StatusOK, map[string]string{"next": "/ui/passkeys?done=registered"})
	}
}

// removePasskey removes one of the person's passkeys (a plain form).
func (u *UI) removePasskey(w http.ResponseWriter, r *http.Request) {
	s := sessionFrom(r)
	if !u.checkCSRF(r, s.csrf) {
		http.Error(w, "missing or wrong CSRF token: reload the page and try again", http.StatusForbidden)
		return
	}
	if u.d.Passkeys == nil {
		http.Error(w, "passkeys are unavailable on this server", http.StatusConflict)
		return
	}
	err := u.d.Passkeys.Remove(r.Context(), s.user.Name, r.PostFormValue("id"))
	if errors.Is(err, passkeys.ErrInvalid) {
		http.Error(w, "no such passkey", http.StatusNotFound)
		return
	}
	if errors.Is(err, passkeys.ErrLastPasskey) {
		http.Error(w, "Not removed: "+err.Error()+".", http.StatusConflict)
		return
	}
	if err != nil {
		u.fail(w, r, err)
		return
	}
	http.Redirect(w, r, "/ui/passkeys?done=removed", http.StatusSeeOther)
}

// challenge begins signing a decision on a request whose rule requires
// it: the server fixes the approval window now, and answers with the
// options for navigator.credentials.get, whose challenge covers the
// request, its binding_hash, the decision and that window.
func (u *UI) challenge(w http.ResponseWriter, r *http.Request) {
	s, ok := u.passkeyCall(w, r)
	if !ok {
		return
	}
	decision := r.PostFormValue("decision")
	if decision != "approve" && decision != "deny" {
		jsonError(w, http.StatusBadRequest, "decision must be approve or deny")
		return
	}
	v := u.voter(s)
	req, err := u.d.Requests.Load(r.Context(), chi.URLParam(r, "id"))
	if err != nil || !requests.Names(v, req) {
		jsonError(w, http.StatusNotFound, "There is no such request, or you are not among its deciders.")
		return
	}
	if !req.ApprovalPolicy.RequirePasskey {
		jsonError(w, http.StatusBadRequest, "This request's rule does not ask for a signed decision; decide it with the form.")
		return
	}
	votes, err := u.d.Requests.Votes(r.Context(), req.ID)
	if err != nil {
		u.fail(w, r, err)
		return
	}
	if may, why := requests.MayDecide(v, req, votes, u.now()); !may {
		jsonError(w, http.StatusForbidden, "You cannot decide this request: "+why+".")
		return
	}
	d := passkeys.Decision{RequestID: req.ID, BindingHash: req.BindingHash, Decision: decision}
	if decision == "approve" {
		// What is signed is the window the page showed the person (sent
		// back by the script), so long as it is still one the request can
		// have; otherwise the page is out of date and is read again.
		until := req.ApprovalUntil(votes, u.now()).UTC().Truncate(time.Second)
		if shown := r.PostFormValue("until"); shown != "" {
			t, err := time.Parse(time.RFC3339, shown)
			if err != nil || !t.After(u.now()) || t.After(until) {
				jsonError(w, http.StatusConflict, "The approval's validity shown on the page is out of date; reload the page and decide again.")
				return
			}
			until = t.UTC()
		}
		d.Until = &until
	}
	id, opts, err := u.d.Passkeys.BeginDecision(r.Context(), sessionHash(r), s.user.Name, d)
	if errors.Is(err, passkeys.ErrNoPasskey) {
		jsonError(w, http.StatusConflict, "You have no passkey registered; register one on the Passkeys page first.")
		return
	}
	if err != nil {
		u.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"ceremony": id, "options": opts})
}

// maxAssertion bounds the assertion a decision form carries.
const maxAssertion = 8 << 10

// signedDecision completes d with the ceremony and the assertion the
// decision form carries, if it carries one: the window fixed when the
// ceremony began, and the signature. The decision must be the one the
// ceremony was begun for. Decide verifies the signature.
func (u *UI) signedDecision(r *http.Request, s *session, id, decision string, d *requests.Decision) string {
	ceremony := r.PostFormValue("ceremony")
	if ceremony == "" {
		return ""
	}
	if u.d.Passkeys == nil {
		return "passkeys are unavailable on this server"
	}
	dec, until, err := u.d.Passkeys.TakeDecision(r.Context(), sessionHash(r), s.user.Name, ceremony, id)
	if err != nil {
		return strings.TrimSuffix(err.Error(), ".")
	}
	if dec != decision {
		return "the signature was made for another decision; start again"
	}
	raw := r.PostFormValue("assertion")
	var a passkeys.Assertion
	if len(raw) > maxAssertion || json.Unmarshal([]byte(raw), &a) != nil || !a.Complete() {
		return "the browser's passkey response cannot be read; start again"
	}
	d.ApprovedUntil, d.Assertion = until, &a
	return ""
}
