// Desired state, as plain functions of a FacilitatorNetwork and what was observed about it: the
// Deployment, Service and PodDisruptionBudget of its facilitator pods, its status and conditions,
// the events of its state changes, and the router's aggregated routing table. No I/O here.
import { createHash } from "node:crypto";
import type { RoutingTable } from "../services/router/routing-table.ts";
import { extensionsFor } from "../services/x402/extensions.ts";
import { chainIdOf } from "../services/x402/networks.ts";
import {
  ADMIN_PORT,
  ANNOTATION_SECRETS_HASH,
  API_VERSION,
  DATA_MOUNT_PATH,
  DEFAULT_SIGNER_KEY,
  FACILITATOR_PORT,
  KIND,
  LABEL_CHAIN_ID,
  LABEL_COMPONENT,
  LABEL_INSTANCE,
  LABEL_MANAGED_BY,
  LABEL_NAME,
  LABEL_PART_OF,
  MANAGED_BY,
  ROUTER_TOKENS_KEY,
  ROUTER_TOKENS_MOUNT_PATH,
  ROUTING_TABLE_KEY,
  SCREENING_MOUNT_PATH,
  SIGNER_MOUNT_PATH,
  type Condition,
  type ConditionType,
  type DegradedReason,
  type FacilitatorNetwork,
  type FacilitatorNetworkStatus,
  type Kind,
  type OwnerReference,
  type Quantity,
} from "./api.ts";

export const X402_VERSION = 2;

export interface BuildOptions {
  /** The facilitator image used when the resource does not override it. */
  image: string;
  /** Digest of the referenced Secret values (signer keys, RPC URLs): a change rolls the pods. */
  secretsHash: string;
  /** The router's token digests are mounted (buildRouterTokensConfigMap): /settle only from the router. */
  routerTokens?: boolean;
}

/** Deployment, Service and PodDisruptionBudget share this name. The CRD caps metadata.name so it fits a Service name. */
export function childName(fn: FacilitatorNetwork): string {
  return `${fn.metadata.name}-facilitator`;
}

export function selectorLabels(fn: FacilitatorNetwork): Record<string, string> {
  return { [LABEL_NAME]: "x402-fleet-facilitator", [LABEL_INSTANCE]: fn.metadata.name };
}

export function childLabels(fn: FacilitatorNetwork): Record<string, string> {
  return {
    ...selectorLabels(fn),
    [LABEL_COMPONENT]: "facilitator",
    [LABEL_PART_OF]: "x402-fleet",
    [LABEL_MANAGED_BY]: MANAGED_BY,
    [LABEL_CHAIN_ID]: String(chainIdOf(fn.spec.network)),
  };
}

export function ownerReference(fn: FacilitatorNetwork): OwnerReference {
  if (!fn.metadata.uid) throw new Error(`FacilitatorNetwork ${fn.metadata.namespace}/${fn.metadata.name} has no uid`);
  return { apiVersion: API_VERSION, kind: KIND, name: fn.metadata.name, uid: fn.metadata.uid, controller: true, blockOwnerDeletion: true };
}

/** The in-cluster address of a network's facilitator Service, as the router reaches it. */
export function serviceUrl(fn: FacilitatorNetwork, clusterDomain: string): string {
  return `http://${childName(fn)}.${fn.metadata.namespace}.svc.${clusterDomain}:${FACILITATOR_PORT}/v2`;
}

export function schemesOf(fn: FacilitatorNetwork): string[] {
  return fn.spec.schemes?.length ? [...fn.spec.schemes] : ["exact"];
}

export function kindsFor(network: string, schemes: readonly string[]): Kind[] {
  return schemes.map((scheme) => ({ x402Version: X402_VERSION, scheme, network }));
}

export function signerKeyName(fn: FacilitatorNetwork): string {
  return fn.spec.signerSecretRef.key ?? DEFAULT_SIGNER_KEY;
}

/** sha256 over the referenced secret values, in a stable order. Reveals nothing about high-entropy keys. */
export function secretsDigest(values: { ref: string; value: string }[]): string {
  const h = createHash("sha256");
  for (const { ref, value } of [...values].sort((a, b) => (a.ref < b.ref ? -1 : a.ref > b.ref ? 1 : 0))) {
    h.update(`${ref.length}:${ref}${value.length}:${value}`);
  }
  return h.digest("hex").slice(0, 32);
}

