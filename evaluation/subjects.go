package evaluation

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/omcp/arap/identity"
)

// SubjectSource looks up the attributes of a subject by identity (a policy
// information point): the directory's users and groups, an HR system, a
// JSON file. Conditions read the result as subject_attributes.
//
// An identity the source does not know is (nil, nil): no attributes, so a
// condition that needs one does not hold. An error fails the evaluation
// closed (deny, reason policy_error). Implementations must compare the
// claimed id as an identity and read no more into it than it says (no
// stripping of type prefixes): a lookup grants attributes, so a looser match
// would let one party pass as another.
type SubjectSource interface {
	SubjectAttributes(ctx context.Context, subjectType, subjectID string) (map[string]any, error)
}

// SubjectAttributes is the policy's subject_attributes section: where
// subject_attributes comes from.
type SubjectAttributes struct {
	// Source names a source the deployment registered
	// (Options.SubjectSources), e.g. "directory".
	Source string
	// File is a JSON file of identities and their attributes, read when the
	// policy is (re)loaded.
	File string
	// SubjectTypes are the subject types looked up; any other type has no
	// attributes. Default: user.
	SubjectTypes []string
	file         *FileSubjects
}

type subjectAttributesSpec struct {
	Line         int      `yaml:"-"`
	Source       string   `yaml:"source"`
	File         string   `yaml:"file"`
	SubjectTypes []string `yaml:"subject_types"`
}

func (s *subjectAttributesSpec) UnmarshalYAML(n *yaml.Node) error {
	if err := checkKeys(n, []string{"source", "file", "subject_types"}, "subject_attributes"); err != nil {
		return err
	}
	type plain subjectAttributesSpec
	var p plain
	if err := n.Decode(&p); err != nil {
		return err
	}
	*s = subjectAttributesSpec(p)
	s.Line = n.Line
	return nil
}

// compileSubjectAttributes checks the section and loads a file source; the
// file's path is relative to the policy file's directory.
func compileSubjectAttributes(policySource string, s *subjectAttributesSpec, add func(line int, format string, args ...any)) *SubjectAttributes {
	if s == nil {
		return nil
	}
	out := &SubjectAttributes{Source: s.Source, File: s.File, SubjectTypes: s.SubjectTypes}
	if len(out.SubjectTypes) == 0 {
		out.SubjectTypes = []string{"user"}
	}
	switch {
	case (s.Source == "") == (s.File == ""):
		add(s.Line, "subject_attributes needs exactly one of source (a source the deployment registers, such as directory) or file (a JSON file)")
		return nil
	case s.File != "":
		path := s.File
		if !filepath.IsAbs(path) {
			path = filepath.Join(filepath.Dir(policySource), path)
		}
		f, err := LoadSubjectFile(path)
		if err != nil {
			add(s.Line, "subject_attributes.file: %v", err)
			return nil
		}
		out.file = f
	case !nameRE.MatchString(s.Source):
		add(s.Line, "subject_attributes.source %q must be lower_snake_case", s.Source)
		return nil
	}
	return out
}

// Bounds of a subject file.
const (
	maxSubjectFile    = 8 << 20
	maxSubjectEntries = 100000
)

// FileSubjects is a SubjectSource read from a JSON object whose members are
// identities and whose values are their attributes (objects), like the
// AuthZEN interop's todo-directory.json. Ids are opaque: compared exactly,
// case included, because such files mix e-mail addresses with opaque
// subject ids (base64, where case matters); list every spelling a subject
// is sent with. Ids must be canonical (identity.Check).
type FileSubjects struct {
	byID map[string]map[string]any
}

// LoadSubjectFile reads a subject file.
func LoadSubjectFile(path string) (*FileSubjects, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxSubjectFile+1))
	if err != nil {
		return nil, err
	}
	if len(b) > maxSubjectFile {
		return nil, fmt.Errorf("%s is larger than %d bytes", path, maxSubjectFile)
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return nil, fmt.Errorf("%s: must be a JSON object of identities and their attributes: %v", path, err)
	}
	if len(raw) > maxSubjectEntries {
		return nil, fmt.Errorf("%s: at most %d identities, got %d", path, maxSubjectEntries, len(raw))
	}
	out := &FileSubjects{byID: make(map[string]map[string]any, len(raw))}
	ids := make([]string, 0, len(raw))
	for id := range raw {
		ids = append(ids, id)
	}
	slices.Sort(ids) // the first problem reported is the same every time
	for _, id := range ids {
		if err := identity.Check(id); err != nil {
			return nil, fmt.Errorf("%s: identity %q %v", path, id, err)
		}
		var attrs map[string]any
		if err := json.Unmarshal(raw[id], &attrs); err != nil || attrs == nil {
			return nil, fmt.Errorf("%s: the attributes of %q must be a JSON object", path, id)
		}
		out.byID[id] = attrs
	}
	return out, nil
}

// SubjectAttributes returns the attributes listed for subjectID, or nil.
func (f *FileSubjects) SubjectAttributes(_ context.Context, _, subjectID string) (map[string]any, error) {
	return f.byID[subjectID], nil
}

// lookupTimeout bounds one subject lookup.
const lookupTimeout = 2 * time.Second

// lookupCache holds the subject lookups of one batch, so items about the
// same subject cost one lookup. Items are evaluated in turn, so it needs no
// lock.
type lookupCache map[[2]string]lookupResult

type lookupResult struct {
	attrs map[string]any
	err   error
}

type lookupCacheKey struct{}

func withLookupCache(ctx context.Context) context.Context {
	return context.WithValue(ctx, lookupCacheKey{}, lookupCache{})
}

// subjectAttributes looks the request's subject up in the policy's source.
func (e *Engine) subjectAttributes(ctx context.Context, sa *SubjectAttributes, subject map[string]any) (map[string]any, error) {
	typ, _ := subject["type"].(string)
	id, _ := subject["id"].(string)
	if !slices.Contains(sa.SubjectTypes, typ) || id == "" {
		return map[string]any{}, nil
	}
	cache, _ := ctx.Value(lookupCacheKey{}).(lookupCache)
	key := [2]string{typ, id}
	if r, ok := cache[key]; ok {
		return r.attrs, r.err
	}
	var src SubjectSource
	if sa.file != nil {
		src = sa.file
	} else if src = e.opts.SubjectSources[sa.Source]; src == nil {
		return nil, fmt.Errorf("subject_attributes: no source %q is configured in this deployment", sa.Source)
	}
	lctx, cancel := context.WithTimeout(ctx, lookupTimeout)
	defer cancel()
	attrs, err := src.SubjectAttributes(lctx, typ, id)
	if err != nil {
		err = fmt.Errorf("subject_attributes: look up %s %q: %w", typ, id, err)
		attrs = nil
	} else if attrs == nil {
		attrs = map[string]any{}
	}
	if cache != nil {
		cache[key] = lookupResult{attrs, err}
	}
	return attrs, err
}
