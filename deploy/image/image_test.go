package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

const root = "../.."

// builtImage is the image `make image` writes, built once for the tests
// (for this machine's architecture, so that its binaries run here).
func builtImage(t *testing.T) (map[string][]byte, string) {
	t.Helper()
	out := filepath.Join(t.TempDir(), "image.tar")
	goCmd := filepath.Join(runtime.GOROOT(), "bin", "go")
	img, err := build(options{root: root, out: out, platform: "linux/" + runtime.GOARCH,
		caBundle: "/etc/ssl/certs/ca-certificates.crt", goCmd: goCmd})
	require.NoError(t, err)
	data, err := os.ReadFile(out)
	require.NoError(t, err)
	return untar(t, data), img.digest
}

func untar(t *testing.T, data []byte) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	tr := tar.NewReader(bytes.NewReader(data))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files
		}
		require.NoError(t, err)
		b, err := io.ReadAll(tr)
		require.NoError(t, err)
		if h.Typeflag == tar.TypeReg {
			files[h.Name] = b
		}
	}
}

// blobOf returns a blob of the layout after checking it has the digest it
// is stored under.
func blobOf(t *testing.T, files map[string][]byte, digest string) []byte {
	t.Helper()
	b, ok := files["blobs/sha256/"+strings.TrimPrefix(digest, "sha256:")]
	require.True(t, ok, "blob %s missing", digest)
	sum := sha256.Sum256(b)
	require.Equal(t, digest, "sha256:"+hex.EncodeToString(sum[:]), "blob content does not match its digest")
	return b
}

type imageConfig struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
	Config       struct {
		User       string   `json:"User"`
		Entrypoint []string `json:"Entrypoint"`
		Env        []string `json:"Env"`
	} `json:"config"`
	RootFS struct {
		DiffIDs []string `json:"diff_ids"`
	} `json:"rootfs"`
}

// chartCommands returns the command of every container the chart runs
// from its own image (`include "pn.image"`), template by template.
func chartCommands(t *testing.T) map[string]string {
	t.Helper()
	image := regexp.MustCompile(`image: \{\{ include "pn\.image" [^}]*\}\}`)
	command := regexp.MustCompile(`^\s*command: \["([^"]+)"`)
	commands := map[string]string{}
	paths, err := filepath.Glob(filepath.Join(root, chartDir, "templates", "*"))
	require.NoError(t, err)
	tests, err := filepath.Glob(filepath.Join(root, chartDir, "templates", "tests", "*"))
	require.NoError(t, err)
	for _, p := range append(paths, tests...) {
		if fi, err := os.Stat(p); err != nil || fi.IsDir() {
			continue
		}
		data, err := os.ReadFile(p)
		require.NoError(t, err)
		lines := strings.Split(string(data), "\n")
		for i, l := range lines {
			if !image.MatchString(l) {
				continue
			}
			// The container's command follows its image within a few lines.
			found := ""
			for _, next := range lines[i+1 : min(i+4, len(lines))] {
				if m := command.FindStringSubmatch(next); m != nil {
					found = m[1]
					break
				}
			}
			commands[fmt.Sprintf("%s line %d", filepath.Base(p), i+1)] = found
		}
	}
	return commands
}