/** Kubernetes expands $(VAR) in env values; `$$` is a literal `$`. */
function escapeEnvValue(v: string): string {
  return v.replace(/\$/g, "$$$$");
}

export interface EnvVar {
  name: string;
  value?: string;
  valueFrom?: { secretKeyRef: { name: string; key: string } };
}

/** The facilitator's configuration as container environment (see `x402-fleet facilitator`). Secret values stay references. */
export function facilitatorEnv(fn: FacilitatorNetwork): EnvVar[] {
  const { spec } = fn;
  const env: EnvVar[] = [{ name: "X402_NETWORK", value: spec.network }];
  const urls: string[] = [];
  spec.rpc.forEach((endpoint, i) => {
    if (endpoint.secretKeyRef) {
      // Defined before X402_RPC_URLS so that $(X402_RPC_URL_i) expands inside it.
      const name = `X402_RPC_URL_${i}`;
      env.push({ name, valueFrom: { secretKeyRef: { name: endpoint.secretKeyRef.name, key: endpoint.secretKeyRef.key } } });
      urls.push(`$(${name})`);
    } else {
      urls.push(escapeEnvValue(endpoint.url));
    }
  });
  env.push({ name: "X402_RPC_URLS", value: urls.join(",") });
  env.push({ name: "X402_SIGNER_KEY_FILE", value: `${SIGNER_MOUNT_PATH}/${signerKeyName(fn)}` });
  env.push({ name: "X402_SCHEMES", value: schemesOf(fn).join(",") });
  env.push({ name: "HOST", value: "0.0.0.0" });
  env.push({ name: "PORT", value: String(FACILITATOR_PORT) });
  env.push({ name: "ADMIN_PORT", value: String(ADMIN_PORT) });
  env.push({ name: "X402_DATA_DIR", value: DATA_MOUNT_PATH });
  if (spec.database) env.push({ name: "DATABASE_URL", valueFrom: { secretKeyRef: { name: spec.database.urlSecretRef.name, key: spec.database.urlSecretRef.key } } });
  const s = spec.settlement ?? {};
  if (s.receiptTimeoutSeconds !== undefined) env.push({ name: "X402_RECEIPT_TIMEOUT_MS", value: String(s.receiptTimeoutSeconds * 1000) });
  if (s.confirmations !== undefined) env.push({ name: "X402_CONFIRMATIONS", value: String(s.confirmations) });
  if (s.maxFeePerGasWei !== undefined) env.push({ name: "X402_MAX_FEE_PER_GAS_WEI", value: s.maxFeePerGasWei });
  if (spec.assets?.length) env.push({ name: "X402_ASSETS", value: spec.assets.join(",") });
  if (spec.eip6492Factories?.length) env.push({ name: "X402_EIP6492_FACTORIES", value: spec.eip6492Factories.join(",") });
  const approval = spec.gasSponsoring?.erc20Approval;
  if (approval?.enabled) {
    env.push({ name: "X402_ERC20_APPROVAL_SPONSORING", value: "on" });
    if (approval.maxApprovalGas !== undefined) env.push({ name: "X402_ERC20_APPROVAL_MAX_GAS", value: String(approval.maxApprovalGas) });
    if (approval.maxFundingWei !== undefined) env.push({ name: "X402_ERC20_APPROVAL_MAX_FUNDING_WEI", value: approval.maxFundingWei });
    if (approval.dailyFundingWei !== undefined) env.push({ name: "X402_ERC20_APPROVAL_DAILY_FUNDING_WEI", value: approval.dailyFundingWei });
  }
  if (spec.screening?.denyListConfigMapRef) env.push({ name: "X402_DENY_LIST_FILE", value: `${SCREENING_MOUNT_PATH}/deny-list.txt` });
  const hook = spec.screening?.service;
  if (hook) {
    env.push({ name: "X402_SCREENING_URL", valueFrom: { secretKeyRef: { name: hook.urlSecretRef.name, key: hook.urlSecretRef.key } } });
    if (hook.timeoutMs !== undefined) env.push({ name: "X402_SCREENING_TIMEOUT_MS", value: String(hook.timeoutMs) });
    if (hook.failure !== undefined) env.push({ name: "X402_SCREENING_FAILURE", value: hook.failure });
    if (hook.cacheSeconds !== undefined) env.push({ name: "X402_SCREENING_CACHE_MS", value: String(hook.cacheSeconds * 1000) });
  }
  return env;
}

