#!/usr/bin/env bash
# `make deploy`'s lab certificates: a CA of this deployment and the manager's certificate for
# its Service names, made once in DIR (kept: agents keep trusting the same CA). Your own CA or
# cert-manager instead: docs/tls.md. Usage: scripts/deploy-tls.sh DIR [NAMESPACE]
set -euo pipefail
dir=$1 ns=${2:-specon}
mkdir -p "$dir"
cd "$dir"
umask 077
if [[ ! -s ca.crt || ! -s ca.key ]]; then
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 3650 \
        -subj "/CN=specon deployment CA" -keyout ca.key -out ca.crt \
        -addext "basicConstraints=critical,CA:TRUE,pathlen:0" \
        -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
    rm -f manager.crt
fi
if [[ ! -s manager.crt ]] || ! openssl x509 -checkend $((30 * 86400)) -noout -in manager.crt >/dev/null; then
    names="DNS:specon-manager,DNS:specon-manager.$ns,DNS:specon-manager.$ns.svc"
    names+=",DNS:specon-manager.$ns.svc.cluster.local,DNS:localhost,IP:127.0.0.1"
    printf '%s\n' "subjectAltName = $names" "basicConstraints = critical,CA:FALSE" \
        "keyUsage = critical,digitalSignature" "extendedKeyUsage = serverAuth" > manager.ext
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=specon-manager" \
        -keyout manager.key -out manager.csr 2>/dev/null
    openssl x509 -req -in manager.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 397 \
        -extfile manager.ext -out manager.crt 2>/dev/null
    rm -f manager.csr
fi
openssl verify -CAfile ca.crt manager.crt >/dev/null
