package pep

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestMoneyIsExact: money writes the amount as the call carries it, never
// rounded (0.004 once read "0.00", 1.999 "2.00", 1e-320 "0"), with
// separators in the integer part and cents in two digits.
func TestMoneyIsExact(t *testing.T) {
	for v, want := range map[float64]string{
		50000: "50,000", 50000.25: "50,000.25", 50000.2: "50,000.20", 0.01: "0.01", 999: "999", 1000: "1,000",
		1234567.5: "1,234,567.50", -1234.5: "-1,234.50", 0.004: "0.004", 1.999: "1.999", 1e9: "1,000,000,000",
	} {
		require.Equal(t, want, money(v), "%v", v)
	}
}
