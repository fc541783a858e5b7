package pgembed

// SetSearchGlobForTest replaces the fallback search location.
func SetSearchGlobForTest(glob string) (restore func()) {
	old := searchGlob
	searchGlob = glob
	return func() { searchGlob = old }
}
