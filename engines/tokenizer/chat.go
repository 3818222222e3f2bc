package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"

	"github.com/ardanlabs/jinja"

	"github.com/omnious/provider-node/engines/openai"
	"github.com/omnious/provider-node/internal/jsonstr"
)

// ChatTemplate renders a model's Jinja chat template the way vLLM's OpenAI
// server does before tokenizing: messages in the "string" content format,
// tool-call arguments decoded into objects, tools as vLLM dumps them, and a
// tojson that is Python's json.dumps. Safe for concurrent use.
type ChatTemplate struct {
	tmpl     *jinja.Template
	specials map[string]string
}

// ChatInput is what a chat request contributes to the template.
type ChatInput struct {
	Messages            []openai.Message
	Tools               []openai.Tool
	AddGenerationPrompt bool
	// Kwargs is chat_template_kwargs, a JSON object (e.g.
	// {"enable_thinking": false}); empty means none.
	Kwargs json.RawMessage
}

// ChatInputFromRequest takes the template inputs of a chat request;
// add_generation_prompt defaults to true as in vLLM.
func ChatInputFromRequest(req *openai.ChatRequest) ChatInput {
	agp := true
	if req.AddGenerationPrompt != nil {
		agp = *req.AddGenerationPrompt
	}
	return ChatInput{Messages: req.Messages, Tools: req.Tools, AddGenerationPrompt: agp}
}

// Filters whose builtin differs from Python are routed to Python-exact
// ones (the engine's builtins cannot be replaced): tojson formats floats
// and some escapes unlike json.dumps, trim strips a different space set.
var (
	tojsonFilter = regexp.MustCompile(`\|\s*tojson\b`)
	trimFilter   = regexp.MustCompile(`\|\s*trim\b`)
)

const (
	pyTojsonName = "__py_tojson"
	pyTrimName   = "__py_trim"
)

// NewChatTemplate compiles a chat template. specials are the special token
// variables the Hugging Face renderer passes (bos_token, eos_token, ...).
func NewChatTemplate(source string, specials map[string]string) (*ChatTemplate, error) {
	if source == "" {
		return nil, errors.New("model has no chat template")
	}
	source = tojsonFilter.ReplaceAllString(source, "| "+pyTojsonName)
	source = trimFilter.ReplaceAllString(source, "| "+pyTrimName)
	tmpl, err := jinja.Compile(source)
	if err != nil {
		return nil, fmt.Errorf("cannot compile chat template: %w", err)
	}
	return &ChatTemplate{tmpl: tmpl, specials: specials}, nil
}

// NewChatTemplate compiles the tokenizer's own chat template.
func (t *HF) NewChatTemplate() (*ChatTemplate, error) {
	sp := map[string]string{}
	if t.bosToken != "" {
		sp["bos_token"] = t.bosToken
	}
	if t.eosToken != "" {
		sp["eos_token"] = t.eosToken
	}
	return NewChatTemplate(t.chatTemplate, sp)
}

// Render renders in into the prompt text.
func (c *ChatTemplate) Render(in ChatInput) (string, error) {
	msgs := make([]jinja.Value, 0, len(in.Messages))
	for i := range in.Messages {
		m, err := messageValue(&in.Messages[i])
		if err != nil {
			return "", fmt.Errorf("message %d: %w", i, err)
		}
		msgs = append(msgs, m)
	}
	tools := jinja.None()
	if len(in.Tools) > 0 {
		list := make([]jinja.Value, 0, len(in.Tools))
		for i := range in.Tools {
			v, err := toolValue(&in.Tools[i])
			if err != nil {
				return "", fmt.Errorf("tool %d: %w", i, err)
			}
			list = append(list, v)
		}
		tools = jinja.NewList(list)
	}
	vars := make(map[string]jinja.Value, 8+len(c.specials))
	for k, v := range c.specials {
		vars[k] = jinja.NewString(v)
	}
	if kw := bytes.TrimSpace(in.Kwargs); len(kw) > 0 && !bytes.Equal(kw, []byte("null")) {
		v, err := decodeOrdered(kw)
		if err != nil {
			return "", fmt.Errorf("cannot decode chat_template_kwargs: %w", err)
		}
		if !v.IsDict() {
			return "", errors.New("chat_template_kwargs must be a JSON object")
		}
		d := v.AsDict()
		for _, k := range d.Keys {
			vars[k] = d.Data[k]
		}
	}
	vars["messages"] = jinja.NewList(msgs)
	vars["tools"] = tools
	vars["documents"] = jinja.None()
	vars["add_generation_prompt"] = jinja.NewBool(in.AddGenerationPrompt)
	vars[pyTojsonName] = jinja.NewCallable(pyTojsonName, pyTojson)
	vars[pyTrimName] = jinja.NewCallable(pyTrimName, pyTrim)
	out, err := c.tmpl.RenderValues(vars)
	if err != nil {
		return "", fmt.Errorf("cannot render chat template: %w", err)
	}
	return out, nil
}

