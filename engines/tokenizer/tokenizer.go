// Package tokenizer turns prompt text into the token ids an engine sees. The
// simulator and the EPP use the same interface, so the simulator caches
// exactly the tokens the router asks the index about.
package tokenizer

// Tokenizer encodes text into token ids. Implementations are safe for
// concurrent use.
type Tokenizer interface {
	// Name identifies the tokenizer (a model id or "standin").
	Name() string
	// Encode appends the ids of text to dst and returns the extended slice.
	// Special tokens written literally in text (e.g. "<|im_start|>") are
	// matched as the reference tokenizer matches added tokens. Encode
	// keeps nothing of text after it returns: the EPP passes prompt text
	// over a buffer it reuses (extproc's TestAppendPromptReusesText).
	Encode(dst []uint32, text string) []uint32
}
