// Package toolprofile owns the reviewed model-family registry
// (deploy/config/tool-profiles.tsv): which vLLM and SGLang tool-call parser
// a model needs, resolution of TOOL_PROFILE=auto|custom for the installer
// (failing closed on unknown families), and the generated Omnious tool
// contract file (deploy/config/omnious-model-tool-profiles.json).
package toolprofile

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/omnious/provider-node/quoter/conformance"
)

// Engines.
const (
	EngineVLLM   = "vllm"
	EngineSGLang = "sglang"
)

// Modes of TOOL_PROFILE.
const (
	ModeAuto   = "auto"
	ModeCustom = "custom"
)

// columns is the TSV header, in order.
var columns = []string{"family", "match", "vllm_tool_call_parser", "vllm_reasoning_parser",
	"sglang_tool_call_parser", "reviewed", "notes"}

// Profile is one reviewed model family.
type Profile struct {
	Family string
	// Match is a case-insensitive regexp on the exact model id.
	Match string
	// VLLMParser is vLLM's --tool-call-parser.
	VLLMParser string
	// VLLMReasoningParser is vLLM's --reasoning-parser ("" if none).
	VLLMReasoningParser string
	// SGLangParser is SGLang's --tool-call-parser ("" = unsupported).
	SGLangParser string
	// Reviewed is when the row was last reviewed.
	Reviewed time.Time
	Notes    string
	re       *regexp.Regexp
}

// Registry is the ordered list of profiles; the first match wins.
type Registry struct {
	Profiles []Profile
}

// parserName is what a parser flag may hold: no shell metacharacters, so
// an installer can splice it into a command line.
var parserName = regexp.MustCompile(`^[a-z0-9][a-z0-9_.-]{0,63}$`)

func dash(s string) string {
	if s == "-" {
		return ""
	}
	return s
}

// Load reads a registry file.
func Load(path string) (*Registry, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("cannot open tool profiles: %w", err)
	}
	defer f.Close()
	r, err := Parse(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return r, nil
}

// Parse reads the TSV: '#' comment lines, a header row, then profiles.
func Parse(rd io.Reader) (*Registry, error) {
	sc := bufio.NewScanner(rd)
	reg := &Registry{}
	header := false
	families := map[string]bool{}
	line := 0
	for sc.Scan() {
		line++
		text := strings.TrimRight(sc.Text(), "\r")
		if strings.TrimSpace(text) == "" || strings.HasPrefix(text, "#") {
			continue
		}
		cells := strings.Split(text, "\t")
		if !header {
			if strings.Join(cells, ",") != strings.Join(columns, ",") {
				return nil, fmt.Errorf("line %d: header is %q, want %q", line, cells, columns)
			}
			header = true
			continue
		}
		if len(cells) != len(columns) {
			return nil, fmt.Errorf("line %d: %d columns, want %d", line, len(cells), len(columns))
		}
		p := Profile{Family: cells[0], Match: cells[1], VLLMParser: dash(cells[2]),
			VLLMReasoningParser: dash(cells[3]), SGLangParser: dash(cells[4]), Notes: dash(cells[6])}
		if p.Family == "" || families[p.Family] {
			return nil, fmt.Errorf("line %d: family %q is empty or repeated", line, p.Family)
		}
		families[p.Family] = true
		re, err := regexp.Compile("(?i)" + p.Match)
		if err != nil {
			return nil, fmt.Errorf("line %d: bad match pattern: %w", line, err)
		}
		p.re = re
		if p.VLLMParser == "" {
			return nil, fmt.Errorf("line %d: %s has no vLLM parser", line, p.Family)
		}
		for _, name := range []string{p.VLLMParser, p.VLLMReasoningParser, p.SGLangParser} {
			if name != "" && !parserName.MatchString(name) {
				return nil, fmt.Errorf("line %d: parser name %q is not [a-z0-9_.-]", line, name)
			}
		}
		if p.Reviewed, err = time.Parse(time.DateOnly, cells[5]); err != nil {
			return nil, fmt.Errorf("line %d: reviewed date %q is not YYYY-MM-DD", line, cells[5])
		}
		reg.Profiles = append(reg.Profiles, p)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("cannot read tool profiles: %w", err)
	}
	if !header || len(reg.Profiles) == 0 {
		return nil, errors.New("no profiles found")
	}
	return reg, nil
}

// Lookup returns the first profile whose pattern matches modelID.
func (r *Registry) Lookup(modelID string) (Profile, bool) {
	for _, p := range r.Profiles {
		if p.re.MatchString(modelID) {
			return p, true
		}
	}
	return Profile{}, false
}

// Request is what the installer knows: TOOL_PROFILE, MODEL_ID, ENGINE and,
// for custom, the explicit parser.
type Request struct {
	Mode    string // auto (default) or custom
	ModelID string
	Engine  string // vllm (default) or sglang
	// CustomParser is VLLM_TOOL_CALL_PARSER (or SGLANG_TOOL_CALL_PARSER for
	// SGLang) when Mode is custom.
	CustomParser string
}

// Resolution is the parser configuration to deploy.
type Resolution struct {
	Family          string `json:"family"`
	Engine          string `json:"engine"`
	Parser          string `json:"tool_call_parser"`
	ReasoningParser string `json:"reasoning_parser,omitempty"`
	Source          string `json:"source"` // "registry" or "custom"
}

// ErrUnknownFamily is returned when auto finds no reviewed family: the
// installer must stop rather than guess a parser.
var ErrUnknownFamily = errors.New("no reviewed tool profile")

