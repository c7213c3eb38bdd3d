#!/usr/bin/env bash
# Install the command-line tools later test suites drive: promtool and Prometheus
# (Debian package prometheus) and amtool and Alertmanager (prometheus-alertmanager).
set -euo pipefail
missing=()
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
command -v amtool >/dev/null 2>&1 || missing+=(prometheus-alertmanager)
if [ ${#missing[@]} -eq 0 ]; then
  echo "tools: promtool and amtool present"
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
echo "tools: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
# The packages' postinst would start the daemons through systemd; tests start their own.
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
# Debian starts the packaged services where it can; tests run their own on other ports.
for svc in prometheus prometheus-alertmanager prometheus-node-exporter; do
  pkill -x "$svc" 2>/dev/null || true
done
command -v promtool >/dev/null && command -v amtool >/dev/null
echo "tools: $(promtool --version 2>&1 | head -n 1)"
