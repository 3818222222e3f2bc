package main

import (
	"flag"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/bench/rig"
)

// TestAgentFlagsOverridePreset: an -agent-* flag given on the command
// line replaces the preset's value; one not given leaves it.
func TestAgentFlagsOverridePreset(t *testing.T) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	var f agentFlags
	f.register(fs)
	require.NoError(t, fs.Parse([]string{"-agent-sessions", "7", "-agent-rate", "0.25", "-agent-gap", "3s",
		"-agent-tool-call-max", "0", "-agent-no-session-ids", "-agent-concurrency", "0", "-agent-retries", "3"}))
	set := map[string]bool{}
	fs.Visit(func(fl *flag.Flag) { set[fl.Name] = true })
	a := rig.AgentOptions{Sessions: 64, SessionRate: 0.5, Calls: 12, Gap: 5 * time.Second, ToolCallMax: 256, Concurrency: new(32), RetryBackoff: time.Second}
	f.apply(&a, set)
	require.Equal(t, rig.AgentOptions{Sessions: 7, SessionRate: 0.25, Calls: 12, Gap: 3 * time.Second, NoSessionIDs: true,
		Concurrency: new(0), Retries: new(3), RetryBackoff: time.Second}, a)
}
