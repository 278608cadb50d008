// The operator's pure desired-state builders and its input checks (with stubbed I/O); the built
// objects are then sent to a real kube-apiserver as server-side dry runs with strict field
// validation (types, required fields, unknown fields, names, MicroTime: the server's own checks).
import { readFile } from "node:fs/promises";
import { createServer, type AddressInfo } from "node:net";
import { parse as parseYaml } from "yaml";
import { beforeAll, describe, expect, it } from "vitest";
import { Deployment } from "kubernetes-models/apps/v1";
import { ConfigMap, PersistentVolumeClaim, Service } from "kubernetes-models/v1";
import { PodDisruptionBudget } from "kubernetes-models/policy/v1";
import { NetworkPolicy } from "kubernetes-models/networking.k8s.io/v1";
import { Event } from "kubernetes-models/events.k8s.io/v1";
import { CoreV1Api } from "@kubernetes/client-node";
import { generatePrivateKey, privateKeyToAccount } from "viem/accounts";
import { parseRoutingTable } from "../services/router/routing-table.ts";
import { ANNOTATION_SECRETS_HASH, FACILITATOR_PORT, ROUTING_TABLE_KEY, type Condition, type FacilitatorNetwork, type FacilitatorNetworkStatus } from "../operator/api.ts";
import {
  buildDeployment,
  buildEvent,
  buildNetworkPolicy,
  buildPersistentVolumeClaim,
  buildPodDisruptionBudget,
  buildRoutingConfigMap,
  buildRoutingTable,
  buildRouterTokensConfigMap,
  buildService,
  buildStatus,
  deploymentState,
  facilitatorEnv,
  kindsFor,
  mergeCondition,
  networkOwner,
  referencedSecrets,
  secretsDigest,
  sameStatus,
  transitionEvents,
  conditionOf,
  type DeploymentState,
} from "../operator/builders.ts";
import { checkInputs, fetchChainId, type CheckDeps } from "../operator/checks.ts";
import { createEgress } from "../services/platform/egress.ts";
import { fetch as undiciFetch } from "undici";
import { expandEnv } from "./helpers/local-pod.ts";
import { describeWithControlPlane } from "./helpers/control-plane.ts";
import { parseBlocks } from "./helpers/doc-blocks.ts";
import { parseRouterTokens, routerTokenDigests } from "../services/platform/router-token.ts";

function network(overrides: Partial<FacilitatorNetwork["spec"]> = {}, meta: Partial<FacilitatorNetwork["metadata"]> = {}): FacilitatorNetwork {
  return {
    apiVersion: "x402fleet.io/v1alpha1",
    kind: "FacilitatorNetwork",
    metadata: { name: "base", namespace: "payments", uid: "uid-base", generation: 3, creationTimestamp: "2026-01-01T00:00:00Z", ...meta },
    spec: { network: "eip155:8453", rpc: [{ url: "https://rpc.example.com" }], signerSecretRef: { name: "base-signer" }, ...overrides },
  };
}

const OPTS = { image: "ghcr.io/example/x402-fleet:1.2.3", secretsHash: "abc123" };
const NOW = "2026-02-02T00:00:00Z";
const available: DeploymentState = { desired: 1, readyReplicas: 1, availableReplicas: 1, available: true, rolledOut: true, stalled: false };
const env = (fn: FacilitatorNetwork) => Object.fromEntries(facilitatorEnv(fn).map((e) => [e.name, e]));

