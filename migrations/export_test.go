package migrations

// CompatibleWith exposes the header parser to the tests; a bad header is
// returned as -1.
func CompatibleWith(sql string, version int) int {
	n, err := compatibleWith(sql, version)
	if err != nil {
		return -1
	}
	return n
}
