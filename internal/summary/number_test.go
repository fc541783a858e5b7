package summary

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestNumberIsExact: a number reads as the call carries it, never rounded
// (0.004 once read "0.00", 1.999 "2.00"), with separators in its integer
// part only.
func TestNumberIsExact(t *testing.T) {
	for v, want := range map[float64]string{
		50000: "50,000", 0: "0", 999: "999", 1000: "1,000", -1234.5: "-1,234.5",
		0.004: "0.004", 1.999: "1.999", 25000.01: "25,000.01", 1e19: "10,000,000,000,000,000,000",
		// RFC 8785's exponent forms, as the binding hash sees them.
		1e-320: "1e-320", 1.5e-7: "1.5e-7", 0.000001: "0.000001", 1e21: "1e+21", -2.5e22: "-2.5e+22",
	} {
		require.Equal(t, want, Number(v), "%v", v)
	}
}