/**
 * Probe timings of the facilitator pods, the chart's too (templates/_helpers.tpl "x402-fleet.probes").
 * The admin port opens once the store is open and migrated: a facilitator creating its embedded
 * store took 29 s on a real node, wallets 45 s on a loaded one; the startup window (2 s x 90 =
 * 180 s) is four times the slowest. An embedded store runs on the event loop and may hold /healthz
 * a moment: timeouts of 3 s (5 s for liveness), and a restart only after a minute without answers.
 */
export const PROBE_TIMINGS = {
  startup: { periodSeconds: 2, timeoutSeconds: 3, failureThreshold: 90 },
  readiness: { periodSeconds: 10, timeoutSeconds: 3, failureThreshold: 3 },
  liveness: { periodSeconds: 20, timeoutSeconds: 5, failureThreshold: 3 },
} as const;

const DEFAULT_RESOURCES: { requests: Record<string, Quantity>; limits: Record<string, Quantity> } = {
  requests: { cpu: "100m", memory: "128Mi" },
  // The embedded store (PGlite) alone takes ~700 MiB; with spec.database (PostgreSQL) the pod needs ~200 MiB.
  limits: { memory: "1Gi" },
};

/** The embedded store's claim: `<name>-facilitator-store`. */
export function storeClaimName(fn: FacilitatorNetwork): string {
  return `${childName(fn)}-store`;
}

/**
 * Without a shared database the one pod's embedded store holds the outbox and the nonces: it lives
 * on a claim that survives restarts (collected with the resource).
 */
export function buildPersistentVolumeClaim(fn: FacilitatorNetwork) {
  if (fn.spec.database) return undefined;
  const storage = fn.spec.storage ?? {};
  return {
    apiVersion: "v1",
    kind: "PersistentVolumeClaim",
    metadata: { name: storeClaimName(fn), namespace: fn.metadata.namespace, labels: childLabels(fn), ownerReferences: [ownerReference(fn)] },
    spec: {
      accessModes: ["ReadWriteOnce"],
      resources: { requests: { storage: storage.size ?? "1Gi" } },
      ...(storage.storageClassName ? { storageClassName: storage.storageClassName } : {}),
    },
  };
}

