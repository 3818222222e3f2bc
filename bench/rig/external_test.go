package rig

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestParseExternal(t *testing.T) {
	tests := []struct {
		policy                     string
		ok                         bool
		kind, label, command, addr string
		metrics, err               string
	}{
		{policy: "precise"},
		{policy: "configs/epp.yaml"},
		{policy: "exec:bin/epp -policy precise", ok: true, kind: KindExec, label: "exec:epp", command: "bin/epp -policy precise"},
		{policy: "exec:llmd=./epp --config-file {file:c.yaml}, --x", ok: true, kind: KindExec, label: "llmd",
			command: "./epp --config-file {file:c.yaml}, --x"},
		{policy: "exec:path/to=x y", ok: true, kind: KindExec, label: "exec:to=x", command: "path/to=x y"},
		{policy: "exec:", ok: true, err: "needs a command"},
		{policy: "exec:ours=  ", ok: true, err: "needs a command"},
		{policy: "addr:127.0.0.1:9002", ok: true, kind: KindAddr, label: "addr:127.0.0.1:9002", addr: "127.0.0.1:9002"},
		{policy: "addr:peer=localhost:9002+127.0.0.1:9090", ok: true, kind: KindAddr, label: "peer", addr: "localhost:9002",
			metrics: "127.0.0.1:9090"},
		{policy: "addr:[::1]:9002", ok: true, kind: KindAddr, label: "addr:[::1]:9002", addr: "[::1]:9002"},
		{policy: "addr:10.0.0.1:9002", ok: true, err: "not on loopback"},
		{policy: "addr:127.0.0.1:9002+10.0.0.1:9090", ok: true, err: "metrics address"},
		{policy: "addr:127.0.0.1", ok: true, err: "want host:port"},
		{policy: "addr:127.0.0.1:0", ok: true, err: "bad port"},
	}
	for _, tc := range tests {
		t.Run(tc.policy, func(t *testing.T) {
			x, ok, err := parseExternal(tc.policy)
			require.Equal(t, tc.ok, ok)
			if tc.err != "" {
				require.ErrorContains(t, err, tc.err)
				return
			}
			require.NoError(t, err)
			if !ok {
				require.Equal(t, tc.policy, PolicyLabel(tc.policy))
				return
			}
			require.Equal(t, external{kind: tc.kind, label: tc.label, command: tc.command, addr: tc.addr, metrics: tc.metrics}, x)
			require.Equal(t, tc.label, PolicyLabel(tc.policy))
			require.Equal(t, tc.kind, PolicyKind(tc.policy))
		})
	}
	require.Equal(t, KindPolicy, PolicyKind("approximate"))
	require.Equal(t, KindConfig, PolicyKind("my.yaml"))
}
