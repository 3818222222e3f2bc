package extproc

import (
	"strings"
	"unicode/utf8"

	"github.com/omnious/provider-node/internal/jsonstr"
)

// Engines is the set of engine families serving a model.
type Engines uint8

// Engine families.
const (
	EngineVLLM Engines = 1 << iota
	EngineSGLang
)

// vLLM 0.32's checks of a request's cache_salt
// (vllm/entrypoints/generate/base/protocol.py, validate_cache_salt, run
// on chat, completions and responses requests): a salt given and not
// null must be a non-empty string of at most 128 characters (Python's,
// code points) holding none of '@', '/', '\' and NUL; anything else is
// answered 400 with these messages. SGLang takes any string (or list of
// strings) and refuses nothing of it.
const (
	saltMaxChars    = 128
	saltForbidden   = "@/\\\x00"
	saltNotString   = "Parameter 'cache_salt' must be a non-empty string if provided."
	saltBadContents = "Parameter 'cache_salt' must be at most 128 characters and must not contain '@', '/', '\\\\', or NUL."
)

// SetModelEngines tells the server which engine families serve each
// model (the endpoints' engines), so that it refuses before routing what
// every replica of the model would refuse. A model it was not told of is
// checked against nothing. Safe to call at any time.
func (s *Server) SetModelEngines(m map[string]Engines) { s.engines.Store(&m) }

// vllmSaltRefusal is vLLM's reason for refusing the cache_salt value raw
// (a JSON value), or "" when vLLM takes it (TestCacheSaltVLLMRefuses).
func vllmSaltRefusal(raw []byte) string {
	if isNull(raw) {
		return ""
	}
	salt, err := jsonstr.Decode(raw)
	if err != nil || salt == "" {
		return saltNotString
	}
	if len(salt) > saltMaxChars && utf8.RuneCountInString(salt) > saltMaxChars || strings.ContainsAny(salt, saltForbidden) {
		return saltBadContents
	}
	return ""
}

// checkSalt answers 400 with vLLM's reason a request whose cache_salt
// every replica of its target model would refuse (all of them vLLM), so
// that such a salt never reaches the scheduler, its index or a metric.
// It returns whether the request was answered.
func (st *stream) checkSalt(body []byte) (bool, error) {
	if !st.rb.saltSpan.ok() {
		return false, nil
	}
	m := st.s.engines.Load()
	if m == nil || (*m)[st.targetModel] != EngineVLLM {
		return false, nil
	}
	if msg := vllmSaltRefusal(st.rb.saltSpan.of(body)); msg != "" {
		return true, st.reject(400, "bad_request", msg)
	}
	return false, nil
}
