// The FacilitatorNetwork API as the operator sees it: names, labels and the resource's shape.
// The schema itself lives in crds/facilitatornetworks.x402fleet.io.yaml (the single source).
import type { Scheme } from "../services/x402/wire.ts";

export const GROUP = "x402fleet.io";
export const VERSION = "v1alpha1";
export const API_VERSION = `${GROUP}/${VERSION}`;
export const KIND = "FacilitatorNetwork";
export const PLURAL = "facilitatornetworks";

/** The one field manager for everything the operator applies (children, routing table, status). */
export const FIELD_MANAGER = "x402-fleet-operator";
/** Written by the operator on every FacilitatorNetwork; removed once its routing entry is gone. */
export const FINALIZER = "x402fleet.io/routing-table";
export const CONTROLLER_NAME = "x402fleet.io/operator";

export const LABEL_MANAGED_BY = "app.kubernetes.io/managed-by";
export const MANAGED_BY = "x402-fleet-operator";
export const LABEL_NAME = "app.kubernetes.io/name";
export const LABEL_INSTANCE = "app.kubernetes.io/instance";
export const LABEL_COMPONENT = "app.kubernetes.io/component";
export const LABEL_PART_OF = "app.kubernetes.io/part-of";
export const LABEL_CHAIN_ID = "x402fleet.io/chain-id";
/** Pod template annotation: a digest of the referenced Secret values, so a Secret change rolls the pods. */
export const ANNOTATION_SECRETS_HASH = "x402fleet.io/secrets-hash";

export const FACILITATOR_PORT = 4021;
/** The facilitator's admin port: /metrics, /healthz, /readyz. */
export const ADMIN_PORT = 9421;
/** Where the embedded store lives in a pod when no database is configured (a PersistentVolumeClaim). */
export const DATA_MOUNT_PATH = "/var/lib/x402";
export const SIGNER_MOUNT_PATH = "/var/run/secrets/x402/signer";
export const SCREENING_MOUNT_PATH = "/etc/x402/screening";
/** The digests of the router's tokens (a ConfigMap the operator writes): the facilitator settles only for the router. */
export const ROUTER_TOKENS_MOUNT_PATH = "/etc/x402/router-tokens";
export const ROUTER_TOKENS_KEY = "router-tokens";
export const ROUTING_TABLE_KEY = "routing.json";
export const DEFAULT_SIGNER_KEY = "signer-keys";

export interface ObjectMeta {
  name: string;
  namespace?: string;
  uid?: string;
  resourceVersion?: string;
  generation?: number;
  creationTimestamp?: string;
  deletionTimestamp?: string;
  finalizers?: string[];
  labels?: Record<string, string>;
  annotations?: Record<string, string>;
  ownerReferences?: OwnerReference[];
}

export interface OwnerReference {
  apiVersion: string;
  kind: string;
  name: string;
  uid: string;
  controller?: boolean;
  blockOwnerDeletion?: boolean;
}

export interface SecretKeyRef {
  name: string;
  key: string;
}

export type RpcEndpoint = { url: string; secretKeyRef?: undefined } | { secretKeyRef: SecretKeyRef; url?: undefined };

export type Quantity = string | number;

export interface FacilitatorNetworkSpec {
  network: string;
  rpc: RpcEndpoint[];
  signerSecretRef: { name: string; key?: string };
  schemes?: Scheme[];
  replicas?: number;
  settlement?: { receiptTimeoutSeconds?: number; confirmations?: number; maxFeePerGasWei?: string };
  assets?: string[];
  /** ERC-6492 factories a counterfactual payer's wallet may be deployed through (none: refused). */
  eip6492Factories?: string[];
  /** The erc20ApprovalGasSponsoring extension: payers' approvals funded (bounded) and relayed. */
  gasSponsoring?: { erc20Approval?: { enabled: boolean; maxApprovalGas?: number; maxFundingWei?: string; dailyFundingWei?: string } };
  database?: { urlSecretRef: SecretKeyRef };
  /**
   * A deny-list of payer and payee addresses, from a ConfigMap key (mounted; edits apply without a
   * restart), and/or an external screening service (its URL from a Secret).
   */
  screening?: {
    denyListConfigMapRef?: SecretKeyRef;
    service?: { urlSecretRef: SecretKeyRef; timeoutMs?: number; failure?: "closed" | "open"; cacheSeconds?: number };
  };
  /** The embedded store's PersistentVolumeClaim, without `database`. */
  storage?: { size?: string; storageClassName?: string };
  image?: string;
  resources?: { requests?: Record<string, Quantity>; limits?: Record<string, Quantity> };
}

/** ChainChecked: the doctor's checks of the chain (contracts, assets, signers, fees); informational, never blocks. */
export type ConditionType = "Ready" | "Progressing" | "Degraded" | "ChainChecked";
export type ConditionStatus = "True" | "False" | "Unknown";

export interface Condition {
  type: ConditionType;
  status: ConditionStatus;
  reason: string;
  message: string;
  lastTransitionTime: string;
  observedGeneration?: number;
}

export interface Kind {
  x402Version: number;
  scheme: string;
  network: string;
  extra?: Record<string, unknown>;
}

export interface FacilitatorNetworkStatus {
  observedGeneration?: number;
  conditions?: Condition[];
  chainId?: number;
  signers?: string[];
  kinds?: Kind[];
  url?: string;
  replicas?: number;
  readyReplicas?: number;
}

export interface FacilitatorNetwork {
  apiVersion: typeof API_VERSION;
  kind: typeof KIND;
  metadata: ObjectMeta;
  spec: FacilitatorNetworkSpec;
  status?: FacilitatorNetworkStatus;
}

/** Why a network cannot be served; each is the `reason` of `Degraded=True` (and of `Ready=False`). */
export type DegradedReason =
  | "SignerSecretNotFound"
  | "SignerSecretInvalid"
  | "DatabaseSecretNotFound"
  | "DatabaseSecretInvalid"
  | "ScreeningSecretNotFound"
  | "ScreeningSecretInvalid"
  | "RpcSecretNotFound"
  | "RpcEndpointInvalid"
  | "RpcEndpointNotAllowed"
  | "RpcUnreachable"
  | "ChainIdMismatch"
  | "NetworkConflict"
  | "RolloutStalled";

export function keyOf(namespace: string, name: string): string {
  return `${namespace}/${name}`;
}

export function splitKey(key: string): { namespace: string; name: string } {
  const i = key.indexOf("/");
  return { namespace: key.slice(0, i), name: key.slice(i + 1) };
}
