package extproc

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestMsgPool: a buffer has the length asked for and the capacity of its
// tier, the power of two at or above it from 256 bytes to 64 MiB; larger
// ones are made to size, and buffers of other capacities are not kept.
func TestMsgPool(t *testing.T) {
	p := new(msgPool)
	for _, tc := range []struct{ n, cap int }{
		{0, 256}, {1, 256}, {256, 256}, {257, 512}, {62000, 64 << 10}, {64 << 10, 64 << 10},
		{200 << 10, 256 << 10}, {64 << 20, 64 << 20}, {64<<20 + 1, 64<<20 + 1},
	} {
		b := p.Get(tc.n)
		require.Len(t, *b, tc.n, "Get(%d)", tc.n)
		require.Equal(t, tc.cap, cap(*b), "Get(%d)", tc.n)
		p.Put(b)
	}
	odd := make([]byte, 300)
	p.Put(&odd) // not a tier's capacity: dropped
	require.Equal(t, 512, cap(*p.Get(300)))
}

// TestMsgPoolReuse: bodies of falling sizes, each of its own letter, go
// through gRPC one stream after another, received and sent in the pool's
// recycled, uncleared buffers; each comes back exactly as it went.
func TestMsgPoolReuse(t *testing.T) {
	c := startServer(t, Config{}, &fakePicker{addrs: []string{"10.0.0.1:8000"}}, nil, nil)
	for i, n := range []int{300 << 10, 200 << 10, 130 << 10, 62000, 40 << 10, 1 << 10} {
		body, err := json.Marshal(map[string]any{"model": "m1", "messages": []map[string]string{
			{"role": "user", "content": strings.Repeat(string(rune('a'+i)), n)}}})
		require.NoError(t, err)
		st, err := c.Process(t.Context())
		require.NoError(t, err)
		require.NoError(t, st.Send(reqHeaders(false, ":method", "POST", ":path", "/v1/chat/completions",
			"content-length", strconv.Itoa(len(body)))))
		require.NoError(t, st.Send(reqBody(string(body), true)))
		routed, err := st.Recv()
		require.NoError(t, err)
		require.NotNil(t, routed.GetRequestHeaders(), "%d bytes: the routing reply first", n)
		var got []byte
		for {
			r, err := st.Recv()
			require.NoError(t, err)
			sb := r.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse()
			require.NotNil(t, sb, "%d bytes: a streamed body chunk", n)
			got = append(got, sb.GetBody()...)
			if sb.GetEndOfStream() {
				break
			}
		}
		require.Equal(t, string(body), string(got), "%d bytes", n)
		require.NoError(t, st.CloseSend())
	}
}
