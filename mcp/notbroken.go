//go:build !arapbroken

package mcp

// brokenExecutesOnRequestableDenial is true only in the deliberately broken
// build (broken.go); a constant, so every other build compiles the branch
// out.
const brokenExecutesOnRequestableDenial = false