// TestImage opens the image `make image` builds: an OCI layout and a
// docker-save archive of one image, named as the chart's default image,
// running as 65532:65532 with the EPP as entrypoint, whose static
// binaries are every command the chart runs from it and start.
func TestImage(t *testing.T) {
	files, digest := builtImage(t)

	var index struct {
		Manifests []descriptor `json:"manifests"`
	}
	require.NoError(t, json.Unmarshal(files["index.json"], &index))
	require.Len(t, index.Manifests, 1)
	require.Equal(t, digest, index.Manifests[0].Digest)
	require.JSONEq(t, `{"imageLayoutVersion":"1.0.0"}`, string(files["oci-layout"]))

	var manifest struct {
		Config descriptor   `json:"config"`
		Layers []descriptor `json:"layers"`
	}
	require.NoError(t, json.Unmarshal(blobOf(t, files, digest), &manifest))
	var cfg imageConfig
	require.NoError(t, json.Unmarshal(blobOf(t, files, manifest.Config.Digest), &cfg))

	// The name is the chart's default: epp.image.repository at appVersion.
	ref, err := chartImage(root)
	require.NoError(t, err)
	chartYAML, err := os.ReadFile(filepath.Join(root, chartDir, "Chart.yaml"))
	require.NoError(t, err)
	require.Regexp(t, `(?m)^appVersion: "?`+regexp.QuoteMeta(ref[strings.LastIndex(ref, ":")+1:])+`"?$`, string(chartYAML))
	require.Equal(t, ref, index.Manifests[0].Annotations["io.containerd.image.name"])
	var docker []struct {
		Config   string
		RepoTags []string
		Layers   []string
	}
	require.NoError(t, json.Unmarshal(files["manifest.json"], &docker))
	require.Len(t, docker, 1)
	require.Equal(t, []string{ref}, docker[0].RepoTags)
	require.Equal(t, "blobs/sha256/"+strings.TrimPrefix(manifest.Config.Digest, "sha256:"), docker[0].Config)

	require.Equal(t, "linux", cfg.OS)
	require.Equal(t, runtime.GOARCH, cfg.Architecture)
	require.Equal(t, "65532:65532", cfg.Config.User)
	require.Equal(t, []string{"/usr/local/bin/epp"}, cfg.Config.Entrypoint)
	require.Contains(t, cfg.Config.Env, "PATH=/usr/local/bin")

	// One layer, its diff_id the digest of its uncompressed content.
	require.Len(t, manifest.Layers, 1)
	require.Equal(t, mediaLayer, manifest.Layers[0].MediaType)
	zr, err := gzip.NewReader(bytes.NewReader(blobOf(t, files, manifest.Layers[0].Digest)))
	require.NoError(t, err)
	raw, err := io.ReadAll(zr)
	require.NoError(t, err)
	sum := sha256.Sum256(raw)
	require.Equal(t, []string{"sha256:" + hex.EncodeToString(sum[:])}, cfg.RootFS.DiffIDs)
	rootfs := untar(t, raw)
	require.Contains(t, string(rootfs["etc/passwd"]), "nonroot:x:65532:65532:")
	require.Contains(t, string(rootfs[caPath]), "-----BEGIN CERTIFICATE-----")

	// Every command the chart runs from this image is a binary in it.
	commands := chartCommands(t)
	require.NotEmpty(t, commands)
	for where, cmd := range commands {
		require.Contains(t, binaries, cmd, "%s runs %q from the chart's image: not a binary the image builds", where, cmd)
	}

	dir := t.TempDir()
	for _, b := range binaries {
		data, ok := rootfs["usr/local/bin/"+b]
		require.True(t, ok, "%s missing from /usr/local/bin", b)
		path := filepath.Join(dir, b)
		require.NoError(t, os.WriteFile(path, data, 0o755))

		// Static: no program interpreter (the image has no libc).
		f, err := elf.Open(path)
		require.NoError(t, err)
		for _, p := range f.Progs {
			require.NotEqual(t, elf.PT_INTERP, p.Type, "%s is dynamically linked", b)
		}
		require.NoError(t, f.Close())

		// It starts: --help prints its usage (epp's flag package exits 1
		// after it, quoter's 0); a crash or an exec error fails here.
		cmd := exec.Command(path, "--help")
		cmd.Env = []string{"PATH=/nonexistent", "HOME=" + dir}
		out, err := cmd.CombinedOutput()
		if err != nil {
			var exit *exec.ExitError
			require.ErrorAs(t, err, &exit, "%s --help: %s", b, out)
			require.NotEqual(t, -1, exit.ExitCode(), "%s --help was killed: %s", b, out)
		}
		require.Contains(t, strings.ToLower(string(out)), "usage", "%s --help printed no usage:\n%s", b, out)
	}
}
