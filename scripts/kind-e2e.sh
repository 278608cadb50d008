#!/usr/bin/env bash
# make kind-e2e: the operator end to end on a real Kubernetes (kind), for machines with Docker.
#   1. a kind cluster            2. the image, built and loaded into it
#   3. helm install (CRD, operator, router)
#   4. an anvil for eip155:8453 in the cluster, turned into a devnet chain (contracts, funded keys)
#   5. a FacilitatorNetwork pointing at it → Ready
#   6. one paid request (verify + settle) through the router
# Needs: docker, kind, kubectl, helm, node (npm ci done). Cannot run where there is no Docker.
# Knobs: KIND_CLUSTER, IMAGE, RELEASE_NAMESPACE, ROUTER_SERVICE, ANVIL_IMAGE, HELM_ARGS, KEEP_CLUSTER=1.
set -euo pipefail
cd "$(dirname "$0")/.."

CLUSTER=${KIND_CLUSTER:-x402-fleet-e2e}
IMAGE=${IMAGE:-x402-fleet:kind-e2e}
RELEASE_NS=${RELEASE_NAMESPACE:-x402-system}
ROUTER_SVC=${ROUTER_SERVICE:-x402-fleet-router}
ANVIL_IMAGE=${ANVIL_IMAGE:-ghcr.io/foundry-rs/foundry:latest}
APP_NS=payments
WORK=$(mktemp -d)
PIDS=()

for tool in docker kind kubectl helm node; do
  command -v "$tool" >/dev/null || { echo "kind-e2e: $tool is required" >&2; exit 2; }
done
[[ -f Dockerfile && -d charts/x402-fleet ]] || { echo "kind-e2e: needs the Dockerfile and charts/x402-fleet (the chart issue)" >&2; exit 2; }

cleanup() {
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null || true; done
  rm -rf "$WORK"
  [[ "${KEEP_CLUSTER:-0}" == 1 ]] || kind delete cluster --name "$CLUSTER"
}
trap cleanup EXIT

forward() { # namespace service local-port remote-port
  kubectl -n "$1" port-forward "svc/$2" "$3:$4" >/dev/null & PIDS+=($!)
  for _ in $(seq 60); do curl -s -o /dev/null "http://127.0.0.1:$3" && return 0; sleep 1; done
  echo "kind-e2e: port-forward to $2 failed" >&2; return 1
}

echo "== 1. cluster"
kind get clusters | grep -qx "$CLUSTER" || kind create cluster --name "$CLUSTER" --wait 180s
kubectl config use-context "kind-$CLUSTER"

echo "== 2. image"
docker build -t "$IMAGE" .
kind load docker-image "$IMAGE" --name "$CLUSTER"

echo "== 3. helm install (the chart's values: image.*, operator.facilitatorImage)"
# shellcheck disable=SC2086
helm upgrade --install x402-fleet charts/x402-fleet --namespace "$RELEASE_NS" --create-namespace \
  --set image.repository="${IMAGE%:*}" --set image.tag="${IMAGE##*:}" --set image.pullPolicy=Never \
  --set operator.facilitatorImage="$IMAGE" ${HELM_ARGS:-} --wait --timeout 5m
kubectl wait crd/facilitatornetworks.x402fleet.io --for=condition=Established --timeout=60s

echo "== 4. an anvil for eip155:8453, made a devnet chain"
kubectl create namespace "$APP_NS" --dry-run=client -o yaml | kubectl apply -f -
kubectl -n "$APP_NS" apply -f - <<EOF
apiVersion: apps/v1
kind: Deployment
metadata: {name: anvil}
spec:
  selector: {matchLabels: {app: anvil}}
  template:
    metadata: {labels: {app: anvil}}
    spec:
      containers:
        - name: anvil
          image: $ANVIL_IMAGE
          command: ["anvil", "--host", "0.0.0.0", "--port", "8545", "--chain-id", "8453"]
          ports: [{containerPort: 8545}]
---
apiVersion: v1
kind: Service
metadata: {name: anvil}
spec: {selector: {app: anvil}, ports: [{port: 8545, targetPort: 8545}]}
EOF
kubectl -n "$APP_NS" rollout status deploy/anvil --timeout=180s
forward "$APP_NS" anvil 18545 8545
forward "$RELEASE_NS" "$ROUTER_SVC" 14020 4020
npx tsx scripts/kind-e2e-chain.ts --rpc-url http://127.0.0.1:18545 --router-url http://127.0.0.1:14020/v2 --out "$WORK"
kubectl -n "$APP_NS" create secret generic base-signer --from-file=signer-keys="$WORK/signer-keys" --dry-run=client -o yaml | kubectl apply -f -

echo "== 5. FacilitatorNetwork → Ready"
kubectl -n "$APP_NS" apply -f - <<EOF
apiVersion: x402fleet.io/v1alpha1
kind: FacilitatorNetwork
metadata: {name: base}
spec:
  network: eip155:8453
  rpc: [{url: "http://anvil.$APP_NS.svc.cluster.local:8545"}]
  signerSecretRef: {name: base-signer}
  schemes: [exact]
EOF
kubectl -n "$APP_NS" wait facilitatornetwork/base --for=condition=Ready --timeout=300s
kubectl -n "$APP_NS" get facilitatornetworks

echo "== 6. one paid request through the router (once it has loaded the routing table)"
for _ in $(seq 120); do curl -s http://127.0.0.1:14020/v2/supported | grep -q '"eip155:8453"' && break; sleep 2; done
npx x402-fleet pay --state-dir "$WORK" --network eip155:8453 --amount 10000 | tee "$WORK/pay.log"
grep -q '/settle -> 200 {"success":true' "$WORK/pay.log"
echo "kind-e2e: passed"