describe("the Deployment", () => {
  it("runs `x402-fleet facilitator` configured from the spec, with the signer Secret mounted and RPC secrets as references", () => {
    const fn = network({
      rpc: [{ secretKeyRef: { name: "base-rpc", key: "alchemy" } }, { url: "https://public.example.org/rpc" }],
      signerSecretRef: { name: "base-signer", key: "keys.txt" },
      schemes: ["exact", "upto"],
      replicas: 3,
      settlement: { receiptTimeoutSeconds: 15, confirmations: 2, maxFeePerGasWei: "50000000000" },
      assets: ["0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913"],
      database: { urlSecretRef: { name: "base-db", key: "url" } },
    });
    const d = buildDeployment(fn, OPTS);
    new Deployment(d as never).validate();
    const pod = d.spec.template.spec;
    const c = pod.containers[0]!;
    expect(d.metadata).toMatchObject({ name: "base-facilitator", namespace: "payments" });
    expect(d.metadata.ownerReferences).toEqual([
      { apiVersion: "x402fleet.io/v1alpha1", kind: "FacilitatorNetwork", name: "base", uid: "uid-base", controller: true, blockOwnerDeletion: true },
    ]);
    expect(d.spec.replicas).toBe(3);
    expect(c.image).toBe(OPTS.image);
    expect(c.args).toEqual(["facilitator"]);
    expect(c.ports).toEqual([
      { name: "http", containerPort: FACILITATOR_PORT, protocol: "TCP" },
      { name: "admin", containerPort: 9421, protocol: "TCP" },
    ]);
    expect(c.readinessProbe).toEqual({ httpGet: { path: "/readyz", port: "admin" }, periodSeconds: 10, timeoutSeconds: 3, failureThreshold: 3 });
    // the slowest first start measured on a real node (wallets, 45 s on a loaded machine) fits the startup window four times
    expect(c.startupProbe!.periodSeconds! * c.startupProbe!.failureThreshold!).toBeGreaterThanOrEqual(4 * 45);
    expect(c.livenessProbe!.timeoutSeconds).toBeGreaterThanOrEqual(3);
    const e = env(fn);
    expect(e.X402_NETWORK!.value).toBe("eip155:8453");
    expect(e.X402_RPC_URL_0!.valueFrom).toEqual({ secretKeyRef: { name: "base-rpc", key: "alchemy" } });
    expect(e.X402_RPC_URLS!.value).toBe("$(X402_RPC_URL_0),https://public.example.org/rpc");
    const names = facilitatorEnv(fn).map((x) => x.name);
    expect(names.indexOf("X402_RPC_URL_0")).toBeLessThan(names.indexOf("X402_RPC_URLS")); // expansion needs the earlier definition
    expect(e.X402_SIGNER_KEY_FILE!.value).toBe("/var/run/secrets/x402/signer/keys.txt");
    expect(e.X402_SCHEMES!.value).toBe("exact,upto");
    expect(e.X402_RECEIPT_TIMEOUT_MS!.value).toBe("15000");
    expect(e.X402_CONFIRMATIONS!.value).toBe("2");
    expect(e.X402_MAX_FEE_PER_GAS_WEI!.value).toBe("50000000000");
    expect(e.X402_ASSETS!.value).toBe("0x833589fCD6eDb6E08f4c7C32D4f71b54bdA02913");
    expect(e.DATABASE_URL).toEqual({ name: "DATABASE_URL", valueFrom: { secretKeyRef: { name: "base-db", key: "url" } } });
    expect(e.X402_DATA_DIR!.value).toBe("/var/lib/x402");
    expect(c.volumeMounts).toContainEqual({ name: "data", mountPath: "/var/lib/x402" });
    expect(pod.volumes).toContainEqual({ name: "data", emptyDir: {} });
    expect(pod.volumes[0]).toEqual({ name: "signer-keys", secret: { secretName: "base-signer", items: [{ key: "keys.txt", path: "keys.txt" }], defaultMode: 0o440 } });
    expect(c.volumeMounts).toContainEqual({ name: "signer-keys", mountPath: "/var/run/secrets/x402/signer", readOnly: true });
    expect(d.spec.template.metadata.annotations[ANNOTATION_SECRETS_HASH]).toBe("abc123");
    // the selector is a subset of the template labels, and every label value is a valid one
    for (const [k, v] of Object.entries(d.spec.selector.matchLabels)) expect(d.spec.template.metadata.labels[k as keyof typeof d.spec.template.metadata.labels]).toBe(v);
    for (const v of Object.values(d.metadata.labels)) expect(v).toMatch(/^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$/);
    // restricted Pod Security
    expect(pod.securityContext).toMatchObject({ runAsNonRoot: true, seccompProfile: { type: "RuntimeDefault" } });
    expect(c.securityContext).toEqual({ allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, capabilities: { drop: ["ALL"] } });
    expect(pod.automountServiceAccountToken).toBe(false);
    expect(d.spec.strategy).toEqual({ type: "RollingUpdate", rollingUpdate: { maxSurge: 1, maxUnavailable: 0 } });
  });

  it("without a database: the store on a PersistentVolumeClaim and Recreate, so one pod at a time holds the keys", () => {
    const d = buildDeployment(network(), OPTS);
    expect(d.spec.strategy).toEqual({ type: "Recreate" }); // never a surge pod beside the old one
    expect(d.spec.template.spec.volumes).toContainEqual({ name: "data", persistentVolumeClaim: { claimName: "base-facilitator-store" } });
    const claim = buildPersistentVolumeClaim(network())!;
    new PersistentVolumeClaim(claim as never).validate();
    expect(claim.metadata).toMatchObject({ name: "base-facilitator-store", namespace: "payments" });
    expect(claim.metadata.ownerReferences[0]).toMatchObject({ kind: "FacilitatorNetwork", uid: "uid-base", controller: true });
    expect(claim.spec).toEqual({ accessModes: ["ReadWriteOnce"], resources: { requests: { storage: "1Gi" } } }); // the cluster's default class
    expect(buildPersistentVolumeClaim(network({ storage: { size: "5Gi", storageClassName: "fast-ssd" } }))!.spec).toEqual({
      accessModes: ["ReadWriteOnce"],
      resources: { requests: { storage: "5Gi" } },
      storageClassName: "fast-ssd",
    });
    expect(buildPersistentVolumeClaim(network({ database: { urlSecretRef: { name: "db", key: "url" } } }))).toBeUndefined();
  });

  it("mounts a screening ConfigMap as a whole volume and points X402_DENY_LIST_FILE at it", () => {
    const fn = network({ screening: { denyListConfigMapRef: { name: "sanctions", key: "addresses" } } });
    const d = buildDeployment(fn, OPTS);
    const c = d.spec.template.spec.containers[0]!;
    expect(env(fn).X402_DENY_LIST_FILE!.value).toBe("/etc/x402/screening/deny-list.txt");
    expect(c.volumeMounts).toContainEqual({ name: "screening", mountPath: "/etc/x402/screening", readOnly: true });
    expect(d.spec.template.spec.volumes).toContainEqual({ name: "screening", configMap: { name: "sanctions", items: [{ key: "addresses", path: "deny-list.txt" }] } });
    expect(env(network()).X402_DENY_LIST_FILE).toBeUndefined();
    expect(buildDeployment(network(), OPTS).spec.template.spec.volumes.map((v) => v.name)).not.toContain("screening");
  });

  it("passes the ERC-6492 factory allow-list to the pods", () => {
    const fn = network({ eip6492Factories: ["0x4020000000000000000000000000000000006492", "0x00000000000000000000000000000000000000aa"] });
    expect(env(fn).X402_EIP6492_FACTORIES!.value).toBe("0x4020000000000000000000000000000000006492,0x00000000000000000000000000000000000000aa");
    expect(env(network()).X402_EIP6492_FACTORIES).toBeUndefined();
  });

  it("switches ERC-20 approval gas sponsoring on with its bounds; the routing table advertises it only there", () => {
    const fn = network({ network: "eip155:56", gasSponsoring: { erc20Approval: { enabled: true, maxApprovalGas: 80_000, maxFundingWei: "1000000000000000", dailyFundingWei: "50000000000000000" } } });
    const e = env(fn);
    expect([e.X402_ERC20_APPROVAL_SPONSORING!.value, e.X402_ERC20_APPROVAL_MAX_GAS!.value, e.X402_ERC20_APPROVAL_MAX_FUNDING_WEI!.value, e.X402_ERC20_APPROVAL_DAILY_FUNDING_WEI!.value]).toEqual([
      "on",
      "80000",
      "1000000000000000",
      "50000000000000000",
    ]);
    expect(env(network({ gasSponsoring: { erc20Approval: { enabled: false } } })).X402_ERC20_APPROVAL_SPONSORING).toBeUndefined();
    expect(env(network()).X402_ERC20_APPROVAL_SPONSORING).toBeUndefined();
    const ctx = { now: NOW, clusterDomain: "cluster.local" };
    const ready = (f: FacilitatorNetwork): FacilitatorNetwork => ({ ...f, status: buildStatus(f, { signers: ["0x70997970C51812dc3A010C7d01b50e0d17dc79C8"] }, available, ctx) });
    const table = buildRoutingTable([ready({ ...fn, metadata: { ...fn.metadata, name: "bsc", uid: "uid-bsc" } }), ready(network())], "cluster.local");
    expect(table.backends.map((b) => [b.network, b.extensions.includes("erc20ApprovalGasSponsoring")])).toEqual([
      ["eip155:56", true],
      ["eip155:8453", false],
    ]);
  });

  it("points the pods at a screening service: its URL from the Secret, its budget, failure policy and cache; the Secret is watched", () => {
    const fn = network({ screening: { service: { urlSecretRef: { name: "screening", key: "url" }, timeoutMs: 250, failure: "open", cacheSeconds: 30 } } });
    const e = env(fn);
    expect(e.X402_SCREENING_URL!.valueFrom).toEqual({ secretKeyRef: { name: "screening", key: "url" } });
    expect([e.X402_SCREENING_TIMEOUT_MS!.value, e.X402_SCREENING_FAILURE!.value, e.X402_SCREENING_CACHE_MS!.value]).toEqual(["250", "open", "30000"]);
    expect(e.X402_DENY_LIST_FILE).toBeUndefined(); // no deny-list named: none mounted
    expect(buildDeployment(fn, OPTS).spec.template.spec.volumes.map((v) => v.name)).not.toContain("screening");
    expect(referencedSecrets(fn)).toContain("screening");
    expect(env(network()).X402_SCREENING_URL).toBeUndefined();
  });

  it("defaults schemes, replicas, key name and resources, and honours image and resources overrides", () => {
    const d = buildDeployment(network(), OPTS);
    const c = d.spec.template.spec.containers[0]!;
    expect(d.spec.replicas).toBe(1);
    expect(env(network()).X402_SCHEMES!.value).toBe("exact");
    expect(env(network()).X402_SIGNER_KEY_FILE!.value).toBe("/var/run/secrets/x402/signer/signer-keys");
    expect(env(network()).X402_CONFIRMATIONS).toBeUndefined();
    expect(env(network()).DATABASE_URL).toBeUndefined(); // the embedded store, on its claim
    expect(env(network()).X402_DATA_DIR!.value).toBe("/var/lib/x402");
    expect(c.resources).toEqual({ requests: { cpu: "100m", memory: "128Mi" }, limits: { memory: "1Gi" } });
    const custom = buildDeployment(network({ image: "registry.local/x402:dev", resources: { requests: { cpu: "1" }, limits: { cpu: 2, memory: "1Gi" } } }), OPTS);
    expect(custom.spec.template.spec.containers[0]!.image).toBe("registry.local/x402:dev");
    expect(custom.spec.template.spec.containers[0]!.resources).toEqual({ requests: { cpu: "1" }, limits: { cpu: 2, memory: "1Gi" } });
  });

  it("escapes `$` in inline URLs so the kubelet's $(VAR) expansion yields them unchanged", () => {
    const fn = network({ rpc: [{ secretKeyRef: { name: "s", key: "k" } }, { url: "https://rpc.example.com/$(NOT_A_VAR)/x$y" }] });
    const defined: Record<string, string> = {};
    for (const e of facilitatorEnv(fn)) defined[e.name] = e.valueFrom ? "https://secret.example.com/v2/KEY" : expandEnv(e.value!, defined);
    expect(defined.X402_RPC_URLS).toBe("https://secret.example.com/v2/KEY,https://rpc.example.com/$(NOT_A_VAR)/x$y");
  });

  it("knows every Secret it references (a change to any of them must reach it)", () => {
    const fn = network({
      rpc: [{ secretKeyRef: { name: "rpc-a", key: "url" } }, { url: "https://x.example.com" }, { secretKeyRef: { name: "base-signer", key: "rpc" } }],
      database: { urlSecretRef: { name: "fleet-db", key: "url" } },
    });
    expect(referencedSecrets(fn).sort()).toEqual(["base-signer", "fleet-db", "rpc-a"]);
    expect(referencedSecrets(network())).toEqual(["base-signer"]);
  });

  it("changes its pod template when a referenced secret value changes, and only then", () => {
    const a = secretsDigest([{ ref: "signer:s/k", value: "0x1" }, { ref: "rpc:r/u", value: "https://a" }]);
    expect(secretsDigest([{ ref: "rpc:r/u", value: "https://a" }, { ref: "signer:s/k", value: "0x1" }])).toBe(a);
    expect(secretsDigest([{ ref: "signer:s/k", value: "0x2" }, { ref: "rpc:r/u", value: "https://a" }])).not.toBe(a);
    expect(a).not.toContain("0x1");
  });
});

