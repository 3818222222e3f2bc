package quoter

import (
	"crypto/ecdsa"
	"encoding/json"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/common/math"
	"github.com/ethereum/go-ethereum/crypto"
	"github.com/ethereum/go-ethereum/signer/core/apitypes"
	"github.com/stretchr/testify/require"
)

var testNow = time.Unix(1_800_000_000, 0)

func testQuote(t *testing.T, key *ecdsa.PrivateKey) *Quote {
	t.Helper()
	nonce, err := NewNonce()
	require.NoError(t, err)
	return &Quote{ChainID: big.NewInt(8453), Provider: crypto.PubkeyToAddress(key.PublicKey), ProviderID: "acme-qwen",
		Model: "Qwen/Qwen3-32B", ModelClass: "qwen3-32b", EndpointHash: EndpointHash("https://acme.example/v1"),
		InputPricePerMTok: big.NewInt(210000), OutputPricePerMTok: big.NewInt(680000),
		HeadroomTokensPerSec: 1234, HeadroomConcurrency: 17, Seq: 42,
		IssuedAt: uint64(testNow.Unix()), Expiry: uint64(testNow.Unix()) + 30, Nonce: nonce}
}

func newKey(t *testing.T) *ecdsa.PrivateKey {
	t.Helper()
	k, err := crypto.GenerateKey()
	require.NoError(t, err)
	return k
}

func verifyAt(now time.Time) VerifyOptions {
	return VerifyOptions{Now: func() time.Time { return now }}
}

// TestSignRecoverWithGoEthereum rebuilds the typed data independently from
// the published JSON (as a generic eth_signTypedData_v4 consumer would) and
// recovers the provider with go-ethereum's EIP-712 and SigToPub.
func TestSignRecoverWithGoEthereum(t *testing.T) {
	key := newKey(t)
	sq, err := Sign(testQuote(t, key), key)
	require.NoError(t, err)
	raw, err := json.Marshal(sq)
	require.NoError(t, err)

	var generic struct {
		Domain      map[string]string          `json:"domain"`
		Types       map[string][]apitypes.Type `json:"types"`
		PrimaryType string                     `json:"primaryType"`
		Message     map[string]any             `json:"message"`
		Signature   string                     `json:"signature"`
		Signer      string                     `json:"signer"`
		Digest      string                     `json:"digest"`
	}
	require.NoError(t, json.Unmarshal(raw, &generic))
	require.NotContains(t, generic.Types, "EIP712Domain")
	for k, v := range generic.Message {
		_, isString := v.(string)
		require.True(t, isString, "message.%s must be a JSON string", k)
	}
	require.Equal(t, "8453", generic.Domain["chainId"])
	require.Equal(t, "42", generic.Message["seq"])

	chain, ok := new(big.Int).SetString(generic.Domain["chainId"], 10)
	require.True(t, ok)
	td := apitypes.TypedData{
		Types: apitypes.Types{
			"EIP712Domain":  {{Name: "name", Type: "string"}, {Name: "version", Type: "string"}, {Name: "chainId", Type: "uint256"}},
			"CapacityQuote": generic.Types["CapacityQuote"],
		},
		PrimaryType: generic.PrimaryType,
		Domain: apitypes.TypedDataDomain{Name: generic.Domain["name"], Version: generic.Domain["version"],
			ChainId: (*math.HexOrDecimal256)(chain)},
		Message: generic.Message,
	}
	digest, _, err := apitypes.TypedDataAndHash(td)
	require.NoError(t, err)
	require.Equal(t, generic.Digest, hexutil.Encode(digest))

	sig, err := hexutil.Decode(generic.Signature)
	require.NoError(t, err)
	require.Len(t, sig, 65)
	require.Contains(t, []byte{27, 28}, sig[64])
	sig[64] -= 27
	pub, err := crypto.SigToPub(digest, sig)
	require.NoError(t, err)
	want := crypto.PubkeyToAddress(key.PublicKey)
	require.Equal(t, want, crypto.PubkeyToAddress(*pub))
	require.Equal(t, want.Hex(), generic.Signer)

	// The type string is exactly the one the issue specifies.
	require.Equal(t, "CapacityQuote(address provider,string providerId,string model,string modelClass,bytes32 endpointHash,"+
		"uint256 inputPricePerMTok,uint256 outputPricePerMTok,uint64 headroomTokensPerSec,uint32 headroomConcurrency,"+
		"uint64 seq,uint64 issuedAt,uint64 expiry,uint256 nonce)", string(td.EncodeType("CapacityQuote")))

	v, err := Verify(sq, verifyAt(testNow))
	require.NoError(t, err)
	require.Equal(t, want, v.Signer)
	require.Equal(t, uint64(42), v.Seq)
}

