#!/usr/bin/env bash
# Install (once) CRIU 4.1.x from Debian trixie into a private root, for Docker's transparent
# checkpoint/restore (migration.mode: criu). Debian 12's criu 3.17 fails on recent kernels
# (vDSO error, criu#2532); trixie's runs through its own ld-linux, so the system's apt
# configuration and packages stay untouched.
#
#   scripts/install-criu.sh        # idempotent: exits at once when cached and `criu check` passes
#
# Prints (stdout, one line) the directory holding the `criu` wrapper and `tini-static` (for
# dockerd --init-path): put it first in dockerd's PATH. Everything else goes to stderr.
#
# Where it lives: ${SPECON_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/specon}/criu/{bin,root}
# Exit codes: 0 ready; 3 impossible here (not root, no apt-get, no Debian mirror or it cannot
#             be reached, or this kernel refuses CRIU: `criu check` fails) -> the tests skip;
#             anything else is a real failure.
set -euo pipefail

SUITE=trixie # the first suite whose criu (4.1.x) works on this machine's kernel
PACKAGES=(criu tini)
HERE="$(cd "$(dirname "$0")" && pwd)"
CACHE="${SPECON_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/specon}/criu"
BIN="$CACHE/bin"

WHAT=CRIU
# shellcheck source=scripts/private-apt.sh
. "$HERE/private-apt.sh"

# `criu check` through the wrapper in $1; its complaint on stderr when it fails.
check() {
    [[ -x "$1/criu" && -x "$1/tini-static" && ! -L "$1/tini-static" ]] || return 1
    local out
    out="$("$1/criu" check 2>&1)" && return 0
    printf '%s\n' "$out" | tail -n 5 >&2
    return 1
}

ready() {
    echo "$BIN"
    exit 0
}

# Download the packages' dependency closure from $SUITE and unpack it into $1/root; write the
# wrappers into $1/bin.
build() {
    local dest="$1"
    private_apt "$dest" "$SUITE"
    local apt="$dest/apt"
    mkdir -p "$dest/root" "$dest/bin"
    log "fetching ${PACKAGES[*]} and their dependencies"
    apt-get "${APTOPTS[@]}" install -y -q --download-only "${PACKAGES[@]}" >>"$dest/apt.log" 2>&1 || {
        tail -n 5 "$dest/apt.log" >&2
        impossible "apt-get --download-only ${PACKAGES[*]} ($SUITE) failed"
    }
    local deb n=0
    for deb in "$apt/cache/archives/"*.deb; do
        dpkg-deb -x "$deb" "$dest/root"
        n=$((n + 1))
    done
    log "unpacked $n packages"
    rm -rf "$apt"

    local root="$dest/root" ld
    ld="$(find "$root/usr/lib/x86_64-linux-gnu" "$root/lib64" "$root/usr/lib64" -maxdepth 1 \
        -name 'ld-linux-x86-64.so.2' 2>/dev/null | head -n1 || true)"
    [[ -n "$ld" && -x "$root/usr/sbin/criu" ]] || {
        log "the unpacked root has no ld-linux-x86-64.so.2 or usr/sbin/criu"
        return 1
    }
    ld="${ld#"$root"/}"
    # The wrapper finds its root relative to itself: the cache directory may be renamed (it is,
    # once built) or copied. runc runs `criu swrk` by name from dockerd's PATH.
    cat >"$dest/bin/criu" <<WRAPPER
#!/bin/sh
# CRIU from Debian $SUITE, run through its own dynamic loader and libraries (scripts/install-criu.sh).
root="\$(dirname "\$(readlink -f "\$0")")/../root"
exec "\$root/$ld" --library-path "\$root/usr/lib/x86_64-linux-gnu:\$root/lib/x86_64-linux-gnu" \\
    "\$root/usr/sbin/criu" "\$@"
WRAPPER
    chmod 755 "$dest/bin/criu"
    # tini-static is static, but a copy, not a symlink: a container started with init=True under
    # an --init-path that is a symlink checkpoints, then fails to restore ("criu failed: type
    # NOTIFY").
    cp "$root/usr/bin/tini-static" "$dest/bin/tini-static" || {
        log "the unpacked root has no usr/bin/tini-static"
        return 1
    }
}

main() {
    # CRIU dumps and restores other processes: it (and Docker's checkpoint API) needs root.
    [[ $(id -u) -eq 0 ]] || impossible "CRIU needs root"
    check "$BIN" 2>/dev/null && ready

    mkdir -p "$CACHE"
    # One install at a time (a make target and a test fixture may race).
    exec 9>"$CACHE/.lock"
    flock 9
    check "$BIN" 2>/dev/null && ready

    local t0=$SECONDS
    rm -rf "$CACHE"/build.* # left by an install that was killed (we hold the lock)
    WORK="$(mktemp -d "$CACHE/build.XXXXXX")"
    trap 'rm -rf "$WORK"' EXIT
    build "$WORK"
    if ! check "$WORK/bin"; then
        impossible "\`criu check\` fails on kernel $(uname -r)"
    fi
    rm -rf "$CACHE/bin" "$CACHE/root"
    mv "$WORK/root" "$CACHE/root"
    mv "$WORK/bin" "$CACHE/bin"
    rm -rf "$WORK"
    trap - EXIT
    log "criu $("$BIN/criu" --version 2>/dev/null | awk '/^Version/ {print $2}') ready in $((SECONDS - t0)) s -> $BIN"
    ready
}

main "$@"