// Resolve applies TOOL_PROFILE semantics; every failure is final (fail
// closed) and says what to do.
func (r *Registry) Resolve(req Request) (Resolution, error) {
	if req.Engine == "" {
		req.Engine = EngineVLLM
	}
	if req.Mode == "" {
		req.Mode = ModeAuto
	}
	if req.Engine != EngineVLLM && req.Engine != EngineSGLang {
		return Resolution{}, fmt.Errorf("ENGINE %q is not vllm or sglang", req.Engine)
	}
	switch req.Mode {
	case ModeCustom:
		if req.CustomParser == "" {
			return Resolution{}, errors.New("TOOL_PROFILE=custom needs VLLM_TOOL_CALL_PARSER (SGLANG_TOOL_CALL_PARSER for SGLang) set to the model's official parser")
		}
		if !parserName.MatchString(req.CustomParser) {
			return Resolution{}, fmt.Errorf("custom tool-call parser %q is not a parser name ([a-z0-9_.-])", req.CustomParser)
		}
		return Resolution{Family: "custom", Engine: req.Engine, Parser: req.CustomParser, Source: "custom"}, nil
	case ModeAuto:
	default:
		return Resolution{}, fmt.Errorf("TOOL_PROFILE %q is not auto or custom", req.Mode)
	}
	if req.ModelID == "" {
		return Resolution{}, errors.New("TOOL_PROFILE=auto needs MODEL_ID")
	}
	p, ok := r.Lookup(req.ModelID)
	if !ok {
		return Resolution{}, fmt.Errorf("%w for model %q: refusing to deploy without a reviewed tool-call parser; "+
			"add the family to deploy/config/tool-profiles.tsv after review, or set TOOL_PROFILE=custom "+
			"VLLM_TOOL_CALL_PARSER=<official parser>", ErrUnknownFamily, req.ModelID)
	}
	res := Resolution{Family: p.Family, Engine: req.Engine, Source: "registry"}
	if req.Engine == EngineSGLang {
		if p.SGLangParser == "" {
			return Resolution{}, fmt.Errorf("%w for %s (%q) on SGLang: no SGLang tool-call parser is listed; "+
				"use ENGINE=vllm or TOOL_PROFILE=custom", ErrUnknownFamily, p.Family, req.ModelID)
		}
		res.Parser = p.SGLangParser
		return res, nil
	}
	res.Parser, res.ReasoningParser = p.VLLMParser, p.VLLMReasoningParser
	return res, nil
}

// ContractVersion names the Omnious tool contract every approved model is
// held to; it is owned by Omnious and independent of any engine parser.
const ContractVersion = "omnious-tools/v1"

// GenerateJSON renders omnious-model-tool-profiles.json: the Omnious tool
// contract per approved family, with the self-hosted parser settings kept
// in a separate section. Output is deterministic (no timestamps).
func (r *Registry) GenerateJSON() ([]byte, error) {
	type model struct {
		Family   string `json:"family"`
		Match    string `json:"match"`
		Contract string `json:"contract"`
		Reviewed string `json:"reviewed"`
	}
	type parsers struct {
		Family              string `json:"family"`
		VLLMParser          string `json:"vllm_tool_call_parser"`
		VLLMReasoningParser string `json:"vllm_reasoning_parser,omitempty"`
		SGLangParser        string `json:"sglang_tool_call_parser,omitempty"`
		Notes               string `json:"notes,omitempty"`
	}
	doc := struct {
		Comment     string         `json:"_comment"`
		Schema      int            `json:"schema"`
		Source      string         `json:"source"`
		Contracts   map[string]any `json:"contracts"`
		Models      []model        `json:"models"`
		SelfHosted  []parsers      `json:"self_hosted_parsers"`
		Unsupported string         `json:"unknown_family_policy"`
	}{
		Comment: "Generated by `go run ./cmd/quoter tool-profiles-json` from tool-profiles.tsv; do not edit.",
		Schema:  1,
		Source:  "deploy/config/tool-profiles.tsv",
		Contracts: map[string]any{ContractVersion: map[string]any{
			"api":                   "openai.chat.completions",
			"tool_choice":           []string{"auto", "required", "named", "none"},
			"streaming_tool_calls":  "delta.tool_calls[]: first delta has index, id, type=function, function.name; later deltas add function.arguments fragments",
			"finish_reason":         map[string]string{"auto": "tool_calls", "required": "tool_calls", "named": "stop"},
			"conformance_checks":    conformance.Full.Checks(),
			"quote_gate_checks":     conformance.Quick.Checks(),
			"runtime_support_from":  "model_capabilities row of the exact provider/model after conformance",
			"aggregator_metadata":   "translated by an adapter; never the contract or auction eligibility",
			"self_hosted_parser_is": "deployment detail; managed endpoints need none but pass the same checks",
		}},
		Unsupported: "fail closed: no quote and no deployment until a parser is reviewed",
	}
	for _, p := range r.Profiles {
		doc.Models = append(doc.Models, model{Family: p.Family, Match: p.Match, Contract: ContractVersion,
			Reviewed: p.Reviewed.Format(time.DateOnly)})
		doc.SelfHosted = append(doc.SelfHosted, parsers{Family: p.Family, VLLMParser: p.VLLMParser,
			VLLMReasoningParser: p.VLLMReasoningParser, SGLangParser: p.SGLangParser, Notes: p.Notes})
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	if err := enc.Encode(doc); err != nil {
		return nil, fmt.Errorf("cannot encode tool profiles JSON: %w", err)
	}
	return buf.Bytes(), nil
}
