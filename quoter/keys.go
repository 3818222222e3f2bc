package quoter

import (
	"bytes"
	"crypto/ecdsa"
	"encoding/hex"
	"errors"
	"fmt"
	"os"

	"github.com/ethereum/go-ethereum/accounts/keystore"
	"github.com/ethereum/go-ethereum/crypto"
)

// KeySource says where the signing key lives: either KeyFile (raw hex) or
// KeystoreFile plus PasswordFile. Only paths are accepted, never key
// material, so nothing secret can end up in flags, env dumps or logs.
type KeySource struct {
	// KeyFile holds a 32-byte secp256k1 key as hex (0x prefix and trailing
	// whitespace tolerated).
	KeyFile string
	// KeystoreFile is a Web3 Secret Storage (geth keystore) JSON file.
	KeystoreFile string
	// PasswordFile holds the keystore password (one trailing newline is
	// stripped).
	PasswordFile string
}

// ErrKeyFilePermissions is returned for key files readable by group or
// others.
var ErrKeyFilePermissions = errors.New("key file is readable by group or others")

// LoadKey reads the signing key. Errors name the file and the problem but
// never include any of its content.
func LoadKey(src KeySource) (*ecdsa.PrivateKey, error) {
	switch {
	case src.KeyFile != "" && src.KeystoreFile != "":
		return nil, errors.New("set either a key file or a keystore file, not both")
	case src.KeyFile != "":
		return loadHexKey(src.KeyFile)
	case src.KeystoreFile != "":
		if src.PasswordFile == "" {
			return nil, errors.New("a keystore file needs a password file")
		}
		return loadKeystore(src.KeystoreFile, src.PasswordFile)
	}
	return nil, errors.New("no signing key configured: set a key file, or a keystore file and a password file")
}

// readSecret reads a file after checking that only its owner can read it.
// The mode is checked on the file the path resolves to, so a Kubernetes
// Secret mount (symlinks into ..data) is judged by its defaultMode.
func readSecret(path string) ([]byte, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("cannot stat %s: %w", path, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file", path)
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("%w: %s has mode %04o; make it owner-only (chmod 600, or defaultMode 0400 on the Secret volume)",
			ErrKeyFilePermissions, path, perm)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("cannot read %s: %w", path, err)
	}
	return b, nil
}

func wipe(b []byte) {
	for i := range b {
		b[i] = 0
	}
}

func loadHexKey(path string) (*ecdsa.PrivateKey, error) {
	raw, err := readSecret(path)
	if err != nil {
		return nil, err
	}
	defer wipe(raw)
	s := bytes.TrimSpace(raw)
	if len(s) >= 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X') {
		s = s[2:]
	}
	// Decode by hand so no error message can quote a character of the key.
	if len(s) != 64 {
		return nil, fmt.Errorf("key file %s does not hold a 32-byte hex key (found %d hex characters, want 64)", path, len(s))
	}
	var b [32]byte
	defer wipe(b[:])
	if _, err := hex.Decode(b[:], s); err != nil {
		return nil, fmt.Errorf("key file %s does not hold a 32-byte hex key (non-hex character)", path)
	}
	key, err := crypto.ToECDSA(b[:])
	if err != nil {
		return nil, fmt.Errorf("key file %s does not hold a valid secp256k1 key", path)
	}
	return key, nil
}

func loadKeystore(path, passwordPath string) (*ecdsa.PrivateKey, error) {
	blob, err := readSecret(path)
	if err != nil {
		return nil, err
	}
	pw, err := readSecret(passwordPath)
	if err != nil {
		return nil, err
	}
	defer wipe(pw)
	pw = bytes.TrimSuffix(bytes.TrimSuffix(pw, []byte("\n")), []byte("\r"))
	k, err := keystore.DecryptKey(blob, string(pw))
	if err != nil {
		return nil, fmt.Errorf("cannot decrypt keystore %s with the password in %s: %w", path, passwordPath, err)
	}
	return k.PrivateKey, nil
}
