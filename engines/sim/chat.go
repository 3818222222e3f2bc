package sim

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/omnious/provider-node/engines/openai"
	"github.com/omnious/provider-node/engines/sim/engine"
	"github.com/omnious/provider-node/engines/tokenizer"
)

// defaultOutputRange bounds the length a simulated model "chooses" when the
// client sets no max_tokens: between 16 and 16+defaultOutputRange tokens.
const defaultOutputRange = 240

// generation is one admitted request: its prompt, what it will say, and how
// the response is shaped.
type generation struct {
	id        string
	chat      bool
	responses bool // POST /v1/responses: a chat answered in the Responses API's shapes
	prompt    []uint32
	out       *output
	finish    string // finish_reason when the output ends naturally
	stream    bool
	usage     bool // stream_options.include_usage
	contUse   bool // stream_options.continuous_usage_stats
	lora      string
	salt      string
	priority  int // the request's priority field (0: none)
	toolMode  openai.ToolChoiceKind
}

func (r *Replica) handleChat(w http.ResponseWriter, req *http.Request) {
	var body openai.ChatRequest
	var opts chatOptions
	if !r.readBody(w, req, &body, &opts) {
		return
	}
	if !r.checkModel(w, body.Model) {
		return
	}
	faults, ok := r.injectFaults(w, req)
	if !ok {
		return
	}
	p, ok := r.chatPrompt(w, &body, opts, faults.RejectAutoToolChoice)
	if !ok {
		return
	}
	prompt, choice, named := p.ids, p.choice, p.named
	maxTokens := body.MaxTokens
	if body.MaxCompletionTokens != nil {
		maxTokens = body.MaxCompletionTokens
	}
	g := &generation{id: r.newID("chatcmpl-"), chat: true, prompt: prompt, stream: body.Stream,
		salt: body.CacheSalt, priority: deref(body.Priority), toolMode: choice, finish: "stop"}
	if body.StreamOptions != nil {
		g.usage, g.contUse = body.StreamOptions.IncludeUsage, body.StreamOptions.ContinuousUsageStats
	}
	if !r.admitLength(w, len(g.prompt), maxTokens) {
		return
	}
	seed := seedFor(r.cfg.Seed, body.Seed, prompt)
	fn, err := pickTool(&body, choice, named, seed)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if fn != nil {
		g.out, err = toolCallOutput(r.tok, r.vocab, r.newID("chatcmpl-tool-"), fn, seed)
		if err != nil {
			writeError(w, http.StatusBadRequest, err.Error())
			return
		}
		// vLLM reports "stop" for a forced named function and "tool_calls"
		// when the parser extracted calls (auto, required).
		if choice != openai.ToolChoiceNamed {
			g.finish = "tool_calls"
		}
		if limit := r.outputLimit(g, g.out.tokens(), maxTokens); limit < g.out.tokens() {
			g.out.truncate(limit)
		}
	} else {
		g.out = r.vocab.textOutput(r.tok, seed, r.outputLimit(g, naturalLength(seed, body.MinTokens, body.IgnoreEOS), maxTokens))
	}
	r.generate(w, req, g, faults)
}

// chatOptions are the chat request's rendering fields that ChatRequest
// leaves in the raw body.
type chatOptions struct {
	ContinueFinalMessage bool `json:"continue_final_message"`
}

// chatPrompt is a chat request's prompt as the chat endpoint renders and
// tokenizes it (the render and tokenize endpoints too, so all three agree
// on the tokens): its tool choice checked as vLLM checks it (rejectAuto: a
// fault refuses auto tool choice), its messages rendered with the stand-in
// ChatML template. A bad request is answered (400) and ok is false.
func (r *Replica) chatPrompt(w http.ResponseWriter, body *openai.ChatRequest, opts chatOptions, rejectAuto bool) (p chatTokens, ok bool) {
	if len(body.Messages) == 0 {
		writeError(w, http.StatusBadRequest, "Field required: messages")
		return p, false
	}
	var err error
	p.choice, p.named, err = openai.ParseToolChoice(body.ToolChoice, len(body.Tools) > 0)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return p, false
	}
	if p.choice == openai.ToolChoiceAuto && len(body.Tools) > 0 && (!*r.cfg.EnableAutoToolChoice || rejectAuto) {
		// vLLM's exact refusal when auto tool choice is not enabled.
		writeError(w, http.StatusBadRequest, "\"auto\" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set")
		return p, false
	}
	if (p.choice == openai.ToolChoiceRequired || p.choice == openai.ToolChoiceNamed) && len(body.Tools) == 0 {
		writeError(w, http.StatusBadRequest, "When using `tool_choice`, `tools` must be set.")
		return p, false
	}
	text, err := renderChat(body.Messages, body.Tools, body.AddGenerationPrompt, opts.ContinueFinalMessage)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return p, false
	}
	p.ids = r.tok.Encode(nil, text)
	return p, true
}