export function buildDeployment(fn: FacilitatorNetwork, opts: BuildOptions) {
  const name = childName(fn);
  const labels = childLabels(fn);
  const replicas = fn.spec.replicas ?? 1;
  // With a shared database, replicas are interchangeable: surge one, never go below the count.
  // Without, the single pod owns the keys and the store: the old pod is gone before the new one
  // starts (a short gap in service rather than two signers with two stores).
  const strategy = fn.spec.database ? { type: "RollingUpdate", rollingUpdate: { maxSurge: 1, maxUnavailable: 0 } } : { type: "Recreate" };
  return {
    apiVersion: "apps/v1",
    kind: "Deployment",
    metadata: { name, namespace: fn.metadata.namespace, labels, ownerReferences: [ownerReference(fn)] },
    spec: {
      replicas,
      revisionHistoryLimit: 3,
      selector: { matchLabels: selectorLabels(fn) },
      strategy,
      template: {
        metadata: { labels, annotations: { [ANNOTATION_SECRETS_HASH]: opts.secretsHash } },
        spec: {
          automountServiceAccountToken: false,
          enableServiceLinks: false,
          securityContext: { runAsNonRoot: true, runAsUser: 65532, runAsGroup: 65532, fsGroup: 65532, seccompProfile: { type: "RuntimeDefault" } },
          terminationGracePeriodSeconds: 30,
          topologySpreadConstraints: [
            { maxSkew: 1, topologyKey: "kubernetes.io/hostname", whenUnsatisfiable: "ScheduleAnyway", labelSelector: { matchLabels: selectorLabels(fn) } },
          ],
          containers: [
            {
              name: "facilitator",
              image: fn.spec.image ?? opts.image,
              args: ["facilitator"],
              ports: [
                { name: "http", containerPort: FACILITATOR_PORT, protocol: "TCP" },
                { name: "admin", containerPort: ADMIN_PORT, protocol: "TCP" },
              ],
              env: [...facilitatorEnv(fn), ...(opts.routerTokens ? [{ name: "X402_ROUTER_TOKEN_FILE", value: `${ROUTER_TOKENS_MOUNT_PATH}/${ROUTER_TOKENS_KEY}` }] : [])],
              resources: {
                requests: fn.spec.resources?.requests ?? DEFAULT_RESOURCES.requests,
                limits: fn.spec.resources?.limits ?? DEFAULT_RESOURCES.limits,
              },
              // The facilitator serves only after its RPC answered with the right chain id; /readyz
              // also checks the RPC, a funded signer and the store.
              startupProbe: { httpGet: { path: "/healthz", port: "admin" }, ...PROBE_TIMINGS.startup },
              readinessProbe: { httpGet: { path: "/readyz", port: "admin" }, ...PROBE_TIMINGS.readiness },
              livenessProbe: { httpGet: { path: "/healthz", port: "admin" }, ...PROBE_TIMINGS.liveness },
              securityContext: { allowPrivilegeEscalation: false, readOnlyRootFilesystem: true, capabilities: { drop: ["ALL"] } },
              volumeMounts: [
                { name: "signer-keys", mountPath: SIGNER_MOUNT_PATH, readOnly: true },
                { name: "data", mountPath: DATA_MOUNT_PATH },
                { name: "tmp", mountPath: "/tmp" },
                ...(fn.spec.screening?.denyListConfigMapRef ? [{ name: "screening", mountPath: SCREENING_MOUNT_PATH, readOnly: true }] : []),
                ...(opts.routerTokens ? [{ name: "router-tokens", mountPath: ROUTER_TOKENS_MOUNT_PATH, readOnly: true }] : []),
              ],
            },
          ],
          volumes: [
            {
              name: "signer-keys",
              secret: { secretName: fn.spec.signerSecretRef.name, items: [{ key: signerKeyName(fn), path: signerKeyName(fn) }], defaultMode: 0o440 },
            },
            fn.spec.database ? { name: "data", emptyDir: {} } : { name: "data", persistentVolumeClaim: { claimName: storeClaimName(fn) } },
            { name: "tmp", emptyDir: {} },
            // the whole volume, not a subPath: an edited ConfigMap reaches the running pod
            ...(fn.spec.screening?.denyListConfigMapRef
              ? [{ name: "screening", configMap: { name: fn.spec.screening.denyListConfigMapRef.name, items: [{ key: fn.spec.screening.denyListConfigMapRef.key, path: "deny-list.txt" }] } }]
              : []),
            // a whole volume too: a rotated token reaches the running pods without a restart
            ...(opts.routerTokens ? [{ name: "router-tokens", configMap: { name: routerTokensName(fn), items: [{ key: ROUTER_TOKENS_KEY, path: ROUTER_TOKENS_KEY }] } }] : []),
          ],
        },
      },
    },
  };
}

export function buildService(fn: FacilitatorNetwork) {
  return {
    apiVersion: "v1",
    kind: "Service",
    metadata: { name: childName(fn), namespace: fn.metadata.namespace, labels: childLabels(fn), ownerReferences: [ownerReference(fn)] },
    spec: {
      type: "ClusterIP",
      selector: selectorLabels(fn),
      ports: [
        { name: "http", port: FACILITATOR_PORT, targetPort: "http", protocol: "TCP" },
        { name: "admin", port: ADMIN_PORT, targetPort: "admin", protocol: "TCP" },
      ],
    },
  };
}

/** A PodDisruptionBudget only makes sense with more than one replica. */
export function buildPodDisruptionBudget(fn: FacilitatorNetwork) {
  if ((fn.spec.replicas ?? 1) <= 1) return undefined;
  return {
    apiVersion: "policy/v1",
    kind: "PodDisruptionBudget",
    metadata: { name: childName(fn), namespace: fn.metadata.namespace, labels: childLabels(fn), ownerReferences: [ownerReference(fn)] },
    spec: { maxUnavailable: 1, selector: { matchLabels: selectorLabels(fn) } },
  };
}

// ---- who may call the facilitator: the router only ------------------------------------------

/** The router's pods when the operator is not told their labels (the chart tells it). */
export const DEFAULT_ROUTER_POD_LABELS: Record<string, string> = { [LABEL_COMPONENT]: "router" };

/** The router as a facilitator's peer: where its pods run, their labels, and its tokens' digests. */
export interface RouterAccess {
  namespace: string;
  podLabels: Record<string, string>;
  /** `sha256:<hex>` lines of the router's token Secret (platform/router-token.ts); unset: no credential. */
  tokenDigests?: string[];
}

