package extproc

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"unsafe"

	"github.com/omnious/provider-node/engines/openai"
	"github.com/omnious/provider-node/engines/tokenizer"
	"github.com/omnious/provider-node/internal/jsonstr"
)

// PromptInput is what a request contributes to its prompt, as raw JSON
// spans of the body (they alias it: a Prompter must not keep them).
type PromptInput struct {
	API API
	// Messages and Tools are the chat request's arrays; Kwargs is
	// chat_template_kwargs. AddGenerationPrompt defaults to true.
	Messages, Tools, Kwargs []byte
	AddGenerationPrompt     bool
	// Prompt is the completions prompt (a string or a token list).
	Prompt []byte
	// Input and Instructions are the Responses API fields; Stateful says
	// the request continues a stored response (previous_response_id),
	// whose messages only the engine has.
	Input, Instructions []byte
	Stateful            bool
}

// Prompter turns a request into the prompt the engine will see. It returns
// the exact token ids when it has model's tokenizer (and chat template),
// else ok=false and the server falls back to approximate matching on the
// prompt's raw text. Implementations are safe for concurrent use.
type Prompter interface {
	Prompt(model string, in *PromptInput) (tokens []uint32, ok bool)
}

// promptAppender is a Prompter that hands the prompt over as the leading
// tokens its tokenizer's prefix cache holds and the others, appended to a
// buffer (TokenPrompter.AppendPromptTail).
type promptAppender interface {
	AppendPromptTail(dst []uint32, model string, in *PromptInput) ([]uint32, tokenizer.Prefix, bool)
}

// maxPooledTokens bounds the token buffers the server keeps (4 bytes a
// token): a buffer grown by a rare huge prompt is left to the collector.
const maxPooledTokens = 1 << 20

// prompt is the prompter's tokens for the stream's request: the cached
// prefix of them, if any, and the tokens after it, in a pooled buffer
// when the prompter can append (give it back with putTokens).
func (s *Server) prompt(model string, in *PromptInput) ([]uint32, tokenizer.Prefix, bool) {
	if s.appender == nil {
		toks, ok := s.prompter.Prompt(model, in)
		return toks, tokenizer.Prefix{}, ok
	}
	var dst []uint32
	if b, ok := s.tokenBufs.Get().(*[]uint32); ok {
		dst = (*b)[:0]
	}
	toks, prefix, ok := s.appender.AppendPromptTail(dst, model, in)
	if !ok {
		s.putTokens(toks)
		return nil, tokenizer.Prefix{}, false
	}
	return toks, prefix, true
}

// putTokens recycles the buffer of prompt's tokens once nothing reads
// them: the scheduler keeps none of a request's tokens after Pick (its key
// cache copies the blocks it records).
func (s *Server) putTokens(t []uint32) {
	if t != nil && cap(t) <= maxPooledTokens && s.appender != nil {
		s.recycleTokens(t[:0])
	}
}

// recycleTokens puts t in the pool. A function of its own: the slice
// header it allocates (as bodyPool's) is then paid only by a request with
// tokens, not by every request passing putTokens (TestAllocsRequest).
func (s *Server) recycleTokens(t []uint32) { s.tokenBufs.Put(&t) }

// ModelTokenizer is the tokenizer and chat template of one model. A nil
// Template renders chats with the stand-in ChatML template. Harmony marks
// a model (gpt-oss) whose Responses API prompts vLLM builds in the harmony
// format rather than with the chat template: those are routed
// approximately.
//
// Tokenizer.Encode must not keep the text it is given: a stand-in chat is
// rendered into a buffer the next request reuses (those of
// engines/tokenizer keep ids and hashes, and copies of the words they
// cache).
type ModelTokenizer struct {
	Tokenizer tokenizer.Tokenizer
	Template  *tokenizer.ChatTemplate
	Harmony   bool
}

// TokenPrompter renders and tokenizes prompts for the models it knows.
type TokenPrompter struct {
	models map[string]ModelTokenizer
	def    *ModelTokenizer
	// textBufs holds *[]byte buffers for stand-in chat renderings, each
	// back in the pool once its text is tokenized.
	textBufs sync.Pool
}

// maxPooledText bounds the rendering buffers kept: one grown by a rare
// huge prompt is left to the collector.
const maxPooledText = 4 << 20

// NewTokenPrompter serves the models in byModel, and every other model with
// def when it is non-nil.
func NewTokenPrompter(byModel map[string]ModelTokenizer, def *ModelTokenizer) *TokenPrompter {
	return &TokenPrompter{models: byModel, def: def}
}

// NewStandInPrompter tokenizes every model as the engine simulator does:
// stand-in ChatML rendering and the stand-in tokenizer, behind a prefix
// cache so that a shared system prompt or an earlier turn is tokenized once.
func NewStandInPrompter() *TokenPrompter {
	tok := tokenizer.NewPrefixCache(tokenizer.NewStandIn(), tokenizer.PrefixCacheConfig{})
	return NewTokenPrompter(nil, &ModelTokenizer{Tokenizer: tok})
}

