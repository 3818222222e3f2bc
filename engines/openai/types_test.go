package openai

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestAppendContentText(t *testing.T) {
	cases := []struct {
		name, content, want, wantErr string
	}{
		{"string with escapes", `"a\"b\n\u00e9"`, "a\"b\né", ""},
		{"text parts in order, others skipped", `[{"type":"text","text":"x"},{"type":"image_url"},{"type":"output_text","text":"y"}]`, "xy", ""},
		{"null", `null`, "", ""},
		{"absent", ``, "", ""},
		{"bad string", `"\x"`, "", "cannot decode message content"},
		{"not text", `{"a":1}`, "", "a string or a list of parts"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := Message{Role: "user", Content: json.RawMessage(tc.content)}
			got, err := m.AppendContentText([]byte("pre:"))
			text, terr := m.ContentText()
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				require.ErrorContains(t, terr, tc.wantErr)
				require.Equal(t, "pre:", string(got), "an error leaves dst as it was")
				return
			}
			require.NoError(t, err)
			require.NoError(t, terr)
			require.Equal(t, "pre:"+tc.want, string(got))
			require.Equal(t, tc.want, text)
		})
	}
}