describe("the Service and the PodDisruptionBudget", () => {
  it("exposes port 4021 named http, selecting exactly the Deployment's pods", () => {
    const fn = network();
    const s = buildService(fn);
    new Service(s as never).validate();
    expect(s.metadata.name).toBe("base-facilitator");
    expect(s.spec.ports).toEqual([
      { name: "http", port: 4021, targetPort: "http", protocol: "TCP" },
      { name: "admin", port: 9421, targetPort: "admin", protocol: "TCP" },
    ]);
    expect(s.spec.selector).toEqual(buildDeployment(fn, OPTS).spec.selector.matchLabels);
  });

  it("exists only with more than one replica", () => {
    expect(buildPodDisruptionBudget(network())).toBeUndefined();
    expect(buildPodDisruptionBudget(network({ replicas: 1 }))).toBeUndefined();
    const pdb = buildPodDisruptionBudget(network({ replicas: 2 }))!;
    new PodDisruptionBudget(pdb as never).validate();
    expect(pdb.spec).toEqual({ maxUnavailable: 1, selector: { matchLabels: buildService(network()).spec.selector } });
  });
});

describe("only the router reaches a facilitator's service port", () => {
  const router = { namespace: "x402-system", podLabels: { "app.kubernetes.io/name": "x402-fleet", "app.kubernetes.io/instance": "fleet", "app.kubernetes.io/component": "router" } };

  it("a NetworkPolicy admits the router's pods to port 4021 and anyone to the admin port (Prometheus, probes)", () => {
    const fn = network();
    const np = buildNetworkPolicy(fn, router);
    new NetworkPolicy(np as never).validate();
    expect(np.metadata).toMatchObject({ name: "base-facilitator", namespace: "payments", ownerReferences: [expect.objectContaining({ kind: "FacilitatorNetwork", uid: "uid-base", controller: true })] });
    expect(np.spec.podSelector.matchLabels).toEqual(buildDeployment(fn, OPTS).spec.selector.matchLabels);
    expect(np.spec.policyTypes).toEqual(["Ingress"]);
    expect(np.spec.ingress).toEqual([
      { from: [{ namespaceSelector: { matchLabels: { "kubernetes.io/metadata.name": "x402-system" } }, podSelector: { matchLabels: router.podLabels } }], ports: [{ port: FACILITATOR_PORT, protocol: "TCP" }] },
      { ports: [{ port: 9421, protocol: "TCP" }] },
    ]);
  });

  it("the router's token digests (never the token) in a ConfigMap the pods mount as a whole volume, X402_ROUTER_TOKEN_FILE pointing at it", () => {
    const fn = network();
    const token = "f".repeat(64);
    const digests = routerTokenDigests(`${token}\n${"e".repeat(64)}\n`);
    const cm = buildRouterTokensConfigMap(fn, digests);
    new ConfigMap(cm as never).validate();
    expect(cm.metadata).toMatchObject({ name: "base-facilitator-router-tokens", namespace: "payments", ownerReferences: [expect.objectContaining({ uid: "uid-base" })] });
    expect(JSON.stringify(cm)).not.toContain(token);
    // what the facilitator reads back: two digests
    expect(parseRouterTokens(cm.data["router-tokens"]).map((e) => [e.token, e.digest.toString("hex")])).toEqual(digests.map((d) => [undefined, d.slice("sha256:".length)]));
    const d = buildDeployment(fn, { ...OPTS, routerTokens: true });
    new Deployment(d as never).validate();
    const c = d.spec.template.spec.containers[0]!;
    expect(c.env).toContainEqual({ name: "X402_ROUTER_TOKEN_FILE", value: "/etc/x402/router-tokens/router-tokens" });
    expect(c.volumeMounts).toContainEqual({ name: "router-tokens", mountPath: "/etc/x402/router-tokens", readOnly: true });
    expect(d.spec.template.spec.volumes).toContainEqual({ name: "router-tokens", configMap: { name: "base-facilitator-router-tokens", items: [{ key: "router-tokens", path: "router-tokens" }] } });
    // without a token Secret the facilitator is open (the NetworkPolicy still holds)
    const open = buildDeployment(fn, OPTS);
    expect(open.spec.template.spec.containers[0]!.env!.map((e) => e.name)).not.toContain("X402_ROUTER_TOKEN_FILE");
    expect(open.spec.template.spec.volumes.map((v) => v.name)).not.toContain("router-tokens");
  });
});