func TestSignRefusesForeignProvider(t *testing.T) {
	key, other := newKey(t), newKey(t)
	q := testQuote(t, key)
	q.Provider = crypto.PubkeyToAddress(other.PublicKey)
	_, err := Sign(q, key)
	require.ErrorContains(t, err, "is not the signing key's address")
}

// TestTamperingBreaksVerification changes each message and domain field in
// turn; every change must fail verification.
func TestTamperingBreaksVerification(t *testing.T) {
	key := newKey(t)
	sq, err := Sign(testQuote(t, key), key)
	require.NoError(t, err)
	mv := reflect.ValueOf(&sq.Message).Elem()
	for i := range mv.NumField() {
		name := mv.Type().Field(i).Name
		t.Run("message."+name, func(t *testing.T) {
			c := *sq
			f := reflect.ValueOf(&c.Message).Elem().Field(i)
			f.SetString(tamper(f.String()))
			_, err := Verify(&c, verifyAt(testNow))
			require.Error(t, err, "tampered %s still verifies", name)
		})
	}
	for _, tc := range []struct {
		name string
		mut  func(*SignedQuote)
	}{
		{"domain.name", func(q *SignedQuote) { q.Domain.Name = "Other" }},
		{"domain.version", func(q *SignedQuote) { q.Domain.Version = "2" }},
		{"domain.chainId", func(q *SignedQuote) { q.Domain.ChainID = "1" }},
		{"primaryType", func(q *SignedQuote) { q.PrimaryType = "Quote" }},
		{"types", func(q *SignedQuote) {
			q.Types = wireTypes()
			q.Types[PrimaryType][9].Type = "uint256"
		}},
		{"signature", func(q *SignedQuote) { q.Signature = tamper(q.Signature) }},
		{"signer", func(q *SignedQuote) { q.Signer = crypto.PubkeyToAddress(newKey(t).PublicKey).Hex() }},
		{"digest", func(q *SignedQuote) { q.Digest = tamper(q.Digest) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := *sq
			c.Types = wireTypes()
			tc.mut(&c)
			_, err := Verify(&c, verifyAt(testNow))
			require.Error(t, err)
		})
	}
}

// tamper changes one character so the value stays well-formed where
// possible (a digit stays a digit, hex stays hex).
func tamper(s string) string {
	if s == "" {
		return "x"
	}
	b := []byte(s)
	i := len(b) - 1
	switch c := b[i]; {
	case c >= '0' && c < '9':
		b[i]++
	case c == '9':
		b[i] = '8'
	case c >= 'a' && c < 'f', c >= 'A' && c < 'F':
		b[i]++
	default:
		b[i] = '0'
	}
	return string(b)
}

