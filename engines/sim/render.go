package sim

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"unicode/utf8"

	"github.com/omnious/provider-node/engines/openai"
	"github.com/omnious/provider-node/engines/tokenizer"
)

// The tokenizer endpoints: POST /tokenize and /detokenize, and the render
// endpoints POST /v1/chat/completions/render and /v1/completions/render,
// which answer with the request as the engine would run it, tokens in
// (vLLM's GenerateRequest). A router that tokenizes through the engine
// (llm-d-router's token-producer) asks the latter. Every one tokenizes as
// the generation endpoints do (chatPrompt, completionPrompts), so the
// tokens are the ones the replica caches.

// tokenizeFields are the fields of a /tokenize body beyond a chat's.
type tokenizeFields struct {
	Prompt          *string `json:"prompt"`
	ReturnTokenStrs bool    `json:"return_token_strs"`
}

func (r *Replica) handleTokenize(w http.ResponseWriter, req *http.Request) {
	var body openai.ChatRequest
	var opts chatOptions
	var tf tokenizeFields
	if !r.readBody(w, req, &body, &opts, &tf) {
		return
	}
	if body.Model != "" && !r.checkModel(w, body.Model) {
		return
	}
	if tf.ReturnTokenStrs {
		// Its ids are hashes of pieces: no id has one string.
		writeError(w, http.StatusBadRequest, "return_token_strs: the simulator's stand-in tokenizer has no token strings")
		return
	}
	var ids []uint32
	switch {
	case tf.Prompt != nil:
		ids = r.tok.Encode(nil, *tf.Prompt)
	case body.Messages != nil:
		p, ok := r.chatPrompt(w, &body, opts, false)
		if !ok {
			return
		}
		ids = p.ids
	default:
		writeError(w, http.StatusBadRequest, "Either prompt or messages is required.")
		return
	}
	writeJSON(w, http.StatusOK, openai.TokenizeResponse{Count: len(ids), MaxModelLen: r.cfg.MaxModelLen, Tokens: ids})
}

// handleDetokenize decodes the ids the simulated model writes in a text
// answer (its vocabulary's words, with or without a leading space) and the
// special tokens. Other ids of the stand-in vocabulary are hashes of prompt
// pieces with no one text, and are refused.
func (r *Replica) handleDetokenize(w http.ResponseWriter, req *http.Request) {
	var body struct {
		openai.DetokenizeRequest
		Tokens *[]int64 `json:"tokens"`
	}
	if !r.readBody(w, req, &body) {
		return
	}
	if body.Model != "" && !r.checkModel(w, body.Model) {
		return
	}
	if body.Tokens == nil {
		writeError(w, http.StatusBadRequest, "Field required: tokens")
		return
	}
	var text []byte
	for i, id := range *body.Tokens {
		if id < 0 {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("tokens.%d: Input should be greater than or equal to 0", i))
			return
		}
		s, ok := r.decode[uint32(min(id, math.MaxUint32))]
		if !ok {
			writeError(w, http.StatusBadRequest, fmt.Sprintf("token id %d: the simulator's stand-in tokenizer decodes only the ids its "+
				"model writes and the special tokens", id))
			return
		}
		text = append(text, s...)
	}
	writeJSON(w, http.StatusOK, openai.DetokenizeResponse{Prompt: string(text)})
}

// decodeTable maps each id the simulated model writes in a text answer,
// and each special token, to its text.
func decodeTable(tok tokenizer.Tokenizer, v *vocabulary) map[uint32]string {
	texts := []string{"<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>"}
	for _, w := range v.words {
		texts = append(texts, w, " "+w)
	}
	m := make(map[uint32]string, len(texts))
	var buf []uint32
	for _, s := range texts {
		if ids := tok.Encode(buf[:0], s); len(ids) == 1 {
			if _, dup := m[ids[0]]; !dup {
				m[ids[0]] = s
			}
		}
	}
	return m
}

// renderFields are the request fields a GenerateRequest carries that the
// chat and completion requests leave in the raw body.
type renderFields struct {
	N                      *int            `json:"n"`
	PresencePenalty        *float64        `json:"presence_penalty"`
	FrequencyPenalty       *float64        `json:"frequency_penalty"`
	RepetitionPenalty      *float64        `json:"repetition_penalty"`
	Temperature            *float64        `json:"temperature"`
	TopP                   *float64        `json:"top_p"`
	TopK                   *int            `json:"top_k"`
	MinP                   *float64        `json:"min_p"`
	Seed                   *int64          `json:"seed"`
	Stop                   json.RawMessage `json:"stop"`
	StopTokenIDs           []uint32        `json:"stop_token_ids"`
	IgnoreEOS              bool            `json:"ignore_eos"`
	MinTokens              int             `json:"min_tokens"`
	SkipSpecialTokens      *bool           `json:"skip_special_tokens"`
	IncludeStopStrInOutput bool            `json:"include_stop_str_in_output"`
	BadWords               []string        `json:"bad_words"`
	Priority               int             `json:"priority"`
	UseBeamSearch          bool            `json:"use_beam_search"`
	Suffix                 *string         `json:"suffix"`
	StreamOptions          *struct {
		IncludeUsage         *bool `json:"include_usage"`
		ContinuousUsageStats bool  `json:"continuous_usage_stats"`
	} `json:"stream_options"`
}