describe("observing a Deployment", () => {
  const dep = (generation: number, spec: number, status: Record<string, unknown>) => deploymentState({ metadata: { generation }, spec: { replicas: spec }, status });
  it("is rolled out only when every pod runs the current template (the kubectl rollout status rule)", () => {
    expect(dep(2, 2, { observedGeneration: 2, replicas: 2, updatedReplicas: 2, availableReplicas: 2, readyReplicas: 2 })).toMatchObject({ rolledOut: true, available: true });
    expect(dep(3, 2, { observedGeneration: 2, replicas: 2, updatedReplicas: 2, availableReplicas: 2 })).toMatchObject({ rolledOut: false, available: true });
    expect(dep(2, 2, { observedGeneration: 2, replicas: 3, updatedReplicas: 2, availableReplicas: 3 })).toMatchObject({ rolledOut: false, available: true });
    expect(dep(2, 2, { observedGeneration: 2, replicas: 2, updatedReplicas: 2, availableReplicas: 0 })).toMatchObject({ rolledOut: false, available: false });
    expect(dep(1, 1, {}).available).toBe(false);
    expect(dep(1, 1, { conditions: [{ type: "Progressing", status: "False", reason: "ProgressDeadlineExceeded" }] }).stalled).toBe(true);
  });
});

