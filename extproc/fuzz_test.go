package extproc

import (
	"context"
	"encoding/json"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"go.uber.org/zap"

	"github.com/omnious/provider-node/endpoint"
	"github.com/omnious/provider-node/scheduler"
)

// FuzzRequestBody: the parser never panics, accepts only valid JSON objects,
// agrees with encoding/json on the fields it extracts, and the usage
// injection always yields valid JSON.
func FuzzRequestBody(f *testing.F) {
	for _, s := range []string{chatBody, streamBody, jsonResp, `{}`, `{"model":"a\u0041","stream":true,"stream_options":{}}`,
		`{"model":"m","stream":true,"stream_options":null}`, `[`, `{"a":[1,{"b":"\\"}]}`, `{"model":"m"}garbage`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		var rb requestBody
		err := parseRequestBody(body, &rb)
		var ref map[string]json.RawMessage
		refErr := json.Unmarshal(body, &ref)
		if err != nil {
			return // the parser may be stricter (depth) but never looser
		}
		if refErr != nil {
			if json.Valid(body) || controlByteInString(body) {
				// Valid JSON that is not a plain object, or raw control
				// characters inside strings, which the scanner leaves for
				// the engine to reject (checking them would cost a
				// byte-by-byte pass over 200 KB prompts).
				return
			}
			t.Fatalf("accepted invalid JSON %q", body)
		}
		if m, ok := ref["model"]; ok {
			var name string
			if json.Unmarshal(m, &name) == nil && name != rb.modelName {
				t.Fatalf("model %q, encoding/json says %q", rb.modelName, name)
			}
		}
		if e, ok := usageEdit(body, &rb); ok && (rb.model.ok() || !rb.streamOptions.ok()) {
			out := applyEdits(nil, body, []edit{e})
			var back map[string]any
			if rb.model.ok() && json.Unmarshal(out, &back) != nil {
				t.Fatalf("usage injection broke %q into %q", body, out)
			}
		}
	})
}

// FuzzExtProcSequence: any sequence of ext_proc messages (valid or not)
// never panics the stream handler, and Done is called at most once.
func FuzzExtProcSequence(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4}, []byte(chatBody))
	f.Add([]byte{0, 2, 3, 4, 4, 5}, []byte(streamBody))
	f.Add([]byte{6, 0, 1, 1, 2, 3, 5}, []byte(`{"model":`))
	f.Add([]byte{3, 4, 0, 0}, []byte(ev1+evUsage))
	f.Fuzz(func(t *testing.T, ops []byte, data []byte) {
		done := 0
		p := pickerFunc(func(*scheduler.Request) (*scheduler.Decision, error) {
			d := &scheduler.Decision{Endpoints: []*endpoint.Endpoint{{Addr: ep1}}}
			d.SetDone(func(scheduler.DoneInfo) { done++ })
			return d, nil
		})
		s := NewServer(Config{MaxBodyBytes: 1 << 16}, p, NewStandInPrompter(), nil, zap.NewNop())
		st := &stream{s: s, ctx: t.Context(), send: func(*extprocv3.ProcessingResponse) error { return nil },
			reqMode: s.defaultMode(), respMode: s.defaultMode()}
		half := len(data) / 2
		msgs := []*extprocv3.ProcessingRequest{
			chatHeaders(), reqBody(string(data[:half]), false), reqBody(string(data[half:]), true),
			okHeaders("text/event-stream"), respBody(string(data), false), respBody(string(data[half:]), true),
			reqHeaders(true, ":path", "/v1/models"), respTrailers(), reqTrailers(), okHeaders("application/json"),
		}
		for _, op := range ops {
			if err := st.handle(msgs[int(op)%len(msgs)]); err != nil {
				break
			}
		}
		st.close(nil)
		if done > 1 {
			t.Fatalf("Done called %d times", done)
		}
	})
}

// controlByteInString reports a raw control byte (< 0x20, tab and newlines
// included) inside a JSON string: invalid JSON that the scanner leaves for
// the engine to reject. Outside strings the scanner must reject them itself.
func controlByteInString(b []byte) bool {
	in := false
	for i := 0; i < len(b); i++ {
		switch c := b[i]; {
		case !in:
			in = c == '"'
		case c == '\\':
			i++
		case c == '"':
			in = false
		case c < 0x20:
			return true
		}
	}
	return false
}

type pickerFunc func(*scheduler.Request) (*scheduler.Decision, error)

func (pickerFunc) Admit(context.Context, *scheduler.Request) (*scheduler.Ticket, error) {
	return nil, nil
}

func (f pickerFunc) Pick(r *scheduler.Request, _ *scheduler.Ticket) (*scheduler.Decision, error) {
	return f(r)
}
