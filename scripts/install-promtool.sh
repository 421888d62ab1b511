#!/usr/bin/env bash
# Install (once) promtool, Prometheus's rule checker, from this machine's Debian release (the
# `prometheus` package, unpacked into a private directory: no service is installed or
# started, the system's apt configuration and packages stay untouched). The suite checks the
# alert rules of manifests/components/monitoring with it.
#
#   scripts/install-promtool.sh     # idempotent: exits at once when cached and it runs
#
# Prints (stdout, one line) the path of the `promtool` binary. Everything else goes to stderr.
# Where it lives: ${SPECON_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/specon}/promtool/promtool
# Exit codes: 0 ready; 3 impossible here (no apt-get, no Debian mirror or it cannot be
#             reached) -> the test skips; anything else is a real failure.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
CACHE="${SPECON_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/specon}/promtool"

WHAT=promtool
# shellcheck source=scripts/private-apt.sh
. "$HERE/private-apt.sh"

ready() {
    echo "$CACHE/promtool"
    exit 0
}

works() { [[ -x "$1" ]] && "$1" --version >/dev/null 2>&1; }

# Download the prometheus package of this system's release and take promtool out of it.
build() {
    local dest="$1"
    local suite
    suite="$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")"
    [[ -n "$suite" ]] || impossible "no VERSION_CODENAME in /etc/os-release"
    private_apt "$dest" "$suite"
    local apt="$dest/apt"
    mkdir -p "$dest/root"
    (cd "$apt/cache/archives" && apt-get "${APTOPTS[@]}" download -q prometheus) >>"$dest/apt.log" 2>&1 || {
        tail -n 5 "$dest/apt.log" >&2
        impossible "apt-get download prometheus ($suite) failed"
    }
    dpkg-deb -x "$apt/cache/archives/"prometheus_*.deb "$dest/root"
    cp "$dest/root/usr/bin/promtool" "$dest/promtool"
}

main() {
    works "$CACHE/promtool" && ready
    mkdir -p "$CACHE"
    exec 9>"$CACHE/.lock" # one install at a time (make and a test may race)
    flock 9
    works "$CACHE/promtool" && ready
    rm -rf "$CACHE"/build.*
    local work
    work="$(mktemp -d "$CACHE/build.XXXXXX")"
    trap 'rm -rf "$work"' EXIT
    build "$work"
    works "$work/promtool" || { log "the unpacked promtool does not run"; exit 1; }
    mv "$work/promtool" "$CACHE/promtool"
    log "$("$CACHE/promtool" --version 2>&1 | head -n1) -> $CACHE/promtool"
    ready
}

main "$@"