func (r *Replica) handleChatRender(w http.ResponseWriter, req *http.Request) {
	var body openai.ChatRequest
	var opts chatOptions
	var rf renderFields
	if !r.readBody(w, req, &body, &opts, &rf) {
		return
	}
	if body.Model != "" && !r.checkModel(w, body.Model) {
		return
	}
	if rf.UseBeamSearch {
		writeError(w, http.StatusBadRequest, "Beam search is not supported by the render endpoint")
		return
	}
	p, ok := r.chatPrompt(w, &body, opts, false)
	if !ok {
		return
	}
	maxTokens := body.MaxTokens
	if body.MaxCompletionTokens != nil {
		maxTokens = body.MaxCompletionTokens
	}
	g, ok := r.generateRequest(w, "chatcmpl-", p.ids, maxTokens, body.Model, body.Stream, body.CacheSalt, rf)
	if !ok {
		return
	}
	writeJSON(w, http.StatusOK, g)
}

func (r *Replica) handleCompletionRender(w http.ResponseWriter, req *http.Request) {
	var body openai.CompletionRequest
	var rf renderFields
	if !r.readBody(w, req, &body, &rf) {
		return
	}
	if body.Model != "" && !r.checkModel(w, body.Model) {
		return
	}
	if rf.Suffix != nil {
		writeError(w, http.StatusBadRequest, "suffix is not currently supported")
		return
	}
	prompts, err := r.completionPrompts(body.Prompt)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	maxTokens := body.MaxTokens
	if maxTokens == nil {
		maxTokens = new(completionsMaxTokens)
	}
	out := make([]openai.GenerateRequest, 0, len(prompts))
	for _, ids := range prompts {
		g, ok := r.generateRequest(w, "cmpl-", ids, maxTokens, body.Model, body.Stream, body.CacheSalt, rf)
		if !ok {
			return
		}
		out = append(out, g)
	}
	writeJSON(w, http.StatusOK, out)
}

// generateRequest is the render answer for one prompt: its length checked
// as generation checks it, max_tokens resolved as vLLM resolves it (the
// request's, capped by the room the context leaves; all that room when the
// request sets none), the sampling parameters validated and encoded.
func (r *Replica) generateRequest(w http.ResponseWriter, idPrefix string, ids []uint32, maxTokens *int, model string,
	stream bool, salt string, rf renderFields) (openai.GenerateRequest, bool) {
	if !r.admitLength(w, len(ids), maxTokens) {
		return openai.GenerateRequest{}, false
	}
	resolved := r.cfg.MaxModelLen - len(ids)
	if maxTokens != nil {
		resolved = min(resolved, *maxTokens)
	}
	sp, err := rf.samplingParams(resolved, stream)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return openai.GenerateRequest{}, false
	}
	g := openai.GenerateRequest{RequestID: r.newID(idPrefix), TokenIDs: ids, SamplingParams: sp, Stream: stream, Priority: rf.Priority}
	if model != "" {
		g.Model = &model
	}
	if salt != "" {
		g.CacheSalt = &salt
	}
	if stream && rf.StreamOptions != nil {
		so := rf.StreamOptions
		g.StreamOptions = &openai.RenderStreamOptions{IncludeUsage: so.IncludeUsage == nil || *so.IncludeUsage,
			ContinuousUsageStats: so.ContinuousUsageStats}
	}
	return g, true
}

// Defaults and limits of vLLM's SamplingParams.
const (
	completionsMaxTokens = 16   // the completions API's default max_tokens
	samplingMaxTokens    = 16   // SamplingParams' own default
	minTemperature       = 1e-2 // a smaller positive temperature is raised to it
	greedyTemperature    = 1e-5 // below it, sampling is greedy
)

