package load

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/omnious/provider-node/engines/tokenizer"
	"github.com/omnious/provider-node/extproc"
)

// workload is the request bodies: per group, a template whose question
// starts with a 16-digit counter, so every request is unique past its
// group's system prompt (or document, at the head of the same message).
type workload struct {
	templates [][]byte
	counterAt []int
	system    [][]uint32 // per group: the shared prefix's tokens as the EPP renders them
	bytes     int
	tokens    int
	next      atomic.Uint64
}

const counterDigits = 16

// newWorkload builds o's requests; with PromptTokens it sizes them in the
// EPP's tokens, rescaling the bytes until the longest prompt is within 2%
// of the target.
func newWorkload(o Options) (*workload, error) {
	prompter, err := newPrompter(o)
	if err != nil {
		return nil, err
	}
	if o.PromptTokens == 0 {
		return buildWorkload(o, prompter)
	}
	o.PromptBytes = max(4*o.PromptTokens, 1024)
	if prompter == nil {
		// No tokens in the EPP: the size is 4 bytes a token, as English
		// has, and the report states the tokens it stands for.
		w, err := buildWorkload(o, prompter)
		if err == nil {
			w.tokens = o.PromptTokens
		}
		return w, err
	}
	for range 4 {
		w, err := buildWorkload(o, prompter)
		if err != nil || math.Abs(float64(w.tokens-o.PromptTokens)) <= 0.02*float64(o.PromptTokens) {
			return w, err
		}
		o.PromptBytes = max(1024, int(float64(o.PromptBytes)*float64(o.PromptTokens)/float64(w.tokens)))
	}
	return nil, fmt.Errorf("cannot size the prompts to %d tokens", o.PromptTokens)
}

// newPrompter is the EPP's prompt path for o's tokenizer (nil: none).
func newPrompter(o Options) (extproc.Prompter, error) {
	var prompter extproc.Prompter
	switch o.Tokenizer {
	case "standin":
		prompter = extproc.NewStandInPrompter()
	case "none":
	default:
		tok, err := tokenizer.Load(o.Model, o.Tokenizer)
		if err != nil {
			return nil, fmt.Errorf("cannot load the tokenizer: %w", err)
		}
		tmpl, err := tok.NewChatTemplate()
		if err != nil {
			return nil, fmt.Errorf("cannot load the chat template: %w", err)
		}
		prompter = extproc.NewTokenPrompter(map[string]extproc.ModelTokenizer{o.Model: {Tokenizer: tok, Template: tmpl}}, nil)
	}
	return prompter, nil
}

func buildWorkload(o Options, prompter extproc.Prompter) (*workload, error) {
	w := &workload{}
	for g := range o.Groups {
		// JSON and role overhead is small; fill the rest with text.
		textBytes := o.PromptBytes - 160
		sharedText := loadText(uint64(g)<<32, int(float64(textBytes)*o.SharedFraction))
		if o.Unique {
			sharedText = ""
		}
		userText := loadText(uint64(g)<<32|1, textBytes-len(sharedText)-counterDigits-1)
		shared, _ := json.Marshal(sharedText)
		question := strings.Repeat("0", counterDigits) + " " + userText
		// sharedOnly is the shared text's own message, to find its tokens.
		var messages, sharedOnly string
		switch {
		case o.Unique:
			user, _ := json.Marshal(question)
			messages = `[{"role":"user","content":` + string(user) + `}]`
		case o.SharedDocument:
			user, _ := json.Marshal(sharedText + "\n\n" + question)
			messages = `[{"role":"user","content":` + string(user) + `}]`
			sharedOnly = `[{"role":"user","content":` + string(shared) + `}]`
		default:
			user, _ := json.Marshal(question)
			messages = `[{"role":"system","content":` + string(shared) + `},{"role":"user","content":` + string(user) + `}]`
			sharedOnly = `[{"role":"system","content":` + string(shared) + `}]`
		}
		var b bytes.Buffer
		b.WriteString(`{"model":`)
		m, _ := json.Marshal(o.Model)
		b.Write(m)
		b.WriteString(`,"max_tokens":1,"messages":`)
		at := b.Len() + strings.Index(messages, strings.Repeat("0", counterDigits))
		b.WriteString(messages)
		b.WriteString(`}`)
		w.templates = append(w.templates, b.Bytes())
		w.counterAt = append(w.counterAt, at)

		w.bytes = max(w.bytes, b.Len())
		if prompter == nil {
			continue // no tokens: nothing to put in the index
		}
		full, ok := prompter.Prompt(o.Model, &extproc.PromptInput{API: extproc.APIChat, Messages: []byte(messages), AddGenerationPrompt: true})
		if !ok {
			return nil, errors.New("the tokenizer cannot render the load workload")
		}
		w.tokens = max(w.tokens, len(full))
		if o.Unique {
			continue // nothing shared: nothing to put in the index
		}
		sharedToks, ok2 := prompter.Prompt(o.Model, &extproc.PromptInput{API: extproc.APIChat, Messages: []byte(sharedOnly), AddGenerationPrompt: false})
		if !ok2 {
			return nil, errors.New("the tokenizer cannot render the load workload")
		}
		n := 0
		for n < len(sharedToks) && n < len(full) && sharedToks[n] == full[n] {
			n++
		}
		w.system = append(w.system, full[:n])
	}
	return w, nil
}

// loadText is n bytes of words of 1 to 5 letters after a space: the
// stand-in tokenizer reads each as one token, so the text has about one
// token per 4 bytes, as English has with real tokenizers.
func loadText(seed uint64, n int) string {
	var b strings.Builder
	b.Grow(n + 8)
	for i := uint64(0); b.Len() < n; i++ {
		x := mix(seed ^ mix(i))
		b.WriteByte(' ')
		for k := 1 + int(x%5); k > 0 && b.Len() < n; k-- {
			x /= 26
			b.WriteByte(byte('a' + x%26))
		}
	}
	return b.String()
}

// body returns a new unique request body and its group.
func (w *workload) body() []byte {
	n := w.next.Add(1)
	g := int(n % uint64(len(w.templates)))
	t := w.templates[g]
	b := make([]byte, len(t))
	copy(b, t)
	d := strconv.AppendUint(make([]byte, 0, 20), n, 10)
	copy(b[w.counterAt[g]+counterDigits-len(d):], d)
	return b
}

// mix is the SplitMix64 finaliser: a cheap, well-spread hash of x. The
// comparison's workloads use the same one; this package keeps its own copy
// rather than depend on the comparison for five lines.
func mix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}