// messageContent flattens content as vLLM's "string" content format does:
// null is "", text parts are joined with newlines.
func messageContent(raw json.RawMessage) (string, error) {
	c := bytes.TrimSpace(raw)
	if len(c) == 0 || bytes.Equal(c, []byte("null")) {
		return "", nil
	}
	if c[0] == '"' {
		s, err := jsonstr.Decode(c)
		if err != nil {
			return "", fmt.Errorf("cannot decode content: %w", err)
		}
		return s, nil
	}
	var parts []struct {
		Type     string  `json:"type"`
		Text     *string `json:"text"`
		Refusal  *string `json:"refusal"`
		Thinking *string `json:"thinking"`
	}
	if err := json.Unmarshal(c, &parts); err != nil {
		return "", fmt.Errorf("content must be a string or a list of parts: %w", err)
	}
	var b []byte
	n := 0
	for _, p := range parts {
		var s *string
		switch p.Type {
		case "text", "input_text", "output_text":
			s = p.Text
		case "refusal":
			s = p.Refusal
		case "thinking":
			s = p.Thinking
		default:
			return "", fmt.Errorf("content part %q cannot be rendered as text", p.Type)
		}
		if s == nil {
			continue
		}
		if n > 0 {
			b = append(b, '\n')
		}
		b = append(b, *s...)
		n++
	}
	return string(b), nil
}

func messageValue(m *openai.Message) (jinja.Value, error) {
	content, err := messageContent(m.Content)
	if err != nil {
		return jinja.Value{}, err
	}
	v := jinja.NewDict()
	d := v.AsDict()
	d.Set("role", jinja.NewString(m.Role))
	d.Set("content", jinja.NewString(content))
	if m.Role == "assistant" && len(m.ToolCalls) > 0 {
		calls := make([]jinja.Value, 0, len(m.ToolCalls))
		for _, tc := range m.ToolCalls {
			cv := jinja.NewDict()
			cd := cv.AsDict()
			if tc.ID != "" {
				cd.Set("id", jinja.NewString(tc.ID))
			}
			if tc.Type != "" {
				cd.Set("type", jinja.NewString(tc.Type))
			}
			fv := jinja.NewDict()
			fd := fv.AsDict()
			fd.Set("name", jinja.NewString(tc.Function.Name))
			// vLLM decodes the arguments; anything that is not JSON is {}.
			args, err := decodeOrdered([]byte(tc.Function.Arguments))
			if err != nil {
				args = jinja.NewDict()
			}
			fd.Set("arguments", args)
			cd.Set("function", fv)
			calls = append(calls, cv)
		}
		d.Set("tool_calls", jinja.NewList(calls))
	}
	if m.Role == "tool" && m.ToolCallID != "" {
		d.Set("tool_call_id", jinja.NewString(m.ToolCallID))
	}
	if m.Name != "" {
		d.Set("name", jinja.NewString(m.Name))
	}
	return v, nil
}

// toolValue is a tool as vLLM's pydantic model_dump gives it: declared
// fields in order, absent optional ones as None, then extra fields.
func toolValue(t *openai.Tool) (jinja.Value, error) {
	fv := jinja.NewDict()
	fd := fv.AsDict()
	fd.Set("name", jinja.NewString(t.Function.Name))
	if t.Function.Description != "" {
		fd.Set("description", jinja.NewString(t.Function.Description))
	} else {
		fd.Set("description", jinja.None())
	}
	params := jinja.None()
	if p := bytes.TrimSpace(t.Function.Parameters); len(p) > 0 {
		var err error
		if params, err = decodeOrdered(p); err != nil {
			return jinja.Value{}, fmt.Errorf("cannot decode parameters: %w", err)
		}
	}
	fd.Set("parameters", params)
	if t.Function.Strict != nil {
		fd.Set("strict", jinja.NewBool(*t.Function.Strict))
	}
	v := jinja.NewDict()
	d := v.AsDict()
	typ := t.Type
	if typ == "" {
		typ = "function"
	}
	d.Set("type", jinja.NewString(typ))
	d.Set("function", fv)
	return v, nil
}
