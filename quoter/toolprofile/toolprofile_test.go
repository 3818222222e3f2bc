package toolprofile

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const (
	tsvPath  = "../../deploy/config/tool-profiles.tsv"
	jsonPath = "../../deploy/config/omnious-model-tool-profiles.json"
)

func load(t *testing.T) *Registry {
	t.Helper()
	r, err := Load(tsvPath)
	require.NoError(t, err)
	return r
}

func TestResolveReviewedFamilies(t *testing.T) {
	r := load(t)
	for _, tc := range []struct {
		model, family, vllm, reasoning, sglang string
	}{
		{"Qwen/Qwen3-Coder-30B-A3B-Instruct", "Qwen3-Coder", "qwen3_xml", "", "qwen3_coder"},
		{"Qwen/Qwen3-Coder-480B-A35B-Instruct-FP8", "Qwen3-Coder", "qwen3_xml", "", "qwen3_coder"},
		{"Qwen/Qwen3-32B", "Qwen3", "hermes", "qwen3", "qwen25"},
		{"Qwen/Qwen3-235B-A22B-Instruct-2507", "Qwen3", "hermes", "qwen3", "qwen25"},
		{"Qwen/Qwen2.5-7B-Instruct", "Qwen2.5 / Hermes", "hermes", "", "qwen25"},
		{"NousResearch/Hermes-3-Llama-3.1-8B", "Qwen2.5 / Hermes", "hermes", "", "qwen25"},
		{"NousResearch/Hermes-2-Pro-Llama-3-8B", "Qwen2.5 / Hermes", "hermes", "", "qwen25"},
		{"openai/gpt-oss-120b", "GPT-OSS", "openai", "", "gpt-oss"},
		{"moonshotai/Kimi-K2-Instruct", "Kimi K2", "kimi_k2", "", "kimi_k2"},
		{"tencent/Hunyuan-A13B-Instruct", "Hunyuan A13B", "hunyuan_a13b", "hunyuan_a13b", "hunyuan"},
		{"zai-org/GLM-4.5", "GLM 4.5 / 4.6", "glm45", "", "glm45"},
		{"zai-org/GLM-4.6-FP8", "GLM 4.5 / 4.6", "glm45", "", "glm45"},
		{"zai-org/GLM-4.7", "GLM 4.7", "glm47", "", "glm47"},
		{"ai21labs/AI21-Jamba-1.5-Mini", "Jamba 1.5", "jamba", "", ""},
		{"mistralai/Mistral-7B-Instruct-v0.3", "Mistral 7B v0.3", "mistral", "", "mistral"},
		{"allenai/Olmo-3-7B-Instruct", "OLMo 3", "olmo3", "", ""},
		{"meta-llama/Llama-3.1-8B-Instruct", "Llama 3.1 / 3.2", "llama3_json", "", "llama3"},
		{"meta-llama/Meta-Llama-3.1-70B-Instruct", "Llama 3.1 / 3.2", "llama3_json", "", "llama3"},
		{"meta-llama/Llama-3.2-3B-Instruct", "Llama 3.1 / 3.2", "llama3_json", "", "llama3"},
	} {
		t.Run(tc.model, func(t *testing.T) {
			res, err := r.Resolve(Request{Mode: ModeAuto, ModelID: tc.model, Engine: EngineVLLM})
			require.NoError(t, err)
			require.Equal(t, Resolution{Family: tc.family, Engine: EngineVLLM, Parser: tc.vllm,
				ReasoningParser: tc.reasoning, Source: "registry"}, res)
			res, err = r.Resolve(Request{ModelID: tc.model, Engine: EngineSGLang})
			if tc.sglang == "" {
				require.ErrorIs(t, err, ErrUnknownFamily)
				require.ErrorContains(t, err, "no SGLang tool-call parser is listed")
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.sglang, res.Parser)
		})
	}
}

func TestResolveFailsClosed(t *testing.T) {
	r := load(t)
	for _, tc := range []struct {
		name string
		req  Request
		want string
	}{
		{"unknown family", Request{ModelID: "acme/Mystery-70B"}, `no reviewed tool profile for model "acme/Mystery-70B"`},
		{"mistral other version", Request{ModelID: "mistralai/Mistral-7B-Instruct-v0.2"}, "no reviewed tool profile"},
		{"llama 3.0", Request{ModelID: "meta-llama/Meta-Llama-3-8B-Instruct"}, "no reviewed tool profile"},
		{"no model", Request{Mode: ModeAuto}, "needs MODEL_ID"},
		{"bad mode", Request{Mode: "guess", ModelID: "x"}, `TOOL_PROFILE "guess" is not auto or custom`},
		{"bad engine", Request{ModelID: "openai/gpt-oss-20b", Engine: "tgi"}, `ENGINE "tgi"`},
		{"custom without parser", Request{Mode: ModeCustom, ModelID: "x"}, "needs VLLM_TOOL_CALL_PARSER"},
		{"custom injection", Request{Mode: ModeCustom, CustomParser: "hermes; rm -rf /"}, "is not a parser name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := r.Resolve(tc.req)
			require.ErrorContains(t, err, tc.want)
		})
	}
	res, err := r.Resolve(Request{Mode: ModeCustom, ModelID: "acme/Mystery-70B", CustomParser: "pythonic"})
	require.NoError(t, err)
	require.Equal(t, Resolution{Family: "custom", Engine: EngineVLLM, Parser: "pythonic", Source: "custom"}, res)
}

func TestParseRejectsBadRegistries(t *testing.T) {
	header := strings.Join(columns, "\t") + "\n"
	row := func(cells ...string) string { return strings.Join(cells, "\t") + "\n" }
	for _, tc := range []struct{ name, data, want string }{
		{"empty", "# only comments\n", "no profiles found"},
		{"bad header", "family\tmatch\n", "header is"},
		{"short row", header + "A\tx\n", "2 columns, want 7"},
		{"bad regexp", header + row("A", "(", "p", "-", "-", "2026-01-01", "-"), "bad match pattern"},
		{"no vllm parser", header + row("A", "a", "-", "-", "-", "2026-01-01", "-"), "has no vLLM parser"},
		{"bad date", header + row("A", "a", "p", "-", "-", "Jan 1", "-"), "not YYYY-MM-DD"},
		{"bad parser", header + row("A", "a", "p$(x)", "-", "-", "2026-01-01", "-"), "is not [a-z0-9_.-]"},
		{"repeated", header + row("A", "a", "p", "-", "-", "2026-01-01", "-") + row("A", "b", "p", "-", "-", "2026-01-01", "-"), "repeated"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse(strings.NewReader(tc.data))
			require.ErrorContains(t, err, tc.want)
		})
	}
}

// TestGeneratedJSONInSync fails when tool-profiles.tsv changed without
// regenerating the contract file.
func TestGeneratedJSONInSync(t *testing.T) {
	want, err := load(t).GenerateJSON()
	require.NoError(t, err)
	got, err := os.ReadFile(jsonPath)
	require.NoError(t, err)
	require.Equal(t, string(want), string(got),
		"deploy/config/omnious-model-tool-profiles.json is out of date; run: go run ./cmd/quoter tool-profiles-json")
}

func FuzzParse(f *testing.F) {
	data, err := os.ReadFile(tsvPath)
	require.NoError(f, err)
	f.Add(string(data))
	f.Add("family\tmatch\n")
	f.Fuzz(func(t *testing.T, s string) {
		r, err := Parse(strings.NewReader(s))
		if err == nil {
			_, _ = r.Resolve(Request{ModelID: "Qwen/Qwen2.5-7B-Instruct"})
		}
	})
}
