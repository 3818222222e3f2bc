package sim

import (
	"encoding/json"
	"net/http"
	"time"

	"go.uber.org/zap"

	"github.com/omnious/provider-node/engines/openai"
	"github.com/omnious/provider-node/engines/sim/engine"
	"github.com/omnious/provider-node/engines/tokenizer"
)

// handleResponses serves POST /v1/responses as vLLM does for a model with
// a chat template: the request becomes chat messages
// (openai.ResponsesMessages), rendered and generated like a chat, answered
// as a response object or as the Responses API's typed events. The
// simulated model answers in text; it stores no responses, so
// previous_response_id is refused.
func (r *Replica) handleResponses(w http.ResponseWriter, req *http.Request) {
	var body openai.ResponsesRequest
	if !r.readBody(w, req, &body) {
		return
	}
	if !r.checkModel(w, body.Model) {
		return
	}
	if body.PreviousResponseID != nil && *body.PreviousResponseID != "" {
		writeError(w, http.StatusBadRequest, "previous_response_id is not supported: the simulator stores no responses")
		return
	}
	msgs, err := openai.ResponsesMessages(body.Instructions, body.Input)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	tools, err := openai.ChatTools(body.Tools)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	faults, ok := r.injectFaults(w, req)
	if !ok {
		return
	}
	text, err := tokenizer.RenderStandInChat(msgs, tools, true)
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	g := &generation{id: r.newID("resp_"), responses: true, prompt: r.tok.Encode(nil, text), stream: body.Stream,
		salt: body.CacheSalt, finish: "stop"}
	if !r.admitLength(w, len(g.prompt), body.MaxOutputTokens) {
		return
	}
	seed := seedFor(r.cfg.Seed, nil, g.prompt)
	g.out = r.vocab.textOutput(r.tok, seed, r.outputLimit(g, naturalLength(seed, 0, false), body.MaxOutputTokens))
	r.generate(w, req, g, faults)
}

// responseObject is the Responses API's response, at status.
func (r *Replica) responseObject(g *generation, created int64, status string, u *engine.Update) map[string]any {
	resp := map[string]any{"id": g.id, "object": "response", "created_at": created, "model": r.cfg.Model,
		"status": status, "output": []any{}, "usage": nil, "incomplete_details": nil, "error": nil}
	if u == nil {
		return resp
	}
	text, _ := g.out.textUpTo(0, u.Generated)
	resp["output"] = []any{r.responseMessage(g, finalStatus(g), text)}
	resp["usage"] = map[string]any{
		"input_tokens": u.PromptTokens, "input_tokens_details": map[string]int{"cached_tokens": u.CachedTokens},
		"output_tokens": u.Generated, "output_tokens_details": map[string]int{"reasoning_tokens": 0},
		"total_tokens": u.PromptTokens + u.Generated,
	}
	if g.finish == "length" {
		resp["status"] = "incomplete"
		resp["incomplete_details"] = map[string]string{"reason": "max_output_tokens"}
	}
	return resp
}

// finalStatus is the status of a finished response and its message:
// incomplete when max_output_tokens cut it.
func finalStatus(g *generation) string {
	if g.finish == "length" {
		return "incomplete"
	}
	return "completed"
}

func (r *Replica) responseMessage(g *generation, status, text string) map[string]any {
	content := []any{}
	if status != "in_progress" {
		content = append(content, outputText(text))
	}
	return map[string]any{"id": "msg_" + g.id[len("resp_"):], "type": "message", "role": "assistant",
		"status": status, "content": content}
}

func outputText(text string) map[string]any {
	return map[string]any{"type": "output_text", "text": text, "annotations": []any{}, "logprobs": nil}
}

// streamResponses writes the Responses API's typed events: created, in
// progress, the message item and its text part added, one text delta per
// engine step, then the text, part and item done, and completed (with
// usage). There is no [DONE].
func (r *Replica) streamResponses(w http.ResponseWriter, req *http.Request, g *generation, updates <-chan engine.Update, faults Faults) {
	bw, flush := startSSE(w)
	seq := 0
	event := func(typ string, fields map[string]any) {
		fields["type"], fields["sequence_number"] = typ, seq
		seq++
		b, err := json.Marshal(fields)
		if err != nil {
			r.log.Error("cannot encode event", zap.Error(err))
			return
		}
		_, _ = bw.WriteString("event: " + typ + "\ndata: ")
		_, _ = bw.Write(b)
		_, _ = bw.WriteString("\n\n")
	}
	created := time.Now().Unix()
	itemID := "msg_" + g.id[len("resp_"):]
	part := func(extra map[string]any) map[string]any {
		m := map[string]any{"item_id": itemID, "output_index": 0, "content_index": 0}
		for k, v := range extra {
			m[k] = v
		}
		return m
	}
	event("response.created", map[string]any{"response": r.responseObject(g, created, "in_progress", nil)})
	event("response.in_progress", map[string]any{"response": r.responseObject(g, created, "in_progress", nil)})
	event("response.output_item.added", map[string]any{"output_index": 0, "item": r.responseMessage(g, "in_progress", "")})
	event("response.content_part.added", part(map[string]any{"part": outputText("")}))
	if !flush() {
		return
	}
	var last engine.Update
	piece, sent := 0, 0
	for u := range updates {
		last = u
		if u.Err != nil {
			break
		}
		text, next := g.out.textUpTo(piece, u.Generated)
		piece = next
		if text != "" {
			event("response.output_text.delta", part(map[string]any{"delta": text, "logprobs": []any{}}))
			sent++
		}
		if !flush() || !r.stallIfDue(req, faults, sent) {
			return
		}
	}
	if last.Err != nil {
		if req.Context().Err() == nil {
			event("error", map[string]any{"code": "server_error", "message": last.Err.Error(), "param": nil})
			flush()
		}
		return
	}
	text, _ := g.out.textUpTo(0, last.Generated)
	event("response.output_text.done", part(map[string]any{"text": text, "logprobs": []any{}}))
	event("response.content_part.done", part(map[string]any{"part": outputText(text)}))
	event("response.output_item.done", map[string]any{"output_index": 0, "item": r.responseMessage(g, finalStatus(g), text)})
	event("response."+finalStatus(g), map[string]any{"response": r.responseObject(g, created, "completed", &last)})
	flush()
}