func TestVerifyFailureReasons(t *testing.T) {
	key := newKey(t)
	sq, err := Sign(testQuote(t, key), key)
	require.NoError(t, err)
	highS := func(q *SignedQuote) {
		sig, _ := hexutil.Decode(q.Signature)
		s := new(big.Int).SetBytes(sig[32:64])
		s.Sub(crypto.S256().Params().N, s)
		copy(sig[32:64], common.LeftPadBytes(s.Bytes(), 32))
		sig[64] = 55 - sig[64] // 27 <-> 28
		q.Signature = hexutil.Encode(sig)
	}
	for _, tc := range []struct {
		name string
		mut  func(*SignedQuote)
		opts VerifyOptions
		want error
		text string
	}{
		{name: "valid at issue", opts: verifyAt(testNow)},
		{name: "valid within skew", opts: verifyAt(testNow.Add(-4 * time.Second))},
		{name: "future beyond skew", opts: verifyAt(testNow.Add(-6 * time.Second)), want: ErrNotYetValid, text: "ahead of this clock"},
		{name: "custom skew", opts: VerifyOptions{Now: func() time.Time { return testNow.Add(-6 * time.Second) }, MaxSkew: 10 * time.Second}},
		{name: "expired at expiry", opts: verifyAt(testNow.Add(30 * time.Second)), want: ErrExpired, text: "expired at"},
		{name: "valid just before expiry", opts: verifyAt(testNow.Add(29 * time.Second))},
		{name: "wrong chain", opts: VerifyOptions{Now: verifyAt(testNow).Now, ChainID: big.NewInt(1)}, want: ErrWrongDomain, text: "chainId 8453, want 1"},
		{name: "wrong expected signer", opts: VerifyOptions{Now: verifyAt(testNow).Now, Signer: common.HexToAddress("0x1")}, want: ErrSignerMismatch},
		{name: "max ttl", opts: VerifyOptions{Now: verifyAt(testNow).Now, MaxTTL: 10 * time.Second}, want: ErrBadValidityRange, text: "TTL 30s"},
		{name: "v=0", mut: func(q *SignedQuote) { q.Signature = q.Signature[:130] + "00" }, opts: verifyAt(testNow), want: ErrBadSignature, text: "want 27 or 28"},
		{name: "short signature", mut: func(q *SignedQuote) { q.Signature = q.Signature[:128] }, opts: verifyAt(testNow), want: ErrBadSignature, text: "63 bytes"},
		{name: "high s", mut: highS, opts: verifyAt(testNow), want: ErrBadSignature, text: "low-s"},
		{name: "signer field", mut: func(q *SignedQuote) { q.Signer = "0x0000000000000000000000000000000000000001" }, opts: verifyAt(testNow), want: ErrSignerMismatch},
		{name: "no digest", mut: func(q *SignedQuote) { q.Digest = "" }, opts: verifyAt(testNow), want: ErrMalformed, text: "digest is missing"},
		{name: "digest field", mut: func(q *SignedQuote) { q.Digest = tamper(q.Digest) }, opts: verifyAt(testNow), want: ErrDigestMismatch},
		{name: "hex integer", mut: func(q *SignedQuote) { q.Message.Seq = "0x2a" }, opts: verifyAt(testNow), want: ErrMalformed, text: "decimal"},
		{name: "tampered headroom", mut: func(q *SignedQuote) { q.Message.HeadroomConcurrency = "18" }, opts: verifyAt(testNow), want: ErrDigestMismatch},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := *sq
			if tc.mut != nil {
				tc.mut(&c)
			}
			_, err := Verify(&c, tc.opts)
			if tc.want == nil {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, tc.want)
			require.ErrorContains(t, err, tc.text)
		})
	}
}

func TestParseSignedQuoteStrict(t *testing.T) {
	key := newKey(t)
	sq, err := Sign(testQuote(t, key), key)
	require.NoError(t, err)
	raw, err := json.Marshal(sq)
	require.NoError(t, err)
	back, err := ParseSignedQuote(raw)
	require.NoError(t, err)
	require.Equal(t, sq, back)
	for _, bad := range []string{
		`{`,
		strings.Replace(string(raw), `"digest"`, `"extra":1,"digest"`, 1),
		string(raw) + `{}`,
	} {
		_, err := ParseSignedQuote([]byte(bad))
		require.ErrorIs(t, err, ErrMalformed)
	}
}

