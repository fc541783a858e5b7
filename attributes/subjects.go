package attributes

import (
	"context"
	"errors"

	"github.com/omcp/arap/directory"
)

// Directory is a subject attribute source (evaluation.SubjectSource) on the
// directory: a subject of type user whose id is an active user's name or
// e-mail address has the attributes
//
//	{name, display_name, email, groups}
//
// read at every evaluation that asks (no cache), so a group change counts at
// once. Any other subject has none.
type Directory struct {
	People *directory.Store
}

// SubjectAttributes looks subjectID up in the directory.
func (d Directory) SubjectAttributes(ctx context.Context, subjectType, subjectID string) (map[string]any, error) {
	if subjectType != "user" {
		return nil, nil
	}
	u, err := d.People.Find(ctx, subjectID)
	if errors.Is(err, directory.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	groups := make([]any, len(u.Groups))
	for i, g := range u.Groups {
		groups[i] = g
	}
	return map[string]any{"name": u.Name, "display_name": u.DisplayName, "email": u.Email, "groups": groups}, nil
}
