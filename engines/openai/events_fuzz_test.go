package openai

import (
	"errors"
	"strings"
	"testing"
)

// FuzzEvents reads any body, split into reads of any size, under any line
// bound. Events must agree with a line-by-line reference: the same data in
// order, ErrLineTooLong exactly where the reference finds the first line
// over the bound (and no data longer than it), no other error. The input's
// lines, written back as a well-formed stream (LF or CRLF, with
// keep-alives), must read back as themselves.
func FuzzEvents(f *testing.F) {
	f.Add("data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: [DONE]\n\n", uint8(0), uint16(0), false)
	f.Add("data: {\"a\":1}\r\n\r\n: keep-alive\r\n\r\ndata:[DONE]\r\n", uint8(3), uint16(40), true)
	f.Add("event: error\ndata: {\"error\":{\"message\":\"boom\"}}\n\n", uint8(1), uint16(8), false)
	f.Add("data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3}}\n\ndata: [DONE]", uint8(7), uint16(300), true)
	f.Add("data: "+strings.Repeat("x", 600)+"\n\ndata: [DONE]\n\n", uint8(5), uint16(100), false)
	f.Add("data: {\"a\":\rdata: 1\r\r\n\ndata:  [DONE] \n", uint8(2), uint16(9), false)
	f.Add("\n\n\r\n:\ndata\ndata:\n", uint8(0), uint16(1), true)
	f.Fuzz(func(t *testing.T, body string, step uint8, bound uint16, crlf bool) {
		maxLine := 1 + int(bound)%512
		want, wantLong := reference(body, maxLine)
		got, err := collect(&pieces{p: split(body, 1+int(step)%17)}, maxLine)
		if wantLong != errors.Is(err, ErrLineTooLong) || (err != nil && !wantLong) {
			t.Fatalf("error %v, reference says over-long %v", err, wantLong)
		}
		if strings.Join(got, "\x00") != strings.Join(want, "\x00") || len(got) != len(want) {
			t.Fatalf("events %q, reference %q", got, want)
		}
		for _, d := range got {
			if len(d) > maxLine {
				t.Fatalf("data of %d bytes under a bound of %d", len(d), maxLine)
			}
		}

		eol := "\n"
		if crlf {
			eol = "\r\n"
		}
		var stream strings.Builder
		var sent []string
		longest := len(": keep-alive")
		for i, line := range strings.Split(body, "\n") {
			p := strings.TrimSpace(strings.ReplaceAll(line, "\r", ""))
			if p == "[DONE]" {
				sent = append(sent, "DONE")
			} else {
				sent = append(sent, p)
			}
			longest = max(longest, len("data: "+p))
			stream.WriteString("data: " + p + eol + eol)
			if i%2 == 1 {
				stream.WriteString(": keep-alive" + eol + eol)
			}
		}
		got, err = collect(&pieces{p: split(stream.String(), 1+int(step)%17)}, longest)
		if err != nil {
			t.Fatalf("a well-formed stream failed: %v", err)
		}
		if strings.Join(got, "\x00") != strings.Join(sent, "\x00") || len(got) != len(sent) {
			t.Fatalf("read back %q, sent %q", got, sent)
		}
	})
}

// reference is what Events must find in body, line by line: each data
// line's value ("DONE" for [DONE]), up to the first line over maxLine.
func reference(body string, maxLine int) (data []string, tooLong bool) {
	lines := strings.Split(body, "\n")
	if lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1] // the last line's terminator, not a line
	}
	for _, l := range lines {
		l = strings.TrimSuffix(l, "\r")
		if len(l) > maxLine {
			return data, true
		}
		if d, ok := strings.CutPrefix(l, "data:"); ok {
			if d = strings.TrimSpace(d); d == "[DONE]" {
				d = "DONE"
			}
			data = append(data, d)
		}
	}
	return data, false
}

// split cuts s into reads of n bytes.
func split(s string, n int) []string {
	var out []string
	for len(s) > n {
		out = append(out, s[:n])
		s = s[n:]
	}
	if s != "" {
		out = append(out, s)
	}
	return out
}
