// Package quoter owns the provider's signed capacity quotes: the EIP-712
// CapacityQuote, its eth_signTypedData_v4 wire format and verification, the
// persisted per-model sequence, signing keys, the health breaker that stops
// renewing quotes when the node is unhealthy, and the service loop that
// reads the EPP's capacity snapshot, signs, publishes and serves quotes.
package quoter

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"strconv"
	"strings"
	"time"

	"github.com/ethereum/go-ethereum/common"
	"github.com/ethereum/go-ethereum/common/hexutil"
	"github.com/ethereum/go-ethereum/common/math"
	"github.com/ethereum/go-ethereum/crypto"
	"github.com/ethereum/go-ethereum/signer/core/apitypes"

	"github.com/omnious/provider-node/internal/opt"
)

// EIP-712 identity of a quote. Changing any of these invalidates every
// verifier in the market, so they are constants, not configuration.
const (
	DomainName    = "OmniousCapacityQuote"
	DomainVersion = "1"
	PrimaryType   = "CapacityQuote"
)

// quoteFields is the CapacityQuote struct in signing order.
var quoteFields = []apitypes.Type{
	{Name: "provider", Type: "address"},
	{Name: "providerId", Type: "string"},
	{Name: "model", Type: "string"},
	{Name: "modelClass", Type: "string"},
	{Name: "endpointHash", Type: "bytes32"},
	{Name: "inputPricePerMTok", Type: "uint256"},
	{Name: "outputPricePerMTok", Type: "uint256"},
	{Name: "headroomTokensPerSec", Type: "uint64"},
	{Name: "headroomConcurrency", Type: "uint32"},
	{Name: "seq", Type: "uint64"},
	{Name: "issuedAt", Type: "uint64"},
	{Name: "expiry", Type: "uint64"},
	{Name: "nonce", Type: "uint256"},
}

var domainFields = []apitypes.Type{
	{Name: "name", Type: "string"},
	{Name: "version", Type: "string"},
	{Name: "chainId", Type: "uint256"},
}

// Quote is the content of a CapacityQuote before signing.
type Quote struct {
	ChainID              *big.Int
	Provider             common.Address
	ProviderID           string
	Model                string
	ModelClass           string
	EndpointHash         common.Hash
	InputPricePerMTok    *big.Int
	OutputPricePerMTok   *big.Int
	HeadroomTokensPerSec uint64
	HeadroomConcurrency  uint32
	Seq                  uint64
	IssuedAt             uint64 // Unix seconds
	Expiry               uint64 // Unix seconds
	Nonce                *big.Int
}

// EndpointHash is keccak256 of the serving URL exactly as configured: the
// market hashes the same string, so it is deliberately not normalised.
func EndpointHash(servingURL string) common.Hash {
	return crypto.Keccak256Hash([]byte(servingURL))
}

// NewNonce returns a uniformly random 256-bit nonce.
func NewNonce() (*big.Int, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, fmt.Errorf("cannot read random nonce: %w", err)
	}
	return new(big.Int).SetBytes(b[:]), nil
}

// WireDomain is the EIP-712 domain as published (chainId a decimal string).
type WireDomain struct {
	Name    string `json:"name"`
	Version string `json:"version"`
	ChainID string `json:"chainId"`
}

// WireMessage is the CapacityQuote message as published: every integer a
// decimal string, the address EIP-55 checksummed, bytes32 0x-hex.
type WireMessage struct {
	Provider             string `json:"provider"`
	ProviderID           string `json:"providerId"`
	Model                string `json:"model"`
	ModelClass           string `json:"modelClass"`
	EndpointHash         string `json:"endpointHash"`
	InputPricePerMTok    string `json:"inputPricePerMTok"`
	OutputPricePerMTok   string `json:"outputPricePerMTok"`
	HeadroomTokensPerSec string `json:"headroomTokensPerSec"`
	HeadroomConcurrency  string `json:"headroomConcurrency"`
	Seq                  string `json:"seq"`
	IssuedAt             string `json:"issuedAt"`
	Expiry               string `json:"expiry"`
	Nonce                string `json:"nonce"`
}

// SignedQuote is the published quote: eth_signTypedData_v4 input (types
// without EIP712Domain, as ethers expects) plus signature, signer and digest.
type SignedQuote struct {
	Domain      WireDomain                 `json:"domain"`
	Types       map[string][]apitypes.Type `json:"types"`
	PrimaryType string                     `json:"primaryType"`
	Message     WireMessage                `json:"message"`
	Signature   string                     `json:"signature"`
	Signer      string                     `json:"signer"`
	Digest      string                     `json:"digest"`
}

