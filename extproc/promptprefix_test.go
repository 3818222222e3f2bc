package extproc

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/omnious/provider-node/endpoint"
	"github.com/omnious/provider-node/engines/openai"
	"github.com/omnious/provider-node/engines/tokenizer"
	"github.com/omnious/provider-node/kvindex"
	"github.com/omnious/provider-node/scheduler"
)

// conversation returns the bodies of a chat's turns: a long system
// prompt, then user and assistant turns, each body the one before it
// plus a turn.
func conversation(t testing.TB, turns int) [][]byte {
	t.Helper()
	msgs := []openai.Message{{Role: "system", Content: jsonString(t, strings.Repeat("You answer questions about KV caches. ", 200))}}
	var bodies [][]byte
	for i := range turns {
		msgs = append(msgs, openai.Message{Role: "user", Content: jsonString(t, fmt.Sprintf("Question %d: %s", i, strings.Repeat("why? ", 50*i+1)))})
		b, err := json.Marshal(map[string]any{"model": "m", "messages": msgs})
		require.NoError(t, err)
		bodies = append(bodies, b)
		msgs = append(msgs, openai.Message{Role: "assistant", Content: jsonString(t, fmt.Sprintf("Answer %d.", i))})
	}
	return bodies
}

func jsonString(t testing.TB, s string) json.RawMessage {
	t.Helper()
	b, err := json.Marshal(s)
	require.NoError(t, err)
	return b
}

// TestPromptPrefixIDs: AppendPromptTail's Prefix followed by its tokens
// is AppendPrompt's prompt, and the keys of the Prefix and the tokens are
// the prompt's own (kvindex.KeyCache.AppendPrefixKeys equals
// AppendBlockKeys) under every root and block size, turn after turn;
// every turn comes with a prefix, ids already in dst stay first, and a
// completions prompt comes with none.
func TestPromptPrefixIDs(t *testing.T) {
	p := NewStandInPrompter()
	plain := NewTokenPrompter(nil, &ModelTokenizer{Tokenizer: tokenizer.NewStandIn()})
	roots := []kvindex.Key{kvindex.RootKey("m", "", ""), kvindex.RootKey("m", "lora", ""), kvindex.RootKey("m", "", "salt")}
	caches := map[int]*kvindex.KeyCache{}
	for _, bs := range []int{16, 5} {
		kc, err := kvindex.NewKeyCache(1<<16, bs)
		require.NoError(t, err)
		caches[bs] = kc
	}
	var dst []uint32
	for i, body := range conversation(t, 6) {
		for rep := range 2 {
			var rb requestBody
			require.NoError(t, parseRequestBody(body, &rb))
			in := promptInput(APIChat, body, &rb)
			toks, prefix, ok := p.AppendPromptTail(dst[:0], "m", &in)
			require.True(t, ok)
			want, ok := plain.AppendPrompt(nil, "m", &in)
			require.True(t, ok)
			require.Equal(t, want, append(prefixIDs(prefix), toks...), "turn %d", i)
			// The first time, the entries the tokens were just stored in.
			require.Positive(t, prefix.Len(), "turn %d, time %d: the conversation so far is cached", i, rep)
			require.Less(t, len(toks), len(want)/2, "turn %d, time %d: the cached ids are not copied", i, rep)
			for _, bs := range []int{16, 5} {
				for _, root := range roots {
					require.Equal(t, kvindex.AppendBlockKeys(nil, root, want, bs), caches[bs].AppendPrefixKeys(nil, root, prefix, toks),
						"turn %d, time %d, block size %d", i, rep, bs)
				}
			}
			dst = toks

			toks, prefix, ok = p.AppendPromptTail([]uint32{1}, "m", &in)
			require.True(t, ok)
			require.Equal(t, uint32(1), toks[0], "ids already in dst stay")
			require.Equal(t, want, append(prefixIDs(prefix), toks[1:]...))
		}
	}
	in := PromptInput{API: APICompletions, Prompt: []byte(`"Once upon a time"`)}
	toks, prefix, ok := p.AppendPromptTail(nil, "m", &in)
	require.True(t, ok)
	require.Zero(t, prefix.Len(), "a completions prompt has no prefix")
	want, ok := plain.AppendPrompt(nil, "m", &in)
	require.True(t, ok)
	require.Equal(t, want, toks)
}

// prefixIDs is a copy of the ids p holds.
func prefixIDs(p tokenizer.Prefix) []uint32 {
	runs, _ := p.AppendRuns(nil, nil)
	var ids []uint32
	for _, r := range runs {
		ids = append(ids, r...)
	}
	return ids
}

// keyPicker checks in Pick that the request's Prefix and Tokens key as
// AppendBlockKeys does the prompt they hold together, and counts the
// requests that had one.
type keyPicker struct {
	t    testing.TB
	kc   *kvindex.KeyCache
	held *int
}

func (keyPicker) Admit(context.Context, *scheduler.Request) (*scheduler.Ticket, error) {
	return nil, nil
}

func (k keyPicker) Pick(r *scheduler.Request, _ *scheduler.Ticket) (*scheduler.Decision, error) {
	root := kvindex.RootKey(r.Model, "", r.CacheSalt)
	all := r.AppendTokens(nil)
	if len(all) != r.TokenCount() {
		k.t.Errorf("request %s: %d ids, TokenCount %d", r.ID, len(all), r.TokenCount())
	}
	if got, want := k.kc.AppendPrefixKeys(nil, root, r.Prefix, r.Tokens), kvindex.AppendBlockKeys(nil, root, all, 16); !slices.Equal(got, want) {
		k.t.Errorf("request %s: the prefix's keys differ from the tokens'", r.ID)
	}
	if r.Prefix != nil {
		*k.held++
	}
	return &scheduler.Decision{Endpoints: []*endpoint.Endpoint{{Addr: "127.0.0.1:8000"}}}, nil
}

// TestServerPassesPrefix: the server hands the scheduler the prefix the
// prompter's cache holds, with the tokens it describes.
func TestServerPassesPrefix(t *testing.T) {
	kc, err := kvindex.NewKeyCache(1<<16, 16)
	require.NoError(t, err)
	held := 0
	s := NewServer(Config{}, keyPicker{t: t, kc: kc, held: &held}, NewStandInPrompter(), nil, zap.NewNop())
	bodies := conversation(t, 4)
	for _, body := range append(bodies, bodies...) {
		got := runRequest(t, s, []*extprocv3.ProcessingRequest{
			reqHeaders(false, ":method", "POST", ":path", "/v1/chat/completions", "content-length", strconv.Itoa(len(body))),
			reqBody(string(body), true),
		})
		require.Equal(t, "127.0.0.1:8000", got.dest)
	}
	require.Equal(t, 2*len(bodies), held, "every request comes with a prefix, the first with the entries it stored")
}
