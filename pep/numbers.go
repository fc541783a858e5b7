package pep

import (
	"bytes"
	"encoding/json"
	"math/big"
	"strconv"
	"strings"
)

// inexactNumber finds the first number in the JSON text raw that a 64-bit
// float does not hold exactly as written (beyond its range or its
// precision): the policy, the binding hash, the approver and the upstream
// would each see another number than the one sent. It returns the number's
// JSON Pointer and its text, or "" and "" when every number is exact.
// Decimals a float stores approximately (0.1) count as exact: the shortest
// text of the float is the same decimal.
func inexactNumber(raw []byte) (pointer, text string) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var v any
	if dec.Decode(&v) != nil {
		return "", ""
	}
	return walkNumbers(v, "")
}

func walkNumbers(v any, at string) (string, string) {
	switch x := v.(type) {
	case json.Number:
		if !exactFloat(string(x)) {
			return at, string(x)
		}
	case map[string]any:
		for k, e := range x {
			if p, t := walkNumbers(e, at+"/"+strings.NewReplacer("~", "~0", "/", "~1").Replace(k)); p != "" || t != "" {
				return p, t
			}
		}
	case []any:
		for i, e := range x {
			if p, t := walkNumbers(e, at+"/"+strconv.Itoa(i)); p != "" || t != "" {
				return p, t
			}
		}
	}
	return "", ""
}

func exactFloat(text string) bool {
	f, err := strconv.ParseFloat(text, 64)
	if err != nil {
		return false // out of range
	}
	want, ok1 := new(big.Rat).SetString(text)
	got, ok2 := new(big.Rat).SetString(strconv.FormatFloat(f, 'g', -1, 64))
	return ok1 && ok2 && want.Cmp(got) == 0
}