func (q *Quote) wire() (WireDomain, WireMessage, error) {
	for name, v := range map[string]*big.Int{"chainId": q.ChainID, "inputPricePerMTok": q.InputPricePerMTok,
		"outputPricePerMTok": q.OutputPricePerMTok, "nonce": q.Nonce} {
		if v == nil || v.Sign() < 0 || v.BitLen() > 256 {
			return WireDomain{}, WireMessage{}, fmt.Errorf("%s must be a uint256, got %v", name, v)
		}
	}
	d := WireDomain{Name: DomainName, Version: DomainVersion, ChainID: q.ChainID.String()}
	m := WireMessage{
		Provider:             q.Provider.Hex(),
		ProviderID:           q.ProviderID,
		Model:                q.Model,
		ModelClass:           q.ModelClass,
		EndpointHash:         q.EndpointHash.Hex(),
		InputPricePerMTok:    q.InputPricePerMTok.String(),
		OutputPricePerMTok:   q.OutputPricePerMTok.String(),
		HeadroomTokensPerSec: strconv.FormatUint(q.HeadroomTokensPerSec, 10),
		HeadroomConcurrency:  strconv.FormatUint(uint64(q.HeadroomConcurrency), 10),
		Seq:                  strconv.FormatUint(q.Seq, 10),
		IssuedAt:             strconv.FormatUint(q.IssuedAt, 10),
		Expiry:               strconv.FormatUint(q.Expiry, 10),
		Nonce:                q.Nonce.String(),
	}
	return d, m, nil
}

// wireTypes is the published types object (no EIP712Domain).
func wireTypes() map[string][]apitypes.Type {
	return map[string][]apitypes.Type{PrimaryType: append([]apitypes.Type(nil), quoteFields...)}
}

// typedDataDigest computes the EIP-712 digest with go-ethereum's own
// implementation, so signer and verifier cannot drift from the standard.
func typedDataDigest(d WireDomain, m WireMessage) ([]byte, error) {
	chainID, ok := new(big.Int).SetString(d.ChainID, 10)
	if !ok || chainID.Sign() < 0 {
		return nil, fmt.Errorf("domain chainId %q is not a decimal uint256", d.ChainID)
	}
	raw, err := json.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("cannot encode message: %w", err)
	}
	msg := apitypes.TypedDataMessage{}
	if err := json.Unmarshal(raw, &msg); err != nil {
		return nil, fmt.Errorf("cannot re-decode message: %w", err)
	}
	// Integers travel as decimal strings; go-ethereum would read a bare
	// "0x…" string as hex, so insist on plain decimal digits first.
	for _, f := range quoteFields {
		if strings.HasPrefix(f.Type, "uint") {
			s, _ := msg[f.Name].(string)
			if !isDecimal(s) {
				return nil, fmt.Errorf("message.%s %q is not a decimal integer string", f.Name, s)
			}
		}
	}
	td := apitypes.TypedData{
		Types:       apitypes.Types{"EIP712Domain": domainFields, PrimaryType: quoteFields},
		PrimaryType: PrimaryType,
		Domain:      apitypes.TypedDataDomain{Name: d.Name, Version: d.Version, ChainId: (*math.HexOrDecimal256)(chainID)},
		Message:     msg,
	}
	digest, _, err := apitypes.TypedDataAndHash(td)
	if err != nil {
		return nil, fmt.Errorf("cannot hash typed data: %w", err)
	}
	return digest, nil
}

