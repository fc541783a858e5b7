package requests

import (
	"context"
	"encoding/base64"
	"fmt"
	"strings"
	"time"

	"github.com/omcp/arap/authzen"
	"github.com/omcp/arap/internal/randid"
)

// ListOptions filter a listing.
type ListOptions struct {
	// Status filters by state; empty means any.
	Status Status
	// Rule filters by policy rule.
	Rule string
	// Limit is the page size (default 50, at most 200).
	Limit int
	// Cursor continues a previous listing.
	Cursor string
}

// List returns requests newest first, for deciders looking for work. With a
// voter, only requests that voter is named a decider of are listed (requests
// they may not decide because they are involved are still shown, so a person
// can see why they cannot act); without one (an admin), all.
func (s *Service) List(ctx context.Context, v *Voter, o ListOptions) ([]*Request, string, error) {
	if o.Limit <= 0 {
		o.Limit = 50
	}
	if o.Limit > 200 {
		o.Limit = 200
	}
	where := []string{"true"}
	args := []any{}
	arg := func(v any) string { args = append(args, v); return fmt.Sprintf("$%d", len(args)) }
	if o.Status != "" {
		where = append(where, "status = "+arg(string(o.Status)))
	}
	if o.Rule != "" {
		where = append(where, "rule = "+arg(o.Rule))
	}
	if o.Cursor != "" {
		at, id, err := decodeCursor(o.Cursor)
		if err != nil {
			return nil, "", refuse(authzen.ProblemInvalidRequest, "cursor is not one this service returned")
		}
		where = append(where, fmt.Sprintf("(created_at, id) < (%s, %s)", arg(at), arg(id)))
	}
	if v != nil {
		if v.human() {
			// The escalation group's people see the request once it has
			// escalated, when they may decide it.
			groups := arg(v.Groups)
			where = append(where, fmt.Sprintf("(approval_policy->'users' ? %s OR approval_policy->'groups' ?| %s OR (escalated_at IS NOT NULL AND approval_policy->>'escalate_to' = ANY(%s)))",
				arg(v.Name), groups, groups))
		} else {
			where = append(where, fmt.Sprintf("(approval_policy->'clients' ? %s OR approval_policy->'kinds' ? %s)", arg(v.Name), arg(v.Kind)))
		}
	}
	q := `SELECT ` + requestColumns + ` FROM arap.requests WHERE ` + strings.Join(where, " AND ") +
		` ORDER BY created_at DESC, id DESC LIMIT ` + arg(o.Limit+1)
	rows, err := s.cfg.DB.Query(ctx, q, args...)
	if err != nil {
		return nil, "", fmt.Errorf("requests: list: %w", err)
	}
	defer rows.Close()
	var out []*Request
	for rows.Next() {
		r, err := scanRequest(rows)
		if err != nil {
			return nil, "", fmt.Errorf("requests: list: %w", err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, "", err
	}
	next := ""
	if len(out) > o.Limit {
		out = out[:o.Limit]
		last := out[len(out)-1]
		next = base64.RawURLEncoding.EncodeToString([]byte(last.CreatedAt.UTC().Format(time.RFC3339Nano) + "|" + last.ID))
	}
	return out, next, nil
}

func decodeCursor(c string) (time.Time, string, error) {
	b, err := base64.RawURLEncoding.DecodeString(c)
	if err != nil {
		return time.Time{}, "", err
	}
	at, id, ok := strings.Cut(string(b), "|")
	if !ok || !randid.Valid(RequestIDPrefix, id) {
		return time.Time{}, "", fmt.Errorf("bad cursor")
	}
	t, err := time.Parse(time.RFC3339Nano, at)
	return t, id, err
}

// Load returns request id regardless of who asks; callers check visibility.
func (s *Service) Load(ctx context.Context, id string) (*Request, error) {
	return load(ctx, s.cfg.DB, id)
}
