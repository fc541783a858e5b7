package authzen

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"

	"github.com/gowebpki/jcs"
)

// Canonical returns the RFC 8785 (JCS) serialization of v.
func Canonical(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("canonical: marshal: %w", err)
	}
	out, err := jcs.Transform(b)
	if err != nil {
		return nil, fmt.Errorf("canonical: jcs: %w", err)
	}
	return out, nil
}

// Digest is base64url-no-pad(SHA-256(JCS(v))), the binding_hash encoding.
func Digest(v any) (string, error) {
	c, err := Canonical(v)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(c)
	return base64.RawURLEncoding.EncodeToString(sum[:]), nil
}

// BoundSubject is the subject as bound: subject.properties.act is removed
// because a PEP may move the actor to client.actor. The input is not modified.
func BoundSubject(subject Object) Object {
	props := subject.Obj("properties")
	if _, ok := props["act"]; !ok {
		return subject
	}
	out := make(Object, len(subject))
	for k, v := range subject {
		out[k] = v
	}
	p := make(map[string]any, len(props))
	for k, v := range props {
		if k != "act" {
			p[k] = v
		}
	}
	out["properties"] = p
	return out
}

// RelevantContext projects context onto the authorization-relevant members.
// A listed member that is absent stays absent; one present as null is kept.
func RelevantContext(context Object, members []string) map[string]any {
	out := make(map[string]any, len(members))
	for _, m := range members {
		if v, ok := context[m]; ok {
			out[m] = v
		}
	}
	return out
}

// BindingInput is the object a single-item binding_hash covers (ARAP
// "Binding Token Integrity"): {subject, resource, action, context}.
func BindingInput(subject, resource, action, context Object, members []string) map[string]any {
	return map[string]any{
		"subject":  BoundSubject(subject),
		"resource": resource,
		"action":   action,
		"context":  RelevantContext(context, members),
	}
}

// BindingHash computes the single-item binding_hash.
func BindingHash(subject, resource, action, context Object, members []string) (string, error) {
	return Digest(BindingInput(subject, resource, action, context, members))
}

// BulkItem is one (resource, action) pair of a bulk binding.
type BulkItem struct {
	Resource Object `json:"resource"`
	Action   Object `json:"action"`
}

// BulkBindingHash computes the bulk binding_hash; item order is bound.
func BulkBindingHash(subject Object, items []BulkItem, context Object, members []string) (string, error) {
	if items == nil {
		items = []BulkItem{}
	}
	return Digest(map[string]any{
		"subject": BoundSubject(subject),
		"items":   items,
		"context": RelevantContext(context, members),
	})
}

// Equal reports whether two JSON values are structurally equal in the ARAP
// sense: same types, numbers equal in canonical form, arrays in order, objects
// with the same member names, absent distinct from null.
func Equal(a, b any) bool {
	ca, err1 := Canonical(a)
	cb, err2 := Canonical(b)
	return err1 == nil && err2 == nil && string(ca) == string(cb)
}
