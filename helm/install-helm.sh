#!/usr/bin/env bash
# Install the tools the Helm chart's tests drive, into the project's venv:
#   helm-python-sdk     Helm v4's Go SDK as a shared library with Python bindings: lint,
#                       render and schema-check charts offline (no helm binary is
#                       packaged for Linux in a registry this project reaches);
#   kubernetes-validate the Kubernetes JSON schemas, v1.25 to v1.37, offline.
# Idempotent: when the pinned versions are installed it only says so (well under a second).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv}"
PY="$VENV/bin/python"
PINS=(helm-python-sdk==0.2.2 kubernetes-validate==1.37.0)
STAMP="$VENV/.stamp-helm"

if [ ! -x "$PY" ]; then
  echo "helm: $PY is missing; run make dev first" >&2
  exit 1
fi
if [ "$(cat "$STAMP" 2>/dev/null)" = "${PINS[*]}" ] \
  && "$PY" -c 'import helm_python, kubernetes_validate' 2>/dev/null; then
  echo "helm: helm-python-sdk and kubernetes-validate present"
  exit 0
fi
echo "helm: installing ${PINS[*]}"
"$PY" -m pip --disable-pip-version-check -q install "${PINS[@]}"
"$PY" -c 'import helm_python as h; print(f"helm: Helm SDK {h.helm_sdk_version()} (libhelm_c {h.helm_c_version()})")'
echo "${PINS[*]}" > "$STAMP"
