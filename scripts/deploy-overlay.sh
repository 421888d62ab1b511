#!/usr/bin/env bash
# The overlay `make deploy` applies, written to DIR: manifests/ (which serves TLS and wants a
# read token: components/tls, components/read-token) with the two Secrets generated from a
# random read token and a CA of this deployment (scripts/deploy-tls.sh), made once in DIR and
# kept across deploys. With WEBHOOK=1, also components/webhook, its caBundle that CA.
# Usage: [WEBHOOK=1] scripts/deploy-overlay.sh DIR IMAGE   (IMAGE: [registry[:port]/]name[:tag][@digest])
set -euo pipefail
dir=$1 image=$2
here=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$dir"
test -s "$dir/read-token" || (umask 077; openssl rand -hex 32 > "$dir/read-token")
bash "$here/scripts/deploy-tls.sh" "$dir/tls" specon
rel=$(realpath -m --relative-to="$dir" "$here/manifests")
# A tag is what follows the last colon of the last path part (a registry's port is no tag);
# a digest pins the image whatever its tag says.
name=${image%%@*} digest=
[[ $image == *@* ]] && digest=${image#*@}
tag=latest
last=${name##*/}
if [[ $last == *:* ]]; then tag=${last##*:}; name=${name%:*}; fi
if [[ -n $digest ]]; then pin="digest: \"$digest\""; else pin="newTag: \"$tag\""; fi
cat > "$dir/kustomization.yaml" <<YAML
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources: [$rel]
images: [{name: specon, newName: $name, $pin}]
# The names manifests/ mounts and components/monitoring's ServiceMonitor reads its CA from, as
# scripts/deploy-secrets.sh makes them (no hash suffix: the manager re-reads its certificate
# when the Secret changes; the read token is made once and kept).
generatorOptions: {disableNameSuffixHash: true}
secretGenerator:
  - {name: specon-read-token, namespace: specon, files: [token=read-token]}
  - name: specon-manager-tls
    namespace: specon
    type: kubernetes.io/tls
    files: [tls.crt=tls/manager.crt, tls.key=tls/manager.key, ca.crt=tls/ca.crt]
YAML
if [[ ${WEBHOOK:-0} == 1 ]]; then
    cat >> "$dir/kustomization.yaml" <<YAML
# The pod admission webhook, trusting the CA that signed the manager's certificate.
components: [$rel/components/webhook]
replacements:
  - source: {kind: Secret, name: specon-manager-tls, namespace: specon, fieldPath: data.ca\\.crt}
    targets:
      - select: {kind: MutatingWebhookConfiguration, name: specon-pods}
        fieldPaths: [webhooks.0.clientConfig.caBundle]
        options: {create: true}
YAML
fi
