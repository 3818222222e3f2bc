package main

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"math/big"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/accounts/keystore"
	"github.com/ethereum/go-ethereum/crypto"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"

	"github.com/omnious/provider-node/capacity"
	"github.com/omnious/provider-node/engines/sim/simtest"
	"github.com/omnious/provider-node/quoter"
)

const model = "Qwen/Qwen3-32B"

func bigInt(n int64) *big.Int { return big.NewInt(n) }

func startEPP(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != capacity.Path {
			http.NotFound(w, r)
			return
		}
		snap := eppSnapshot()
		snap.Taken = time.Now()
		_ = json.NewEncoder(w).Encode(snap)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// eppSnapshot is the fake EPP's pool: one replica running 4 requests whose
// curve holds about 12 within the default objectives.
func eppSnapshot() capacity.Snapshot {
	bin := func(running, itl, tps float64) capacity.Bin {
		return capacity.Bin{Concurrency: running, Running: running, Seconds: 10, Windows: 5, OutputTokensPerSec: tps,
			ITL:  capacity.Histogram{Counts: []float64{0, itl * 1000, 1000}, Count: 1000},
			TTFT: capacity.Histogram{Counts: []float64{1000, 1000, 1000}, Count: 1000}}
	}
	c := capacity.Curve{ITLBounds: []float64{0.025, 0.05, 0.1}, TTFTBounds: []float64{1, 2, 4},
		Bins: []capacity.Bin{bin(4, 1, 400), bin(10, 0.99, 900), bin(20, 0.9, 1500)}}
	return capacity.Snapshot{Models: []capacity.Model{{Model: model, Replicas: 1, Healthy: 1, MaxConcurrency: 16, Running: 4,
		OutputTokensPerSec: 400, ReplicaCapacity: []capacity.Replica{{Addr: "r", Healthy: true, Running: 4,
			OutputTokensPerSec: 400, MaxRunning: 256, Curve: c}}}}}
}

func invoke(ctx context.Context, args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := run(ctx, args, &out, &errb)
	return code, out.String(), errb.String()
}

// stopAfter collects output and cancels once needle has appeared count
// times, so a loop test ends as soon as it has shown what it must.
type stopAfter struct {
	mu     sync.Mutex
	buf    bytes.Buffer
	needle string
	count  int
	cancel context.CancelFunc
}

func (s *stopAfter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.buf.Write(p) // everything, shutdown lines included, is checked for leaks
	if s.cancel != nil && strings.Count(s.buf.String(), s.needle) >= s.count {
		s.cancel()
		s.cancel = nil
	}
	return len(p), nil
}

func (s *stopAfter) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}

func writeSecret(t *testing.T, dir, name, content string, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(dir, name)
	require.NoError(t, os.WriteFile(p, []byte(content), mode))
	require.NoError(t, os.Chmod(p, mode))
	return p
}

