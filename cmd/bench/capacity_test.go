package main

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestCapacityExternalFleetFlags: what shapes simulated replicas is refused
// for running engines, and the fleet's URLs must be loopback ones that
// answer.
func TestCapacityExternalFleetFlags(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"urls mode without urls", []string{"-fleet", "urls"}, "-fleet urls needs -urls"},
		{"urls and an endpoint file", []string{"-urls", "http://127.0.0.1:1", "-endpoints-file", "e.yaml"}, "-urls or -endpoints-file, not both"},
		{"tokenizer for simulated replicas", []string{"-tokenizer", "standin"}, "-tokenizer applies to running engines"},
		{"scrape timeout for simulated replicas", []string{"-scrape-timeout", "5s"}, "-scrape-timeout applies to running engines"},
		{"endpoint file missing", []string{"-endpoints-file", "/nonexistent/endpoints.yaml"}, "cannot read the endpoint file"},
		{"tokenizer without tokenizer.json", []string{"-endpoints-file", "e.yaml", "-tokenizer", "/nonexistent"}, "tokenizer.json"},
		{"negative block size", []string{"-urls", "http://127.0.0.1:1", "-engine-block-size", "-1"}, "-engine-block-size -1 is negative"},
		{"negative scrape timeout", []string{"-urls", "http://127.0.0.1:1", "-scrape-timeout", "-1s"}, "-scrape-timeout -1s is negative"},
		{"urls with another mode", []string{"-fleet", "process", "-urls", "http://127.0.0.1:1"}, `-urls needs -fleet urls (or no -fleet), not "process"`},
		{"replicas", []string{"-urls", "http://127.0.0.1:1", "-replicas", "3"}, "-replicas applies to simulated replicas"},
		{"time scale", []string{"-urls", "http://127.0.0.1:1", "-time-scale", "4"}, "-time-scale applies to simulated replicas"},
		{"KV blocks", []string{"-fleet", "urls", "-urls", "http://127.0.0.1:1", "-num-gpu-blocks", "64"}, "-num-gpu-blocks applies to simulated replicas"},
		{"mix flag with a trace", []string{"-trace", "x.jsonl", "-system-len", "10"}, "-system-len shapes the shared-prefix workload, not -trace"},
		{"not loopback", []string{"-urls", "http://192.0.2.1:8000"}, "not on loopback"},
		{"nothing listening", []string{"-urls", "http://127.0.0.1:1"}, "cannot list models of http://127.0.0.1:1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.ErrorContains(t, runCapacity(tc.args), tc.want)
		})
	}
}