func FuzzParseAndVerify(f *testing.F) {
	key, err := crypto.GenerateKey()
	require.NoError(f, err)
	nonce, err := NewNonce()
	require.NoError(f, err)
	q := &Quote{ChainID: big.NewInt(1), Provider: crypto.PubkeyToAddress(key.PublicKey), InputPricePerMTok: big.NewInt(1),
		OutputPricePerMTok: big.NewInt(2), Seq: 1, IssuedAt: 1, Expiry: 2, Nonce: nonce}
	sq, err := Sign(q, key)
	require.NoError(f, err)
	raw, err := json.Marshal(sq)
	require.NoError(f, err)
	f.Add(raw)
	f.Add([]byte(`{"domain":{},"types":{},"message":{}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		sq, err := ParseSignedQuote(data)
		if err != nil {
			return
		}
		_, _ = Verify(sq, VerifyOptions{Now: func() time.Time { return time.Unix(1, 0) }})
	})
}

// TestEthersVerifiesQuote checks the same JSON with ethers v6 in Node, an
// implementation independent of go-ethereum.
func TestEthersVerifiesQuote(t *testing.T) {
	dir, err := filepath.Abs("testdata/ethers")
	require.NoError(t, err)
	_, err = os.Stat(filepath.Join(dir, "node_modules", "ethers", "package.json"))
	require.NoError(t, err, "ethers is not installed for the Node verification test; run: npm ci --prefix quoter/testdata/ethers")
	node, err := exec.LookPath("node")
	require.NoError(t, err, "node is required for the ethers verification test")

	key := newKey(t)
	sq, err := Sign(testQuote(t, key), key)
	require.NoError(t, err)
	good := writeQuote(t, sq)
	bad := *sq
	bad.Message.HeadroomTokensPerSec = "999999"
	badPath := writeQuote(t, &bad)

	out, err := exec.Command(node, filepath.Join(dir, "verify.mjs"), good).CombinedOutput()
	require.NoError(t, err, "ethers rejected a valid quote: %s", out)
	require.Contains(t, string(out), "VALID "+crypto.PubkeyToAddress(key.PublicKey).Hex())

	out, err = exec.Command(node, filepath.Join(dir, "verify.mjs"), badPath).CombinedOutput()
	require.Error(t, err, "ethers accepted a tampered quote: %s", out)
	require.Contains(t, string(out), "INVALID")
}

func writeQuote(t *testing.T, sq *SignedQuote) string {
	t.Helper()
	raw, err := json.MarshalIndent(sq, "", "  ")
	require.NoError(t, err)
	p := filepath.Join(t.TempDir(), "quote.json")
	require.NoError(t, os.WriteFile(p, raw, 0o600))
	return p
}

func BenchmarkSign(b *testing.B) {
	key, err := crypto.GenerateKey()
	require.NoError(b, err)
	nonce, err := NewNonce()
	require.NoError(b, err)
	q := &Quote{ChainID: big.NewInt(1), Provider: crypto.PubkeyToAddress(key.PublicKey), ProviderID: "p", Model: "m",
		InputPricePerMTok: big.NewInt(1), OutputPricePerMTok: big.NewInt(2), Seq: 1, IssuedAt: 1, Expiry: 31, Nonce: nonce}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Sign(q, key); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkVerify(b *testing.B) {
	key, err := crypto.GenerateKey()
	require.NoError(b, err)
	nonce, err := NewNonce()
	require.NoError(b, err)
	q := &Quote{ChainID: big.NewInt(1), Provider: crypto.PubkeyToAddress(key.PublicKey), ProviderID: "p", Model: "m",
		InputPricePerMTok: big.NewInt(1), OutputPricePerMTok: big.NewInt(2), Seq: 1, IssuedAt: 1, Expiry: 31, Nonce: nonce}
	sq, err := Sign(q, key)
	require.NoError(b, err)
	opts := VerifyOptions{Now: func() time.Time { return time.Unix(2, 0) }}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Verify(sq, opts); err != nil {
			b.Fatal(err)
		}
	}
}
