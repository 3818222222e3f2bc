package tokenizer

// Accessors the tests read the loaded configuration with; users get the
// template compiled (NewChatTemplate) and added tokens from AddedToken.

// ChatTemplate returns the Jinja chat template, or "" when the model has none.
func (t *HF) ChatTemplate() string { return t.chatTemplate }

// BOSToken returns the beginning-of-sequence token string of the config.
func (t *HF) BOSToken() string { return t.bosToken }

// EOSToken returns the end-of-sequence token string of the config.
func (t *HF) EOSToken() string { return t.eosToken }

// AddedTokenID is AddedToken.
func (t *HF) AddedTokenID(content string) (uint32, bool) { return t.AddedToken(content) }
