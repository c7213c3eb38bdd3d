#!/usr/bin/env bash
# Install the command-line tools later test suites drive: promtool and Prometheus
# (Debian package prometheus) and amtool and Alertmanager (prometheus-alertmanager).
# Idempotent: when both tools are on PATH nothing is installed.
#
# The packages' maintainer scripts would start their daemons; the tests run their own
# Prometheus and Alertmanager on ports of their own, so no daemon may start. A
# policy-rc.d that exits 101 ("action forbidden") tells invoke-rc.d and deb-systemd-invoke
# to start nothing; it is removed afterwards (or the machine's own one put back). There is
# no systemd here, so the check that nothing started looks at the process table.
# `bash .ci/tools.sh prometheus` installs only Prometheus (what `make demo` needs).
set -euo pipefail
missing=()
command -v promtool >/dev/null 2>&1 || missing+=(prometheus)
if [ "${1:-}" != "prometheus" ]; then
  command -v amtool >/dev/null 2>&1 || missing+=(prometheus-alertmanager)
fi
if [ ${#missing[@]} -eq 0 ]; then
  echo "tools: the tools asked for are present"
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
# The packages' daemons, by executable (process names are cut at 15 characters).
DAEMONS=(/usr/bin/prometheus /usr/bin/prometheus-alertmanager /usr/bin/prometheus-node-exporter)
POLICY=/usr/sbin/policy-rc.d
BACKUP=""

daemon_pids() {
  local exe daemon pid
  for exe in /proc/[0-9]*/exe; do
    pid="${exe#/proc/}"
    pid="${pid%/exe}"
    daemon="$(readlink "$exe" 2>/dev/null)" || continue
    for d in "${DAEMONS[@]}"; do
      # `if`, not `&&`: a last test that fails would end the loop with status 1, which
      # pipefail turns into a failed `before=$(daemon_pids)` and set -e into an exit.
      if [ "$daemon" = "$d" ]; then echo "$pid"; fi
    done
  done | sort
}

restore_policy() {
  if [ -n "$BACKUP" ]; then
    $SUDO mv -f "$BACKUP" "$POLICY"
  else
    $SUDO rm -f "$POLICY"
  fi
}

if [ -e "$POLICY" ]; then
  BACKUP="$($SUDO mktemp /usr/sbin/policy-rc.d.stocksentry.XXXXXX)"
  $SUDO cp -p "$POLICY" "$BACKUP"
fi
trap restore_policy EXIT
trap "exit 130" INT
trap "exit 143" TERM
printf '#!/bin/sh\n# stocksentry .ci/tools.sh: start no service while installing tools.\nexit 101\n' \
  | $SUDO tee "$POLICY" >/dev/null
$SUDO chmod 0755 "$POLICY"

before="$(daemon_pids)"
echo "tools: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
after="$(daemon_pids)"
started="$(comm -13 <(echo "$before") <(echo "$after") | tr '\n' ' ')"
if [ -n "${started// /}" ]; then
  echo "tools: the packages started daemons despite $POLICY (pids: $started)" >&2
  exit 1
fi
command -v promtool >/dev/null
[ "${1:-}" = "prometheus" ] || command -v amtool >/dev/null
echo "tools: $(promtool --version 2>&1 | head -n 1)"
