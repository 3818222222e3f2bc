package tokenizer

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/engines/openai"
)

type chatVector struct {
	Name                string           `json:"name"`
	Messages            []openai.Message `json:"messages"`
	Tools               []openai.Tool    `json:"tools"`
	AddGenerationPrompt bool             `json:"add_generation_prompt"`
	Kwargs              json.RawMessage  `json:"kwargs"`
	Text                string           `json:"text"`
	IDs                 []uint32         `json:"ids"`
}

// chatFamilies are the families whose tokenizer_config.json has a template.
var chatFamilies = []string{"qwen3", "llama3_1", "deepseek_v3"}

func TestGoldenChat(t *testing.T) {
	for _, fam := range chatFamilies {
		t.Run(fam, func(t *testing.T) {
			tok := loadFamily(t, fam)
			ct, err := tok.NewChatTemplate()
			require.NoError(t, err)
			vecs := readJSONL[chatVector](t, filepath.Join("testdata", "golden", fam+".chat.jsonl"))
			require.GreaterOrEqual(t, len(vecs), 50)
			for _, v := range vecs {
				text, err := ct.Render(ChatInput{Messages: v.Messages, Tools: v.Tools, AddGenerationPrompt: v.AddGenerationPrompt, Kwargs: v.Kwargs})
				require.NoError(t, err, v.Name)
				require.Equal(t, v.Text, text, v.Name)
				require.Equal(t, v.IDs, tok.Encode(nil, text), v.Name)
			}
		})
	}
}

// TestChatTemplatePythonJSON checks what the JS reference cannot: floats
// with integral values print as Python does, and the schema keeps the
// request's key order and non-ASCII text.
func TestChatTemplatePythonJSON(t *testing.T) {
	tok := loadFamily(t, "qwen3")
	ct, err := tok.NewChatTemplate()
	require.NoError(t, err)
	var req openai.ChatRequest
	require.NoError(t, json.Unmarshal([]byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],
		"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"z":{"type":"number","default":1.0,"description":"東京 <b>"},"a":{"type":"integer","maximum":1e21}}}}}]}`), &req))
	in := ChatInputFromRequest(&req)
	require.True(t, in.AddGenerationPrompt)
	text, err := ct.Render(in)
	require.NoError(t, err)
	require.Contains(t, text, `{"type": "function", "function": {"name": "f", "description": null, "parameters": {"type": "object", "properties": {"z": {"type": "number", "default": 1.0, "description": "東京 <b>"}, "a": {"type": "integer", "maximum": 1e+21}}}}}`)
	require.True(t, strings.HasSuffix(text, "<|im_start|>assistant\n"))
}
