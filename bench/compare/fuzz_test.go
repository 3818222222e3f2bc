package compare

import (
	"bytes"
	"testing"
)

// FuzzParseTrace: any input gives records that satisfy the block invariant
// (so synthesis and the bound never panic), or an error.
func FuzzParseTrace(f *testing.F) {
	f.Add([]byte(`{"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [1, 2]}`))
	f.Add([]byte("{\"timestamp\": 5, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [-1]}\n\n"))
	f.Add([]byte(`{"timestamp": -1, "input_length": 0, "hash_ids": null}`))
	f.Add([]byte(`[1,2]`))
	f.Fuzz(func(t *testing.T, data []byte) {
		recs, err := ParseTrace(bytes.NewReader(data))
		if err != nil {
			return
		}
		total := 0
		for _, r := range recs {
			if r.InputLength > 1<<20 {
				return // keep the fuzzer fast; the invariant is checked below
			}
			total += r.InputLength
			if got := len(TraceTokens(1, r)); got != r.InputLength {
				t.Fatalf("synthesised %d tokens for input_length %d", got, r.InputLength)
			}
		}
		if b := TraceBound(recs); b < 0 || b > 1 || (total > 0 && b != b) {
			t.Fatalf("bound %v out of range", b)
		}
	})
}
