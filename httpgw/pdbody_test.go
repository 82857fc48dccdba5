package httpgw

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPrefillAndDecodeBodies(t *testing.T) {
	tests := []struct {
		name, body, prefill, decode string
	}{
		{
			name:    "streamed chat with limits and options",
			body:    `{"model":"m","stream":true,"stream_options":{"include_usage":true},"max_tokens":50,"messages":[{"role":"user","content":"hi"}]}`,
			prefill: `{"model":"m","messages":[{"role":"user","content":"hi"}],` + prefillTail + `}`,
			decode:  `{"model":"m","stream":true,"stream_options":{"include_usage":true},"max_tokens":50,"messages":[{"role":"user","content":"hi"}],"kv_transfer_params":{"a":1}}`,
		},
		{
			name:    "spaces and a client's own kv params",
			body:    " { \"model\" : \"m\" ,\n \"kv_transfer_params\" : {\"x\":null} , \"temperature\" : 0.70000000000000000001 } \n",
			prefill: `{"model":"m","temperature":0.70000000000000000001,` + prefillTail + `}`,
			decode:  `{"model":"m","temperature":0.70000000000000000001,"kv_transfer_params":{"a":1}}`,
		},
		{
			name:    "repeated and escaped names",
			body:    `{"max_tokens":1,"m\u0061x_tokens":2,"seed":18446744073709551615,"max_completion_tokens":3}`,
			prefill: `{"seed":18446744073709551615,` + prefillTail + `}`,
			decode:  `{"max_tokens":1,"m\u0061x_tokens":2,"seed":18446744073709551615,"max_completion_tokens":3,"kv_transfer_params":{"a":1}}`,
		},
		{name: "empty object", body: `{}`, prefill: `{` + prefillTail + `}`, decode: `{"kv_transfer_params":{"a":1}}`},
		{
			name:    "min_tokens stays off the prefill",
			body:    `{"model":"m","min_tokens":5,"max_tokens":50}`,
			prefill: `{"model":"m",` + prefillTail + `}`,
			decode:  `{"model":"m","min_tokens":5,"max_tokens":50,"kv_transfer_params":{"a":1}}`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := prefillBody([]byte(tt.body))
			require.NoError(t, err)
			assert.Equal(t, tt.prefill, string(p))
			assert.True(t, json.Valid(p))
			d, err := decodeBody([]byte(tt.body), []byte(`{"a":1}`))
			require.NoError(t, err)
			assert.Equal(t, tt.decode, string(d))
		})
	}
	for _, bad := range []string{``, `[]`, `{"a":1} {}`, `{"a":}`, `"x"`, `{"a":1,}`} {
		_, err := prefillBody([]byte(bad))
		assert.ErrorIs(t, err, errPDBody, "%q", bad)
		_, err = decodeBody([]byte(bad), []byte(`{}`))
		assert.ErrorIs(t, err, errPDBody, "%q", bad)
	}
}

func TestAnswerKVParams(t *testing.T) {
	tests := []struct {
		answer, kv string
		ok         bool
	}{
		{`{"id":"x","choices":[{"finish_reason":"remote_decode"}],"kv_transfer_params":{"do_remote_prefill":true,"remote_block_ids":["DUMMY_ID"]}}`,
			`{"do_remote_prefill":true,"remote_block_ids":["DUMMY_ID"]}`, true},
		{`{"kv_transfer_params":{"a":1},"kv_transfer_params":{"b":2}}`, `{"b":2}`, true},
		{`{"kv_transfer_params":null}`, ``, false},
		{`{"kv_transfer_params":{"a":1},"kv_transfer_params":null}`, ``, false},
		{`{"choices":[]}`, ``, false},
		{`{"kv_transfer_params":{"a":1}`, ``, false},
		{`not json`, ``, false},
	}
	for _, tt := range tests {
		kv, ok := answerKVParams([]byte(tt.answer))
		assert.Equal(t, tt.ok, ok, tt.answer)
		assert.Equal(t, tt.kv, string(kv), tt.answer)
	}
}

// canonical decodes a JSON object as encoding/json does (the last of
// repeated members wins), its values decoded with numbers kept as text.
func canonical(t *testing.T, b []byte) (map[string]any, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return nil, err
	}
	if raw == nil {
		return nil, errors.New("null")
	}
	out := make(map[string]any, len(raw))
	for k, v := range raw {
		d := json.NewDecoder(bytes.NewReader(v))
		d.UseNumber()
		var x any
		if err := d.Decode(&x); err != nil {
			t.Fatalf("re-decoding %q: %v", v, err)
		}
		out[k] = x
	}
	return out, nil
}

// FuzzPDBodies compares the P/D rewrite with encoding/json: a body is
// rewritten exactly when encoding/json reads it as an object, and the
// prefill and decode bodies are valid JSON that encoding/json reads as the
// client's object with the protocol's members replaced.
func FuzzPDBodies(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","stream":true,"stream_options":{"include_usage":true},"max_tokens":50,"messages":[{"role":"user","content":"hi"}]}`,
		`{"max_tokens":1,"m\u0061x_tokens":2}`, `{}`, `[]`, `{"a":1} {}`, ` {"a" : [1, {"b":null}] } `, `{"a":"\ud800"}`,
		`{"kv_transfer_params":{"x":1},"kv_transfer_params":2}`, "{\"a\":1}\x00", `{"a":1e400}`,
	} {
		f.Add([]byte(s))
	}
	kv := []byte(`{"do_remote_prefill":true,"remote_engine_id":"e","remote_block_ids":[1,2]}`)
	f.Fuzz(func(t *testing.T, body []byte) {
		want, werr := canonical(t, body)
		p, perr := prefillBody(body)
		d, derr := decodeBody(body, kv)
		if (werr == nil) != (perr == nil) || (perr == nil) != (derr == nil) {
			t.Fatalf("encoding/json: %v, prefill: %v, decode: %v", werr, perr, derr)
		}
		if werr != nil {
			return
		}
		gotP, err := canonical(t, p)
		if err != nil {
			t.Fatalf("prefill body %q is not valid: %v", p, err)
		}
		gotD, err := canonical(t, d)
		if err != nil {
			t.Fatalf("decode body %q is not valid: %v", d, err)
		}
		wantP := map[string]any{}
		for k, v := range want {
			wantP[k] = v
		}
		for _, k := range []string{"stream_options", "min_tokens"} {
			delete(wantP, k)
		}
		tail, _ := canonical(t, []byte("{"+prefillTail+"}"))
		for k, v := range tail {
			wantP[k] = v
		}
		if !reflect.DeepEqual(wantP, gotP) {
			t.Fatalf("prefill body of %q:\n got %v\nwant %v", body, gotP, wantP)
		}
		kvv, _ := canonical(t, []byte(`{"kv_transfer_params":`+string(kv)+`}`))
		want[fieldKVTransferParams] = kvv[fieldKVTransferParams]
		if !reflect.DeepEqual(want, gotD) {
			t.Fatalf("decode body of %q:\n got %v\nwant %v", body, gotD, want)
		}
	})
}
