package authzen

import (
	"fmt"
)

// MaxActorDepth bounds a delegation chain (nested "act" objects, RFC 8693
// section 4.1). A deeper chain is refused, never accepted with its deep part
// unchecked: the actor allow-list, separation of duties and the actor
// binding all walk the chain ActorChain returns.
const MaxActorDepth = 8

// ActorChain lists the ids of a delegation chain, outermost first: the
// first link's idKey member ("sub" in subject.properties.act, "id" in
// client.actor), then each nested act's "sub". where names the chain's
// field (subject.properties.act), for errors. A chain whose links are not
// objects, lack a string id, or nest deeper than MaxActorDepth is an error.
func ActorChain(act any, idKey, where string) ([]string, error) {
	var ids []string
	for depth := 0; act != nil; depth++ {
		if depth == MaxActorDepth {
			return nil, fmt.Errorf("%s: the actor chain is deeper than %d; this service does not accept longer chains", where, MaxActorDepth)
		}
		link, ok := act.(map[string]any)
		if !ok {
			if o, isObj := act.(Object); isObj {
				link, ok = o, true
			}
		}
		if !ok {
			return nil, fmt.Errorf("%s: must be an object; send the actor as {\"sub\": ...}", where)
		}
		id, ok := link[idKey].(string)
		if !ok {
			return nil, fmt.Errorf("%s.%s: every actor in the chain needs a string id; give this actor one", where, idKey)
		}
		ids = append(ids, id)
		next, present := link["act"]
		if !present {
			break
		}
		if next == nil {
			return nil, fmt.Errorf("%s.act: must be an object; send the next actor as {\"sub\": ...} or leave act out", where)
		}
		act, idKey, where = next, "sub", where+".act"
	}
	return ids, nil
}

// SubjectActors is the chain in subject.properties.act (none when absent).
func SubjectActors(subject Object) ([]string, error) {
	act, ok := subject.Obj("properties")["act"]
	if !ok {
		return nil, nil
	}
	if act == nil {
		return nil, fmt.Errorf("subject.properties.act: must be an object; send the actor as {\"sub\": ...} or leave act out")
	}
	return ActorChain(act, "sub", "subject.properties.act")
}

// ActorHash binds the delegation chain, which binding_hash leaves out (ARAP
// removes subject.properties.act from the bound subject): the JCS SHA-256
// of subject.properties.act, or of null when there is none. A binding_token
// and an approval carry it beside binding_hash, so an approval for "alice
// via agent:demo" does not cover alice via another agent, or alice alone.
func ActorHash(subject Object) (string, error) {
	return Digest(subject.Obj("properties")["act"])
}