describe("status", () => {
  const ctx = { now: NOW, clusterDomain: "cluster.local" };

  it("is Ready with kinds, signers, chain id, url and observedGeneration when the checks pass and a pod serves", () => {
    const s = buildStatus(network({ schemes: ["exact", "upto"] }), { chainId: 8453, signers: ["0xabc"] }, available, ctx);
    expect(s).toMatchObject({
      observedGeneration: 3,
      chainId: 8453,
      signers: ["0xabc"],
      url: "http://base-facilitator.payments.svc.cluster.local:4021/v2",
      kinds: kindsFor("eip155:8453", ["exact", "upto"]),
      replicas: 1,
      readyReplicas: 1,
    });
    const byType = Object.fromEntries(s.conditions!.map((c) => [c.type, c]));
    expect(byType.Ready).toMatchObject({ status: "True", reason: "Available", observedGeneration: 3, lastTransitionTime: NOW });
    expect(byType.Progressing).toMatchObject({ status: "False", reason: "RolloutComplete" });
    expect(byType.Degraded).toMatchObject({ status: "False", reason: "AsExpected" });
    for (const c of s.conditions!) expect(c.reason).toMatch(/^[A-Z][A-Za-z0-9]*$/);
  });

  it("is Degraded with the blocker's reason, not Ready, and lists no kinds", () => {
    const s = buildStatus(network(), { blocker: { reason: "ChainIdMismatch", message: "RPC x reports chain id 137" }, chainId: 137 }, undefined, ctx);
    const byType = Object.fromEntries(s.conditions!.map((c) => [c.type, c]));
    expect(byType.Ready).toMatchObject({ status: "False", reason: "ChainIdMismatch" });
    expect(byType.Degraded).toMatchObject({ status: "True", reason: "ChainIdMismatch", message: "RPC x reports chain id 137" });
    expect(byType.Progressing).toMatchObject({ status: "False", reason: "Blocked" });
    expect(s.kinds).toBeUndefined();
    expect(s.chainId).toBe(137);
  });

  it("is Degraded but still Ready while no RPC answers the operator and the pods serve", () => {
    const s = buildStatus(network(), { warning: { reason: "RpcUnreachable", message: "no RPC endpoint answered" } }, available, ctx);
    const byType = Object.fromEntries(s.conditions!.map((c) => [c.type, c]));
    expect(byType.Ready).toMatchObject({ status: "True", reason: "Available" });
    expect(byType.Degraded).toMatchObject({ status: "True", reason: "RpcUnreachable" });
    expect(s.kinds).toHaveLength(1);
  });

  it("stays Ready while a rollout is in progress, advertising only the kinds both pod generations serve", () => {
    const before = buildStatus(network({ schemes: ["exact", "upto"] }), {}, available, ctx);
    const fn = { ...network({ schemes: ["exact", "batch-settlement"] }, { generation: 4 }), status: before };
    const rolling = buildStatus(fn, {}, { ...available, rolledOut: false }, { ...ctx, now: "2026-03-03T00:00:00Z" });
    expect(rolling.kinds!.map((k) => k.scheme)).toEqual(["exact"]);
    const byType = Object.fromEntries(rolling.conditions!.map((c) => [c.type, c]));
    expect(byType.Ready).toMatchObject({ status: "True", lastTransitionTime: NOW }); // no flip: time kept
    expect(byType.Progressing).toMatchObject({ status: "True", reason: "RollingOut", lastTransitionTime: "2026-03-03T00:00:00Z" });
    expect(rolling.observedGeneration).toBe(4);
    const done = buildStatus({ ...fn, status: rolling }, {}, available, ctx);
    expect(done.kinds!.map((k) => k.scheme)).toEqual(["exact", "batch-settlement"]);
  });

  it("reports the chain checks as ChainChecked without touching Ready, keeps the last result in passes that did not check, and records a flip as an event", () => {
    const failed = buildStatus(network(), { chainId: 8453, chainCheck: { ok: false, message: "1 problem(s): contracts: Permit2 has no code" } }, available, ctx);
    const byType = Object.fromEntries(failed.conditions!.map((c) => [c.type, c]));
    expect(byType.ChainChecked).toMatchObject({ status: "False", reason: "ChecksFailed", message: "1 problem(s): contracts: Permit2 has no code", observedGeneration: 3 });
    expect(byType.Ready).toMatchObject({ status: "True", reason: "Available" }); // informational: never blocks
    expect(transitionEvents(undefined, failed)).toContainEqual({ type: "Warning", reason: "ChainChecksFailed", note: "1 problem(s): contracts: Permit2 has no code" });
    const unchecked = buildStatus({ ...network(), status: failed }, { chainId: 8453 }, available, { ...ctx, now: "2026-03-04T00:00:00Z" });
    expect(unchecked.conditions!.find((c) => c.type === "ChainChecked")).toEqual(byType.ChainChecked);
    expect(transitionEvents(failed, unchecked)).toEqual([]);
    const passed = buildStatus({ ...network(), status: failed }, { chainId: 8453, chainCheck: { ok: true, message: "12 checks passed" } }, available, ctx);
    expect(passed.conditions!.find((c) => c.type === "ChainChecked")).toMatchObject({ status: "True", reason: "ChecksPassed" });
    expect(transitionEvents(failed, passed)).toContainEqual({ type: "Normal", reason: "ChainChecksPassed", note: "12 checks passed" });
    expect(buildStatus(network(), {}, available, ctx).conditions!.map((c) => c.type)).not.toContain("ChainChecked");
  });

  it("moves lastTransitionTime only when a condition's status flips", () => {
    const prev: Condition[] = [{ type: "Ready", status: "False", reason: "A", message: "", lastTransitionTime: "t0" }];
    expect(mergeCondition(prev, "Ready", { status: "False", reason: "B", message: "m" }, 2, "t1").lastTransitionTime).toBe("t0");
    expect(mergeCondition(prev, "Ready", { status: "True", reason: "B", message: "m" }, 2, "t1").lastTransitionTime).toBe("t1");
  });

  it("is compared without regard to key order", () => {
    const a: FacilitatorNetworkStatus = { observedGeneration: 1, chainId: 1 };
    expect(sameStatus(a, { chainId: 1, observedGeneration: 1 })).toBe(true);
    expect(sameStatus(a, { chainId: 2, observedGeneration: 1 })).toBe(false);
  });
});

describe("events", () => {
  const ctx = { now: NOW, clusterDomain: "cluster.local" };
  it("are emitted for state changes only", () => {
    const degraded = buildStatus(network(), { blocker: { reason: "SignerSecretNotFound", message: "signer Secret missing" } }, undefined, ctx);
    expect(transitionEvents(undefined, degraded)).toEqual([{ type: "Warning", reason: "SignerSecretNotFound", note: "signer Secret missing" }]);
    expect(transitionEvents(degraded, degraded)).toEqual([]);
    const ready = buildStatus({ ...network(), status: degraded }, { signers: [] }, available, ctx);
    expect(transitionEvents(degraded, ready).map((e) => `${e.type}/${e.reason}`)).toEqual(["Normal/Recovered", "Normal/Ready"]);
    expect(transitionEvents(ready, ready)).toEqual([]);
    const lost = buildStatus({ ...network(), status: ready }, {}, { ...available, available: false, availableReplicas: 0 }, ctx);
    expect(transitionEvents(ready, lost).map((e) => `${e.type}/${e.reason}`)).toContain("Warning/NotReady");
  });

  it("are valid events.k8s.io/v1 Events with a MicroTime", () => {
    const e = buildEvent(network(), { type: "Warning", reason: "ChainIdMismatch", note: "x" }, { now: new Date("2026-01-01T00:00:00.123Z"), seq: 7, instance: "op-0", controller: "x402fleet.io/operator" });
    new Event(e as never).validate();
    expect(e.eventTime).toBe("2026-01-01T00:00:00.123000Z");
    expect(e.regarding).toMatchObject({ kind: "FacilitatorNetwork", name: "base", namespace: "payments", uid: "uid-base" });
  });
});

