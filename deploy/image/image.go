package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Binaries are the programs the chart runs from the image, as
// commands on PATH; TestImage checks every command of the chart's
// templates is one of them.
var binaries = []string{"epp", "quoter"}

const (
	binDir = "/usr/local/bin"
	// user is the image's user: non-root, the uid the chart's EPP and
	// calibration Pods run as.
	user       = "65532:65532"
	chartDir   = "deploy/helm/provider-node"
	caPath     = "etc/ssl/certs/ca-certificates.crt"
	mediaIndex = "application/vnd.oci.image.index.v1+json"
	mediaMan   = "application/vnd.oci.image.manifest.v1+json"
	mediaCfg   = "application/vnd.oci.image.config.v1+json"
	mediaLayer = "application/vnd.oci.image.layer.v1.tar+gzip"
)

// epoch is every file's time and the image's creation time, so that the
// digest depends on content only.
var epoch = time.Unix(0, 0).UTC()

type options struct {
	root, out, platform, caBundle, goCmd string
}

// built is what build wrote: the image's name and its manifest digest.
type built struct {
	ref, digest string
}

// chartImage returns the chart's default image of the epp and quoter:
// epp.image.repository at the chart's appVersion (templates/_helpers.tpl,
// "pn.image").
func chartImage(root string) (string, error) {
	var chart struct {
		AppVersion string `yaml:"appVersion"`
	}
	var values struct {
		EPP struct {
			Image struct {
				Repository string `yaml:"repository"`
				Tag        string `yaml:"tag"`
			} `yaml:"image"`
		} `yaml:"epp"`
	}
	for file, v := range map[string]any{"Chart.yaml": &chart, "values.yaml": &values} {
		data, err := os.ReadFile(filepath.Join(root, chartDir, file))
		if err != nil {
			return "", fmt.Errorf("read the chart: %w", err)
		}
		if err := yaml.Unmarshal(data, v); err != nil {
			return "", fmt.Errorf("parse %s: %w", file, err)
		}
	}
	tag := values.EPP.Image.Tag
	if tag == "" {
		tag = chart.AppVersion
	}
	if values.EPP.Image.Repository == "" || tag == "" {
		return "", errors.New("the chart names no epp.image.repository or appVersion")
	}
	return values.EPP.Image.Repository + ":" + tag, nil
}

func build(o options) (built, error) {
	goos, goarch, ok := strings.Cut(o.platform, "/")
	if !ok || goos != "linux" || goarch == "" {
		return built{}, fmt.Errorf("platform %q is not linux/ARCH", o.platform)
	}
	ref, err := chartImage(o.root)
	if err != nil {
		return built{}, err
	}
	ca, err := os.ReadFile(o.caBundle)
	if err != nil {
		return built{}, fmt.Errorf("CA bundle (-ca-certificates): %w", err)
	}
	if !bytes.Contains(ca, []byte("-----BEGIN CERTIFICATE-----")) {
		return built{}, fmt.Errorf("CA bundle %s holds no PEM certificate", o.caBundle)
	}
	bin, err := os.MkdirTemp("", "provider-node-image-")
	if err != nil {
		return built{}, err
	}
	defer os.RemoveAll(bin)
	args := []string{"build", "-trimpath", "-ldflags=-s -w", "-o", bin + "/"}
	for _, b := range binaries {
		args = append(args, "./cmd/"+b)
	}
	cmd := exec.Command(o.goCmd, args...)
	cmd.Dir = o.root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS="+goos, "GOARCH="+goarch)
	if out, err := cmd.CombinedOutput(); err != nil {
		return built{}, fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, out)
	}

	files := []file{
		{name: "etc/", mode: 0o755},
		{name: "etc/group", mode: 0o644, data: []byte("root:x:0:\nnonroot:x:65532:\n")},
		{name: "etc/passwd", mode: 0o644, data: []byte("root:x:0:0:root:/root:/sbin/nologin\n" +
			"nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")},
		{name: "etc/ssl/", mode: 0o755},
		{name: "etc/ssl/certs/", mode: 0o755},
		{name: caPath, mode: 0o644, data: ca},
		{name: "home/", mode: 0o755},
		{name: "home/nonroot/", mode: 0o700, uid: 65532},
		{name: "tmp/", mode: 0o1777},
		{name: "usr/", mode: 0o755},
		{name: "usr/local/", mode: 0o755},
		{name: "usr/local/bin/", mode: 0o755},
	}
	for _, b := range binaries {
		data, err := os.ReadFile(filepath.Join(bin, b))
		if err != nil {
			return built{}, err
		}
		files = append(files, file{name: strings.TrimPrefix(binDir, "/") + "/" + b, mode: 0o755, data: data})
	}
	img, err := assemble(ref, goarch, files)
	if err != nil {
		return built{}, err
	}
	if err := os.MkdirAll(filepath.Dir(o.out), 0o755); err != nil {
		return built{}, err
	}
	tmp := o.out + ".tmp"
	if err := os.WriteFile(tmp, img.tar, 0o644); err != nil {
		return built{}, err
	}
	if err := os.Rename(tmp, o.out); err != nil {
		return built{}, err
	}
	return built{ref: ref, digest: img.digest}, nil
}