func isDecimal(s string) bool {
	if s == "" || len(s) > 78 || (len(s) > 1 && s[0] == '0') {
		return false
	}
	for _, c := range []byte(s) {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// Sign signs q with key. q.Provider must be the key's address: a quote
// whose provider field disagrees with its signer is useless to the market.
func Sign(q *Quote, key *ecdsa.PrivateKey) (*SignedQuote, error) {
	addr := crypto.PubkeyToAddress(key.PublicKey)
	if q.Provider != addr {
		return nil, fmt.Errorf("quote provider %s is not the signing key's address %s", q.Provider.Hex(), addr.Hex())
	}
	d, m, err := q.wire()
	if err != nil {
		return nil, err
	}
	digest, err := typedDataDigest(d, m)
	if err != nil {
		return nil, err
	}
	sig, err := crypto.Sign(digest, key)
	if err != nil {
		return nil, fmt.Errorf("cannot sign quote: %w", err)
	}
	sig[crypto.RecoveryIDOffset] += 27 // eth_signTypedData_v4 convention
	return &SignedQuote{Domain: d, Types: wireTypes(), PrimaryType: PrimaryType, Message: m,
		Signature: hexutil.Encode(sig), Signer: addr.Hex(), Digest: hexutil.Encode(digest)}, nil
}

// Failure classes of Verify; errors wrap one of these so callers (and the
// CLI's exit reason) can tell them apart with errors.Is.
var (
	ErrMalformed        = errors.New("malformed quote")
	ErrWrongDomain      = errors.New("wrong EIP-712 domain or types")
	ErrDigestMismatch   = errors.New("digest does not match the typed data")
	ErrBadSignature     = errors.New("invalid signature")
	ErrSignerMismatch   = errors.New("signer mismatch")
	ErrExpired          = errors.New("quote expired")
	ErrNotYetValid      = errors.New("quote issued in the future beyond the allowed clock skew")
	ErrBadValidityRange = errors.New("quote validity range is invalid")
)

// VerifyOptions tune Verify. The zero value checks against time.Now with a
// 5 s skew allowance and accepts any chain.
type VerifyOptions struct {
	// Now is the verifier's clock. Default time.Now.
	Now func() time.Time
	// MaxSkew is how far in the future issuedAt may be. Zero means the
	// default, 5s; a negative one is refused.
	MaxSkew time.Duration
	// MaxTTL bounds expiry-issuedAt. Default 0 (no bound); a negative one
	// is refused.
	MaxTTL time.Duration
	// ChainID, when set, must equal the domain's chainId.
	ChainID *big.Int
	// Signer, when non-zero, must be the recovered signer.
	Signer common.Address
}

// Verified is what Verify established about a quote.
type Verified struct {
	Signer   common.Address
	Seq      uint64
	IssuedAt time.Time
	Expiry   time.Time
}

// Verify checks the quote's structure, digest, signature, signer (against
// the signer field, message.provider and opts.Signer), expiry and skew.
// Expiry is strict (no skew allowance): a consumer must never act on a
// quote its own clock says has lapsed.
func Verify(sq *SignedQuote, opts VerifyOptions) (Verified, error) {
	var v Verified
	if opts.Now == nil {
		opts.Now = time.Now
	}
	opt.Zero(&opts.MaxSkew, 5*time.Second)
	if err := errors.Join(opt.DefaultNonNegative("--max-skew", opts.MaxSkew, 5*time.Second),
		opt.NonNegative("--max-ttl", opts.MaxTTL)); err != nil {
		return v, err
	}
	if sq.PrimaryType != PrimaryType {
		return v, fmt.Errorf("%w: primaryType %q, want %q", ErrWrongDomain, sq.PrimaryType, PrimaryType)
	}
	if sq.Domain.Name != DomainName || sq.Domain.Version != DomainVersion {
		return v, fmt.Errorf("%w: domain %q version %q, want %q version %q", ErrWrongDomain,
			sq.Domain.Name, sq.Domain.Version, DomainName, DomainVersion)
	}
	if err := checkTypes(sq.Types); err != nil {
		return v, err
	}
	if opts.ChainID != nil && sq.Domain.ChainID != opts.ChainID.String() {
		return v, fmt.Errorf("%w: chainId %s, want %s", ErrWrongDomain, sq.Domain.ChainID, opts.ChainID)
	}
	digest, err := typedDataDigest(sq.Domain, sq.Message)
	if err != nil {
		return v, fmt.Errorf("%w: %w", ErrMalformed, err)
	}
	if sq.Digest == "" {
		return v, fmt.Errorf("%w: digest is missing", ErrMalformed)
	}
	if !strings.EqualFold(sq.Digest, hexutil.Encode(digest)) {
		return v, fmt.Errorf("%w: published %s, computed %s", ErrDigestMismatch, sq.Digest, hexutil.Encode(digest))
	}
	signer, err := recoverSigner(digest, sq.Signature)
	if err != nil {
		return v, err
	}
	if !common.IsHexAddress(sq.Signer) || common.HexToAddress(sq.Signer) != signer {
		return v, fmt.Errorf("%w: signature recovers %s, quote claims signer %q", ErrSignerMismatch, signer.Hex(), sq.Signer)
	}
	if common.HexToAddress(sq.Message.Provider) != signer {
		return v, fmt.Errorf("%w: signature recovers %s, message.provider is %s", ErrSignerMismatch, signer.Hex(), sq.Message.Provider)
	}
	if opts.Signer != (common.Address{}) && signer != opts.Signer {
		return v, fmt.Errorf("%w: signed by %s, expected %s", ErrSignerMismatch, signer.Hex(), opts.Signer.Hex())
	}
	seq, _ := strconv.ParseUint(sq.Message.Seq, 10, 64)
	issued, _ := strconv.ParseUint(sq.Message.IssuedAt, 10, 64)
	expiry, _ := strconv.ParseUint(sq.Message.Expiry, 10, 64)
	v = Verified{Signer: signer, Seq: seq, IssuedAt: time.Unix(int64(issued), 0), Expiry: time.Unix(int64(expiry), 0)}
	if expiry <= issued {
		return v, fmt.Errorf("%w: expiry %d is not after issuedAt %d", ErrBadValidityRange, expiry, issued)
	}
	if opts.MaxTTL > 0 && time.Duration(expiry-issued)*time.Second > opts.MaxTTL {
		return v, fmt.Errorf("%w: TTL %ds exceeds the allowed %s", ErrBadValidityRange, expiry-issued, opts.MaxTTL)
	}
	now := opts.Now()
	if v.IssuedAt.After(now.Add(opts.MaxSkew)) {
		return v, fmt.Errorf("%w: issuedAt %s is %s ahead of this clock (allowed skew %s)", ErrNotYetValid,
			v.IssuedAt.UTC().Format(time.RFC3339), v.IssuedAt.Sub(now).Round(time.Second), opts.MaxSkew)
	}
	if !now.Before(v.Expiry) {
		return v, fmt.Errorf("%w: expired at %s, %s ago", ErrExpired, v.Expiry.UTC().Format(time.RFC3339),
			now.Sub(v.Expiry).Round(time.Second))
	}
	return v, nil
}

func checkTypes(types map[string][]apitypes.Type) error {
	if len(types) != 1 || len(types[PrimaryType]) != len(quoteFields) {
		return fmt.Errorf("%w: types must hold exactly %s with %d fields", ErrWrongDomain, PrimaryType, len(quoteFields))
	}
	for i, f := range types[PrimaryType] {
		if f != quoteFields[i] {
			return fmt.Errorf("%w: field %d is %s %s, want %s %s", ErrWrongDomain, i, f.Type, f.Name,
				quoteFields[i].Type, quoteFields[i].Name)
		}
	}
	return nil
}

func recoverSigner(digest []byte, signature string) (common.Address, error) {
	sig, err := hexutil.Decode(signature)
	if err != nil {
		return common.Address{}, fmt.Errorf("%w: signature is not 0x-hex: %w", ErrBadSignature, err)
	}
	if len(sig) != crypto.SignatureLength {
		return common.Address{}, fmt.Errorf("%w: signature has %d bytes, want 65", ErrBadSignature, len(sig))
	}
	v := sig[crypto.RecoveryIDOffset]
	if v != 27 && v != 28 {
		return common.Address{}, fmt.Errorf("%w: v is %d, want 27 or 28", ErrBadSignature, v)
	}
	sig[crypto.RecoveryIDOffset] = v - 27
	r, s := new(big.Int).SetBytes(sig[:32]), new(big.Int).SetBytes(sig[32:64])
	// Reject high-s signatures: they are malleable copies of valid ones.
	if !crypto.ValidateSignatureValues(v-27, r, s, true) {
		return common.Address{}, fmt.Errorf("%w: r/s out of range or s not canonical (low-s)", ErrBadSignature)
	}
	pub, err := crypto.SigToPub(digest, sig)
	if err != nil {
		return common.Address{}, fmt.Errorf("%w: cannot recover public key: %w", ErrBadSignature, err)
	}
	return crypto.PubkeyToAddress(*pub), nil
}

// ParseSignedQuote decodes a published quote strictly (unknown fields are
// an error, so a field added by a tamperer is not silently ignored).
func ParseSignedQuote(data []byte) (*SignedQuote, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var sq SignedQuote
	if err := dec.Decode(&sq); err != nil {
		return nil, fmt.Errorf("%w: cannot decode quote JSON: %w", ErrMalformed, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%w: trailing data after the quote JSON", ErrMalformed)
	}
	return &sq, nil
}