// samplingParams are the request's sampling parameters as vLLM builds,
// normalises, validates and encodes them (defaults omitted); maxTokens is
// the resolved max_tokens.
func (rf renderFields) samplingParams(maxTokens int, stream bool) (openai.SamplingParams, error) {
	p := openai.SamplingParams{Stop: []string{}, StopTokenIDs: []uint32{}, BadWords: []string{}, SkipClone: true,
		IgnoreEOS: rf.IgnoreEOS, MinTokens: rf.MinTokens, IncludeStopStrInOutput: rf.IncludeStopStrInOutput, OutputKind: 2}
	if stream {
		p.OutputKind = 1
	}
	stop, err := stopStrings(rf.Stop)
	if err != nil {
		return p, err
	}
	n, pres, freq, rep := orDefault(rf.N, 1), orDefault(rf.PresencePenalty, 0), orDefault(rf.FrequencyPenalty, 0), orDefault(rf.RepetitionPenalty, 1)
	temp, topP, topK, minP := orDefault(rf.Temperature, 1), orDefault(rf.TopP, 1), orDefault(rf.TopK, 0), orDefault(rf.MinP, 0)
	if temp > 0 && temp < minTemperature {
		temp = minTemperature
	}
	switch {
	case n < 1:
		return p, fmt.Errorf("n must be at least 1, got %d.", n)
	case pres < -2 || pres > 2:
		return p, fmt.Errorf("presence_penalty must be in [-2, 2], got %s.", pyFloat(pres))
	case freq < -2 || freq > 2:
		return p, fmt.Errorf("frequency_penalty must be in [-2, 2], got %s.", pyFloat(freq))
	case !(rep > 0) || math.IsInf(rep, 0):
		return p, fmt.Errorf("repetition_penalty must be greater than zero, got %s.", pyFloat(rep))
	case temp < 0:
		return p, fmt.Errorf("temperature must be non-negative, got %s.", pyFloat(temp))
	case temp > 2:
		return p, fmt.Errorf("temperature must be in [0, 2], got %s.", pyFloat(temp))
	case !(topP > 0 && topP <= 1):
		return p, fmt.Errorf("top_p must be in (0, 1], got %s.", pyFloat(topP))
	case topK < -1:
		return p, fmt.Errorf("top_k must be 0 (disable), or at least 1, got %d.", topK)
	case !(minP >= 0 && minP <= 1):
		return p, fmt.Errorf("min_p must be in [0, 1], got %s.", pyFloat(minP))
	case rf.MinTokens < 0:
		return p, fmt.Errorf("min_tokens must be greater than or equal to 0, got %d.", rf.MinTokens)
	case rf.MinTokens > maxTokens:
		return p, fmt.Errorf("min_tokens must be less than or equal to max_tokens=%d, got %d.", maxTokens, rf.MinTokens)
	case slices.Contains(stop, ""):
		return p, fmt.Errorf("stop cannot contain an empty string.")
	}
	if temp < greedyTemperature {
		topP, topK, minP = 1, 0, 0
		if n > 1 {
			return p, fmt.Errorf("n must be 1 when using greedy sampling, got %d.", n)
		}
	}
	p.N, p.PresencePenalty, p.FrequencyPenalty, p.RepetitionPenalty = unlessDefault(n, 1), unlessDefault(pres, 0), unlessDefault(freq, 0), unlessDefault(rep, 1)
	p.Temperature, p.TopP, p.TopK, p.MinP = unlessDefault(temp, 1), unlessDefault(topP, 1), unlessDefault(topK, 0), unlessDefault(minP, 0)
	if rf.Seed != nil && *rf.Seed != -1 { // -1 means none
		p.Seed = rf.Seed
	}
	p.MaxTokens = unlessDefault(maxTokens, samplingMaxTokens)
	if rf.SkipSpecialTokens != nil && !*rf.SkipSpecialTokens {
		p.SkipSpecialTokens = rf.SkipSpecialTokens
	}
	p.Stop = append(p.Stop, stop...)
	p.StopTokenIDs = appendUnique(p.StopTokenIDs, rf.StopTokenIDs)
	p.BadWords = appendUnique(p.BadWords, rf.BadWords)
	if len(stop) > 0 && !rf.IncludeStopStrInOutput {
		// Characters held back while a stop string may still complete.
		longest := 0
		for _, s := range stop {
			longest = max(longest, utf8.RuneCountInString(s))
		}
		p.OutputTextBufferLength = longest - 1
	}
	return p, nil
}

// stopStrings decodes stop: absent, null, a string or a list of strings.
func stopStrings(raw json.RawMessage) ([]string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var one string
	if err := json.Unmarshal(raw, &one); err == nil {
		return []string{one}, nil
	}
	var list []string
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, fmt.Errorf("stop must be a string or a list of strings")
	}
	return list, nil
}

func orDefault[T any](p *T, def T) T {
	if p != nil {
		return *p
	}
	return def
}

// unlessDefault is &v, or nil when v is the default (omitted, as vLLM
// encodes it).
func unlessDefault[T comparable](v, def T) *T {
	if v == def {
		return nil
	}
	return &v
}

// appendUnique appends the values of src not yet in dst, in order.
func appendUnique[T comparable](dst, src []T) []T {
	for _, v := range src {
		if !slices.Contains(dst, v) {
			dst = append(dst, v)
		}
	}
	return dst
}

// pyFloat formats v as Python prints a float (2.0, not 2).
func pyFloat(v float64) string {
	s := strconv.FormatFloat(v, 'g', -1, 64)
	if !math.IsInf(v, 0) && !math.IsNaN(v) && v == math.Trunc(v) && math.Abs(v) < 1e16 {
		s = strconv.FormatFloat(v, 'f', 1, 64)
	}
	return s
}
