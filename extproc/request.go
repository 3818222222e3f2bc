package extproc

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/omnious/provider-node/internal/jsonstr"
)

// API is the OpenAI endpoint a request addresses.
type API uint8

const (
	APIOther API = iota
	APIChat
	APICompletions
	APIResponses
	APIModels
)

func (a API) String() string {
	switch a {
	case APIChat:
		return "chat"
	case APICompletions:
		return "completions"
	case APIResponses:
		return "responses"
	case APIModels:
		return "models"
	}
	return "other"
}

// apiOf classifies a request path (query string ignored).
func apiOf(path string) API {
	if i := strings.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	path = strings.TrimSuffix(path, "/")
	switch path {
	case "/v1/chat/completions":
		return APIChat
	case "/v1/completions":
		return APICompletions
	case "/v1/responses":
		return APIResponses
	case "/v1/models":
		return APIModels
	}
	return APIOther
}

// span is a byte range of the body; e == 0 means absent.
type span struct{ s, e int }

func (p span) ok() bool              { return p.e > p.s }
func (p span) of(b []byte) []byte    { return b[p.s:p.e] }
func (p span) isNull(b []byte) bool  { return p.ok() && isNull(p.of(b)) }
func (p span) present(b []byte) bool { return p.ok() && !isNull(p.of(b)) }

// requestBody is the result of the single parse of a request body: spans
// into the body and the few scalars routing needs.
type requestBody struct {
	obj           int // offset of the top-level '{'
	model         span
	modelName     string
	stream        bool
	streamOptions span
	includeUsage  span // value of stream_options.include_usage
	usageAsked    bool // include_usage is true
	user          string
	cacheSalt     string
	messages      span
	tools         span
	prompt        span
	input         span
	instructions  span
	previousResp  span // previous_response_id
	kwargs        span
	addGenPrompt  span
}

var errNotObject = errors.New("request body must be a JSON object")

// parseRequestBody scans body once. It fails on malformed JSON; semantic
// checks (model present, types of fields the engine validates) are left to
// the caller and the engine.
func parseRequestBody(body []byte, rb *requestBody) error {
	*rb = requestBody{}
	i := skipWS(body, 0)
	if i >= len(body) || body[i] != '{' {
		return errNotObject
	}
	rb.obj = i
	it, err := newObjIter(body, i, 1)
	if err != nil {
		return err
	}
	for {
		key, vs, ve, ok, err := it.next()
		if err != nil {
			return err
		}
		if !ok {
			break
		}
		v := span{vs, ve}
		switch {
		case keyIs(key, "model"):
			rb.model = v
		case keyIs(key, "stream"):
			rb.stream = string(body[vs:ve]) == "true"
		case keyIs(key, "stream_options"):
			rb.streamOptions = v
		case keyIs(key, "user"):
			rb.user, _ = jsonstr.Decode(body[vs:ve])
		case keyIs(key, "cache_salt"):
			rb.cacheSalt, _ = jsonstr.Decode(body[vs:ve])
		case keyIs(key, "messages"):
			rb.messages = v
		case keyIs(key, "tools"):
			rb.tools = v
		case keyIs(key, "prompt"):
			rb.prompt = v
		case keyIs(key, "input"):
			rb.input = v
		case keyIs(key, "instructions"):
			rb.instructions = v
		case keyIs(key, "previous_response_id"):
			rb.previousResp = v
		case keyIs(key, "chat_template_kwargs"):
			rb.kwargs = v
		case keyIs(key, "add_generation_prompt"):
			rb.addGenPrompt = v
		}
	}
	if j := skipWS(body, it.i); j != len(body) {
		return fmt.Errorf("invalid character %q after the JSON object at offset %d", body[j], j)
	}
	if rb.model.ok() {
		name, err := jsonstr.Decode(rb.model.of(body))
		if err != nil {
			return errors.New("model must be a string")
		}
		rb.modelName = name
	}
	if rb.streamOptions.ok() && body[rb.streamOptions.s] == '{' {
		so, _ := newObjIter(body, rb.streamOptions.s, 2)
		for {
			key, vs, ve, ok, _ := so.next() // already validated by the outer scan
			if !ok {
				break
			}
			if keyIs(key, "include_usage") {
				rb.includeUsage = span{vs, ve}
				rb.usageAsked = string(body[vs:ve]) == "true"
			}
		}
	}
	return nil
}

// edit replaces body[s:e] with repl (s == e inserts).
type edit struct {
	s, e int
	repl string
}

// usageEdit returns the edit that makes stream_options.include_usage true,
// or ok=false when stream_options has a shape the engine will reject anyway.
func usageEdit(body []byte, rb *requestBody) (edit, bool) {
	so := rb.streamOptions
	switch {
	case !so.ok():
		return edit{rb.obj + 1, rb.obj + 1, `"stream_options":{"include_usage":true},`}, true
	case so.isNull(body):
		return edit{so.s, so.e, `{"include_usage":true}`}, true
	case body[so.s] != '{':
		return edit{}, false
	case rb.includeUsage.ok():
		return edit{rb.includeUsage.s, rb.includeUsage.e, "true"}, true
	}
	if j := skipWS(body, so.s+1); body[j] == '}' {
		return edit{so.s + 1, so.s + 1, `"include_usage":true`}, true
	}
	return edit{so.s + 1, so.s + 1, `"include_usage":true,`}, true
}

// editedLen is the length of body after edits.
func editedLen(body []byte, edits []edit) int {
	n := len(body)
	for _, e := range edits {
		n += len(e.repl) - (e.e - e.s)
	}
	return n
}

// applyEdits appends the edited body to dst (pass nil for a new buffer of
// the exact size). edits must be sorted by offset and must not overlap.
func applyEdits(dst, body []byte, edits []edit) []byte {
	out := dst
	if out == nil {
		out = make([]byte, 0, editedLen(body, edits))
	}
	at := 0
	for _, e := range edits {
		out = append(out, body[at:e.s]...)
		out = append(out, e.repl...)
		at = e.e
	}
	return append(out, body[at:]...)
}

// quoteJSON returns s as a JSON string literal.
func quoteJSON(s string) string {
	b, _ := json.Marshal(s) // a string always marshals
	return string(b)
}
