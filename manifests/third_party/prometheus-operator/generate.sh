#!/usr/bin/env bash
# Regenerates the Prometheus Operator CRDs in this directory from the operator's Go API types,
# with controller-gen, both fetched from the Go module proxy (no release downloads).
# Usage: manifests/third_party/prometheus-operator/generate.sh   (needs Go >= 1.26)
set -euo pipefail

PROMETHEUS_OPERATOR_VERSION=v0.95.2   # github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring
CONTROLLER_TOOLS_VERSION=v0.23.0      # sigs.k8s.io/controller-tools/cmd/controller-gen

export GOTOOLCHAIN=local GOFLAGS=-mod=mod
here="$(cd "$(dirname "$0")" && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

GOBIN="$work/bin" go install "sigs.k8s.io/controller-tools/cmd/controller-gen@${CONTROLLER_TOOLS_VERSION}"

mkdir -p "$work/mod" "$work/out"
cd "$work/mod"
cat > go.mod <<'MOD'
module specdecode.local/pogen

go 1.26.0
MOD
printf 'package pogen\n\nimport _ "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"\n' > tools.go
go get "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring@${PROMETHEUS_OPERATOR_VERSION}"
go mod tidy
"$work/bin/controller-gen" crd \
  paths=github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1 \
  output:crd:dir="$work/out"

for kind in servicemonitors podmonitors prometheusrules; do
  cp "$work/out/monitoring.coreos.com_${kind}.yaml" "$here/"
done
cd "$here"
sha256sum monitoring.coreos.com_*.yaml > SHA256SUMS
