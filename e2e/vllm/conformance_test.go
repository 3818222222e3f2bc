package vllm

import (
	"context"
	"math/big"
	"path/filepath"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/crypto"
	"github.com/stretchr/testify/require"
	"go.uber.org/zap"

	"github.com/omnious/provider-node/quoter"
	"github.com/omnious/provider-node/quoter/conformance"
)

// TestConformanceRealVLLM: the conformance suite through the serving path
// (gateway, EPP, vLLM). Identity, chat and streaming pass; tool_choice
// "required" and a named function pass, since vLLM constrains the output
// to the tool's schema; automatic tool choice, which a random-weight
// model does not use, fails with its reason, and the quoter's gate keeps
// the signer stopped.
func TestConformanceRealVLLM(t *testing.T) {
	f := getFleet(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	rep := conformance.Run(ctx, conformance.Config{URL: f.gatewayURL(), Model: model, MaxTokens: 64, CheckTimeout: time.Minute}, conformance.Full)
	t.Logf("\n%s", rep)
	byName := map[string]conformance.Result{}
	for _, r := range rep.Results {
		byName[r.Name] = r
	}
	for _, name := range []string{conformance.CheckModels, conformance.CheckChat, conformance.CheckStream, conformance.CheckRequired, conformance.CheckNamedTool} {
		require.True(t, byName[name].OK, "%s failed against real vLLM: %s", name, byName[name].Error)
	}
	auto := byName[conformance.CheckToolAuto]
	require.False(t, auto.OK, "a random-weight model made an automatic tool call")
	require.NotEmpty(t, auto.Error, "automatic tool choice failed without a reason")
	require.Equal(t, []string{conformance.CheckToolAuto}, rep.Failed())

	key, err := crypto.GenerateKey()
	require.NoError(t, err)
	svc, err := quoter.New(quoter.Config{ProviderID: "e2e-vllm", Model: model, ModelClass: "qwen3-test",
		ServingURL: f.gatewayURL(), FloorIn: big.NewInt(1000), FloorOut: big.NewInt(2000),
		CapacityURL: "http://" + f.epp.AdminAddr(), StateFile: filepath.Join(t.TempDir(), "seq"),
		Conformance: conformance.Config{MaxTokens: 64, CheckTimeout: time.Minute}}, key, zap.NewNop(), quoter.Options{})
	require.NoError(t, err)
	_, err = svc.SignOnce(ctx)
	require.ErrorContains(t, err, "conformance gate failed")
	_, ok := svc.Current()
	require.False(t, ok, "the quoter signed a quote past a failed conformance gate")
}
