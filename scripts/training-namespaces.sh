#!/usr/bin/env bash
# Prepare the training namespaces of manifests/training before `make deploy` applies their
# Roles: create the missing ones, and have Pod Security Admission enforce at least the
# `baseline` profile in each (warn and audit at `restricted`), so no pod in them, a restored
# copy included, may be privileged, share the host's namespaces or mount a host path, by the
# API server's own rules (Kubernetes >= 1.23; older servers keep the labels and ignore them).
# A namespace that already enforces `baseline` or `restricted` keeps its level; a laxer one
# (none, `privileged`) is raised to `baseline`, and said.
#
#   scripts/training-namespaces.sh [KUBECTL...]    # default: kubectl (the current context)
set -euo pipefail
if [[ $# -gt 0 ]]; then kubectl=("$@"); else kubectl=(kubectl); fi
here=$(cd "$(dirname "$0")/.." && pwd)
PSA=pod-security.kubernetes.io
for ns in $("${kubectl[@]}" kustomize "$here/manifests/training" \
    | awk '/^metadata:/ {m = 1; next} /^[^ ]/ {m = 0} m && /^  namespace: / {print $2}' | sort -u); do
    "${kubectl[@]}" get namespace "$ns" >/dev/null 2>&1 || "${kubectl[@]}" create namespace "$ns"
    level=$("${kubectl[@]}" get namespace "$ns" -o "jsonpath={.metadata.labels.pod-security\.kubernetes\.io/enforce}")
    case "$level" in
        baseline | restricted) ;;
        *)
            [[ -n "$level" ]] && echo "training namespace $ns enforced Pod Security '$level': raised to baseline" >&2
            "${kubectl[@]}" label namespace "$ns" --overwrite "$PSA/enforce=baseline" "$PSA/enforce-version=latest" >/dev/null
            ;;
    esac
    for mode in warn audit; do # never lower what an operator set
        cur=$("${kubectl[@]}" get namespace "$ns" -o "jsonpath={.metadata.labels.pod-security\.kubernetes\.io/$mode}")
        [[ -n "$cur" ]] || "${kubectl[@]}" label namespace "$ns" "$PSA/$mode=restricted" >/dev/null
    done
done
