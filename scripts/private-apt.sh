# shellcheck shell=bash
# Sourced, not run: an apt of one's own, to download Debian packages without touching the
# system's apt configuration, lists or packages (scripts/install-criu.sh, install-promtool.sh).
#
#   WHAT="CRIU"; . scripts/private-apt.sh      # log, impossible (exit 3: the tests skip)
#   private_apt "$dir" trixie                  # sets APTOPTS, has run `apt-get update`
#   apt-get "${APTOPTS[@]}" install -y -q --download-only criu   # -> $dir/apt/cache/archives

log() { printf '[%s %s] %s\n' "$(basename "$0" .sh)" "$(date +%T)" "$*" >&2; }
impossible() {
    log "cannot use ${WHAT:-it} here: $*"
    exit 3
}

# Configure an isolated apt in $1/apt for Debian suite $2 from the mirror this machine's apt
# already uses: its own sources list, lists, cache and an empty dpkg status (so a download
# takes a package's whole dependency closure), then `apt-get update`. Sets APTOPTS.
private_apt() {
    local dest="$1" suite="$2"
    command -v apt-get >/dev/null || impossible "no apt-get"
    command -v dpkg-deb >/dev/null || impossible "no dpkg-deb"
    # shellcheck source=scripts/debian-mirror.sh
    . "$(dirname "${BASH_SOURCE[0]}")/debian-mirror.sh"
    local mirror keyring opts=""
    read -r mirror keyring < <(debian_mirror "$suite") || true
    [[ -n "${mirror:-}" ]] || impossible "no apt source for a Debian mirror in /etc/apt"
    local apt="$dest/apt"
    mkdir -p "$apt/lists/partial" "$apt/cache/archives/partial"
    [[ -n "${keyring:-}" ]] && opts=" [signed-by=$keyring]"
    echo "deb$opts $mirror $suite main" >"$apt/sources.list"
    : >"$apt/status"
    APTOPTS=(
        -o "DPkg::Lock::Timeout=600" # other apt runs on the machine must not make this fail
        -o "Dir::Etc::SourceList=$apt/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
        -o "Dir::Etc::Preferences=/dev/null" -o "Dir::Etc::PreferencesParts=/dev/null"
        -o "Dir::State::Lists=$apt/lists" -o "Dir::Cache=$apt/cache" -o "Dir::State::status=$apt/status"
        -o "APT::Sandbox::User=root" # the private dirs are root's; no _apt sandbox to hand them to
        -o "APT::Install-Recommends=false" -o "APT::Get::AllowUnauthenticated=false"
    )
    log "fetching from $mirror ($suite)"
    apt-get "${APTOPTS[@]}" update -q >"$dest/apt.log" 2>&1 || {
        tail -n 5 "$dest/apt.log" >&2
        impossible "apt-get update from $mirror ($suite) failed"
    }
}