/** `<name>-facilitator-router-tokens`: the digests only, so the token never leaves the router's namespace. */
export function routerTokensName(fn: FacilitatorNetwork): string {
  return `${childName(fn)}-router-tokens`;
}

export function buildRouterTokensConfigMap(fn: FacilitatorNetwork, digests: string[]) {
  return {
    apiVersion: "v1",
    kind: "ConfigMap",
    metadata: { name: routerTokensName(fn), namespace: fn.metadata.namespace, labels: childLabels(fn), ownerReferences: [ownerReference(fn)] },
    data: { [ROUTER_TOKENS_KEY]: `${digests.join("\n")}\n` },
  };
}

/**
 * The facilitator's service port admits the router's pods only (a caller elsewhere would skip its
 * API keys, quotas and budgets); the admin port (/metrics, probes) stays open to any peer, as the
 * chart's networkPolicy.metricsFrom defaults to. Egress is left alone (RPC providers anywhere).
 */
export function buildNetworkPolicy(fn: FacilitatorNetwork, router: RouterAccess) {
  return {
    apiVersion: "networking.k8s.io/v1",
    kind: "NetworkPolicy",
    metadata: { name: childName(fn), namespace: fn.metadata.namespace, labels: childLabels(fn), ownerReferences: [ownerReference(fn)] },
    spec: {
      podSelector: { matchLabels: selectorLabels(fn) },
      policyTypes: ["Ingress"],
      ingress: [
        {
          from: [{ namespaceSelector: { matchLabels: { "kubernetes.io/metadata.name": router.namespace } }, podSelector: { matchLabels: router.podLabels } }],
          ports: [{ port: FACILITATOR_PORT, protocol: "TCP" }],
        },
        { ports: [{ port: ADMIN_PORT, protocol: "TCP" }] },
      ],
    },
  };
}

// ---- observing the Deployment -------------------------------------------------------------

export interface DeploymentLike {
  metadata?: { generation?: number };
  spec?: { replicas?: number };
  status?: {
    observedGeneration?: number;
    replicas?: number;
    updatedReplicas?: number;
    readyReplicas?: number;
    availableReplicas?: number;
    conditions?: { type: string; status: string; reason?: string }[];
  };
}

export interface DeploymentState {
  desired: number;
  readyReplicas: number;
  availableReplicas: number;
  /** At least one pod serves: the network can be routed. */
  available: boolean;
  /** Every pod runs the current template (the `kubectl rollout status` rule). */
  rolledOut: boolean;
  /** The Deployment controller gave up (progressDeadlineSeconds exceeded). */
  stalled: boolean;
}

export function deploymentState(d: DeploymentLike): DeploymentState {
  const st = d.status ?? {};
  const desired = d.spec?.replicas ?? 1;
  const updated = st.updatedReplicas ?? 0;
  const available = st.availableReplicas ?? 0;
  const observedCurrent = (st.observedGeneration ?? 0) >= (d.metadata?.generation ?? 1);
  const progressing = st.conditions?.find((c) => c.type === "Progressing");
  return {
    desired,
    readyReplicas: st.readyReplicas ?? 0,
    availableReplicas: available,
    available: available >= 1,
    rolledOut: observedCurrent && updated >= desired && (st.replicas ?? 0) === updated && available >= updated,
    stalled: progressing?.status === "False" && progressing.reason === "ProgressDeadlineExceeded",
  };
}

// ---- status and conditions ------------------------------------------------------------------

export interface Observation {
  /** The first input check that failed: nothing is applied while one is set. */
  blocker?: { reason: DegradedReason; message: string };
  /**
   * A problem that does not stop the rollout (no RPC endpoint answered just now): Degraded, while
   * Ready still follows the pods, whose own readiness probes check the RPC.
   */
  warning?: { reason: DegradedReason; message: string };
  /** The chain id reported by the RPC endpoints. */
  chainId?: number;
  /** Addresses of the signer keys. */
  signers?: string[];
  /** The doctor's chain checks (`x402-fleet doctor`), when they ran for this pass; else the last condition stays. */
  chainCheck?: { ok: boolean; message: string };
}

interface ConditionSpec {
  status: "True" | "False";
  reason: string;
  message: string;
}

