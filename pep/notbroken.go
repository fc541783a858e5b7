//go:build !arapbroken

package pep

// Every build but the deliberately broken one (broken.go): constants, so
// broken(v) is false at compile time and its branches are compiled out.
const (
	brokenBuild           = false
	brokenAs    violation = ""
)
