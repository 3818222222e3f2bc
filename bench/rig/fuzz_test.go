package rig

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

// FuzzParseExternal: any policy string is a built-in or config policy, an
// error, or an external EPP with a label and, for addr:, a loopback
// address.
func FuzzParseExternal(f *testing.F) {
	for _, s := range []string{"precise", "exec:bin/epp -x", "exec:l=a,b", "exec:", "addr:127.0.0.1:9002",
		"addr:p=localhost:1+127.0.0.1:2", "addr:10.0.0.1:1", "addr:[::1]:80", "exec:FOO=1 x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, policy string) {
		x, ok, err := parseExternal(policy)
		if !ok {
			if err != nil || PolicyLabel(policy) != policy {
				t.Fatalf("%q: not external but %v / %q", policy, err, PolicyLabel(policy))
			}
			return
		}
		if err != nil {
			return
		}
		if x.label == "" || PolicyLabel(policy) != x.label {
			t.Fatalf("%q: label %q", policy, x.label)
		}
		switch x.kind {
		case KindExec:
			if x.command == "" {
				t.Fatalf("%q: empty command", policy)
			}
		case KindAddr:
			if requireLoopback(x.addr) != nil || (x.metrics != "" && requireLoopback(x.metrics) != nil) {
				t.Fatalf("%q: address %q / %q not checked", policy, x.addr, x.metrics)
			}
		default:
			t.Fatalf("%q: kind %q", policy, x.kind)
		}
	})
}
