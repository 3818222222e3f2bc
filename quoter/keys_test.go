package quoter

import (
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ethereum/go-ethereum/accounts/keystore"
	"github.com/ethereum/go-ethereum/crypto"
	"github.com/google/uuid"
	"github.com/stretchr/testify/require"
)

func writeFile(t *testing.T, name, content string, mode os.FileMode) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.WriteFile(p, []byte(content), mode))
	require.NoError(t, os.Chmod(p, mode)) // umask-proof
	return p
}

func TestLoadKey(t *testing.T) {
	key := newKey(t)
	addr := crypto.PubkeyToAddress(key.PublicKey)
	keyHex := hex.EncodeToString(crypto.FromECDSA(key))

	ks, err := keystore.EncryptKey(&keystore.Key{Id: uuid.New(), Address: addr, PrivateKey: key}, "s3cret pw",
		keystore.LightScryptN, keystore.LightScryptP)
	require.NoError(t, err)
	ksPath := writeFile(t, "keystore.json", string(ks), 0o600)

	for _, tc := range []struct {
		name    string
		src     func(t *testing.T) KeySource
		wantErr string
	}{
		{"hex plain", func(t *testing.T) KeySource { return KeySource{KeyFile: writeFile(t, "k", keyHex, 0o600)} }, ""},
		{"hex 0x newline", func(t *testing.T) KeySource { return KeySource{KeyFile: writeFile(t, "k", "0x"+keyHex+"\n", 0o400)} }, ""},
		{"hex upper CRLF", func(t *testing.T) KeySource {
			return KeySource{KeyFile: writeFile(t, "k", "0X"+strings.ToUpper(keyHex)+"\r\n", 0o600)}
		}, ""},
		{"keystore", func(t *testing.T) KeySource {
			return KeySource{KeystoreFile: ksPath, PasswordFile: writeFile(t, "pw", "s3cret pw\n", 0o600)}
		}, ""},
		{"world readable", func(t *testing.T) KeySource { return KeySource{KeyFile: writeFile(t, "k", keyHex, 0o644)} }, "readable by group or others"},
		{"group readable", func(t *testing.T) KeySource { return KeySource{KeyFile: writeFile(t, "k", keyHex, 0o640)} }, "chmod 600"},
		{"password world readable", func(t *testing.T) KeySource {
			return KeySource{KeystoreFile: ksPath, PasswordFile: writeFile(t, "pw", "s3cret pw", 0o604)}
		}, "readable by group or others"},
		{"wrong password", func(t *testing.T) KeySource {
			return KeySource{KeystoreFile: ksPath, PasswordFile: writeFile(t, "pw", "nope", 0o600)}
		}, "cannot decrypt keystore"},
		{"short", func(t *testing.T) KeySource { return KeySource{KeyFile: writeFile(t, "k", keyHex[:62], 0o600)} }, "found 62 hex characters"},
		{"non hex", func(t *testing.T) KeySource {
			return KeySource{KeyFile: writeFile(t, "k", "zz"+keyHex[2:], 0o600)}
		}, "non-hex character"},
		{"zero key", func(t *testing.T) KeySource {
			return KeySource{KeyFile: writeFile(t, "k", strings.Repeat("0", 64), 0o600)}
		}, "does not hold a valid secp256k1 key"},
		{"missing", func(t *testing.T) KeySource { return KeySource{KeyFile: filepath.Join(t.TempDir(), "none")} }, "cannot stat"},
		{"none", func(*testing.T) KeySource { return KeySource{} }, "no signing key configured"},
		{"both", func(*testing.T) KeySource { return KeySource{KeyFile: "a", KeystoreFile: "b"} }, "not both"},
		{"keystore without password", func(*testing.T) KeySource { return KeySource{KeystoreFile: ksPath} }, "needs a password file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := LoadKey(tc.src(t))
			if tc.wantErr == "" {
				require.NoError(t, err)
				require.Equal(t, addr, crypto.PubkeyToAddress(got.PublicKey))
				return
			}
			require.ErrorContains(t, err, tc.wantErr)
			// No error may carry any fragment of the key.
			require.NotContains(t, strings.ToLower(err.Error()), keyHex[2:18])
		})
	}
}