function conditionSpecs(fn: FacilitatorNetwork, obs: Observation, dep: DeploymentState | undefined): Record<Exclude<ConditionType, "ChainChecked">, ConditionSpec> {
  if (obs.blocker) {
    const { reason, message } = obs.blocker;
    return {
      Ready: { status: "False", reason, message },
      Progressing: { status: "False", reason: "Blocked", message: `nothing is rolled out until this is fixed: ${message}` },
      Degraded: { status: "True", reason, message },
    };
  }
  if (!dep) {
    return {
      Ready: { status: "False", reason: "DeploymentUnavailable", message: "waiting for the facilitator Deployment" },
      Progressing: { status: "True", reason: "RollingOut", message: `rolling out generation ${fn.metadata.generation ?? 1}` },
      Degraded: obs.warning ? { status: "True", ...obs.warning } : { status: "False", reason: "AsExpected", message: "all checks passed" },
    };
  }
  const counts = `${dep.availableReplicas}/${dep.desired} replicas available`;
  const degraded: ConditionSpec = obs.warning
    ? { status: "True", reason: obs.warning.reason, message: obs.warning.message }
    : { status: "False", reason: "AsExpected", message: "all checks passed" };
  if (dep.stalled) {
    return {
      Ready: dep.available ? { status: "True", reason: "Available", message: counts } : { status: "False", reason: "RolloutStalled", message: counts },
      Progressing: { status: "False", reason: "RolloutStalled", message: "the Deployment exceeded its progress deadline" },
      Degraded: { status: "True", reason: "RolloutStalled", message: `the Deployment exceeded its progress deadline; ${counts}` },
    };
  }
  return {
    Ready: dep.available ? { status: "True", reason: "Available", message: counts } : { status: "False", reason: "DeploymentUnavailable", message: counts },
    Progressing: dep.rolledOut
      ? { status: "False", reason: "RolloutComplete", message: `generation ${fn.metadata.generation ?? 1} is rolled out` }
      : { status: "True", reason: "RollingOut", message: `rolling out generation ${fn.metadata.generation ?? 1}; ${counts}` },
    Degraded: degraded,
  };
}

/** metav1.Condition semantics: lastTransitionTime moves only when the status flips. */
export function mergeCondition(previous: Condition[] | undefined, type: ConditionType, next: ConditionSpec, generation: number, now: string): Condition {
  const prev = previous?.find((c) => c.type === type);
  const lastTransitionTime = prev && prev.status === next.status ? prev.lastTransitionTime : now;
  return { type, status: next.status, reason: next.reason, message: next.message, lastTransitionTime, observedGeneration: generation };
}

export function conditionOf(status: FacilitatorNetworkStatus | undefined, type: ConditionType): Condition | undefined {
  return status?.conditions?.find((c) => c.type === type);
}

export function isReady(fn: FacilitatorNetwork): boolean {
  return conditionOf(fn.status, "Ready")?.status === "True";
}

/** During a rollout only the kinds both pod generations serve are advertised. */
function servedKinds(fn: FacilitatorNetwork, dep: DeploymentState): Kind[] {
  const next = kindsFor(fn.spec.network, schemesOf(fn));
  const previous = fn.status?.kinds;
  if (dep.rolledOut || !previous?.length || !isReady(fn)) return next;
  return next.filter((k) => previous.some((p) => p.scheme === k.scheme && p.x402Version === k.x402Version));
}

export interface StatusContext {
  now: string;
  clusterDomain: string;
}

export function buildStatus(fn: FacilitatorNetwork, obs: Observation, dep: DeploymentState | undefined, ctx: StatusContext): FacilitatorNetworkStatus {
  const generation = fn.metadata.generation ?? 1;
  const specs = conditionSpecs(fn, obs, dep);
  const conditions = (["Ready", "Progressing", "Degraded"] as const).map((type) => mergeCondition(fn.status?.conditions, type, specs[type], generation, ctx.now));
  if (obs.chainCheck) {
    const check = obs.chainCheck.ok ? { status: "True" as const, reason: "ChecksPassed", message: obs.chainCheck.message } : { status: "False" as const, reason: "ChecksFailed", message: obs.chainCheck.message };
    conditions.push(mergeCondition(fn.status?.conditions, "ChainChecked", check, generation, ctx.now));
  } else {
    // Not checked in this pass (cached, or the inputs are blocked): keep what the last check said.
    const last = conditionOf(fn.status, "ChainChecked");
    if (last) conditions.push(last);
  }
  const ready = specs.Ready.status === "True";
  const status: FacilitatorNetworkStatus = {
    observedGeneration: generation,
    conditions,
    url: serviceUrl(fn, ctx.clusterDomain),
    replicas: fn.spec.replicas ?? 1,
    readyReplicas: dep?.readyReplicas ?? 0,
  };
  if (obs.chainId !== undefined) status.chainId = obs.chainId;
  if (obs.signers) status.signers = obs.signers;
  if (ready && dep) status.kinds = servedKinds(fn, dep);
  // A network that served and has no available pod for now (a pod restarted, a Recreate rollout)
  // keeps its kinds and so its routing entry: the router answers 503 (try again) while nothing
  // serves, never 400 "no facilitator", a final answer to a valid (or already paid) payment.
  else if (dep && !obs.blocker && fn.status?.kinds?.length) status.kinds = fn.status.kinds;
  return status;
}

