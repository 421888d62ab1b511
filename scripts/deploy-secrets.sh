#!/usr/bin/env bash
# The two Secrets `kubectl apply -k manifests/` needs, in namespace specon: specon-read-token
# (key token: the status API's read token, random) and specon-manager-tls (tls.crt, tls.key,
# ca.crt: the manager's certificate from a CA of this deployment, scripts/deploy-tls.sh).
# Both are made once in DIR and kept there (never in git: DIR holds the CA's key); the
# Secrets are applied from them, so running it again changes nothing. Creates the namespace
# if it is missing. `make deploy` does the same through its overlay (scripts/deploy-overlay.sh).
# Your own CA or cert-manager instead: docs/tls.md.
#
#   scripts/deploy-secrets.sh DIR [KUBECTL...]    # default: kubectl (the current context)
set -euo pipefail
if [[ $# -lt 1 ]]; then
    echo "usage: scripts/deploy-secrets.sh DIR [KUBECTL...]" >&2
    exit 2
fi
dir=$1
shift
if [[ $# -gt 0 ]]; then kubectl=("$@"); else kubectl=(kubectl); fi
here=$(cd "$(dirname "$0")/.." && pwd)
ns=specon
mkdir -p "$dir"
test -s "$dir/read-token" || (umask 077; openssl rand -hex 32 > "$dir/read-token")
bash "$here/scripts/deploy-tls.sh" "$dir/tls" "$ns"
"${kubectl[@]}" get namespace "$ns" >/dev/null 2>&1 || "${kubectl[@]}" create namespace "$ns" >/dev/null
apply() { "${kubectl[@]}" -n "$ns" create secret generic "$@" --dry-run=client -o yaml | "${kubectl[@]}" apply -f - >/dev/null; }
apply specon-read-token --from-file=token="$dir/read-token"
apply specon-manager-tls --type=kubernetes.io/tls --from-file=tls.crt="$dir/tls/manager.crt" \
    --from-file=tls.key="$dir/tls/manager.key" --from-file=ca.crt="$dir/tls/ca.crt"
echo "Secrets specon-read-token and specon-manager-tls in namespace $ns (from $dir)"
