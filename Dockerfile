# syntax=docker/dockerfile:1
# The provider node's image for providers who build with Docker:
#
#   docker build -t ghcr.io/<you>/provider-node:0.1.0 .
#
# The same file system as `make image` (deploy/image), which needs no
# Docker engine: the binaries the chart runs (epp, quoter), static, in
# /usr/local/bin of an empty base with /etc/passwd, /etc/group and a CA
# bundle; user 65532:65532; the EPP as entrypoint. Keep the two alike.
ARG GO_VERSION=1.26.8

FROM golang:${GO_VERSION} AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG TARGETARCH
RUN CGO_ENABLED=0 GOOS=linux GOARCH=${TARGETARCH:-amd64} \
	go build -trimpath -ldflags="-s -w" -o /out/ ./cmd/epp ./cmd/quoter
RUN mkdir -p /rootfs/etc/ssl/certs /rootfs/home/nonroot /rootfs/tmp /rootfs/usr/local/bin && \
	printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' >/rootfs/etc/passwd && \
	printf 'root:x:0:\nnonroot:x:65532:\n' >/rootfs/etc/group && \
	cp /etc/ssl/certs/ca-certificates.crt /rootfs/etc/ssl/certs/ && \
	cp /out/epp /out/quoter /rootfs/usr/local/bin/ && \
	chmod 1777 /rootfs/tmp && chmod 700 /rootfs/home/nonroot

FROM scratch
COPY --from=build /rootfs/ /
COPY --from=build --chown=65532:65532 /rootfs/home/nonroot /home/nonroot
ENV PATH=/usr/local/bin SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt HOME=/home/nonroot
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/epp"]
