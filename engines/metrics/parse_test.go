package metrics

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"
)

func readFixture(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile("testdata/" + name)
	require.NoError(t, err)
	return b
}

func TestParseFixtures(t *testing.T) {
	tests := []struct {
		file string
		want Signals
	}{
		{"vllm.txt", Signals{
			Engine: EngineVLLM, Running: 5, Waiting: 5, KVUsage: 0.375,
			PrefixQueries: 12000, PrefixHits: 7000, PromptTokens: 12000, GenerationTokens: 3456,
			BlockSize: 16, NumGPUBlocks: 27000,
			MaxLoRA: 4, RunningLoRA: "sql-lora,chat-lora", WaitingLoRA: "math-lora",
		}},
		{"sglang.txt", Signals{
			Engine: EngineSGLang, Running: 7, Waiting: 2, KVUsage: 0.42,
			PrefixQueries: 90000, PrefixHits: 54000, PromptTokens: 90000, GenerationTokens: 30000,
			BlockSize: 1, NumGPUBlocks: 512000, MaxTotalTokens: 512000,
		}},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			var s Signals
			require.NoError(t, Parse(readFixture(t, tt.file), &s))
			require.Equal(t, tt.want.Engine, s.Engine)
			require.InDelta(t, tt.want.Running, s.Running, 1e-9)
			require.InDelta(t, tt.want.Waiting, s.Waiting, 1e-9)
			require.InDelta(t, tt.want.KVUsage, s.KVUsage, 1e-9)
			require.InDelta(t, tt.want.PrefixQueries, s.PrefixQueries, 1e-9)
			require.InDelta(t, tt.want.PrefixHits, s.PrefixHits, 1e-9)
			require.InDelta(t, tt.want.PromptTokens, s.PromptTokens, 1e-9)
			require.InDelta(t, tt.want.GenerationTokens, s.GenerationTokens, 1e-9)
			require.Equal(t, tt.want.BlockSize, s.BlockSize)
			require.Equal(t, tt.want.NumGPUBlocks, s.NumGPUBlocks)
			require.Equal(t, tt.want.MaxTotalTokens, s.MaxTotalTokens)
			require.Equal(t, tt.want.MaxLoRA, s.MaxLoRA)
			require.Equal(t, tt.want.RunningLoRA, s.RunningLoRA)
			require.Equal(t, tt.want.WaitingLoRA, s.WaitingLoRA)
			require.NotZero(t, s.Has&HasRunning)
			require.NotZero(t, s.Has&HasCacheConfig)
		})
	}
}

func TestKVCapacityAndAdapters(t *testing.T) {
	var v, g Signals
	require.NoError(t, Parse(readFixture(t, "vllm.txt"), &v))
	require.NoError(t, Parse(readFixture(t, "sglang.txt"), &g))
	require.Equal(t, int64(16*27000), v.KVCapacityTokens())
	require.Equal(t, int64(512000), g.KVCapacityTokens())
	for _, tt := range []struct {
		name string
		want bool
	}{
		{"sql-lora", true}, {"chat-lora", true}, {"math-lora", true},
		{"old-adapter", false}, {"sql", false}, {"", false},
	} {
		require.Equal(t, tt.want, v.HasAdapter(tt.name), tt.name)
	}
}

func TestParseEdgeCases(t *testing.T) {
	tests := []struct {
		name    string
		in      string
		wantErr bool
		check   func(t *testing.T, s *Signals)
	}{
		{"empty", "", true, nil},
		{"only foreign series", "foo 1\nbar{a=\"b\"} 2\n", true, nil},
		{"no labels with timestamp", "vllm:num_requests_waiting 3 1700000000000\n", false,
			func(t *testing.T, s *Signals) { require.InDelta(t, 3.0, s.Waiting, 0) }},
		{"crlf and spaces", "  vllm:num_requests_running{engine=\"0\"}   2  \r\n", false,
			func(t *testing.T, s *Signals) { require.InDelta(t, 2.0, s.Running, 0) }},
		{"legacy gpu_cache_usage_perc", "vllm:gpu_cache_usage_perc 0.7\n", false,
			func(t *testing.T, s *Signals) { require.InDelta(t, 0.7, s.KVUsage, 1e-9) }},
		{"kv usage clamped", "sglang:token_usage 3.5\n", false,
			func(t *testing.T, s *Signals) { require.InDelta(t, 1.0, s.KVUsage, 0) }},
		{"NaN counts as zero", "vllm:num_requests_waiting NaN\nvllm:num_requests_running 1\n", false,
			func(t *testing.T, s *Signals) { require.InDelta(t, 0.0, s.Waiting, 0) }},
		{"escaped quote in label", "vllm:num_requests_running{model_name=\"a\\\"}b\"} 4\n", false,
			func(t *testing.T, s *Signals) { require.InDelta(t, 4.0, s.Running, 0) }},
		{"block size None ignored", "vllm:cache_config_info{block_size=\"None\",num_gpu_blocks=\"8\"} 1\n", false,
			func(t *testing.T, s *Signals) {
				require.Equal(t, 0, s.BlockSize)
				require.Equal(t, int64(8), s.NumGPUBlocks)
			}},
		{"recognised series bad value", "vllm:num_requests_running abc\n", true, nil},
		{"recognised series missing value", "vllm:num_requests_running{a=\"b\"}\n", true, nil},
		{"unterminated labels", "vllm:num_requests_running{a=\"b 1\n", true, nil},
		{"malformed foreign series ignored", "foo{{{ x\nvllm:num_requests_running 1\n", false,
			func(t *testing.T, s *Signals) { require.InDelta(t, 1.0, s.Running, 0) }},
		{"label without quotes", "vllm:cache_config_info{block_size=16} 1\n", true, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var s Signals
			err := Parse([]byte(tt.in), &s)
			if tt.wantErr {
				require.Error(t, err)
				return
			}
			require.NoError(t, err)
			tt.check(t, &s)
		})
	}
}

func FuzzParse(f *testing.F) {
	f.Add(readFixture(f, "vllm.txt"))
	f.Add(readFixture(f, "sglang.txt"))
	f.Add([]byte("vllm:num_requests_running{a=\"\\\\\"} 1e3 12\n"))
	f.Add([]byte("vllm:lora_requests_info{max_lora=\"1\",running_lora_adapters=\"a,b\"} 5\n"))
	f.Add([]byte("sglang:cache_config_info{page_size=\"x\",num_pages=\"-1\"} 1"))
	f.Fuzz(func(t *testing.T, data []byte) {
		var s Signals
		if err := Parse(data, &s); err != nil {
			return
		}
		if s.KVUsage < 0 || s.KVUsage > 1 {
			t.Fatalf("kv usage out of range: %v", s.KVUsage)
		}
		if s.Has == 0 {
			t.Fatal("nil error without any signal")
		}
	})
}

var sinkSignals Signals

func BenchmarkParse(b *testing.B) {
	for _, name := range []string{"vllm.txt", "sglang.txt"} {
		data := readFixture(b, name)
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(data)))
			for b.Loop() {
				if err := Parse(data, &sinkSignals); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