describe("the routing table", () => {
  const ctx = { now: NOW, clusterDomain: "cluster.local" };
  const ready = (fn: FacilitatorNetwork): FacilitatorNetwork => ({ ...fn, status: buildStatus(fn, { signers: ["0x70997970C51812dc3A010C7d01b50e0d17dc79C8"] }, available, ctx) });

  it("lists every Ready network once, oldest resource first, ordered by chain id, in the router's own format", () => {
    const base = ready(network());
    const bsc = ready(network({ network: "eip155:56" }, { name: "bsc", uid: "uid-bsc" }));
    const duplicate = ready(network({}, { name: "base-2", namespace: "other", uid: "uid-dup", creationTimestamp: "2026-06-01T00:00:00Z" }));
    const notReady = { ...network({ network: "eip155:137" }, { name: "polygon", uid: "uid-p" }), status: buildStatus(network({ network: "eip155:137" }), { blocker: { reason: "RpcUnreachable", message: "" } }, undefined, ctx) };
    const deleting = ready(network({ network: "eip155:42161" }, { name: "arb", uid: "uid-a", deletionTimestamp: NOW }));
    const table = buildRoutingTable([duplicate, notReady, base, deleting, bsc], "cluster.local");
    expect(table.backends.map((b) => b.network)).toEqual(["eip155:56", "eip155:8453"]);
    expect(table.backends[1]).toEqual({
      network: "eip155:8453",
      url: "http://base-facilitator.payments.svc.cluster.local:4021/v2",
      kinds: [{ x402Version: 2, scheme: "exact", network: "eip155:8453" }],
      signers: ["0x70997970C51812dc3A010C7d01b50e0d17dc79C8"],
      extensions: ["eip2612GasSponsoring", "payment-identifier"], // what the served exact scheme supports, and idempotency ids
    });
    const cm = buildRoutingConfigMap(table, { name: "x402-fleet-routing", namespace: "x402-system" });
    new ConfigMap(cm as never).validate();
    expect(parseRoutingTable(cm.data[ROUTING_TABLE_KEY])).toEqual(table);
    expect(networkOwner([duplicate, base], "eip155:8453")!.metadata.uid).toBe("uid-base");
    // an incumbent (Ready) keeps its network against an older resource that is not Ready
    const olderNotReady = { ...network({}, { name: "early", uid: "uid-early", creationTimestamp: "2025-01-01T00:00:00Z" }) };
    expect(networkOwner([olderNotReady, duplicate], "eip155:8453")!.metadata.uid).toBe("uid-dup");
    expect(networkOwner([olderNotReady, network({}, { uid: "uid-x" })], "eip155:8453")!.metadata.uid).toBe("uid-early");
    expect(buildRoutingTable([], "cluster.local")).toEqual({ backends: [] });
  });

  it("keeps a network that served while it has no available pod (a pod restarted, a Recreate rollout), so the router answers 503 rather than 400; a new or blocked one is not listed", () => {
    const unavailable: DeploymentState = { ...available, readyReplicas: 0, availableReplicas: 0, available: false };
    const served = ready(network());
    const waiting = { ...served, status: buildStatus(served, {}, unavailable, ctx) };
    expect(conditionOf(waiting.status, "Ready")).toMatchObject({ status: "False", reason: "DeploymentUnavailable" });
    expect(waiting.status!.kinds).toEqual(served.status!.kinds);
    expect(buildRoutingTable([waiting], "cluster.local").backends.map((b) => b.network)).toEqual(["eip155:8453"]);
    const fresh = { ...network(), status: buildStatus(network(), {}, unavailable, ctx) };
    expect(buildRoutingTable([fresh], "cluster.local")).toEqual({ backends: [] });
    const blocked = { ...served, status: buildStatus(waiting, { blocker: { reason: "SignerSecretNotFound", message: "" } }, unavailable, ctx) };
    expect(buildRoutingTable([blocked], "cluster.local")).toEqual({ backends: [] });
  });
});