// chatTokens is a rendered and tokenized chat prompt and its tool choice.
type chatTokens struct {
	ids    []uint32
	choice openai.ToolChoiceKind
	named  string
}

// renderChat renders messages with the stand-in ChatML template. The
// generation prompt is added unless addGeneration is false; with
// continueFinal the text ends with the final message's content, left open
// for the model to continue, as Hugging Face templates cut it.
func renderChat(msgs []openai.Message, tools []openai.Tool, addGeneration *bool, continueFinal bool) (string, error) {
	addGen := addGeneration == nil || *addGeneration
	if continueFinal && addGen {
		if addGeneration != nil {
			return "", errors.New("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
		}
		return "", errors.New("continue_final_message and add_generation_prompt are not compatible. Use continue_final_message " +
			"when you want the model to continue the final message, and add_generation_prompt when you want to add a header " +
			"that will prompt it to start a new assistant message instead.")
	}
	text, err := tokenizer.RenderStandInChat(msgs, tools, addGen)
	if err != nil || !continueFinal {
		return text, err
	}
	final, err := msgs[len(msgs)-1].ContentText()
	if err != nil {
		return "", err
	}
	// The template may trim the content; the cut looks for it as written,
	// then trimmed.
	for _, c := range []string{final, strings.TrimSpace(final)} {
		if i := strings.LastIndex(text, c); i >= 0 && c != "" {
			return text[:i+len(c)], nil
		}
	}
	return "", errors.New("continue_final_message is set but the final message does not appear in the chat after applying the chat template")
}

// pickTool returns the function the model calls, or nil for a text answer.
// With auto it calls a tool unless the conversation just returned a tool
// result, as a well-behaved model does.
func pickTool(body *openai.ChatRequest, choice openai.ToolChoiceKind, named string, seed uint64) (*openai.ToolFunction, error) {
	switch choice {
	case openai.ToolChoiceNone:
		return nil, nil
	case openai.ToolChoiceNamed:
		for i := range body.Tools {
			if body.Tools[i].Function.Name == named {
				return &body.Tools[i].Function, nil
			}
		}
		return nil, fmt.Errorf("Tool '%s' has not been passed in `tools`.", named)
	case openai.ToolChoiceAuto:
		if len(body.Tools) == 0 || body.Messages[len(body.Messages)-1].Role == "tool" {
			return nil, nil
		}
	}
	return &body.Tools[seed%uint64(len(body.Tools))].Function, nil
}

// naturalLength is how many tokens the simulated model would say before its
// end-of-sequence token: a seeded length, at least min_tokens; with
// ignore_eos it would never stop (admit then cuts it at the limit).
func naturalLength(seed uint64, minTokens int, ignoreEOS bool) int {
	if ignoreEOS {
		return math.MaxInt32
	}
	return max(16+int(seed%defaultOutputRange), minTokens)
}

func (r *Replica) handleCompletion(w http.ResponseWriter, req *http.Request) {
	var body openai.CompletionRequest
	if !r.readBody(w, req, &body) {
		return
	}
	if !r.checkModel(w, body.Model) {
		return
	}
	prompt, err := r.completionPrompt(body.Prompt)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	faults, ok := r.injectFaults(w, req)
	if !ok {
		return
	}
	g := &generation{id: r.newID("cmpl-"), prompt: prompt, stream: body.Stream, salt: body.CacheSalt, priority: deref(body.Priority), finish: "stop"}
	if body.StreamOptions != nil {
		g.usage, g.contUse = body.StreamOptions.IncludeUsage, body.StreamOptions.ContinuousUsageStats
	}
	maxTokens := body.MaxTokens
	if maxTokens == nil {
		sixteen := 16 // the completions API's default max_tokens
		maxTokens = &sixteen
	}
	if !r.admitLength(w, len(g.prompt), maxTokens) {
		return
	}
	seed := seedFor(r.cfg.Seed, body.Seed, prompt)
	g.out = r.vocab.textOutput(r.tok, seed, r.outputLimit(g, naturalLength(seed, body.MinTokens, body.IgnoreEOS), maxTokens))
	r.generate(w, req, g, faults)
}

// completionPrompt accepts a string, a list of token ids, or a one-element
// list of either, as vLLM does for a single prompt.
func (r *Replica) completionPrompt(raw json.RawMessage) ([]uint32, error) {
	prompts, err := r.completionPrompts(raw)
	if err != nil {
		return nil, err
	}
	if len(prompts) != 1 {
		return nil, fmt.Errorf("prompt must be a string, a list of token ids, or a one-element list of either")
	}
	return prompts[0], nil
}

// completionPrompts accepts a string, a list of token ids, or a list of
// either, as vLLM's completions API does, and tokenizes each prompt.
func (r *Replica) completionPrompts(raw json.RawMessage) ([][]uint32, error) {
	one := func(raw json.RawMessage) ([]uint32, bool, error) {
		var s string
		if err := json.Unmarshal(raw, &s); err == nil {
			if s == "" {
				return nil, true, fmt.Errorf("prompt cannot be empty")
			}
			return r.tok.Encode(nil, s), true, nil
		}
		var ids []uint32
		if err := json.Unmarshal(raw, &ids); err == nil {
			if len(ids) == 0 {
				return nil, true, fmt.Errorf("prompt cannot be empty")
			}
			return ids, true, nil
		}
		return nil, false, nil
	}
	if ids, ok, err := one(raw); ok {
		return [][]uint32{ids}, err
	}
	var list []json.RawMessage
	if err := json.Unmarshal(raw, &list); err == nil && len(list) > 0 {
		out := make([][]uint32, 0, len(list))
		for _, item := range list {
			ids, ok, err := one(item)
			if !ok {
				break
			}
			if err != nil {
				return nil, err
			}
			out = append(out, ids)
		}
		if len(out) == len(list) {
			return out, nil
		}
	}
	if len(raw) == 0 {
		return nil, fmt.Errorf("Field required: prompt")
	}
	return nil, fmt.Errorf("prompt must be a string, a list of token ids, or a list of either")
}

// admitLength applies vLLM's context-length checks to a prompt of n tokens.
func (r *Replica) admitLength(w http.ResponseWriter, n int, maxTokens *int) bool {
	switch {
	case n >= r.cfg.MaxModelLen:
		writeError(w, http.StatusBadRequest, fmt.Sprintf(
			"This model's maximum context length is %d tokens. However, your request has %d input tokens. "+
				"Please reduce the length of the input messages.", r.cfg.MaxModelLen, n))
		return false
	case maxTokens != nil && *maxTokens < 1:
		writeError(w, http.StatusBadRequest, "max_tokens must be at least 1")
		return false
	case maxTokens != nil && n+*maxTokens > r.cfg.MaxModelLen:
		writeError(w, http.StatusBadRequest, fmt.Sprintf(
			"'max_tokens' or 'max_completion_tokens' is too large: %d. This model's maximum context length is %d tokens and your request has %d input tokens (%d > %d - %d).",
			*maxTokens, r.cfg.MaxModelLen, n, *maxTokens, r.cfg.MaxModelLen, n))
		return false
	}
	return true
}

// outputLimit returns how many of natural tokens the model may generate
// (max_tokens, else the rest of the context) and sets finish_reason
// "length" when that cuts the output.
func (r *Replica) outputLimit(g *generation, natural int, maxTokens *int) int {
	limit := max(r.cfg.MaxModelLen-len(g.prompt), 0)
	if maxTokens != nil {
		limit = min(limit, *maxTokens)
	}
	if natural > limit {
		g.finish = "length"
		return limit
	}
	return natural
}

// generate runs g through the engine and writes the response.
func (r *Replica) generate(w http.ResponseWriter, req *http.Request, g *generation, faults Faults) {
	reason := "stop" // vllm:request_success knows stop, length and abort
	if g.finish == "length" {
		reason = "length"
	}
	updates, err := r.eng.Submit(req.Context(), &engine.Request{
		ID: g.id, Prompt: g.prompt, Output: g.out.ids, LoraName: g.lora, CacheSalt: g.salt, FinishReason: reason, Priority: g.priority,
	})
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if g.stream && g.responses {
		r.streamResponses(w, req, g, updates, faults)
		return
	}
	if g.stream {
		r.stream(w, req, g, updates, faults)
		return
	}
	var last engine.Update
	for u := range updates {
		last = u
	}
	if last.Err != nil {
		if req.Context().Err() == nil {
			writeError(w, http.StatusInternalServerError, last.Err.Error())
		}
		return
	}
	if g.responses {
		writeJSON(w, http.StatusOK, r.responseObject(g, time.Now().Unix(), "completed", &last))
		return
	}
	writeJSON(w, http.StatusOK, r.fullResponse(g, last))
}

func (r *Replica) newID(prefix string) string {
	// Unique per process and rank; not random, so runs are reproducible.
	n := r.reqSeq.Add(1)
	return prefix + strconv.FormatUint(uint64(r.created), 16) + strconv.Itoa(r.rank) + fmt.Sprintf("%016x", n)
}

func usageOf(u engine.Update) *openai.Usage {
	return &openai.Usage{
		PromptTokens: u.PromptTokens, CompletionTokens: u.Generated, TotalTokens: u.PromptTokens + u.Generated,
		PromptTokensDetails: &openai.PromptTokensDetails{CachedTokens: u.CachedTokens},
	}
}

func (r *Replica) fullResponse(g *generation, u engine.Update) map[string]any {
	text, _ := g.out.textUpTo(0, u.Generated)
	resp := map[string]any{"id": g.id, "created": time.Now().Unix(), "model": r.cfg.Model, "usage": usageOf(u)}
	if !g.chat {
		resp["object"] = "text_completion"
		resp["choices"] = []map[string]any{{"index": 0, "text": text, "logprobs": nil,
			"finish_reason": g.finish, "stop_reason": nil, "prompt_logprobs": nil}}
		return resp
	}
	msg := map[string]any{"role": "assistant", "content": text, "refusal": nil, "annotations": nil,
		"audio": nil, "function_call": nil, "tool_calls": []any{}, "reasoning_content": nil}
	if tc := g.out.toolCall; tc != nil && u.Generated == g.out.tokens() {
		msg["content"] = nil
		msg["tool_calls"] = []openai.ToolCall{*tc}
	}
	resp["object"] = "chat.completion"
	resp["choices"] = []map[string]any{{"index": 0, "message": msg, "logprobs": nil,
		"finish_reason": g.finish, "stop_reason": nil}}
	resp["service_tier"] = nil
	resp["system_fingerprint"] = nil
	resp["prompt_logprobs"] = nil
	resp["kv_transfer_params"] = nil
	return resp
}

// stream writes the response as server-sent events, one chunk per engine
// step, in vLLM's chunk shapes.
func (r *Replica) stream(w http.ResponseWriter, req *http.Request, g *generation, updates <-chan engine.Update, faults Faults) {
	bw, flush := startSSE(w)
	s := &sseWriter{r: r, g: g, w: bw, created: time.Now().Unix()}
	if g.chat {
		empty := ""
		s.choice(openai.ChunkChoice{Delta: &openai.Delta{Role: "assistant", Content: &empty}}, nil, nil)
	}
	var last engine.Update
	sent := 0
	for u := range updates {
		last = u
		if u.Err != nil {
			break
		}
		if u.Generated > s.generated || u.Done {
			s.emit(u)
			sent++
		}
		if !flush() || !r.stallIfDue(req, faults, sent) {
			return
		}
	}
	if last.Err != nil {
		if req.Context().Err() == nil {
			// vLLM reports a failure after the stream started as an error event.
			s.data(map[string]any{"error": openai.ErrorBody{Message: last.Err.Error(), Type: "InternalServerError", Code: 500}})
			flush()
		}
		return
	}
	if g.usage {
		s.usageChunk(last)
	}
	_, _ = bw.WriteString("data: [DONE]\n\n")
	flush()
}

// startSSE starts a server-sent events response; flush sends what was
// written and reports whether the client is still there.
func startSSE(w http.ResponseWriter) (*bufio.Writer, func() bool) {
	w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	flusher, _ := w.(http.Flusher)
	bw := bufio.NewWriter(w)
	return bw, func() bool {
		if err := bw.Flush(); err != nil {
			return false
		}
		if flusher != nil {
			flusher.Flush()
		}
		return true
	}
}

// stallIfDue applies the stall_after_tokens fault once sent chunks went
// out; false when the client went away meanwhile.
func (r *Replica) stallIfDue(req *http.Request, faults Faults, sent int) bool {
	if faults.StallAfterTokens > 0 && sent == faults.StallAfterTokens {
		r.stall(req, faults.StallFor)
	}
	return req.Context().Err() == nil
}

func (r *Replica) stall(req *http.Request, d time.Duration) {
	r.log.Debug("stalling stream", zap.Duration("for", d))
	if d <= 0 {
		<-req.Context().Done()
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-req.Context().Done():
	}
}

// sseWriter shapes a generation into vLLM's streamed chunks.
type sseWriter struct {
	r         *Replica
	g         *generation
	w         *bufio.Writer
	created   int64
	generated int  // tokens already emitted
	piece     int  // next piece of the output to emit
	headSent  bool // tool call: the delta with id, type and name went out
	argsSent  int  // tool call: bytes of arguments already emitted
}

// emit sends the text of the tokens generated since the last call.
func (s *sseWriter) emit(u engine.Update) {
	text, next := s.g.out.textUpTo(s.piece, u.Generated)
	s.piece, s.generated = next, u.Generated
	var finish *string
	if u.Done {
		finish = &s.g.finish
	}
	var usage *openai.Usage
	if s.g.contUse {
		usage = usageOf(u)
	}
	switch {
	case !s.g.chat:
		s.choice(openai.ChunkChoice{Text: &text}, finish, usage)
	case s.g.out.toolCall != nil:
		s.emitToolCall(finish, usage)
	default:
		s.choice(openai.ChunkChoice{Delta: &openai.Delta{Content: &text}}, finish, usage)
	}
}

// emitToolCall streams a tool call as vLLM's parsers do: nothing until the
// function name is complete, then one delta with id, type, index and name,
// then argument fragments as they are generated.
func (s *sseWriter) emitToolCall(finish *string, usage *openai.Usage) {
	tc := s.g.out.toolCall
	generatedText, _ := s.g.out.textUpTo(0, s.generated)
	prefix := fmt.Sprintf(toolCallPrefixFmt, tc.Function.Name)
	var deltas []openai.DeltaToolCall
	if !s.headSent && len(generatedText) >= len(prefix) {
		s.headSent = true
		deltas = append(deltas, openai.DeltaToolCall{ID: tc.ID, Type: "function",
			Function: openai.DeltaFunction{Name: tc.Function.Name}})
	}
	if s.headSent {
		argsEnd := min(len(generatedText)-len(prefix), len(tc.Function.Arguments))
		if argsEnd > s.argsSent {
			frag := tc.Function.Arguments[s.argsSent:argsEnd]
			deltas = append(deltas, openai.DeltaToolCall{Function: openai.DeltaFunction{Arguments: &frag}})
			s.argsSent = argsEnd
		}
	}
	if len(deltas) == 0 && finish == nil {
		return // the parser is still buffering: vLLM sends no chunk
	}
	d := &openai.Delta{ToolCalls: deltas}
	if len(deltas) == 0 {
		empty := ""
		d.Content = &empty
	}
	s.choice(openai.ChunkChoice{Delta: d}, finish, usage)
}

func (s *sseWriter) choice(c openai.ChunkChoice, finish *string, usage *openai.Usage) {
	c.Logprobs = openai.Null
	c.FinishReason = finish
	if finish != nil {
		c.StopReason = openai.Null
	}
	s.data(s.chunk([]openai.ChunkChoice{c}, usage))
}

func (s *sseWriter) usageChunk(u engine.Update) {
	s.data(s.chunk([]openai.ChunkChoice{}, usageOf(u)))
}

func (s *sseWriter) chunk(choices []openai.ChunkChoice, usage *openai.Usage) *openai.Chunk {
	object := "text_completion"
	if s.g.chat {
		object = "chat.completion.chunk"
	}
	return &openai.Chunk{ID: s.g.id, Object: object, Created: s.created, Model: s.r.cfg.Model, Choices: choices, Usage: usage}
}

func (s *sseWriter) data(v any) {
	b, err := json.Marshal(v)
	if err != nil {
		s.r.log.Error("cannot encode chunk", zap.Error(err))
		return
	}
	_, _ = s.w.WriteString("data: ")
	_, _ = s.w.Write(b)
	_, _ = s.w.WriteString("\n\n")
}

// deref is *p, or 0 for nil.
func deref(p *int) int {
	if p == nil {
		return 0
	}
	return *p
}