// Prompt implements Prompter.
func (p *TokenPrompter) Prompt(model string, in *PromptInput) ([]uint32, bool) {
	return p.AppendPrompt(nil, model, in)
}

// AppendPrompt is Prompt appending the tokens to dst, so that a caller can
// reuse one buffer for request after request (the server does:
// TestAllocsPromptTokens). A token-list prompt comes back in a slice of
// its own.
func (p *TokenPrompter) AppendPrompt(dst []uint32, model string, in *PromptInput) ([]uint32, bool) {
	return p.appendPrompt(dst, model, in, nil)
}

// AppendPromptTail is AppendPrompt that leaves out of dst the leading
// tokens the model's tokenizer, when it is a PrefixCache, holds in its
// entries, and returns them as a Prefix: the prompt's tokens are the
// Prefix's followed by those appended to dst (TestPromptPrefixIDs). The
// cached tokens are not copied (tokenizer.PrefixCache.EncodeTail). The
// Prefix is the zero one for a completions prompt.
func (p *TokenPrompter) AppendPromptTail(dst []uint32, model string, in *PromptInput) ([]uint32, tokenizer.Prefix, bool) {
	var prefix tokenizer.Prefix
	dst, ok := p.appendPrompt(dst, model, in, &prefix)
	return dst, prefix, ok
}

// appendPrompt is AppendPrompt, or AppendPromptTail's tokens when prefix
// is not nil: then *prefix is set to the leading tokens left out.
func (p *TokenPrompter) appendPrompt(dst []uint32, model string, in *PromptInput, prefix *tokenizer.Prefix) ([]uint32, bool) {
	mt, ok := p.models[model]
	if !ok {
		if p.def == nil {
			return dst, false
		}
		mt = *p.def
	}
	var text string
	var buf *[]byte // the rendering's, recycled after Encode
	switch in.API {
	case APIChat:
		msgs, err := decodeMessages(in.Messages)
		if err != nil {
			return dst, false
		}
		if mt.Template == nil {
			buf = p.textBuf()
		}
		if text, err = renderChat(mt.Template, msgs, in, buf); err != nil {
			p.putText(buf)
			return dst, false
		}
	case APIResponses:
		if mt.Harmony {
			return dst, false
		}
		msgs, err := responsesMessages(in)
		if err != nil {
			return dst, false
		}
		if mt.Template == nil {
			buf = p.textBuf()
		}
		// No chat_template_kwargs: vLLM's Responses request has none.
		if text, err = renderChat(mt.Template, msgs, &PromptInput{AddGenerationPrompt: true}, buf); err != nil {
			p.putText(buf)
			return dst, false
		}
	case APICompletions:
		return completionTokens(dst, mt.Tokenizer, in.Prompt)
	default:
		return dst, false
	}
	if pc, ok := mt.Tokenizer.(*tokenizer.PrefixCache); ok && prefix != nil {
		dst, *prefix = pc.EncodeTail(dst, text)
	} else {
		dst = mt.Tokenizer.Encode(dst, text)
	}
	p.putText(buf) // text is not read again (TestAppendPromptReusesText)
	return dst, true
}

// textBuf returns an empty rendering buffer from the pool.
func (p *TokenPrompter) textBuf() *[]byte {
	if b, ok := p.textBufs.Get().(*[]byte); ok {
		*b = (*b)[:0]
		return b
	}
	return new([]byte)
}

// putText gives a rendering buffer (or nil) back.
func (p *TokenPrompter) putText(b *[]byte) {
	if b != nil && cap(*b) <= maxPooledText {
		p.textBufs.Put(b)
	}
}

// renderChat renders msgs with in's tools, kwargs and generation prompt.
// A stand-in rendering (tmpl nil) goes into *buf when buf is non-nil, and
// the text returned aliases it.
func renderChat(tmpl *tokenizer.ChatTemplate, msgs []openai.Message, in *PromptInput, buf *[]byte) (string, error) {
	var tools []openai.Tool
	if len(in.Tools) > 0 && !isNull(in.Tools) {
		if err := json.Unmarshal(in.Tools, &tools); err != nil {
			return "", fmt.Errorf("cannot decode tools: %w", err)
		}
	}
	if tmpl == nil {
		if buf == nil {
			return tokenizer.RenderStandInChat(msgs, tools, in.AddGenerationPrompt)
		}
		var err error
		if *buf, err = tokenizer.AppendStandInChat(*buf, msgs, tools, in.AddGenerationPrompt); err != nil {
			return "", err
		}
		return unsafe.String(unsafe.SliceData(*buf), len(*buf)), nil
	}
	return tmpl.Render(tokenizer.ChatInput{Messages: msgs, Tools: tools,
		AddGenerationPrompt: in.AddGenerationPrompt, Kwargs: in.Kwargs})
}