/** Status equality for deciding whether to write (field order and absent-vs-undefined ignored). */
export function sameStatus(a: FacilitatorNetworkStatus | undefined, b: FacilitatorNetworkStatus | undefined): boolean {
  return canonical(a ?? {}) === canonical(b ?? {});
}

function canonical(v: unknown): string {
  if (Array.isArray(v)) return `[${v.map(canonical).join(",")}]`;
  if (v && typeof v === "object") {
    const entries = Object.entries(v as Record<string, unknown>)
      .filter(([, x]) => x !== undefined)
      .sort(([a], [b]) => (a < b ? -1 : 1));
    return `{${entries.map(([k, x]) => `${JSON.stringify(k)}:${canonical(x)}`).join(",")}}`;
  }
  return JSON.stringify(v);
}

// ---- events ---------------------------------------------------------------------------------

export interface EventSpec {
  type: "Normal" | "Warning";
  reason: string;
  note: string;
}

/** The events a status change deserves: state changes only, never one per reconcile pass. */
export function transitionEvents(previous: FacilitatorNetworkStatus | undefined, next: FacilitatorNetworkStatus): EventSpec[] {
  const events: EventSpec[] = [];
  const was = (t: ConditionType) => conditionOf(previous, t);
  const now = (t: ConditionType) => conditionOf(next, t)!;
  const degraded = now("Degraded");
  if (degraded.status === "True" && (was("Degraded")?.status !== "True" || was("Degraded")?.reason !== degraded.reason)) {
    events.push({ type: "Warning", reason: degraded.reason, note: degraded.message });
  } else if (degraded.status === "False" && was("Degraded")?.status === "True") {
    events.push({ type: "Normal", reason: "Recovered", note: `no longer degraded (was ${was("Degraded")!.reason})` });
  }
  const progressing = now("Progressing");
  if (progressing.status === "True" && was("Progressing")?.status !== "True") events.push({ type: "Normal", reason: "RollingOut", note: progressing.message });
  if (progressing.reason === "RolloutComplete" && was("Progressing")?.status === "True") events.push({ type: "Normal", reason: "RolloutComplete", note: progressing.message });
  const checked = conditionOf(next, "ChainChecked");
  if (checked?.status === "False" && (was("ChainChecked")?.status !== "False" || was("ChainChecked")?.message !== checked.message)) {
    events.push({ type: "Warning", reason: "ChainChecksFailed", note: checked.message });
  } else if (checked?.status === "True" && was("ChainChecked")?.status === "False") {
    events.push({ type: "Normal", reason: "ChainChecksPassed", note: checked.message });
  }
  const ready = now("Ready");
  if (ready.status === "True" && was("Ready")?.status !== "True") {
    events.push({ type: "Normal", reason: "Ready", note: `serving ${(next.kinds ?? []).map((k) => k.scheme).join(", ")} (${ready.message}); listed in the routing table` });
  } else if (ready.status !== "True" && was("Ready")?.status === "True") {
    events.push({ type: "Warning", reason: "NotReady", note: `removed from the routing table: ${ready.reason}: ${ready.message}` });
  }
  return events;
}

/** RFC 3339 with microseconds, the MicroTime wire format of events.k8s.io/v1 and Leases. */
export function microTime(date: Date): string {
  return date.toISOString().replace(/\.(\d{3})Z$/, ".$1000Z");
}

/** RFC 3339 with seconds, the metav1.Time wire format. */
export function rfc3339(date: Date): string {
  return date.toISOString().replace(/\.\d{3}Z$/, "Z");
}