// TestKeyMaterialNeverPrinted runs sign, run and failing key loads with
// debug logging and asserts that no output carries the key or password.
func TestKeyMaterialNeverPrinted(t *testing.T) {
	simURL, eppURL := simtest.URL(t, ""), startEPP(t)
	market := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusAccepted) }))
	defer market.Close()
	dir := t.TempDir()

	key, err := crypto.GenerateKey()
	require.NoError(t, err)
	keyHex := hex.EncodeToString(crypto.FromECDSA(key))
	const password = "correct-horse-battery-staple"
	ks, err := keystore.EncryptKey(&keystore.Key{Id: uuid.New(), Address: crypto.PubkeyToAddress(key.PublicKey), PrivateKey: key},
		password, keystore.LightScryptN, keystore.LightScryptP)
	require.NoError(t, err)

	keyFile := writeSecret(t, dir, "key.hex", "0x"+keyHex+"\n", 0o600)
	openKey := writeSecret(t, dir, "open.hex", keyHex, 0o644)
	badKey := writeSecret(t, dir, "bad.hex", keyHex[:40]+"zz"+keyHex[42:], 0o600)
	ksFile := writeSecret(t, dir, "keystore.json", string(ks), 0o600)
	pwFile := writeSecret(t, dir, "password", password+"\n", 0o600)
	wrongPw := writeSecret(t, dir, "wrong", "nope\n", 0o600)

	common := []string{"--provider-id", "acme", "--model", model, "--model-class", "qwen3-32b", "--serving-url", simURL,
		"--capacity-url", eppURL, "--floor-in", "210000", "--floor-out", "680000", "--chain-id", "8453",
		"--state-file", filepath.Join(dir, "state.json"), "--log-level", "debug"}
	var transcript strings.Builder
	ctx := context.Background()
	record := func(code int, out, errOut string) int {
		transcript.WriteString(out)
		transcript.WriteString(errOut)
		return code
	}

	code, out, errOut := invoke(ctx, append([]string{"sign", "--once", "--key-file", keyFile}, common...)...)
	require.Equal(t, exitOK, record(code, out, errOut), errOut)
	sq, err := quoter.ParseSignedQuote([]byte(out))
	require.NoError(t, err)
	v, err := quoter.Verify(sq, quoter.VerifyOptions{})
	require.NoError(t, err)
	require.Equal(t, crypto.PubkeyToAddress(key.PublicKey), v.Signer)
	want, _ := quoter.ComputeHeadroom(eppSnapshot().Models[0], nil, quoter.Config{}.WithDefaults().Objectives)
	require.Positive(t, want.Concurrency)
	require.Equal(t, strconv.FormatUint(uint64(want.Concurrency), 10), sq.Message.HeadroomConcurrency)
	require.Equal(t, strconv.FormatUint(want.TokensPerSec, 10), sq.Message.HeadroomTokensPerSec)
	quoteFile := filepath.Join(dir, "quote.json")
	require.NoError(t, os.WriteFile(quoteFile, []byte(out), 0o600))

	code, out, errOut = invoke(ctx, append([]string{"sign", "--once", "--keystore-file", ksFile, "--password-file", pwFile}, common...)...)
	require.Equal(t, exitOK, record(code, out, errOut), errOut)
	sq2, err := quoter.ParseSignedQuote([]byte(out))
	require.NoError(t, err)
	require.Equal(t, "2", sq2.Message.Seq, "seq continues across processes")

	// The loop runs until it has logged two signed quotes (or 30 s).
	rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	var runOut bytes.Buffer
	runErr := &stopAfter{needle: "quote signed", count: 2, cancel: cancel}
	code = run(rctx, append([]string{"run", "--key-file", keyFile, "--listen", "127.0.0.1:0",
		"--market-url", market.URL, "--refresh", "200ms", "--ttl", "2s"}, common...), &runOut, runErr)
	cancel()
	errOut = runErr.String()
	require.Equal(t, exitOK, record(code, runOut.String(), errOut), errOut)
	require.Contains(t, errOut, "conformance gate passed")
	require.GreaterOrEqual(t, strings.Count(errOut, "quote signed"), 2, errOut)

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--key-file", openKey}, "readable by group or others"},
		{[]string{"--key-file", badKey}, "non-hex character"},
		{[]string{"--keystore-file", ksFile, "--password-file", wrongPw}, "cannot decrypt keystore"},
		{[]string{"--keystore-file", ksFile}, "needs a password file"},
	} {
		code, out, errOut = invoke(ctx, append(append([]string{"sign", "--once"}, tc.args...), common...)...)
		require.Equal(t, exitFail, record(code, out, errOut))
		require.Contains(t, errOut, tc.want)
	}
	code, out, errOut = invoke(ctx, "verify", quoteFile)
	require.Equal(t, exitOK, record(code, out, errOut), errOut)

	all := strings.ToLower(transcript.String())
	require.NotEmpty(t, all)
	for _, secret := range []string{keyHex, keyHex[:16], keyHex[24:40], keyHex[48:], password} {
		require.NotContains(t, all, strings.ToLower(secret), "key material appeared in output")
	}
}

// writeJSON writes v as JSON to dir/name, mode 0600, and returns the path.
func writeJSON(t *testing.T, dir, name string, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	require.NoError(t, err)
	p := filepath.Join(dir, name)
	require.NoError(t, os.WriteFile(p, b, 0o600))
	return p
}

func TestVerifyCommand(t *testing.T) {
	key, err := crypto.GenerateKey()
	require.NoError(t, err)
	nonce, err := quoter.NewNonce()
	require.NoError(t, err)
	issued := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	sq, err := quoter.Sign(&quoter.Quote{ChainID: bigInt(8453), Provider: crypto.PubkeyToAddress(key.PublicKey),
		ProviderID: "acme", Model: model, ModelClass: "c", EndpointHash: quoter.EndpointHash("https://x/v1"),
		InputPricePerMTok: bigInt(1), OutputPricePerMTok: bigInt(2), Seq: 7, IssuedAt: uint64(issued.Unix()),
		Expiry: uint64(issued.Unix()) + 30, Nonce: nonce}, key)
	require.NoError(t, err)
	dir := t.TempDir()
	write := func(name string, v any) string { return writeJSON(t, dir, name, v) }
	good := write("good.json", sq)
	tampered := *sq
	tampered.Message.Model = "other"
	bad := write("bad.json", &tampered)
	at := func(d time.Duration) string { return issued.Add(d).Format(time.RFC3339) }

	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"valid", []string{"--at", at(time.Second), good}, exitOK, "VALID signer=" + crypto.PubkeyToAddress(key.PublicKey).Hex()},
		{"expired", []string{"--at", at(31 * time.Second), good}, exitFail, "INVALID: quote expired"},
		{"skew", []string{"--at", at(-10 * time.Second), good}, exitFail, "issued in the future"},
		{"skew allowed", []string{"--at", at(-10 * time.Second), "--max-skew", "15s", good}, exitOK, "VALID"},
		{"tampered", []string{"--at", at(time.Second), bad}, exitFail, "digest does not match"},
		{"chain", []string{"--at", at(time.Second), "--chain-id", "1", good}, exitFail, "wrong EIP-712 domain"},
		{"signer", []string{"--at", at(time.Second), "--signer", "0x0000000000000000000000000000000000000001", good}, exitFail, "signer mismatch"},
		{"missing", []string{filepath.Join(dir, "none.json")}, exitFail, "cannot read quote"},
		{"not json", []string{write("x.json", "text")}, exitFail, "malformed quote"},
		{"usage", nil, exitUsage, "usage: quoter verify"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := invoke(context.Background(), append([]string{"verify"}, tc.args...)...)
			require.Equal(t, tc.code, code, out+errOut)
			require.Contains(t, out+errOut, tc.want)
		})
	}
}