// Why a Responses API request has no exact prompt here.
var (
	errStateful       = errors.New("previous_response_id: the engine prepends a stored conversation")
	errResponsesTools = errors.New("tools: the engine's rendering of Responses tools is version-specific")
)

// responsesMessages is openai.ResponsesMessages for requests whose prompt
// the EPP can know: not one that continues a stored response, nor one with
// tools (vLLM's rendering of Responses tools differs between versions).
func responsesMessages(in *PromptInput) ([]openai.Message, error) {
	if in.Stateful {
		return nil, errStateful
	}
	if t := bytes.TrimSpace(in.Tools); len(t) > 0 && !isNull(t) && string(t) != "[]" {
		return nil, errResponsesTools
	}
	return openai.ResponsesMessages(in.Instructions, in.Input)
}

// decodeMessages decodes a chat request's messages array with the body
// scanner: content stays a span of the body (ContentText decodes it once,
// later; TestAllocsDecodeMessages), and only tool_calls, rare and small,
// go through encoding/json.
// Keys match exactly, as in the engines' Python parsers; unknown keys are
// skipped; a repeated key keeps its last value.
func decodeMessages(raw []byte) ([]openai.Message, error) {
	i := skipWS(raw, 0)
	if i >= len(raw) || raw[i] != '[' {
		return nil, errors.New("messages must be an array")
	}
	msgs := make([]openai.Message, 0, 8)
	end, err := walkArray(raw, i, 0, func(n, vs, ve int) error {
		elem := raw[vs:ve]
		it, err := newObjIter(elem, 0, 1)
		if err != nil {
			return fmt.Errorf("message %d: %w", n, err)
		}
		var m openai.Message
		for {
			key, vs, ve, ok, err := it.next()
			if err != nil {
				return fmt.Errorf("message %d: %w", n, err)
			}
			if !ok {
				break
			}
			v := elem[vs:ve]
			switch {
			case keyIs(key, "role"):
				m.Role, err = jsonstr.Decode(v)
			case keyIs(key, "content"):
				m.Content = v
			case keyIs(key, "name"):
				m.Name, err = optionalString(v)
			case keyIs(key, "tool_call_id"):
				m.ToolCallID, err = optionalString(v)
			case keyIs(key, "tool_calls"):
				m.ToolCalls = nil
				err = json.Unmarshal(v, &m.ToolCalls)
			}
			if err != nil {
				return fmt.Errorf("message %d: %s: %w", n, key, err)
			}
		}
		msgs = append(msgs, m)
		return nil
	})
	if err != nil {
		return nil, err
	}
	if j := skipWS(raw, end); j != len(raw) {
		return nil, fmt.Errorf("invalid character %q after messages", raw[j])
	}
	return msgs, nil
}

// optionalString decodes a string member that may be null.
func optionalString(v []byte) (string, error) {
	if isNull(v) {
		return "", nil
	}
	return jsonstr.Decode(v)
}

// completionTokens handles a string prompt, a token list, or a one-element
// list of either, as vLLM does for a single prompt; a string's tokens are
// appended to dst.
func completionTokens(dst []uint32, tok tokenizer.Tokenizer, raw []byte) ([]uint32, bool) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return dst, false
	}
	switch raw[0] {
	case '"':
		s, err := jsonstr.Decode(raw)
		if err != nil {
			return dst, false
		}
		return tok.Encode(dst, s), true
	case '[':
		var ids []uint32
		if json.Unmarshal(raw, &ids) == nil {
			return ids, len(ids) > 0
		}
		var list []json.RawMessage
		if json.Unmarshal(raw, &list) == nil && len(list) == 1 {
			return completionTokens(dst, tok, list[0])
		}
	}
	return dst, false
}

// approximateText is the prompt text used when exact tokens are unknown:
// the raw JSON of the part of the body that grows turn by turn, so that a
// conversation's later requests share a prefix with earlier ones.
func approximateText(body []byte, rb *requestBody) []byte {
	switch {
	case rb.messages.ok():
		return rb.messages.of(body)
	case rb.prompt.ok():
		return rb.prompt.of(body)
	case rb.input.ok():
		return rb.input.of(body)
	}
	return nil
}

func promptInput(api API, body []byte, rb *requestBody) PromptInput {
	in := PromptInput{API: api, AddGenerationPrompt: true}
	if rb.messages.ok() {
		in.Messages = rb.messages.of(body)
	}
	if rb.tools.ok() {
		in.Tools = rb.tools.of(body)
	}
	if rb.kwargs.present(body) {
		in.Kwargs = rb.kwargs.of(body)
	}
	if rb.addGenPrompt.ok() && string(rb.addGenPrompt.of(body)) == "false" {
		in.AddGenerationPrompt = false
	}
	if rb.prompt.ok() {
		in.Prompt = rb.prompt.of(body)
	}
	if rb.input.ok() {
		in.Input = rb.input.of(body)
	}
	if rb.instructions.ok() {
		in.Instructions = rb.instructions.of(body)
	}
	in.Stateful = rb.previousResp.present(body)
	return in
}
