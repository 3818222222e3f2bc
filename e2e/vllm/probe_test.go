package vllm

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/engines/tokenizer"
	"github.com/omnious/provider-node/extproc"
	"github.com/omnious/provider-node/extproc/testgw"
	"github.com/omnious/provider-node/kvindex"
)

// words make prompts: common English words, so the tokenizer gives about
// one token per word and the prompts' lengths are predictable.
var words = strings.Fields(`time year people way day man thing woman life child world school state family
student group country problem hand part place case week company system program question work government
number night point home water room mother area money story fact month lot right study book eye job word
business issue side kind head house service friend father power hour game line end member law car city
community name president team minute idea kid body information back parent face others level office door
health person art war history party result change morning reason research girl guy moment air teacher force
education river garden window paper music market bridge forest letter summer winter island engine signal`)

// text is n seeded words.
func text(rng *rand.Rand, n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(words[rng.IntN(len(words))])
	}
	return b.String()
}

// chat is one chat request's messages.
type chat []map[string]any

// family makes a chat family: one long system prompt (the shared prefix)
// and per-member questions.
func family(rng *rand.Rand, systemWords int) func(q string) chat {
	sys := text(rng, systemWords)
	return func(q string) chat {
		return chat{{"role": "system", "content": sys}, {"role": "user", "content": q}}
	}
}

// prompter is our tokenization of the test model's chats, as the EPP's.
func prompter(t *testing.T, f *fleet) func(chat) []uint32 {
	t.Helper()
	tok, err := tokenizer.Load(model, f.model)
	require.NoError(t, err)
	tmpl, err := tok.NewChatTemplate()
	require.NoError(t, err)
	p := extproc.NewTokenPrompter(map[string]extproc.ModelTokenizer{model: {Tokenizer: tok, Template: tmpl}}, nil)
	return func(c chat) []uint32 {
		msgs, err := json.Marshal(c)
		require.NoError(t, err)
		ids, ok := p.Prompt(model, &extproc.PromptInput{API: extproc.APIChat, Messages: msgs, AddGenerationPrompt: true})
		require.True(t, ok)
		return ids
	}
}

// usage is the part of an OpenAI response the tests read.
type usage struct {
	PromptTokens int `json:"prompt_tokens"`
	Details      *struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

func (u usage) cached() int {
	if u.Details == nil {
		return 0
	}
	return u.Details.CachedTokens
}

// send posts a one-token chat to base (a replica, or the gateway with tag
// as the test gateway's request tag) and returns vLLM's usage.
func send(ctx context.Context, base string, c chat, tag string) (usage, error) {
	b, err := json.Marshal(map[string]any{"model": model, "messages": c, "max_tokens": 1, "temperature": 0})
	if err != nil {
		return usage{}, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", bytes.NewReader(b))
	if err != nil {
		return usage{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	if tag != "" {
		req.Header.Set(testgw.HeaderTag, tag)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return usage{}, fmt.Errorf("chat to %s: %w", base, err)
	}
	defer resp.Body.Close()
	rb, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return usage{}, fmt.Errorf("chat to %s: %s: %s", base, resp.Status, rb)
	}
	var out struct {
		Usage usage `json:"usage"`
	}
	if err := json.Unmarshal(rb, &out); err != nil {
		return usage{}, fmt.Errorf("chat to %s: %w", base, err)
	}
	return out.Usage, nil
}

// settle waits until no replica has published a KV-event batch for a
// while, and the EPP has had time to apply the last ones.
func (f *fleet) settle(t *testing.T) {
	t.Helper()
	last := func() []uint64 {
		out := make([]uint64, len(f.replicas))
		for i, r := range f.replicas {
			r.relay.mu.Lock()
			out[i] = r.relay.latest
			r.relay.mu.Unlock()
		}
		return out
	}
	prev := last()
	quiet := time.Now()
	deadline := time.Now().Add(30 * time.Second)
	for time.Since(quiet) < 400*time.Millisecond {
		require.True(t, time.Now().Before(deadline), "KV events did not settle in 30s")
		time.Sleep(50 * time.Millisecond)
		if cur := last(); !equalSeqs(cur, prev) {
			prev, quiet = cur, time.Now()
		}
	}
}

func equalSeqs(a, b []uint64) bool {
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// index is the EPP's KV index as its admin port serves it to a sibling.
type index struct {
	snap  *kvindex.Snapshot
	names map[kvindex.Replica]string
}

func (f *fleet) index(t *testing.T) index {
	t.Helper()
	var body []byte
	for attempt := 0; ; attempt++ {
		resp, err := http.Get("http://" + f.epp.AdminAddr() + kvindex.SnapshotPath)
		require.NoError(t, err)
		body, err = io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		if resp.StatusCode == http.StatusOK {
			break
		}
		require.Less(t, attempt, 20, "snapshot: %s %s", resp.Status, body)
		time.Sleep(100 * time.Millisecond)
	}
	sr, err := kvindex.NewSnapshotReader(bytes.NewReader(body), 0)
	require.NoError(t, err)
	snap, err := kvindex.LoadSnapshot(bytes.NewReader(body), kvindex.LoadOptions{Want: sr.Header()})
	require.NoError(t, err)
	ix := index{snap: snap, names: map[kvindex.Replica]string{}}
	for _, r := range snap.Replicas {
		ix.names[r.State.Replica()] = r.Name
	}
	return ix
}

// predicted is the prefix of tokens, in tokens, the index says replica
// addr holds.
func (ix index) predicted(addr string, tokens []uint32) int {
	keys := kvindex.AppendBlockKeys(nil, kvindex.RootKey(model, "", ""), tokens, blockSize)
	for _, m := range ix.snap.Index.Match(keys, nil) {
		if ix.names[m.Replica] == addr {
			return m.Blocks * blockSize
		}
	}
	return 0
}

// holder is the replica the index says holds the longest prefix of
// tokens, and that prefix; "" when none holds any.
func (ix index) holder(tokens []uint32) (string, int) {
	keys := kvindex.AppendBlockKeys(nil, kvindex.RootKey(model, "", ""), tokens, blockSize)
	best, n := "", 0
	for _, m := range ix.snap.Index.Match(keys, nil) {
		if m.Blocks > n {
			best, n = ix.names[m.Replica], m.Blocks
		}
	}
	return best, n * blockSize
}
