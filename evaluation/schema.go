package evaluation

import "github.com/omcp/arap/authzen"

// fitsRequestSchema says, without the validator, that req has the shape
// the AuthZEN request schema requires (the schema has nothing else):
// subject and resource with type and id strings, action with a name
// string, and each properties member, when present, an object; context is
// an object by its Go type. The validator, which costs an evaluation
// about a tenth of the backend's CPU, then runs only to word what does not
// fit. TestFitsRequestSchemaAgrees holds the two to the same answer.
func fitsRequestSchema(req authzen.EvaluationRequest) bool {
	entity := func(o authzen.Object, names ...string) bool {
		if o == nil {
			return false
		}
		for _, n := range names {
			if _, ok := o[n].(string); !ok {
				return false
			}
		}
		if p, ok := o["properties"]; ok {
			if _, ok := p.(map[string]any); !ok {
				return false
			}
		}
		return true
	}
	return entity(req.Subject, "type", "id") && entity(req.Resource, "type", "id") && entity(req.Action, "name")
}
