package evaluation

import (
	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/common/types"
	"github.com/google/cel-go/common/types/ref"
	"github.com/google/cel-go/common/types/traits"

	"github.com/omcp/arap/internal/visible"
)

// FuncHiddenCharacters is the CEL function hidden_characters(value): true
// when any string in value, or any member name of a map in it, holds a
// character a person reading the request could not see or could mistake
// (see package visible): every character the approver's page, e-mail and
// Slack message mark, compatibility characters such as fullwidth "ａ" or
// superscript "²" (whose NFKC form differs) among them. A rule can refuse
// such calls outright:
//
//	when: hidden_characters(resource.properties.arguments)
//	effect: deny
const FuncHiddenCharacters = "hidden_characters"

// functions are the CEL functions policy conditions may call beyond the
// standard library.
func functions() []cel.EnvOption {
	return []cel.EnvOption{
		cel.Function(FuncHiddenCharacters,
			cel.Overload("hidden_characters_dyn", []*cel.Type{cel.DynType}, cel.BoolType,
				cel.UnaryBinding(func(v ref.Val) ref.Val { return types.Bool(hiddenIn(v, 0)) }))),
	}
}

// maxWalk bounds the nesting hiddenIn follows; deeper counts as hidden,
// since what cannot be checked cannot be called clean.
const maxWalk = 64

func hiddenIn(v ref.Val, depth int) bool {
	if depth > maxWalk {
		return true
	}
	switch x := v.(type) {
	case types.String:
		return !visible.Clean(string(x))
	case traits.Mapper:
		for it := x.Iterator(); it.HasNext() == types.True; {
			k := it.Next()
			if hiddenIn(k, depth+1) {
				return true
			}
			if val, ok := x.Find(k); ok && hiddenIn(val, depth+1) {
				return true
			}
		}
	case traits.Lister:
		for it := x.Iterator(); it.HasNext() == types.True; {
			if hiddenIn(it.Next(), depth+1) {
				return true
			}
		}
	}
	return false
}