// file is one entry of the image's only layer; a name ending in / is a
// directory. Everything is owned by root but the user's home.
type file struct {
	name string
	mode int64
	uid  int
	data []byte
}

type image struct {
	tar    []byte
	digest string
}

// blob is content addressed by its sha256.
type blob struct {
	data   []byte
	digest string
}

func newBlob(data []byte) blob {
	sum := sha256.Sum256(data)
	return blob{data: data, digest: "sha256:" + hex.EncodeToString(sum[:])}
}

func (b blob) path() string { return "blobs/sha256/" + strings.TrimPrefix(b.digest, "sha256:") }

type descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int               `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// assemble writes the layer, the config, the manifest and the index, and
// tars them as an OCI image layout plus a docker-save manifest.json.
func assemble(ref, arch string, files []file) (image, error) {
	var raw bytes.Buffer
	tw := tar.NewWriter(&raw)
	for _, f := range files {
		h := &tar.Header{Name: f.name, Mode: f.mode, Uid: f.uid, Gid: f.uid, ModTime: epoch, Format: tar.FormatPAX}
		if strings.HasSuffix(f.name, "/") {
			h.Typeflag = tar.TypeDir
		} else {
			h.Typeflag, h.Size = tar.TypeReg, int64(len(f.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return image{}, err
		}
		if _, err := tw.Write(f.data); err != nil {
			return image{}, err
		}
	}
	if err := tw.Close(); err != nil {
		return image{}, err
	}
	diffID := newBlob(raw.Bytes()).digest
	var gz bytes.Buffer
	zw, err := gzip.NewWriterLevel(&gz, gzip.BestCompression)
	if err != nil {
		return image{}, err
	}
	if _, err := zw.Write(raw.Bytes()); err != nil {
		return image{}, err
	}
	if err := zw.Close(); err != nil {
		return image{}, err
	}
	layer := newBlob(gz.Bytes())

	repo, tag := splitRef(ref)
	labels := map[string]string{
		"org.opencontainers.image.source":  "https://github.com/omnious/provider-node",
		"org.opencontainers.image.version": tag,
		"org.opencontainers.image.title":   "provider-node",
	}
	cfg, err := json.Marshal(map[string]any{
		"created":      epoch.Format(time.RFC3339),
		"architecture": arch,
		"os":           "linux",
		"config": map[string]any{
			"User":       user,
			"Entrypoint": []string{binDir + "/epp"},
			"Env":        []string{"PATH=" + binDir, "SSL_CERT_FILE=/" + caPath, "HOME=/home/nonroot"},
			"WorkingDir": "/",
			"Labels":     labels,
		},
		"rootfs":  map[string]any{"type": "layers", "diff_ids": []string{diffID}},
		"history": []map[string]string{{"created": epoch.Format(time.RFC3339), "created_by": "go run ./deploy/image"}},
	})
	if err != nil {
		return image{}, err
	}
	config := newBlob(cfg)
	man, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     mediaMan,
		"config":        descriptor{MediaType: mediaCfg, Digest: config.digest, Size: len(config.data)},
		"layers":        []descriptor{{MediaType: mediaLayer, Digest: layer.digest, Size: len(layer.data)}},
		"annotations":   labels,
	})
	if err != nil {
		return image{}, err
	}
	manifest := newBlob(man)
	index, err := json.Marshal(map[string]any{
		"schemaVersion": 2,
		"mediaType":     mediaIndex,
		"manifests": []descriptor{{MediaType: mediaMan, Digest: manifest.digest, Size: len(manifest.data),
			Annotations: map[string]string{
				"org.opencontainers.image.ref.name": tag,
				"io.containerd.image.name":          repo + ":" + tag,
			}}},
	})
	if err != nil {
		return image{}, err
	}
	docker, err := json.Marshal([]map[string]any{{
		"Config": config.path(), "RepoTags": []string{ref}, "Layers": []string{layer.path()},
	}})
	if err != nil {
		return image{}, err
	}

	var out bytes.Buffer
	ow := tar.NewWriter(&out)
	entries := []struct {
		name string
		data []byte
	}{
		{"blobs/", nil}, {"blobs/sha256/", nil},
		{config.path(), config.data}, {layer.path(), layer.data}, {manifest.path(), manifest.data},
		{"index.json", index}, {"manifest.json", docker},
		{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)},
	}
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Mode: 0o644, ModTime: epoch, Typeflag: tar.TypeReg, Size: int64(len(e.data)), Format: tar.FormatPAX}
		if strings.HasSuffix(e.name, "/") {
			h.Typeflag, h.Mode, h.Size = tar.TypeDir, 0o755, 0
		}
		if err := ow.WriteHeader(h); err != nil {
			return image{}, err
		}
		if _, err := ow.Write(e.data); err != nil {
			return image{}, err
		}
	}
	if err := ow.Close(); err != nil {
		return image{}, err
	}
	return image{tar: out.Bytes(), digest: manifest.digest}, nil
}

// splitRef splits name:tag at the last colon after the last slash (a
// registry host may carry a port).
func splitRef(ref string) (repo, tag string) {
	i := strings.LastIndex(ref, ":")
	if i < 0 || strings.Contains(ref[i:], "/") {
		return ref, "latest"
	}
	return ref[:i], ref[i+1:]
}