/** An events.k8s.io/v1 Event about a FacilitatorNetwork; `seq` keeps names unique within a millisecond. */
export function buildEvent(fn: FacilitatorNetwork, e: EventSpec, ctx: { now: Date; seq: number; instance: string; controller: string }) {
  return {
    apiVersion: "events.k8s.io/v1",
    kind: "Event",
    metadata: { name: `${fn.metadata.name}.${(ctx.now.getTime() * 1000 + (ctx.seq % 1000)).toString(16)}`, namespace: fn.metadata.namespace },
    eventTime: microTime(ctx.now),
    reportingController: ctx.controller,
    reportingInstance: ctx.instance,
    action: "Reconcile",
    type: e.type,
    reason: e.reason,
    note: e.note.slice(0, 1024),
    regarding: {
      apiVersion: API_VERSION,
      kind: KIND,
      name: fn.metadata.name,
      namespace: fn.metadata.namespace,
      uid: fn.metadata.uid,
      resourceVersion: fn.metadata.resourceVersion,
    },
  };
}

// ---- the aggregated routing table --------------------------------------------------------------

function age(fn: FacilitatorNetwork): [string, string] {
  return [fn.metadata.creationTimestamp ?? "", `${fn.metadata.namespace}/${fn.metadata.name}`];
}

function olderFirst(a: FacilitatorNetwork, b: FacilitatorNetwork): number {
  const [ta, na] = age(a);
  const [tb, nb] = age(b);
  return ta !== tb ? (ta < tb ? -1 : 1) : na < nb ? -1 : na > nb ? 1 : 0;
}

/** The Secrets a resource references (signer keys, RPC URLs, database and screening URLs): a change to one must reach it. */
export function referencedSecrets(fn: FacilitatorNetwork): string[] {
  const names = [fn.spec.signerSecretRef?.name, ...(fn.spec.rpc ?? []).map((r) => r.secretKeyRef?.name), fn.spec.database?.urlSecretRef.name, fn.spec.screening?.service?.urlSecretRef.name];
  return [...new Set(names.filter((n): n is string => Boolean(n)))];
}

/**
 * Which resource serves a network when several name it: the one already Ready (an incumbent
 * keeps it), else the oldest (then by namespace/name; timestamps have one-second precision).
 */
export function networkOwner(fns: readonly FacilitatorNetwork[], network: string): FacilitatorNetwork | undefined {
  return fns
    .filter((f) => f.spec.network === network && !f.metadata.deletionTimestamp)
    .sort((a, b) => Number(isReady(b)) - Number(isReady(a)) || olderFirst(a, b))[0];
}

/** Every not-deleting network with kinds (Ready, or served and waiting for a pod) with its Service address, kinds and signers, ordered by chain id. */
export function buildRoutingTable(fns: readonly FacilitatorNetwork[], clusterDomain: string): RoutingTable {
  const seen = new Set<string>();
  const backends: RoutingTable["backends"] = [];
  for (const fn of [...fns].sort(olderFirst)) {
    if (fn.metadata.deletionTimestamp || !fn.status?.kinds?.length) continue;
    if (seen.has(fn.spec.network)) continue;
    seen.add(fn.spec.network);
    backends.push({
      network: fn.spec.network,
      url: serviceUrl(fn, clusterDomain),
      kinds: fn.status.kinds.map((k) => ({ ...k, network: fn.spec.network as `${string}:${string}` })),
      signers: [...(fn.status.signers ?? [])],
      extensions: extensionsFor(
        fn.status.kinds.map((k) => k.scheme),
        { erc20ApprovalSponsoring: fn.spec.gasSponsoring?.erc20Approval?.enabled === true },
      ),
    });
  }
  backends.sort((a, b) => chainIdOf(a.network) - chainIdOf(b.network));
  return { backends };
}

export function buildRoutingConfigMap(table: RoutingTable, ref: { name: string; namespace: string }) {
  return {
    apiVersion: "v1",
    kind: "ConfigMap",
    metadata: {
      name: ref.name,
      namespace: ref.namespace,
      labels: { [LABEL_NAME]: "x402-fleet", [LABEL_COMPONENT]: "routing-table", [LABEL_PART_OF]: "x402-fleet", [LABEL_MANAGED_BY]: MANAGED_BY },
    },
    data: { [ROUTING_TABLE_KEY]: `${JSON.stringify(table, null, 2)}\n` },
  };
}
