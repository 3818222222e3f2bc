package extproc

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/endpoint"
	"github.com/omnious/provider-node/kvindex"
	"github.com/omnious/provider-node/scheduler"
)

// TestSGLangPriority: with the scheduler's sessions.sglang_priority on,
// the body sent to SGLang replicas ends in the EPP's priority, the
// configured one for a call of an admitted session and 0 for any other,
// whatever priority the client put in it; off, or routed to vLLM, the
// client's body goes through byte for byte.
func TestSGLangPriority(t *testing.T) {
	const client = `{"model":"m1","priority":999,"messages":[{"role":"user","content":"hi"}]}`
	for _, tc := range []struct {
		name     string
		priority int
		engine   string
		session  string
		want     string // the body forwarded ("": the client's)
	}{
		{"admitted session", 7, "sglang", "s1", `{"model":"m1","priority":999,"messages":[{"role":"user","content":"hi"}],"priority":7}`},
		{"no session", 7, "sglang", "", `{"model":"m1","priority":999,"messages":[{"role":"user","content":"hi"}],"priority":0}`},
		{"off", 0, "sglang", "s1", ""},
		{"vllm", 7, "vllm", "s1", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			cfg := must(scheduler.ParseConfig([]byte("policy: agent\nsessions:\n  admission: \"on\"\n")))
			cfg.Sessions.SGLangPriority = tc.priority
			sched, err := scheduler.New(cfg, nil, reg, nil)
			require.NoError(t, err)
			sched.SetEndpoints([]scheduler.Target{
				{Endpoint: endpoint.Endpoint{Addr: ep1, Model: "m1", Engine: tc.engine}, Replica: kvindex.Replica(0)},
				{Endpoint: endpoint.Endpoint{Addr: ep2, Model: "m1", Engine: tc.engine}, Replica: kvindex.Replica(1)}})
			c := startServer(t, Config{}, sched, nil, reg)
			st, err := c.Process(context.Background())
			require.NoError(t, err)
			var kv []string
			if tc.session != "" {
				kv = []string{"x-session-id", tc.session}
			}
			require.NoError(t, st.Send(chatHeaders(kv...)))
			require.NoError(t, st.Send(reqBody(client, true)))
			_, err = st.Recv() // the routing reply
			require.NoError(t, err)
			resp, err := st.Recv()
			require.NoError(t, err)
			got := string(resp.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetBody())
			want := tc.want
			if want == "" {
				want = client
			}
			require.Equal(t, want, got)
			var body struct{ Priority int }
			require.NoError(t, json.Unmarshal([]byte(got), &body))
			if tc.want != "" {
				require.Equal(t, map[string]int{"s1": tc.priority, "": 0}[tc.session], body.Priority, "the last priority is the one read")
			}
			require.NoError(t, st.CloseSend())
		})
	}
}

// TestPriorityEdit: the priority goes in as the object's last member,
// after any whitespace-free or padded closing brace; a body that does not
// end in one gets none.
func TestPriorityEdit(t *testing.T) {
	for _, tc := range []struct {
		in, want string
		ok       bool
	}{
		{`{"model":"m"}`, `{"model":"m","priority":3}`, true},
		{"{\"model\":\"m\"}\n ", "{\"model\":\"m\",\"priority\":3}\n ", true},
		{`{"model":"m" }`, `{"model":"m" ,"priority":3}`, true},
		{`{ }`, `{ "priority":3}`, true},
		{`[1]`, "", false},
		{``, "", false},
		{`}`, "", false},
	} {
		e, ok := priorityEdit([]byte(tc.in), 3)
		require.Equal(t, tc.ok, ok, "%q", tc.in)
		if ok {
			require.Equal(t, tc.want, string(applyEdits(nil, []byte(tc.in), []edit{e})), "%q", tc.in)
		}
	}
}