func TestConformanceCommand(t *testing.T) {
	simURL := simtest.URL(t, "")
	code, out, errOut := invoke(context.Background(), "conformance", "--url", simURL, "--model", model)
	require.Equal(t, exitOK, code, out+errOut)
	require.Contains(t, out, "result: PASS (6 checks)")

	resp, err := http.Post(simURL+"/admin/faults", "application/json", strings.NewReader(`{"reject_auto_tool_choice":true}`))
	require.NoError(t, err)
	resp.Body.Close()
	code, out, _ = invoke(context.Background(), "conformance", "--url", simURL, "--model", model)
	require.Equal(t, exitFail, code)
	require.Contains(t, out, "FAIL tool-auto-stream")
	require.Contains(t, out, "result: FAIL (tool-auto-stream)")

	code, out, _ = invoke(context.Background(), "conformance", "--url", simURL, "--model", model, "--json", "--quick")
	require.Equal(t, exitFail, code)
	var rep struct {
		Passed  bool `json:"passed"`
		Results []struct {
			Name string `json:"name"`
			OK   bool   `json:"ok"`
		} `json:"results"`
	}
	require.NoError(t, json.Unmarshal([]byte(out), &rep))
	require.False(t, rep.Passed)
	require.Len(t, rep.Results, 3)
}

func TestToolProfileCommands(t *testing.T) {
	for _, name := range []string{"TOOL_PROFILE", "MODEL_ID", "ENGINE", "VLLM_TOOL_CALL_PARSER", "SGLANG_TOOL_CALL_PARSER", "TOOL_PROFILES_FILE"} {
		t.Setenv(name, "")
	}
	const tsv = "../../deploy/config/tool-profiles.tsv"
	for _, tc := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"auto", []string{"--model", "openai/gpt-oss-20b"}, exitOK, "openai\n"},
		{"sglang", []string{"--model", "openai/gpt-oss-20b", "--engine", "sglang"}, exitOK, "gpt-oss\n"},
		{"env", []string{"--model", "tencent/Hunyuan-A13B-Instruct", "--format", "env"}, exitOK,
			"TOOL_FAMILY='Hunyuan A13B'\nTOOL_CALL_PARSER=hunyuan_a13b\nREASONING_PARSER=hunyuan_a13b\n"},
		{"custom", []string{"--mode", "custom", "--parser", "pythonic"}, exitOK, "pythonic\n"},
		{"unknown", []string{"--model", "acme/Mystery"}, exitFail, "no reviewed tool profile"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := invoke(context.Background(), append([]string{"tool-profile", "--profiles", tsv}, tc.args...)...)
			require.Equal(t, tc.code, code, errOut)
			if tc.code == exitOK {
				require.Equal(t, tc.want, out)
			} else {
				require.Contains(t, errOut, tc.want)
			}
		})
	}
	code, _, errOut := invoke(context.Background(), "tool-profiles-json", "--profiles", tsv,
		"--out", "../../deploy/config/omnious-model-tool-profiles.json", "--check")
	require.Equal(t, exitOK, code, errOut)
	stale := filepath.Join(t.TempDir(), "stale.json")
	require.NoError(t, os.WriteFile(stale, []byte("{}"), 0o600))
	code, _, errOut = invoke(context.Background(), "tool-profiles-json", "--profiles", tsv, "--out", stale, "--check")
	require.Equal(t, exitFail, code)
	require.Contains(t, errOut, "is out of date")
}

func TestUsage(t *testing.T) {
	code, _, errOut := invoke(context.Background())
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, "usage: quoter")
	code, _, errOut = invoke(context.Background(), "bogus")
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, `unknown command "bogus"`)
	code, _, errOut = invoke(context.Background(), "sign")
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, "use --once")
}
