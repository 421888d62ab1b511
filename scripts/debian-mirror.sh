# shellcheck shell=bash
# Sourced, not run: which Debian mirror this machine's apt already uses.
#
#   . scripts/debian-mirror.sh
#   read -r mirror keyring < <(debian_mirror trixie bookworm)   # first suite that has one wins
#
# The first URI under /etc/apt/sources.list.d is not always Debian's (cloud SDKs, nodesource),
# so a source counts only when it serves the named suite.

# "URI [keyring]" of each apt source serving Debian suite $1 (deb822 *.sources, one-line *.list).
debian_sources() {
    local f
    for f in /etc/apt/sources.list.d/*.sources; do
        [[ -f "$f" ]] || continue
        awk -v suite="$1" '
            function flush() { if (ok && uri) print uri, key; ok = 0; uri = ""; key = "" }
            /^[[:space:]]*$/ { flush(); next }
            tolower($1) == "uris:" { uri = $2 }
            tolower($1) == "signed-by:" && $2 ~ /^\// { key = $2 }
            tolower($1) == "suites:" { for (i = 2; i <= NF; i++) if ($i == suite) ok = 1 }
            END { flush() }' "$f"
    done
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
        [[ -f "$f" ]] || continue
        # "deb [opts] URI suite comp..."; without its signed-by, apt's default keyrings apply.
        sed -E 's/\[[^]]*\]//' "$f" | awk -v suite="$1" '$1 == "deb" && $3 == suite { print $2 }'
    done
}

# "URI [keyring]" of the first source serving any of the suites named (in that order), then of
# this system's own release (the same archive serves every suite); nothing when there is none.
debian_mirror() {
    local codename suite
    codename="$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")"
    for suite in "$@" "$codename"; do
        [[ -n "$suite" ]] && debian_sources "$suite"
    done | head -n1
}
