// Command image builds the provider node's container image without a
// Docker engine or a base image (`make image`): the binaries the chart
// runs (cmd/epp, cmd/quoter), static (CGO_ENABLED=0), in /usr/local/bin of
// an otherwise empty file system holding only /etc/passwd, /etc/group, a
// CA bundle and the non-root user's home, run as 65532:65532. It writes
// one tar that is both an OCI image layout and a `docker save` archive
// (manifest.json), so `docker load`, `podman load`, `skopeo copy
// oci-archive:` and `crane push` all read it. Its name is the chart's
// default image, epp.image.repository at the chart's appVersion, read from
// the chart itself. File times are fixed, so the same binaries and CA
// bundle give the same image digest.
package main

import (
	"flag"
	"fmt"
	"os"
)

func main() {
	opts := options{}
	flag.StringVar(&opts.root, "root", ".", "repository root (holds go.mod and deploy/helm/provider-node)")
	flag.StringVar(&opts.out, "out", "out/provider-node-image.tar", "image tar to write")
	flag.StringVar(&opts.platform, "platform", "linux/amd64", "os/arch of the binaries")
	flag.StringVar(&opts.caBundle, "ca-certificates", "/etc/ssl/certs/ca-certificates.crt",
		"PEM CA bundle copied to /etc/ssl/certs/ca-certificates.crt (the quoter and its checks call https URLs)")
	flag.StringVar(&opts.goCmd, "go", "go", "go command that builds the binaries")
	flag.Parse()
	if flag.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "image: unexpected argument %q\n", flag.Arg(0))
		os.Exit(2)
	}
	img, err := build(opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
	fmt.Printf("image: %s (%s) %s\n  %s\n", img.ref, opts.platform, img.digest, opts.out)
}