describe("input checks", () => {
  const key = generatePrivateKey();
  const secretUrl = "https://base-mainnet.example.com/v2/SUPER-SECRET-API-KEY";
  const deps = (over: Partial<CheckDeps> & { secrets?: Record<string, Record<string, string>>; chains?: Record<string, number | Error> } = {}): CheckDeps => ({
    readSecret: over.readSecret ?? (async (_ns, name) => (over.secrets ?? { "base-signer": { "signer-keys": `${key}\n` } })[name] && { data: (over.secrets ?? { "base-signer": { "signer-keys": `${key}\n` } })[name]! }),
    chainIdOf:
      over.chainIdOf ??
      (async (url) => {
        const v = (over.chains ?? {})[url] ?? 8453;
        if (v instanceof Error) throw v;
        return v;
      }),
  });

  it("pass with the signer addresses, the chain id and a digest of the secret values", async () => {
    const r = await checkInputs(network(), deps());
    expect(r.observation).toEqual({ signers: [privateKeyToAccount(key).address], chainId: 8453 });
    expect(r.secretsHash).toMatch(/^[0-9a-f]{32}$/);
  });

  it("block on a missing or unparsable signer Secret, without echoing its content", async () => {
    expect((await checkInputs(network(), deps({ secrets: {} }))).observation.blocker).toEqual({
      reason: "SignerSecretNotFound",
      message: 'signer Secret "base-signer" not found in namespace payments',
    });
    expect((await checkInputs(network(), deps({ secrets: { "base-signer": { other: "x" } } }))).observation.blocker?.reason).toBe("SignerSecretInvalid");
    const leaky = `${key.slice(0, 40)}-not-a-key`;
    const bad = await checkInputs(network(), deps({ secrets: { "base-signer": { "signer-keys": `${leaky}\n` } } }));
    expect(bad.observation.blocker?.reason).toBe("SignerSecretInvalid");
    expect(JSON.stringify(bad)).not.toContain(leaky);
  });

  it("resolve RPC URLs from Secrets and name them by reference, never by value", async () => {
    const fn = network({ rpc: [{ secretKeyRef: { name: "base-rpc", key: "url" } }] });
    const secrets = { "base-signer": { "signer-keys": key }, "base-rpc": { url: secretUrl } };
    expect((await checkInputs(fn, deps({ secrets, chains: { [secretUrl]: 137 } }))).observation.blocker).toEqual({
      reason: "ChainIdMismatch",
      message: "RPC Secret base-rpc/url reports chain id 137, but eip155:8453 needs 8453",
    });
    const down = await checkInputs(fn, deps({ secrets, chains: { [secretUrl]: new Error("ECONNREFUSED") } }));
    expect(down.observation.blocker).toBeUndefined(); // an outage does not block: the pods' probes check the RPC
    expect(down.observation.warning).toEqual({ reason: "RpcUnreachable", message: "no RPC endpoint answered eth_chainId: Secret base-rpc/url (ECONNREFUSED)" });
    expect((await checkInputs(fn, deps({ secrets: { "base-signer": { "signer-keys": key } } }))).observation.blocker?.reason).toBe("RpcSecretNotFound");
    const invalid = await checkInputs(fn, deps({ secrets: { ...secrets, "base-rpc": { url: "not a url SECRET" } } }));
    expect(invalid.observation.blocker?.reason).toBe("RpcEndpointInvalid");
    for (const r of [down, invalid]) expect(JSON.stringify(r)).not.toMatch(/SUPER-SECRET|SECRET"/);
  });

  it("refuse RPC endpoints the egress guard refuses (RpcEndpointNotAllowed), before any connection, naming them by reference", async () => {
    const egress = createEgress({ allowPrivateNetworks: false });
    const sockets: unknown[] = [];
    const listener = createServer((sock) => void sockets.push(sock.destroy()));
    await new Promise<void>((r) => listener.listen(0, "127.0.0.1", r));
    const loopback = `http://127.0.0.1:${(listener.address() as AddressInfo).port}/SECRET-PATH`;
    try {
      const guarded = (url: string) => fetchChainId(url, 2000, egress.fetch);
      const fn = network({ rpc: [{ url: "https://rpc.example.com/" }, { secretKeyRef: { name: "base-rpc", key: "url" } }] });
      const secrets = { "base-signer": { "signer-keys": key }, "base-rpc": { url: loopback } };
      const chainIdOf = (url: string) => (url === loopback ? guarded(url) : Promise.resolve(8453));
      const r = await checkInputs(fn, deps({ secrets, chainIdOf }));
      expect(r.observation.blocker).toEqual({
        reason: "RpcEndpointNotAllowed",
        message: "RPC Secret base-rpc/url is a loopback, private or cluster-internal address; the operator contacts public endpoints only unless it allows private RPC (chart value operator.allowPrivateRpc)",
      });
      expect(r.resolved).toBeUndefined(); // nothing for the chain checks to contact either
      for (const url of ["http://10.1.2.3:8545", "http://169.254.169.254/", "http://[fd00::1]/", "http://geth.chains.svc.cluster.local:8545", "http://localhost:8545"]) {
        await expect(guarded(url), url).rejects.toMatchObject({ code: "X402_DESTINATION_NOT_ALLOWED" });
      }
      // the dispatcher itself refuses literal private addresses (a redirect target never meets the literal check)
      await expect(undiciFetch(loopback, { dispatcher: egress.dispatcher })).rejects.toMatchObject({ cause: { code: "X402_DESTINATION_NOT_ALLOWED" } });
      expect(sockets).toHaveLength(0);
      // allowed: the same loopback endpoint is contacted (and is no JSON-RPC server)
      const open = createEgress({ allowPrivateNetworks: true });
      await expect(fetchChainId(loopback, 2000, open.fetch)).rejects.toThrow();
      expect(sockets).toHaveLength(1);
      await open.close();
    } finally {
      listener.close();
      await egress.close();
    }
  });

  it("need the database Secret when a database is configured, and a postgres:// URL in it", async () => {
    const fn = network({ database: { urlSecretRef: { name: "base-db", key: "url" } } });
    const signer = { "base-signer": { "signer-keys": key } };
    expect((await checkInputs(fn, deps({ secrets: signer }))).observation.blocker).toEqual({ reason: "DatabaseSecretNotFound", message: 'database Secret "base-db" not found in namespace payments' });
    const wrong = await checkInputs(fn, deps({ secrets: { ...signer, "base-db": { url: "mysql://user:TOPSECRET@db" } } }));
    expect(wrong.observation.blocker?.reason).toBe("DatabaseSecretInvalid");
    expect(JSON.stringify(wrong)).not.toContain("TOPSECRET");
    const ok = await checkInputs(fn, deps({ secrets: { ...signer, "base-db": { url: "postgres://x402:TOPSECRET@db:5432/x402" } } }));
    expect(ok.observation.blocker).toBeUndefined();
    const other = await checkInputs(fn, deps({ secrets: { ...signer, "base-db": { url: "postgres://x402:CHANGED@db:5432/x402" } } }));
    expect(other.secretsHash).not.toBe(ok.secretsHash); // a new database password rolls the pods
  });

  it("accept one unreachable endpoint among several (fallback), but no endpoint on another chain", async () => {
    const fn = network({ rpc: [{ url: "https://a.example.com" }, { url: "https://b.example.com" }] });
    expect((await checkInputs(fn, deps({ chains: { "https://a.example.com": new Error("timeout") } }))).observation.blocker).toBeUndefined();
    expect((await checkInputs(fn, deps({ chains: { "https://b.example.com": 1 } }))).observation.blocker?.message).toBe(
      "RPC b.example.com reports chain id 1, but eip155:8453 needs 8453",
    );
  });
});

describeWithControlPlane("the built objects on kube-apiserver (server-side dry run, strict field validation)", {}, (cp) => {
  beforeAll(async () => {
    await cp().kc.makeApiClient(CoreV1Api).createNamespace({ body: { metadata: { name: "payments" } } });
  });
  /** POST as kubectl would (the JSON as built, not client-node's typed models), dryRun=All: the status code and message. */
  const dryRun = async (collection: string, body: object) => {
    const res = await cp().request(`${collection}?dryRun=All&fieldValidation=Strict`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
    return { status: res.status, message: (JSON.parse(res.text) as { message?: string }).message ?? "" };
  };
  const full = network({
    rpc: [{ secretKeyRef: { name: "base-rpc", key: "alchemy" } }, { url: "https://public.example.org/rpc" }],
    schemes: ["exact", "upto"],
    replicas: 3,
    settlement: { receiptTimeoutSeconds: 15, confirmations: 2, maxFeePerGasWei: "50000000000" },
    database: { urlSecretRef: { name: "base-db", key: "url" } },
    resources: { requests: { cpu: "100m", memory: "128Mi" }, limits: { memory: "512Mi" } },
  });

  it("accepts the doctor Job of docs/networks.md, and its env and mounts are the facilitator pod's", async () => {
    const page = await readFile(new URL("../docs/networks.md", import.meta.url), "utf8");
    const job = parseBlocks("docs/networks.md", page).find((b) => b.lang === "yaml" && b.body.includes("kind: Job"));
    expect(job).toBeDefined();
    const manifest = parseYaml(job!.body) as { spec: { template: { spec: { containers: { args: string[]; env: { name: string; value?: string }[]; volumeMounts: { mountPath: string }[] }[] } } } };
    expect(await dryRun("/apis/batch/v1/namespaces/payments/jobs", manifest)).toEqual({ status: 201, message: "" });
    const container = manifest.spec.template.spec.containers[0]!;
    expect(container.args[0]).toBe("doctor");
    const pod = buildDeployment(network({ rpc: [{ secretKeyRef: { name: "base-rpc", key: "url" } }] }), OPTS).spec.template.spec.containers[0]!;
    const podEnv = Object.fromEntries(pod.env!.map((e) => [e.name, e]));
    // the same key file path and the same $(X402_RPC_URL_0) reference from the same Secret as the pods
    expect(container.env.find((e) => e.name === "X402_SIGNER_KEY_FILE")).toEqual(podEnv.X402_SIGNER_KEY_FILE);
    expect(container.env.find((e) => e.name === "X402_RPC_URL_0")).toEqual(podEnv.X402_RPC_URL_0);
    expect(container.volumeMounts[0]!.mountPath).toBe(pod.volumeMounts!.find((m) => m.name === "signer-keys")!.mountPath);
  });

  it("accepts the Deployment, the Service, the PodDisruptionBudget, the routing ConfigMap and an Event", async () => {
    expect(await dryRun("/apis/apps/v1/namespaces/payments/deployments", buildDeployment(full, OPTS))).toEqual({ status: 201, message: "" });
    expect(await dryRun("/api/v1/namespaces/payments/services", buildService(full))).toEqual({ status: 201, message: "" });
    expect(await dryRun("/apis/policy/v1/namespaces/payments/poddisruptionbudgets", buildPodDisruptionBudget(full)!)).toEqual({ status: 201, message: "" });
    const embedded = network({ storage: { size: "2Gi", storageClassName: "standard" }, screening: { denyListConfigMapRef: { name: "sanctions", key: "addresses" } } });
    expect(await dryRun("/api/v1/namespaces/payments/persistentvolumeclaims", buildPersistentVolumeClaim(embedded)!)).toEqual({ status: 201, message: "" });
    expect(await dryRun("/apis/apps/v1/namespaces/payments/deployments", buildDeployment(embedded, OPTS))).toEqual({ status: 201, message: "" });
    expect(await dryRun("/apis/networking.k8s.io/v1/namespaces/payments/networkpolicies", buildNetworkPolicy(full, { namespace: "x402-system", podLabels: { "app.kubernetes.io/component": "router" } }))).toEqual({ status: 201, message: "" });
    expect(await dryRun("/api/v1/namespaces/payments/configmaps", buildRouterTokensConfigMap(full, routerTokenDigests("f".repeat(64))))).toEqual({ status: 201, message: "" });
    expect(await dryRun("/apis/apps/v1/namespaces/payments/deployments", buildDeployment(full, { ...OPTS, routerTokens: true }))).toEqual({ status: 201, message: "" });
    const table = buildRoutingTable([], "cluster.local");
    expect(await dryRun("/api/v1/namespaces/payments/configmaps", buildRoutingConfigMap(table, { name: "x402-fleet-routing", namespace: "payments" }))).toEqual({ status: 201, message: "" });
    const e = buildEvent(full, { type: "Warning", reason: "ChainIdMismatch", note: "x" }, { now: new Date("2026-01-01T00:00:00.123Z"), seq: 7, instance: "op-0", controller: "x402fleet.io/operator" });
    expect(await dryRun("/apis/events.k8s.io/v1/namespaces/payments/events", e)).toEqual({ status: 201, message: "" });
  });

  it("the check itself: the server refuses an unknown field and a selector that does not match the template", async () => {
    const d = buildDeployment(full, OPTS);
    const typo = { ...d, spec: { ...d.spec, replica: 2 } };
    expect(await dryRun("/apis/apps/v1/namespaces/payments/deployments", typo)).toMatchObject({ status: 400, message: expect.stringContaining('unknown field "spec.replica"') });
    const mismatch = { ...d, spec: { ...d.spec, selector: { matchLabels: { other: "x" } } } };
    expect(await dryRun("/apis/apps/v1/namespaces/payments/deployments", mismatch)).toMatchObject({ status: 422, message: expect.stringContaining("`selector` does not match template `labels`") });
  });
});
